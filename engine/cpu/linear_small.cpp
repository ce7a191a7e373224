// y = x W^T (+ b) for the few rows of a decode step, W row-major [out, in] float32.
//
// oneDNN's packed linear (torch.ops.mkldnn._linear_pointwise) costs tens of us per call before any
// arithmetic, on ~120 calls per SmolLM2 decode step. Here each block of 8 weight rows is read once from
// memory and dotted with the input rows two at a time while it sits in L1 or L2 (16 accumulators: each
// weight load feeds two FMAs, and a 1,536-wide block that overflows L1 is re-read half as often); blocks
// are spread over torch's intra-op threads. Memory-bound at one row; at many rows oneDNN's blocked GEMM
// wins, and where it starts to is measured per shape when a model loads (`engine/cpu/linear.py`).
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <optional>

#include "vec_math.h"

#ifdef SPECFLEET_VEC8
namespace {

using specfleet_vec::v8f;

// the R input rows x[r * k, ...] dotted with the 8 weight rows w[j]: out[r] lane j
template <int R>
inline void dot8_rows(const float* x, int64_t k, const float* const* w, v8f* out) {
  v8f acc[R][8] = {};
  for (int64_t i = 0; i < k; i += 8) {
    v8f xv[R];
    for (int r = 0; r < R; ++r) xv[r] = specfleet_vec::load8(x + r * k + i);
    for (int j = 0; j < 8; ++j) {
      const v8f wv = specfleet_vec::load8(w[j] + i);
      for (int r = 0; r < R; ++r) acc[r][j] += xv[r] * wv;
    }
  }
  for (int r = 0; r < R; ++r) out[r] = specfleet_vec::reduce8(acc[r]);
}

}  // namespace
#endif

torch::Tensor linear_small(torch::Tensor x, torch::Tensor weight, std::optional<torch::Tensor> bias) {
#ifdef SPECFLEET_VEC8
  const bool fits = x.scalar_type() == torch::kFloat && weight.scalar_type() == torch::kFloat && x.dim() == 2 &&
                    x.is_contiguous() && weight.is_contiguous() && weight.size(1) % 8 == 0 &&
                    weight.size(1) == x.size(1) && weight.size(0) >= 8 &&
                    (!bias || (bias->scalar_type() == torch::kFloat && bias->is_contiguous() &&
                               bias->numel() == weight.size(0)));
  if (fits) {
    const int64_t rows = x.size(0), n = weight.size(0), k = weight.size(1), blocks = (n + 7) / 8;
    auto out = torch::empty({rows, n}, x.options());
    const float *xp = x.data_ptr<float>(), *wp = weight.data_ptr<float>();
    const float* bp = bias ? bias->data_ptr<float>() : nullptr;
    float* op = out.data_ptr<float>();
    // ~16K multiply-adds per task at least: smaller splits cost more in thread wake-ups than they save
    const int64_t grain = std::max<int64_t>(1, (1 << 14) / (8 * k * rows));
    at::parallel_for(0, blocks, grain, [&](int64_t begin, int64_t end) {
      for (int64_t b = begin; b < end; ++b) {
        // a last block of fewer than 8 rows is computed as the 8 ending at n and stores only its own outputs
        const int64_t first = std::min(b * 8, n - 8), skip = b * 8 - first;
        const float* w_rows[8];
        for (int j = 0; j < 8; ++j) w_rows[j] = wp + (first + j) * k;
        auto store = [&](int64_t row, v8f sums) {
          float y[8];
          if (bp != nullptr) sums += specfleet_vec::load8(bp + first);
          __builtin_memcpy(y, &sums, sizeof y);
          std::copy(y + skip, y + 8, op + row * n + first + skip);
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
    return out;
  }
#endif
  return torch::linear(x, weight, bias);
}
