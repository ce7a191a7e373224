// Float math the compiler vectorizes (AVX2, AVX-512, NEON): no libm calls and no branches, so a loop over
// these under `#pragma omp simd` becomes vector code; and 8-wide dot products in GCC/Clang vector types.
// `attention.py` inlines this file into each source that includes it, so a change here rebuilds the
// extension. The clamps in `exp` vectorize only with -fno-trapping-math (the extension's flags).
#ifndef SPECFLEET_VEC_MATH_H
#define SPECFLEET_VEC_MATH_H

#include <cstdint>

namespace specfleet_vec {

// exp(x), within 2 ulp of libm over the float range: Cody-Waite reduction x = n ln2 + r, the Cephes
// degree-6 polynomial on r, and 2^n built in the exponent bits. Inputs are clamped to where 2^n stays a
// normal float (exp(-87.3) ~ 1e-38 stands in for 0, exp(88.3) ~ 2e38 for overflow).
// A caller that divides by (or multiplies with) the result in the same vectorized loop lets GCC compute
// the clamped case as a branch of its own for every lane and blend it in; x / (1 + exp(88.3)) is then a
// subnormal in every lane, and each costs a microcode assist. Store the result first, and use it in a
// second loop (`silu_and_mul` in fused_ops.cpp does; the softmax only stores and sums it).
inline float exp(float x) {
  x = x < -87.3f ? -87.3f : x;
  x = x > 88.3f ? 88.3f : x;
  // n = round(x / ln2): adding 1.5 * 2^23 leaves the rounded integer in the low mantissa bits
  const float shifted = x * 1.44269504088896341f + 12582912.f;
  const float n = shifted - 12582912.f;
  float r = x - n * 0.693359375f;
  r = r + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const int32_t bits = (__builtin_bit_cast(int32_t, shifted) - 0x4B400000 + 127) << 23;
  return p * __builtin_bit_cast(float, bits);
}

// row[0, n) -> exp(row - max(row)), the softmax's numerators; returns their sum.
inline float softmax_numerators(float* row, int64_t n) {
  float top = -3.4e38f, sum = 0.f;
#pragma omp simd reduction(max : top)
  for (int64_t j = 0; j < n; ++j) top = row[j] > top ? row[j] : top;
#pragma omp simd reduction(+ : sum)
  for (int64_t j = 0; j < n; ++j) {
    row[j] = exp(row[j] - top);
    sum += row[j];
  }
  return sum;
}

// bfloat16 held as its 16 bits: the top half of a float. To float is exact; from float rounds to nearest
// even as torch does (NaN stays NaN). Plain integer code, so loops over them vectorize.
inline float bf16_to_float(uint16_t h) { return __builtin_bit_cast(float, static_cast<uint32_t>(h) << 16); }
inline uint16_t float_to_bf16(float f) {
  const uint32_t u = __builtin_bit_cast(uint32_t, f);
  return f != f ? uint16_t{0x7FC0} : static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

// The kernels' element types: float, or bfloat16 as uint16_t. `widen` reads one as a float, `narrow<T>`
// stores a float as one, `round_to<T>` is the float a T can hold (what a torch op in T rounds to).
inline float widen(float x) { return x; }
inline float widen(uint16_t x) { return bf16_to_float(x); }
template <typename T>
inline T narrow(float x) {
  if constexpr (sizeof(T) == sizeof(float)) return x;
  else return float_to_bf16(x);
}
template <typename T>
inline float round_to(float x) { return widen(narrow<T>(x)); }

// sum of x[i]^2 in eight interleaved partial sums, which the compiler keeps in one vector register.
template <typename T>
inline float sum_squares(const T* x, int64_t n) {
  float part[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) part[j] += widen(x[i + j]) * widen(x[i + j]);
  float total = ((part[0] + part[4]) + (part[1] + part[5])) + ((part[2] + part[6]) + (part[3] + part[7]));
  for (; i < n; ++i) total += widen(x[i]) * widen(x[i]);
  return total;
}

#if defined(__clang__) || (defined(__GNUC__) && __GNUC__ >= 12)
#define SPECFLEET_VEC8 1   // GCC/Clang vector extensions with __builtin_shufflevector
typedef float v8f __attribute__((vector_size(32)));

inline v8f load8(const float* p) {
  v8f v;
  __builtin_memcpy(&v, p, sizeof v);
  return v;
}

// eight bfloat16 values widened to floats
inline v8f load8(const uint16_t* p) {
  typedef uint16_t v8h __attribute__((vector_size(16)));
  typedef uint32_t v8w __attribute__((vector_size(32)));
  v8h h;
  __builtin_memcpy(&h, p, sizeof h);
  return reinterpret_cast<v8f>(__builtin_convertvector(h, v8w) << 16);
}

inline v8f pair_sums(v8f a, v8f b) {   // a0+a1, a2+a3, b0+b1, b2+b3, a4+a5, a6+a7, b4+b5, b6+b7
  return __builtin_shufflevector(a, b, 0, 2, 8, 10, 4, 6, 12, 14) +
         __builtin_shufflevector(a, b, 1, 3, 9, 11, 5, 7, 13, 15);
}

// lane j = the sum of acc[j]'s eight lanes: one shuffle tree for all eight instead of a horizontal sum each
inline v8f reduce8(const v8f* acc) {
  // rows 0-3 then 4-7, each lane the sum of lanes 0-3 or 4-7 of its row's accumulator
  const v8f low = pair_sums(pair_sums(acc[0], acc[1]), pair_sums(acc[2], acc[3]));
  const v8f high = pair_sums(pair_sums(acc[4], acc[5]), pair_sums(acc[6], acc[7]));
  return __builtin_shufflevector(low, high, 0, 1, 2, 3, 8, 9, 10, 11) +
         __builtin_shufflevector(low, high, 4, 5, 6, 7, 12, 13, 14, 15);
}

// The R rows x[r * k, r * k + k) dotted with the 8 rows w[j] (float or bfloat16; k a multiple of 8):
// out[r] lane j. Each w vector is loaded (and widened) once for all R rows; the 8R independent
// accumulators keep the FMA units busy, and `reduce8` sums them.
template <int R, typename W>
inline void dot8_rows(const float* x, int64_t k, const W* const* w, v8f* out) {
  v8f acc[R][8] = {};
  for (int64_t i = 0; i < k; i += 8) {
    v8f xv[R];
    for (int r = 0; r < R; ++r) xv[r] = load8(x + r * k + i);
    for (int j = 0; j < 8; ++j) {
      const v8f wv = load8(w[j] + i);
      for (int r = 0; r < R; ++r) acc[r][j] += xv[r] * wv;
    }
  }
  for (int r = 0; r < R; ++r) out[r] = reduce8(acc[r]);
}
#endif

}  // namespace specfleet_vec

#endif  // SPECFLEET_VEC_MATH_H
