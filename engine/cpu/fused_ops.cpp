// The Llama decoder's per-layer elementwise steps (RMSNorm, residual add + RMSNorm, SiLU-and-mul, RoPE),
// one call each instead of 3-14 Python-dispatched ops.
//
// For float32 and bfloat16 each is one loop over the data (vectorized by the compiler; `vec_math.h` for
// exp and the sum of squares): a decode step's tensors are a few KB, where the ~5 us of dispatch and
// allocation per ATen op was the whole cost (7 ops for an RMSNorm). Results equal the Python reference
// (`engine/model/llama.py`, TorchElementwise) to float rounding, not bit for bit: the sum of squares is
// added in another order and products may fuse into FMAs. bfloat16 is computed in float and rounded to
// bfloat16 wherever the reference's bfloat16 ops round (after each product and sum), so its results
// differ from the reference's only where those float differences cross a rounding boundary. Other dtypes
// run the reference's ATen kernels.
// Rows are spread over torch's intra-op threads only when a call has enough work (prefill chunks): a
// parallel region costs more than a decode step's few KB, and the two cores are shared with the HTTP loop.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <cmath>
#include <tuple>
#include <vector>

#include "vec_math.h"

namespace {

// Fewer elements than this run on the calling thread.
constexpr int64_t kSerialBelow = 1 << 16;

template <typename F>
void for_rows(int64_t rows, int64_t row_size, const F& body) {
  const int64_t grain = std::max<int64_t>(1, kSerialBelow / std::max<int64_t>(1, row_size));
  at::parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) body(row);
  });
}

// Element types with loops here: float, and bfloat16 as uint16_t (`vec_math.h` widens, narrows and rounds).
using specfleet_vec::narrow;
using specfleet_vec::round_to;
using specfleet_vec::widen;

template <typename T>
T* data(const torch::Tensor& t) { return reinterpret_cast<T*>(t.data_ptr()); }

// float32 or bfloat16 (the dtypes with loops here), contiguous, all of `dtype`
bool contiguous_as(const torch::Tensor& t, torch::ScalarType dtype) {
  return t.scalar_type() == dtype && t.is_contiguous() &&
         (dtype == torch::kFloat || dtype == torch::kBFloat16);
}

// out = weight * (x * rsqrt(mean(x^2) + eps)), one row of n; the normalized x is rounded to the dtype
// before the weight multiplies it, as in the reference.
template <typename T>
inline void rms_row(const T* x, const T* weight, float eps, int64_t n, T* out) {
  const float inv = 1.f / std::sqrt(specfleet_vec::sum_squares(x, n) / static_cast<float>(n) + eps);
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) out[i] = narrow<T>(widen(weight[i]) * round_to<T>(widen(x[i]) * inv));
}

torch::Tensor rms_norm_aten(const torch::Tensor& x, const torch::Tensor& weight, double eps) {
  auto x32 = x.to(torch::kFloat);
  x32 = x32 * torch::rsqrt(x32.pow(2).mean(-1, /*keepdim=*/true) + eps);
  return weight * x32.to(x.scalar_type());
}

torch::Tensor rotate_half(const torch::Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  return torch::cat({-x.narrow(-1, half, x.size(-1) - half), x.narrow(-1, 0, half)}, -1);
}

// Heads contiguous within a token, tokens at any stride: q and k as views into the fused QKV projection.
bool rows_of_heads(const torch::Tensor& t, torch::ScalarType dtype) {
  return t.scalar_type() == dtype && t.dim() == 3 && t.stride(2) == 1 && t.stride(1) == t.size(2) &&
         t.size(2) % 2 == 0;
}

// x [tokens, heads, d] rotated into `out` (contiguous); cos/sin [tokens, 1, d] in x's dtype.
template <typename T>
void rotate(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin, torch::Tensor& out) {
  const int64_t heads = x.size(1), d = x.size(2), half = d / 2, token_stride = x.stride(0);
  const T *xp = data<T>(x), *cp = data<T>(cos), *sp = data<T>(sin);
  T* op = data<T>(out);
  for_rows(x.size(0), heads * d, [&](int64_t t) {
    const T *c = cp + t * d, *s = sp + t * d;
    for (int64_t h = 0; h < heads; ++h) {
      const T* a = xp + t * token_stride + h * d;
      T* o = op + (t * heads + h) * d;
#pragma omp simd
      for (int64_t i = 0; i < half; ++i)
        o[i] = narrow<T>(round_to<T>(widen(a[i]) * widen(c[i])) + round_to<T>(-widen(a[i + half]) * widen(s[i])));
#pragma omp simd
      for (int64_t i = half; i < d; ++i)
        o[i] = narrow<T>(round_to<T>(widen(a[i]) * widen(c[i])) + round_to<T>(widen(a[i - half]) * widen(s[i])));
    }
  });
}

template <typename T>
void rms_rows(const torch::Tensor& x, const torch::Tensor& weight, double eps, torch::Tensor& out) {
  const int64_t n = x.size(-1);
  const T *xp = data<T>(x), *wp = data<T>(weight);
  T* op = data<T>(out);
  for_rows(x.numel() / n, n, [&](int64_t r) { rms_row(xp + r * n, wp, static_cast<float>(eps), n, op + r * n); });
}

template <typename T>
void add_rms_rows(const torch::Tensor& x, const torch::Tensor& residual, const torch::Tensor& weight, double eps,
                  torch::Tensor& sum, torch::Tensor& normed) {
  const int64_t n = x.size(-1);
  const T *xp = data<T>(x), *rp = data<T>(residual), *wp = data<T>(weight);
  T *sp = data<T>(sum), *np = data<T>(normed);
  for_rows(x.numel() / n, n, [&](int64_t r) {
    T* s = sp + r * n;
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) s[i] = narrow<T>(widen(rp[r * n + i]) + widen(xp[r * n + i]));
    rms_row(s, wp, static_cast<float>(eps), n, np + r * n);
  });
}

template <typename T>
void silu_rows(const torch::Tensor& x, int64_t rows, int64_t d, torch::Tensor& out) {
  const T* xp = data<T>(x);
  T* op = data<T>(out);
  for_rows(rows, 2 * d, [&](int64_t r) {
    const T *gate = xp + r * 2 * d, *up = gate + d;
    T* o = op + r * d;
    thread_local std::vector<float> denominators;
    denominators.resize(d);
    float* e = denominators.data();
    // Two passes over the row (in L1), not one: in `gate / (1 + exp(-gate))` GCC turns exp's input clamp
    // into a second branch, gate / (1 + exp(88.3)), computed for every lane and blended; that quotient is
    // subnormal for every ordinary gate, and each subnormal result costs a microcode assist (~11x slower
    // at 8 to 2,048 rows: commit 8e89f63's benchmarks/silu_kernel.py). Stored first, exp's result is opaque to the division.
#pragma omp simd
    for (int64_t i = 0; i < d; ++i) e[i] = specfleet_vec::exp(-widen(gate[i]));
#pragma omp simd
    for (int64_t i = 0; i < d; ++i) o[i] = narrow<T>(round_to<T>(widen(gate[i]) / (1.f + e[i])) * widen(up[i]));
  });
}

}  // namespace

torch::Tensor rms_norm(torch::Tensor x, torch::Tensor weight, double eps) {
  if (!contiguous_as(x, x.scalar_type()) || !contiguous_as(weight, x.scalar_type())) return rms_norm_aten(x, weight, eps);
  auto out = torch::empty_like(x);
  if (x.scalar_type() == torch::kFloat) rms_rows<float>(x, weight, eps, out);
  else rms_rows<uint16_t>(x, weight, eps, out);
  return out;
}

// (x + residual, rms_norm(x + residual)): the residual stream after a sub-layer and the next one's input.
std::tuple<torch::Tensor, torch::Tensor> add_rms_norm(torch::Tensor x, torch::Tensor residual, torch::Tensor weight,
                                                      double eps) {
  const auto dtype = x.scalar_type();
  if (!contiguous_as(x, dtype) || !contiguous_as(residual, dtype) || !contiguous_as(weight, dtype)) {
    auto sum = residual + x;
    return {sum, rms_norm_aten(sum, weight, eps)};
  }
  auto sum = torch::empty_like(x), normed = torch::empty_like(x);
  if (dtype == torch::kFloat) add_rms_rows<float>(x, residual, weight, eps, sum, normed);
  else add_rms_rows<uint16_t>(x, residual, weight, eps, sum, normed);
  return {sum, normed};
}

// [tokens, 2 * d] (gate | up) -> silu(gate) * up, [tokens, d].
torch::Tensor silu_and_mul(torch::Tensor x) {
  if (!contiguous_as(x, x.scalar_type())) {
    auto parts = x.chunk(2, -1);
    return torch::silu(parts[0]) * parts[1];
  }
  const int64_t d = x.size(-1) / 2, rows = x.numel() / (2 * d);
  auto sizes = x.sizes().vec();
  sizes.back() = d;
  auto out = torch::empty(sizes, x.options());
  if (x.scalar_type() == torch::kFloat) silu_rows<float>(x, rows, d, out);
  else silu_rows<uint16_t>(x, rows, d, out);
  return out;
}

// q [tokens, q_heads, d], k [tokens, kv_heads, d], cos/sin [tokens, 1, d].
std::tuple<torch::Tensor, torch::Tensor> rotary(torch::Tensor q, torch::Tensor k, torch::Tensor cos,
                                                torch::Tensor sin) {
  const auto dtype = q.scalar_type();
  if (!rows_of_heads(q, dtype) || !rows_of_heads(k, dtype) || !contiguous_as(cos, dtype) || !contiguous_as(sin, dtype) ||
      cos.numel() != q.size(0) * q.size(2) || sin.numel() != cos.numel())
    return {q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin};
  auto q_out = torch::empty(q.sizes(), q.options()), k_out = torch::empty(k.sizes(), k.options());
  if (dtype == torch::kFloat) {
    rotate<float>(q, cos, sin, q_out);
    rotate<float>(k, cos, sin, k_out);
  } else {
    rotate<uint16_t>(q, cos, sin, q_out);
    rotate<uint16_t>(k, cos, sin, k_out);
  }
  return {q_out, k_out};
}
