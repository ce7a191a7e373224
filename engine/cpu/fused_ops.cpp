// The Llama decoder's per-layer elementwise steps (RMSNorm, residual add + RMSNorm, SiLU-and-mul, RoPE),
// one call each instead of 3-14 Python-dispatched ops.
//
// Each runs exactly the ATen kernels the Python reference (`engine/model/llama.py`, TorchElementwise) runs,
// in the same order and dtype, so results are bit-identical to it. What changes is the cost around them:
// one dispatch from Python instead of many, and, for the small tensors of a decode step, no OpenMP
// parallel region: with two cores shared by the HTTP loop (and, on a busy machine, other processes), a
// parallel region waits for a thread that may not be scheduled, which costs more than the work itself.
#include <torch/extension.h>
#include <c10/util/ParallelGuard.h>

#include <optional>
#include <tuple>

namespace {

// Below this many elements an op runs on the calling thread (decode steps); above it (prefill chunks)
// ATen parallelizes as usual.
constexpr int64_t kSerialBelow = 1 << 18;

struct MaybeSerial {
  explicit MaybeSerial(const torch::Tensor& t) {
    if (t.numel() < kSerialBelow) guard.emplace(true);
  }
  std::optional<c10::ParallelGuard> guard;
};

torch::Tensor rms_norm_impl(const torch::Tensor& x, const torch::Tensor& weight, double eps) {
  auto x32 = x.to(torch::kFloat);
  x32 = x32 * torch::rsqrt(x32.pow(2).mean(-1, /*keepdim=*/true) + eps);
  return weight * x32.to(x.scalar_type());
}

torch::Tensor rotate_half(const torch::Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  return torch::cat({-x.narrow(-1, half, x.size(-1) - half), x.narrow(-1, 0, half)}, -1);
}

}  // namespace

torch::Tensor rms_norm(torch::Tensor x, torch::Tensor weight, double eps) {
  MaybeSerial serial(x);
  return rms_norm_impl(x, weight, eps);
}

// (x + residual, rms_norm(x + residual)): the residual stream after a sub-layer and the next one's input.
std::tuple<torch::Tensor, torch::Tensor> add_rms_norm(torch::Tensor x, torch::Tensor residual, torch::Tensor weight,
                                                      double eps) {
  MaybeSerial serial(x);
  auto sum = residual + x;
  return {sum, rms_norm_impl(sum, weight, eps)};
}

// [tokens, 2 * d] (gate | up) -> silu(gate) * up, [tokens, d].
torch::Tensor silu_and_mul(torch::Tensor x) {
  MaybeSerial serial(x);
  auto parts = x.chunk(2, -1);
  return torch::silu(parts[0]) * parts[1];
}

// q [tokens, q_heads, d], k [tokens, kv_heads, d], cos/sin [tokens, 1, d].
std::tuple<torch::Tensor, torch::Tensor> rotary(torch::Tensor q, torch::Tensor k, torch::Tensor cos,
                                                torch::Tensor sin) {
  MaybeSerial serial(q);
  return {q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin};
}
