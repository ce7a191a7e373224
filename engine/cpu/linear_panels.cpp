// y = x W^T (+ b) for the few rows of a decode step, over a weight packed once into output panels.
//
// A decode step's linears stream their weights from memory once per step, and at 1 to 32 rows that is
// what they wait on. `pack_panels` lays W [out, in] out as panels of 48 outputs: for each 4-byte unit of
// inputs (one float, or a pair of bfloat16), the panel's 48 outputs' weights are one 192-byte line, so
// a panel is one contiguous stream. `linear_panels` broadcasts a unit of an input row against a line:
// three 16-wide FMAs (AVX512F) or pairwise bf16 dot products (AVX512-BF16) into 16 sums each, up to 8 rows
// at once (24 accumulators). Each line is read from memory once for all rows, and the sums need no
// horizontal reduction, which `linear_small.cpp`'s row-dot layout pays per output.
// Where the CPU has neither, `pack_panels` returns None and the engine keeps `linear_small`.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <vector>

#ifdef __AVX512F__
#include <immintrin.h>
#endif

namespace {

constexpr int64_t kPanel = 48;    // outputs per panel: three 16-float vectors
constexpr int64_t kMaxRows = 8;   // rows per pass over a panel: 8 x 3 accumulators of 32 vector registers

bool panels_support(torch::ScalarType dtype) {
#if defined(__AVX512BF16__)
  return dtype == torch::kFloat || dtype == torch::kBFloat16;
#elif defined(__AVX512F__)
  return dtype == torch::kFloat;
#else
  (void)dtype;
  return false;
#endif
}

// elements per 4-byte unit: a float, or a pair of bfloat16
int64_t unit_of(torch::ScalarType dtype) { return dtype == torch::kFloat ? 1 : 2; }

#ifdef __AVX512F__
inline __m512 fma_unit(__m512 acc, __m512 x, __m512 w) { return _mm512_fmadd_ps(x, w, acc); }
#ifdef __AVX512BF16__
inline __m512 dot_unit(__m512 acc, __m512 x, __m512 w) {
  return _mm512_dpbf16_ps(acc, (__m512bh)_mm512_castps_si512(x), (__m512bh)_mm512_castps_si512(w));
}
#endif

// sums[r][48] = x[r] . the panel's 48 weight rows, for R rows of `units` 4-byte units each (stride `units`)
template <int R, __m512 (*Madd)(__m512, __m512, __m512)>
inline void panel_pass(const float* x, int64_t units, const float* panel, float* sums) {
  __m512 acc[R][3];
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < 3; ++j) acc[r][j] = _mm512_setzero_ps();
  for (int64_t u = 0; u < units; ++u) {
    const float* line = panel + u * kPanel;
    const __m512 w0 = _mm512_loadu_ps(line), w1 = _mm512_loadu_ps(line + 16), w2 = _mm512_loadu_ps(line + 32);
    for (int r = 0; r < R; ++r) {
      const __m512 xv = _mm512_set1_ps(x[r * units + u]);   // a float, or a bf16 pair seen as one
      acc[r][0] = Madd(acc[r][0], xv, w0);
      acc[r][1] = Madd(acc[r][1], xv, w1);
      acc[r][2] = Madd(acc[r][2], xv, w2);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < 3; ++j) _mm512_storeu_ps(sums + r * kPanel + j * 16, acc[r][j]);
}

template <__m512 (*Madd)(__m512, __m512, __m512)>
void panel_rows(int64_t rows, const float* x, int64_t units, const float* panel, float* sums) {
  switch (rows) {
    case 1: return panel_pass<1, Madd>(x, units, panel, sums);
    case 2: return panel_pass<2, Madd>(x, units, panel, sums);
    case 3: return panel_pass<3, Madd>(x, units, panel, sums);
    case 4: return panel_pass<4, Madd>(x, units, panel, sums);
    case 5: return panel_pass<5, Madd>(x, units, panel, sums);
    case 6: return panel_pass<6, Madd>(x, units, panel, sums);
    case 7: return panel_pass<7, Madd>(x, units, panel, sums);
    default: return panel_pass<8, Madd>(x, units, panel, sums);
  }
}

// y[rows, n] over all panels; `put(row, first, count, sums)` stores `count` outputs from column `first`
template <__m512 (*Madd)(__m512, __m512, __m512), typename Put>
void run_panels(const float* x, int64_t rows, int64_t units, const float* panels, int64_t n, const Put& put) {
  const int64_t count = (n + kPanel - 1) / kPanel;
  // ~16K multiply-adds per task at least: smaller splits cost more in thread wake-ups than they save
  const int64_t grain = std::max<int64_t>(1, (1 << 14) / (kPanel * units * rows));
  at::parallel_for(0, count, grain, [&](int64_t begin, int64_t end) {
    alignas(64) float sums[kMaxRows * kPanel];
    for (int64_t p = begin; p < end; ++p) {
      const float* panel = panels + p * units * kPanel;
      const int64_t first = p * kPanel, cols = std::min(kPanel, n - first);
      for (int64_t r0 = 0; r0 < rows; r0 += kMaxRows) {   // later passes find the panel in L2
        const int64_t r_count = std::min(kMaxRows, rows - r0);
        panel_rows<Madd>(r_count, x + r0 * units, units, panel, sums);
        for (int64_t r = 0; r < r_count; ++r) put(r0 + r, first, cols, sums + r * kPanel);
      }
    }
  });
}

inline __mmask16 first_lanes(int64_t count) {
  return count >= 16 ? __mmask16(0xffff) : __mmask16((1u << count) - 1);
}
#endif

}  // namespace

// W [out, in] (float32 or bfloat16) as [ceil(out / 48), in units, 48, unit elements], zero-padded; None where
// this CPU's build has no panel kernel for its dtype.
std::optional<torch::Tensor> pack_panels(torch::Tensor weight) {
  if (weight.dim() != 2 || !panels_support(weight.scalar_type())) return std::nullopt;
  const int64_t n = weight.size(0), k = weight.size(1), unit = unit_of(weight.scalar_type());
  const int64_t units = (k + unit - 1) / unit, count = (n + kPanel - 1) / kPanel;
  auto padded = torch::zeros({count * kPanel, units * unit}, weight.options());
  padded.narrow(0, 0, n).narrow(1, 0, k).copy_(weight);
  // [panel, 48 outputs, units, unit] -> [panel, units, 48 outputs, unit]
  return padded.view({count, kPanel, units, unit}).transpose(1, 2).contiguous();
}

// x [rows, in] of the packed weight's dtype; bias (optional) [out] of the same dtype
torch::Tensor linear_panels(torch::Tensor x, torch::Tensor panels, int64_t out_features,
                            std::optional<torch::Tensor> bias) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == panels.scalar_type() && panels.dim() == 4 && panels.is_contiguous(),
              "linear_panels: x must be [rows, in] of the panels' dtype");
  const int64_t rows = x.size(0), k = x.size(1), units = panels.size(1), unit = panels.size(3);
  TORCH_CHECK((k + unit - 1) / unit == units && panels.size(0) * kPanel >= out_features,
              "linear_panels: x's width or out_features does not fit the panels");
  auto y = torch::empty({rows, out_features}, x.options());
#ifdef __AVX512F__
  auto xs = x.contiguous();
  if (k % unit != 0) xs = torch::constant_pad_nd(xs, {0, units * unit - k});   // an odd bf16 width: a zero pair
  std::vector<float> b;
  if (bias) {
    b.resize(out_features);
    const auto bf = bias->to(torch::kFloat).contiguous();
    std::memcpy(b.data(), bf.data_ptr<float>(), out_features * sizeof(float));
  }
  const float* bp = bias ? b.data() : nullptr;
  const auto* xp = reinterpret_cast<const float*>(xs.data_ptr());
  const auto* wp = reinterpret_cast<const float*>(panels.data_ptr());
  auto add_bias = [bp](__m512 v, int64_t col, __mmask16 m) {
    return bp ? _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, bp + col)) : v;
  };
  if (x.scalar_type() == torch::kFloat) {
    float* yp = y.data_ptr<float>();
    run_panels<fma_unit>(xp, rows, units, wp, out_features, [&](int64_t row, int64_t first, int64_t cols, const float* s) {
      for (int64_t j = 0; j < cols; j += 16) {
        const __mmask16 m = first_lanes(cols - j);
        _mm512_mask_storeu_ps(yp + row * out_features + first + j, m, add_bias(_mm512_loadu_ps(s + j), first + j, m));
      }
    });
    return y;
  }
#ifdef __AVX512BF16__
  auto* yp = reinterpret_cast<uint16_t*>(y.data_ptr());
  // sums rounded to bfloat16 once (nearest even), as oneDNN's bf16 GEMM rounds them
  run_panels<dot_unit>(xp, rows, units, wp, out_features, [&](int64_t row, int64_t first, int64_t cols, const float* s) {
    for (int64_t j = 0; j < cols; j += 16) {
      const __mmask16 m = first_lanes(cols - j);
      const __m512 v = add_bias(_mm512_loadu_ps(s + j), first + j, m);
      _mm256_mask_storeu_epi16(yp + row * out_features + first + j, m, (__m256i)_mm512_cvtneps_pbh(v));
    }
  });
  return y;
#endif
#endif
  TORCH_CHECK(false, "linear_panels: not built for this CPU and dtype");
  return y;
}
