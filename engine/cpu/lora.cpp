// y[t] += B[slot_t] A[slot_t] x[t] for each adapter row t of a CPU step, in place: the multi-LoRA op of
// `engine/lora/layers.py` in one call. torch's bmm over the slots in use runs one small MKL GEMM per slot
// and part (4 rows against 16 rank rows), tens of them per projection, and the gathers around it add more
// calls; here one task per (slot, part) reads the part's A rows and B^T block once from memory for up to
// 16 of the slot's rows, which reuse them from L1, all in one parallel region per call. Rows are grouped
// by slot (`ids` = token rows in slot order, group g the rows offsets[g]..offsets[g+1] on slot slots[g]).
// A fused projection's parts each own `rank` rows of A and their own output columns of B^T, so only the
// diagonal blocks are read. Rows of no group are not touched. Each row's sums run in one fixed order
// whatever else is in the batch.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <vector>

#include "vec_math.h"

#ifdef SPECFLEET_VEC8
namespace {

using specfleet_vec::dot8_rows;
using specfleet_vec::v8f;
constexpr int64_t kColumns = 64;     // output columns summed at a time: rank x 256 bytes of B^T, kept in L1
constexpr int64_t kRowTile = 16;     // rows per task: a prefill's long group is spread over the threads too

struct LoRATile {
  int64_t slot, begin, end;          // grouped rows [begin, end), all on `slot`
};

std::vector<LoRATile> lora_tiles(const int64_t* offsets, const int64_t* slots, int64_t groups) {
  std::vector<LoRATile> tiles;
  for (int64_t g = 0; g < groups; ++g)
    for (int64_t r = offsets[g]; r < offsets[g + 1]; r += kRowTile)
      tiles.push_back({slots[g], r, std::min(r + kRowTile, offsets[g + 1])});
  return tiles;
}

// xa[r, j - lo] = A[slot, j] . x[r] for the tile's rows r and rank rows j in [lo, hi): blocks of 8 rows of A
// (a block past the end is the 8 ending at rank_rows, storing only its own rows), each dotted with two rows
// of x at a time.
void lora_shrink(const float* xg, const float* a, const LoRATile& tile, int64_t lo, int64_t hi, int64_t rank_rows,
                 int64_t k, float* xa) {
  const int64_t width = hi - lo;
  for (int64_t b = lo; b < hi; b += 8) {
    const int64_t first = std::min(b, rank_rows - 8), last = std::min(first + 8, hi);
    const float* w_rows[8];
    for (int j = 0; j < 8; ++j) w_rows[j] = a + (tile.slot * rank_rows + first + j) * k;
    auto store = [&](int64_t r, v8f sums) {
      float s[8];
      __builtin_memcpy(s, &sums, sizeof s);
      for (int64_t j = b; j < last; ++j) xa[(r - tile.begin) * width + j - lo] = s[j - first];
    };
    v8f sums[2];
    int64_t r = tile.begin;
    for (; r + 2 <= tile.end; r += 2) {
      dot8_rows<2>(xg + r * k, k, w_rows, sums);
      store(r, sums[0]);
      store(r + 1, sums[1]);
    }
    if (r < tile.end) {
      dot8_rows<1>(xg + r * k, k, w_rows, sums);
      store(r, sums[0]);
    }
  }
}

// y[ids[r], first:end] += xa[r] @ B^T[slot, rank rows, first:end] for the tile's rows, 64 columns at a time:
// each chunk of B^T is read from memory once and from L1 for every further row.
void lora_expand(const float* xa, const float* bt_rows, int64_t rank, int64_t fan_out, const int64_t* ids,
                 const LoRATile& tile, int64_t first, int64_t end, float* y) {
  float acc[kColumns];
  for (int64_t c = first; c < end; c += kColumns) {
    const int64_t width = std::min(kColumns, end - c);
    for (int64_t r = tile.begin; r < tile.end; ++r) {
      const float* coef = xa + (r - tile.begin) * rank;
      for (int64_t i = 0; i < width; ++i) acc[i] = 0.f;
      for (int64_t j = 0; j < rank; ++j) {
        const float s = coef[j];
        const float* row = bt_rows + j * fan_out + c;
#pragma omp simd
        for (int64_t i = 0; i < width; ++i) acc[i] += s * row[i];
      }
      float* out = y + ids[r] * fan_out + c;
#pragma omp simd
      for (int64_t i = 0; i < width; ++i) out[i] += acc[i];
    }
  }
}

// one task per (tile, part): the part's rank rows of A, then its columns of B^T; one parallel region per call
void lora_tasks(const float* xg, const float* a, const float* bt, const int64_t* ids,
                const std::vector<LoRATile>& tiles, const std::vector<int64_t>& parts, int64_t rank_rows, int64_t k,
                int64_t fan_out, float* y) {
  const int64_t num_parts = static_cast<int64_t>(parts.size()), rank = rank_rows / num_parts;
  std::vector<int64_t> columns(num_parts + 1, 0);
  for (int64_t p = 0; p < num_parts; ++p) columns[p + 1] = columns[p] + parts[p];
  at::parallel_for(0, static_cast<int64_t>(tiles.size()) * num_parts, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> xa(kRowTile * rank);
    for (int64_t task = begin; task < end; ++task) {
      const LoRATile& tile = tiles[task / num_parts];
      const int64_t p = task % num_parts;
      lora_shrink(xg, a, tile, p * rank, (p + 1) * rank, rank_rows, k, xa.data());
      lora_expand(xa.data(), bt + (tile.slot * rank_rows + p * rank) * fan_out, rank, fan_out, ids, tile,
                  columns[p], columns[p + 1], y);
    }
  });
}

}  // namespace
#endif

// False (nothing done) where the kernel does not apply: not all float32 and contiguous, or a fan-in or
// rank-row count it cannot tile; the caller then runs the torch op.
bool lora_add(torch::Tensor y, torch::Tensor x, torch::Tensor lora_a, torch::Tensor lora_bt, torch::Tensor ids,
              torch::Tensor offsets, torch::Tensor slots, std::vector<int64_t> parts) {
#ifdef SPECFLEET_VEC8
  const auto f32 = torch::kFloat;
  const int64_t k = lora_a.size(2), rank_rows = lora_a.size(1), fan_out = lora_bt.size(2);
  int64_t widths = 0;
  for (const int64_t width : parts) widths += width;
  const bool fits = y.scalar_type() == f32 && x.scalar_type() == f32 && lora_a.scalar_type() == f32 &&
                    lora_bt.scalar_type() == f32 && y.is_contiguous() && lora_a.is_contiguous() &&
                    lora_bt.is_contiguous() && x.dim() == 2 && x.size(1) == k && k % 8 == 0 && rank_rows >= 8 &&
                    !parts.empty() && rank_rows % static_cast<int64_t>(parts.size()) == 0 && y.dim() == 2 &&
                    y.size(0) == x.size(0) && y.size(1) == fan_out && widths == fan_out &&
                    lora_bt.size(0) == lora_a.size(0) && lora_bt.size(1) == rank_rows &&
                    ids.scalar_type() == torch::kLong && offsets.scalar_type() == torch::kLong &&
                    slots.scalar_type() == torch::kLong && ids.is_contiguous() && offsets.is_contiguous() &&
                    slots.is_contiguous();
  if (!fits) return false;
  const auto tiles = lora_tiles(offsets.data_ptr<int64_t>(), slots.data_ptr<int64_t>(), slots.numel());
  const auto xg = x.index_select(0, ids).contiguous();
  lora_tasks(xg.data_ptr<float>(), lora_a.data_ptr<float>(), lora_bt.data_ptr<float>(), ids.data_ptr<int64_t>(), tiles,
             parts, rank_rows, k, fan_out, y.data_ptr<float>());
  return true;
#else
  return false;
#endif
}
