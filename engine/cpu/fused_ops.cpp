// The Llama decoder's per-layer elementwise steps (RMSNorm, residual add + RMSNorm, SiLU-and-mul, RoPE),
// one call each instead of 3-14 Python-dispatched ops.
//
// For float32 each is one loop over the data (vectorized by the compiler; `vec_math.h` for exp and the
// sum of squares): a decode step's tensors are a few KB, where the ~5 us of dispatch and allocation per
// ATen op was the whole cost (7 ops for an RMSNorm). Results equal the Python reference
// (`engine/model/llama.py`, TorchElementwise) to float rounding, not bit for bit: the sum of squares is
// added in another order and products may fuse into FMAs. Other dtypes run the reference's ATen kernels.
// Rows are spread over torch's intra-op threads only when a call has enough work (prefill chunks): a
// parallel region costs more than a decode step's few KB, and the two cores are shared with the HTTP loop.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <cmath>
#include <tuple>

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

bool contiguous_float(const torch::Tensor& t) { return t.scalar_type() == torch::kFloat && t.is_contiguous(); }

// out = weight * (x * rsqrt(mean(x^2) + eps)), one row of n.
inline void rms_row(const float* x, const float* weight, float eps, int64_t n, float* out) {
  const float inv = 1.f / std::sqrt(specfleet_vec::sum_squares(x, n) / static_cast<float>(n) + eps);
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) out[i] = weight[i] * (x[i] * inv);
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
bool rows_of_heads(const torch::Tensor& t) {
  return t.scalar_type() == torch::kFloat && t.dim() == 3 && t.stride(2) == 1 && t.stride(1) == t.size(2) &&
         t.size(2) % 2 == 0;
}

// x [tokens, heads, d] rotated into `out` (contiguous); cos/sin [tokens, 1, d].
void rotate(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin, torch::Tensor& out) {
  const int64_t heads = x.size(1), d = x.size(2), half = d / 2, token_stride = x.stride(0);
  const float *xp = x.data_ptr<float>(), *cp = cos.data_ptr<float>(), *sp = sin.data_ptr<float>();
  float* op = out.data_ptr<float>();
  for_rows(x.size(0), heads * d, [&](int64_t t) {
    const float *c = cp + t * d, *s = sp + t * d;
    for (int64_t h = 0; h < heads; ++h) {
      const float* a = xp + t * token_stride + h * d;
      float* o = op + (t * heads + h) * d;
#pragma omp simd
      for (int64_t i = 0; i < half; ++i) o[i] = a[i] * c[i] + (-a[i + half]) * s[i];
#pragma omp simd
      for (int64_t i = half; i < d; ++i) o[i] = a[i] * c[i] + a[i - half] * s[i];
    }
  });
}

}  // namespace

torch::Tensor rms_norm(torch::Tensor x, torch::Tensor weight, double eps) {
  if (!contiguous_float(x) || !contiguous_float(weight)) return rms_norm_aten(x, weight, eps);
  const int64_t n = x.size(-1);
  auto out = torch::empty_like(x);
  const float *xp = x.data_ptr<float>(), *wp = weight.data_ptr<float>();
  float* op = out.data_ptr<float>();
  for_rows(x.numel() / n, n, [&](int64_t r) { rms_row(xp + r * n, wp, static_cast<float>(eps), n, op + r * n); });
  return out;
}

// (x + residual, rms_norm(x + residual)): the residual stream after a sub-layer and the next one's input.
std::tuple<torch::Tensor, torch::Tensor> add_rms_norm(torch::Tensor x, torch::Tensor residual, torch::Tensor weight,
                                                      double eps) {
  if (!contiguous_float(x) || !contiguous_float(residual) || !contiguous_float(weight)) {
    auto sum = residual + x;
    return {sum, rms_norm_aten(sum, weight, eps)};
  }
  const int64_t n = x.size(-1);
  auto sum = torch::empty_like(x), normed = torch::empty_like(x);
  const float *xp = x.data_ptr<float>(), *rp = residual.data_ptr<float>(), *wp = weight.data_ptr<float>();
  float *sp = sum.data_ptr<float>(), *np = normed.data_ptr<float>();
  for_rows(x.numel() / n, n, [&](int64_t r) {
    float* s = sp + r * n;
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) s[i] = rp[r * n + i] + xp[r * n + i];
    rms_row(s, wp, static_cast<float>(eps), n, np + r * n);
  });
  return {sum, normed};
}

// [tokens, 2 * d] (gate | up) -> silu(gate) * up, [tokens, d].
torch::Tensor silu_and_mul(torch::Tensor x) {
  if (!contiguous_float(x)) {
    auto parts = x.chunk(2, -1);
    return torch::silu(parts[0]) * parts[1];
  }
  const int64_t d = x.size(-1) / 2, rows = x.numel() / (2 * d);
  auto sizes = x.sizes().vec();
  sizes.back() = d;
  auto out = torch::empty(sizes, x.options());
  const float* xp = x.data_ptr<float>();
  float* op = out.data_ptr<float>();
  for_rows(rows, 2 * d, [&](int64_t r) {
    const float *gate = xp + r * 2 * d, *up = gate + d;
    float* o = op + r * d;
    // Two passes over the row (in L1), not one: in `gate / (1 + exp(-gate))` GCC turns exp's input clamp
    // into a second branch, gate / (1 + exp(88.3)), computed for every lane and blended; that quotient is
    // subnormal for every ordinary gate, and each subnormal result costs a microcode assist (~11x slower
    // at 8 to 2,048 rows: benchmarks/silu_kernel.py). Stored first, exp's result is opaque to the division.
#pragma omp simd
    for (int64_t i = 0; i < d; ++i) o[i] = specfleet_vec::exp(-gate[i]);
#pragma omp simd
    for (int64_t i = 0; i < d; ++i) o[i] = gate[i] / (1.f + o[i]) * up[i];
  });
  return out;
}

// q [tokens, q_heads, d], k [tokens, kv_heads, d], cos/sin [tokens, 1, d].
std::tuple<torch::Tensor, torch::Tensor> rotary(torch::Tensor q, torch::Tensor k, torch::Tensor cos,
                                                torch::Tensor sin) {
  if (!rows_of_heads(q) || !rows_of_heads(k) || !contiguous_float(cos) || !contiguous_float(sin) || cos.numel() != q.size(0) * q.size(2) ||
      sin.numel() != cos.numel())
    return {q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin};
  auto q_out = torch::empty(q.sizes(), q.options()), k_out = torch::empty(k.sizes(), k.options());
  rotate(q, cos, sin, q_out);
  rotate(k, cos, sin, k_out);
  return {q_out, k_out};
}
