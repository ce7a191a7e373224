// y = x W^T (+ b) for the few rows of a decode step, W row-major [out, in], float32 or bfloat16: the
// portable path (8-wide vectors, AVX2 or NEON), for CPUs without `linear_panels.cpp`'s AVX-512 kernels.
//
// oneDNN's packed linear (torch.ops.mkldnn._linear_pointwise) costs tens of us per call before any
// arithmetic, on ~120 calls per SmolLM2 decode step. Here each block of 8 weight rows is read once from
// memory and dotted with the input rows two at a time while it sits in L1 or L2 (16 accumulators: each
// weight load feeds two FMAs, and a 1,536-wide block that overflows L1 is re-read half as often); blocks
// are spread over torch's intra-op threads. Memory-bound at one row; at many rows oneDNN's blocked GEMM
// wins, and where it starts to is measured per shape when a model loads (`engine/cpu/linear.py`). A bf16
// weight is half the bytes to stream, which is what a one-row step waits on.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <optional>
#include <vector>

#include "vec_math.h"

#ifdef SPECFLEET_VEC8
namespace {

using specfleet_vec::dot8_rows;
using specfleet_vec::v8f;

// y[rows, n] = x W^T + b over weight rows of type W, output stored through `put(index, value)`.
template <typename X, typename W, typename Put>
void small_rows(const X* xp, int64_t rows, const W* wp, int64_t n, int64_t k, const float* bp, const Put& put) {
  const int64_t blocks = (n + 7) / 8;
  // ~16K multiply-adds per task at least: smaller splits cost more in thread wake-ups than they save
  const int64_t grain = std::max<int64_t>(1, (1 << 14) / (8 * k * rows));
  at::parallel_for(0, blocks, grain, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      // a last block of fewer than 8 rows is computed as the 8 ending at n and stores only its own outputs
      const int64_t first = std::min(b * 8, n - 8), skip = b * 8 - first;
      const W* w_rows[8];
      for (int j = 0; j < 8; ++j) w_rows[j] = wp + (first + j) * k;
      auto store = [&](int64_t row, v8f sums) {
        float y[8];
        if (bp != nullptr) sums += specfleet_vec::load8(bp + first);
        __builtin_memcpy(y, &sums, sizeof y);
        for (int64_t j = skip; j < 8; ++j) put(row * n + first + j, y[j]);
      };
      v8f sums[2];
      int64_t r = 0;
      for (; r + 2 <= rows; r += 2) {
        dot8_rows<2>(xp + r * k, k, w_rows, sums);
        store(r, sums[0]);
        store(r + 1, sums[1]);
      }
      if (r < rows) {
        dot8_rows<1>(xp + r * k, k, w_rows, sums);
        store(r, sums[0]);
      }
    }
  });
}

}  // namespace
#endif

// float32 x and weight, or bfloat16 x and weight (widened to float as they are read, the sums rounded to
// bfloat16 once, as oneDNN's bf16 GEMM rounds them); anything else goes to torch::linear.
torch::Tensor linear_small(torch::Tensor x, torch::Tensor weight, std::optional<torch::Tensor> bias) {
#ifdef SPECFLEET_VEC8
  const auto dtype = weight.scalar_type();
  const bool fits = (dtype == torch::kFloat || dtype == torch::kBFloat16) && x.scalar_type() == dtype &&
                    x.dim() == 2 && x.is_contiguous() && weight.is_contiguous() && weight.size(1) % 8 == 0 &&
                    weight.size(1) == x.size(1) && weight.size(0) >= 8 &&
                    (!bias || (bias->scalar_type() == dtype && bias->is_contiguous() &&
                               bias->numel() == weight.size(0)));
  if (fits) {
    const int64_t rows = x.size(0), n = weight.size(0), k = weight.size(1);
    auto out = torch::empty({rows, n}, x.options());
    if (dtype == torch::kFloat) {
      float* op = out.data_ptr<float>();
      small_rows(x.data_ptr<float>(), rows, weight.data_ptr<float>(), n, k, bias ? bias->data_ptr<float>() : nullptr,
                 [op](int64_t i, float v) { op[i] = v; });
    } else {
      const auto* xb = reinterpret_cast<const uint16_t*>(x.data_ptr());
      const auto* wb = reinterpret_cast<const uint16_t*>(weight.data_ptr());
      std::vector<float> bf;
      if (bias) {
        const auto* bb = reinterpret_cast<const uint16_t*>(bias->data_ptr());
        bf.resize(n);
        for (int64_t i = 0; i < n; ++i) bf[i] = specfleet_vec::bf16_to_float(bb[i]);
      }
      auto* op = reinterpret_cast<uint16_t*>(out.data_ptr());
      auto put = [op](int64_t i, float v) { op[i] = specfleet_vec::float_to_bf16(v); };
      std::vector<float> xf(rows * k);
      for (int64_t i = 0; i < rows * k; ++i) xf[i] = specfleet_vec::bf16_to_float(xb[i]);
      small_rows(xf.data(), rows, wb, n, k, bias ? bf.data() : nullptr, put);
    }
    return out;
  }
#endif
  return torch::linear(x, weight, bias);
}
