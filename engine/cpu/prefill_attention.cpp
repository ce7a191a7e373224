// Causal paged attention for prefill chunks on CPU (fp32 or bf16 as its bits, head_dim a multiple of 16;
// sums in fp32 either way; bf16 with AVX512-BF16 multiplies in bf16 pairs, see `namespace bf16`).
//
// SDPA's CPU kernel scores every query against every key of the chunk and masks afterwards: a 256-token
// prompt fits one of its key blocks, so the masked half is computed too. Here a work item is one
// sequence, one KV head and a tile of TILE query tokens with all the query heads that share that KV head
// (GQA: the keys are read once for them), and it computes only the keys its rows can see, in steps of 16:
//   1. the keys of each (sequence, KV head), read in place through the block table, are first transposed
//      once into [step][head_dim][16] slabs that every tile shares;
//   then, R rows at a time (a block: its scores stay in L1),
//   2. scores against each slab the block sees (broadcast-FMA: each key load feeds R rows, no
//      horizontal sums), into a [R, keys] scratch;
//   3. an exact softmax per row over the keys it sees (the rest of its scratch row set to 0);
//   4. the weighted values, 16 columns at a time, values read in place, the R x 16 sums kept in
//      registers across all the keys and written straight to the output.
// Two passes instead of an online softmax: a row's scratch is at most the context long, and rescaling
// running sums every 16 keys cost as much as the arithmetic. Items are spread over torch's intra-op
// threads in an order that pairs a tile near the start of the prompt with one near its end, so that the
// contiguous ranges `at::parallel_for` hands out cost alike.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <memory>
#include <vector>

#ifdef __AVX512BF16__
#include <immintrin.h>
#endif

#include "vec_math.h"

#ifdef SPECFLEET_VEC8
// Named, not anonymous: the extension's sources are compiled as one file, and the decode kernel's
// anonymous namespace has its own Shape and Scratch.
namespace specfleet_prefill {

using specfleet_vec::load8;
using specfleet_vec::narrow;
using specfleet_vec::widen;
using specfleet_vec::v8f;

constexpr int64_t TILE = 16;         // query tokens per work item
constexpr int64_t KEYS = 16;         // keys per slab
constexpr int R = 6;                 // rows computed together: 12 accumulators hide FMA latency and fit AVX2's 16
                                     // registers with the two key (or value) vectors and the broadcast; 4 rows ran
                                     // 11-13% slower, 8 only 3-5% faster on AVX-512 and past AVX2's registers
                                     // (commit 3cbc3dc's benchmarks/prefill_kernel_rows.py)

struct Shape {
  int64_t num_seqs, query_len, q_heads, kv_heads, head_dim, block_size, table_stride;
};

inline int64_t steps_of(int64_t keys) { return (keys + KEYS - 1) / KEYS; }

// Position `pos`'s row of KV head `kv` in a paged cache, through the sequence's block table.
template <typename T>
inline const T* cache_row(const Shape& s, const T* cache, const int32_t* table, int64_t pos, int64_t kv) {
  return cache + ((table[pos / s.block_size] * s.block_size + pos % s.block_size) * s.kv_heads + kv) * s.head_dim;
}

// The rows of work item (seq, kv, tile): (token, query head of this KV head) for the tile's tokens. A
// block of R rows past the last real row takes that row in their place: they see what it sees, and are
// never written out.
struct TileRows {
  const Shape& s;
  int64_t seq, kv, first, group, offset;   // offset: keys before the chunk (a cached prefix)
  int64_t rows, stride;                    // real rows; keys the last row sees, in whole slabs
  TileRows(const Shape& shape, int64_t seq_, int64_t kv_, int64_t tile, int64_t ctx)
      : s(shape), seq(seq_), kv(kv_), first(tile * TILE), group(shape.q_heads / shape.kv_heads),
        offset(ctx - shape.query_len) {
    const int64_t tokens = std::min(TILE, s.query_len - first);
    rows = tokens * group;
    stride = steps_of(offset + first + tokens) * KEYS;
  }
  int64_t real(int64_t r) const { return std::min(r, rows - 1); }
  // element offset of row r in q and in the output
  int64_t at(int64_t r) const {
    r = real(r);
    return ((seq * s.query_len + first + r / group) * s.q_heads + kv * group + r % group) * s.head_dim;
  }
  int64_t visible(int64_t r) const { return offset + first + real(r) / group + 1; }   // keys row r sees
  int64_t steps(int64_t r0) const { return steps_of(visible(r0 + R - 1)); }           // slabs block r0 sees
  int64_t written(int64_t r0) const { return std::min<int64_t>(R, rows - r0); }        // real rows of block r0
};

// kt[x * KEYS + j] = key (first + j)'s element x, for the slab of keys [first, first + KEYS) of KV head
// `kv`; past the context the last key is repeated (finite, and never weighted).
template <typename T>
void transpose_slab(const Shape& s, const T* k_cache, const int32_t* table, int64_t ctx, int64_t kv,
                    int64_t first, float* kt) {
  const int64_t d = s.head_dim;
  for (int64_t j = 0; j < KEYS; ++j) {
    const int64_t pos = std::min(first + j, ctx - 1);
    const T* key = cache_row(s, k_cache, table, pos, kv);
    for (int64_t x = 0; x < d; ++x) kt[x * KEYS + j] = widen(key[x]);
  }
}

// s[r * stride + j] = q_r . key_j for R rows and one slab
inline void score(const float* q, const float* kt, int64_t d, float* s, int64_t stride) {
  v8f acc[R][2] = {};
  for (int64_t x = 0; x < d; ++x) {
    const v8f k0 = load8(kt + x * KEYS), k1 = load8(kt + x * KEYS + 8);
    for (int r = 0; r < R; ++r) {
      const float qv = q[r * d + x];
      acc[r][0] += qv * k0;
      acc[r][1] += qv * k1;
    }
  }
  for (int r = 0; r < R; ++r) __builtin_memcpy(s + r * stride, acc[r], sizeof acc[r]);
}

// out[r][col, col + 16) = inv[r] * sum over the keys j < `keys` of p[r * stride + j] * values[j][col, col + 16),
// for the first `rows` of R rows: the sums stay in registers across all the keys, values read in place.
template <typename T>
inline void weigh_strip(const float* p, int64_t stride, const T* const* values, int64_t keys, int64_t col,
                        const float* inv, T* const* out, int64_t rows) {
  v8f sum[R][2] = {};
  for (int64_t j = 0; j < keys; ++j) {
    const v8f v0 = load8(values[j] + col), v1 = load8(values[j] + col + 8);
    for (int r = 0; r < R; ++r) {
      const float w = p[r * stride + j];
      sum[r][0] += w * v0;
      sum[r][1] += w * v1;
    }
  }
  for (int64_t r = 0; r < rows; ++r) {
    float strip[16];
    __builtin_memcpy(strip, sum[r], sizeof strip);
    for (int x = 0; x < 16; ++x) out[r][col + x] = narrow<T>(strip[x] * inv[r]);
  }
}

// Row scores [0, visible) -> softmax numerators, [visible, padded) -> 0; returns the numerators' sum.
// The scores are computed for whole slabs, so the row is taken to the slab's end in vector code and the
// keys past `visible` are zeroed there: with vec_math's softmax over [0, visible), whose ragged tail is a
// scalar loop, the bf16 kernel took 1.04-1.08x the time
// (commit 3c32813's docs/benchmarks.md, "Prefill attention in bf16 pairs").
// The float path's; the bf16 path has its own in AVX-512 (`bf16::softmax_row_bf16`).
inline float softmax_row(float* row, int64_t visible, int64_t padded) {
  const int64_t slabs_end = steps_of(visible) * KEYS;
  float top = -3.4e38f, sum = 0.f;
#pragma omp simd reduction(max : top)
  for (int64_t j = 0; j < slabs_end; ++j) top = j < visible && row[j] > top ? row[j] : top;
#pragma omp simd reduction(+ : sum)
  for (int64_t j = 0; j < slabs_end; ++j) {
    const float e = specfleet_vec::exp(row[j] - top);
    row[j] = j < visible ? e : 0.f;
    sum += row[j];
  }
  std::fill(row + slabs_end, row + padded, 0.f);
  return sum;
}

template <typename T>
struct Scratch {
  std::vector<float> q, scores;       // a block of R rows: widened and scaled, and their scores
  std::vector<const T*> values;       // the tile's value rows, in key order
};

// Tile `tile` of sequence `seq` for KV head `kv` over its transposed keys `kt` (steps_of(ctx) slabs), R rows
// at a time from scores to output (`TileRows`): a block's scores stay in L1 and its weighted sums in registers.
template <typename T>
void attend_tile(const Shape& s, int64_t seq, int64_t kv, int64_t tile, const T* q, const float* kt,
                 const T* v_cache, const int32_t* table, int64_t ctx, float scale, T* out, Scratch<T>& w) {
  const TileRows t(s, seq, kv, tile, ctx);
  const int64_t d = s.head_dim;
  w.q.resize(R * d);
  w.scores.resize(R * t.stride);
  w.values.resize(t.stride);
  for (int64_t j = 0; j < t.stride; ++j)       // past the context: the last value (finite, never weighted)
    w.values[j] = cache_row(s, v_cache, table, std::min(j, ctx - 1), kv);
  for (int64_t r0 = 0; r0 < t.rows; r0 += R) {
    T* out_rows[R];
    float inv[R];
    for (int r = 0; r < R; ++r) {
      const T* src = q + t.at(r0 + r);
      for (int64_t x = 0; x < d; ++x) w.q[r * d + x] = widen(src[x]) * scale;
      out_rows[r] = out + t.at(r0 + r);
    }
    const int64_t steps = t.steps(r0);
    for (int64_t step = 0; step < steps; ++step)
      score(w.q.data(), kt + step * d * KEYS, d, &w.scores[step * KEYS], t.stride);
    for (int r = 0; r < R; ++r) inv[r] = 1.f / softmax_row(&w.scores[r * t.stride], t.visible(r0 + r), steps * KEYS);
    for (int64_t col = 0; col < d; col += 16)
      weigh_strip(w.scores.data(), t.stride, w.values.data(), steps * KEYS, col, inv, out_rows, t.written(r0));
  }
}

#ifdef __AVX512BF16__
// bf16 with AVX512-BF16: both products as pairwise dot products into float sums (`_mm512_dpbf16_ps`: each
// 32-bit lane adds a0*b0 + a1*b1), one instruction per 16 keys or columns and two elements, where widening
// to float first takes two FMAs and the conversions. So the keys are packed as pairs of a key's elements
// ([step][d/2][KEYS] words) and the values as pairs of keys ([step][KEYS/2][d] words), once per (sequence,
// KV head) as the float path transposes its keys; the softmax's numerators are rounded to bf16 for the
// second product (as GPU flash attention rounds P), while their sum stays in float.
// Blocks of R rows as in the float path, 64 columns of sums in registers at a time, and the softmax
// base-2 in AVX-512 with a short polynomial, its error far below the bf16 rounding of the numerators
// (commit 7df7c77's docs/benchmarks.md, "Prefill attention: row blocks from scores to output").
namespace bf16 {

constexpr int64_t PAIRS = KEYS / 2;   // key pairs per slab

inline uint32_t word_at(const uint16_t* row, int64_t i) {   // elements i and i + 1, the first in the low half
  uint32_t w;
  __builtin_memcpy(&w, row + i, sizeof w);
  return w;
}

// kt[p * KEYS + j] = key (first + j)'s elements 2p, 2p + 1; vt[jp * d + x] = element x of values
// (first + 2jp) and (first + 2jp + 1). Past the context the last key and value are repeated (never weighted).
inline void pack_slab(const Shape& s, const uint16_t* k_cache, const uint16_t* v_cache, const int32_t* table,
                      int64_t ctx, int64_t kv, int64_t first, uint32_t* kt, uint32_t* vt) {
  const int64_t d = s.head_dim;
  const uint16_t* keys[KEYS];
  const uint16_t* values[KEYS];
  for (int64_t j = 0; j < KEYS; ++j) {
    const int64_t pos = std::min(first + j, ctx - 1);
    keys[j] = cache_row(s, k_cache, table, pos, kv);
    values[j] = cache_row(s, v_cache, table, pos, kv);
  }
  for (int64_t p = 0; p < d / 2; ++p)
    for (int64_t j = 0; j < KEYS; ++j) kt[p * KEYS + j] = word_at(keys[j], 2 * p);
  for (int64_t jp = 0; jp < PAIRS; ++jp)
    for (int64_t x = 0; x < d; ++x)
      vt[jp * d + x] = values[2 * jp][x] | static_cast<uint32_t>(values[2 * jp + 1][x]) << 16;
}

// 2^x for x <= 0 (scores come in base 2, see `run_bf16`): x = n + f with f in [-1/2, 1/2], 2^f by its
// degree-5 Taylor polynomial (relative error under 3e-6, far below the bf16 rounding of the numerators
// that follows), 2^n applied by `scalef`; below -126 it gives 0 or a subnormal, and either weighs nothing.
inline __m512 exp2_nonpositive(__m512 x) {
  const __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(x, n);
  __m512 p = _mm512_set1_ps(1.3333558146e-3f);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.6181291076e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.5504108665e-2f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.4022650696e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.9314718056e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.f));
  return _mm512_scalef_ps(p, _mm512_max_ps(n, _mm512_set1_ps(-150.f)));
}

// A row's base-2 scores [0, visible) -> its softmax numerators rounded to bf16 in `p`, zeros in [visible,
// padded); returns the numerators' sum (of the float values). One pass for the maximum and one for the
// powers, 16 keys per instruction, the ragged last slab masked.
inline float softmax_row_bf16(const float* row, int64_t visible, int64_t padded, uint16_t* p) {
  const int64_t full = visible / 16 * 16;
  const __mmask16 tail = static_cast<__mmask16>((1u << (visible - full)) - 1);
  __m512 top = _mm512_set1_ps(-3.4e38f);
  for (int64_t j = 0; j < full; j += 16) top = _mm512_max_ps(top, _mm512_loadu_ps(row + j));
  if (tail) top = _mm512_mask_max_ps(top, tail, top, _mm512_loadu_ps(row + full));
  const __m512 m = _mm512_set1_ps(_mm512_reduce_max_ps(top));
  __m512 sum = _mm512_setzero_ps();
  auto store = [&](int64_t j, __m512 e) {
    sum = _mm512_add_ps(sum, e);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p + j), (__m256i)_mm512_cvtneps_pbh(e));
  };
  for (int64_t j = 0; j < full; j += 16) store(j, exp2_nonpositive(_mm512_sub_ps(_mm512_loadu_ps(row + j), m)));
  int64_t end = full;
  if (tail) {
    store(full, _mm512_maskz_mov_ps(tail, exp2_nonpositive(_mm512_sub_ps(_mm512_loadu_ps(row + full), m))));
    end += 16;
  }
  std::fill(p + end, p + padded, uint16_t{0});
  return _mm512_reduce_add_ps(sum);
}

// s[r * stride + n * KEYS + j] = scale * q_r . key_j of slab n, for R rows (`q[r]`: the row's elements as
// pairs, read in place) and NS consecutive slabs (two give 12 independent sums, enough to cover the
// instruction's latency)
template <int NS>
inline void score(const uint32_t* const* q, const uint32_t* kt, int64_t half, float* s, int64_t stride, float scale) {
  __m512 acc[NS][R];
  for (int n = 0; n < NS; ++n)
    for (int r = 0; r < R; ++r) acc[n][r] = _mm512_setzero_ps();
  for (int64_t p = 0; p < half; ++p) {
    __m512i k[NS];
    for (int n = 0; n < NS; ++n) k[n] = _mm512_loadu_si512(kt + (n * half + p) * KEYS);
    for (int r = 0; r < R; ++r) {
      const __m512bh qr = (__m512bh)_mm512_set1_epi32(static_cast<int>(q[r][p]));
      for (int n = 0; n < NS; ++n) acc[n][r] = _mm512_dpbf16_ps(acc[n][r], qr, (__m512bh)k[n]);
    }
  }
  const __m512 sc = _mm512_set1_ps(scale);
  for (int n = 0; n < NS; ++n)
    for (int r = 0; r < R; ++r) _mm512_storeu_ps(s + r * stride + n * KEYS, _mm512_mul_ps(acc[n][r], sc));
}

// out[r][col, col + 16C) = inv[r] * sum over the keys of `steps` slabs of p_r,j * value_j, for the first
// `rows` of R rows; p holds each row's numerators as bf16 pairs (`words` per row), vt the packed values.
// The sums stay in registers across all the slabs, and are scaled and rounded straight into the output.
template <int C>
inline void weigh_values(const uint32_t* p, int64_t words, const uint32_t* vt, int64_t steps, int64_t d, int64_t col,
                         const float* inv, uint16_t* const* out, int64_t rows) {
  __m512 sum[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) sum[r][c] = _mm512_setzero_ps();
  for (int64_t jp = 0; jp < steps * PAIRS; ++jp) {
    __m512i v[C];
    for (int c = 0; c < C; ++c) v[c] = _mm512_loadu_si512(vt + jp * d + col + 16 * c);
    for (int r = 0; r < R; ++r) {
      const __m512bh w = (__m512bh)_mm512_set1_epi32(static_cast<int>(p[r * words + jp]));
      for (int c = 0; c < C; ++c) sum[r][c] = _mm512_dpbf16_ps(sum[r][c], w, (__m512bh)v[c]);
    }
  }
  for (int64_t r = 0; r < rows; ++r) {
    const __m512 scale = _mm512_set1_ps(inv[r]);
    for (int c = 0; c < C; ++c)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out[r] + col + 16 * c),
                          (__m256i)_mm512_cvtneps_pbh(_mm512_mul_ps(sum[r][c], scale)));
  }
}

struct Scratch {
  std::vector<float> scores;       // a block of R rows' scores
  std::vector<uint16_t> p;         // their numerators rounded to bf16
};

// As the float `attend_tile`, over packed slabs (`kt`, `vt`: steps_of(ctx) of each), but R rows at a
// time from scores to output: a block's scores and numerators stay in L1, and its weighted sums in
// registers. Rows are read from `q` and written to `out` in place.
inline void attend_tile(const Shape& s, int64_t seq, int64_t kv, int64_t tile, const uint16_t* q, const uint32_t* kt,
                        const uint32_t* vt, int64_t ctx, float scale, uint16_t* out, Scratch& w) {
  const TileRows t(s, seq, kv, tile, ctx);
  const int64_t d = s.head_dim, half = d / 2;
  w.scores.resize(R * t.stride);
  w.p.resize(R * t.stride);
  const uint32_t* p = reinterpret_cast<const uint32_t*>(w.p.data());
  for (int64_t r0 = 0; r0 < t.rows; r0 += R) {
    const uint32_t* q_rows[R];
    uint16_t* out_rows[R];
    float inv[R];
    for (int r = 0; r < R; ++r) {
      q_rows[r] = reinterpret_cast<const uint32_t*>(q + t.at(r0 + r));
      out_rows[r] = out + t.at(r0 + r);
    }
    const int64_t steps = t.steps(r0);
    int64_t step = 0;
    for (; step + 2 <= steps; step += 2) score<2>(q_rows, kt + step * half * KEYS, half, &w.scores[step * KEYS], t.stride, scale);
    if (step < steps) score<1>(q_rows, kt + step * half * KEYS, half, &w.scores[step * KEYS], t.stride, scale);
    for (int r = 0; r < R; ++r)
      inv[r] = 1.f / softmax_row_bf16(&w.scores[r * t.stride], t.visible(r0 + r), steps * KEYS, &w.p[r * t.stride]);
    int64_t col = 0;
    for (; col + 64 <= d; col += 64) weigh_values<4>(p, t.stride / 2, vt, steps, d, col, inv, out_rows, t.written(r0));
    for (; col < d; col += 16) weigh_values<1>(p, t.stride / 2, vt, steps, d, col, inv, out_rows, t.written(r0));
  }
}

}  // namespace bf16
#endif

// Item i of n in an order whose every contiguous range holds as many late (costly) tiles as early ones:
// 0, n-1, 1, n-2, ...
inline int64_t balanced(int64_t i, int64_t n) { return i % 2 == 0 ? i / 2 : n - 1 - i / 2; }

// The chunk's tensors as pointers to elements of type T.
template <typename T>
struct Chunk {
  const T *q, *k_cache, *v_cache;
  const int32_t *tables, *ctx;
  T* out;
  Chunk(const torch::Tensor& q_, const torch::Tensor& k, const torch::Tensor& v, const torch::Tensor& block_tables,
        const torch::Tensor& context_lens, torch::Tensor& out_)
      : q(reinterpret_cast<const T*>(q_.data_ptr())), k_cache(reinterpret_cast<const T*>(k.data_ptr())),
        v_cache(reinterpret_cast<const T*>(v.data_ptr())), tables(block_tables.data_ptr<int32_t>()),
        ctx(context_lens.data_ptr<int32_t>()), out(reinterpret_cast<T*>(out_.data_ptr())) {}
};

inline int64_t max_steps_of(const Shape& s, const int32_t* ctx) {
  int64_t steps = 0;
  for (int64_t seq = 0; seq < s.num_seqs; ++seq) steps = std::max(steps, steps_of(ctx[seq]));
  return steps;
}

// The chunk in two parallel passes: `pack(seq, kv, step)` for each key slab of each (sequence, KV head)
// its context reaches, then `attend(seq, kv, tile, scratch)` for each work item, in the `balanced` order,
// with one Scratch per thread.
template <typename Scratch, typename Pack, typename Attend>
void slabs_then_tiles(const Shape& s, const int32_t* ctx, int64_t max_steps, const Pack& pack, const Attend& attend) {
  at::parallel_for(0, s.num_seqs * s.kv_heads * max_steps, 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t seq = i / (s.kv_heads * max_steps), kv = i / max_steps % s.kv_heads, step = i % max_steps;
      if (step < steps_of(ctx[seq])) pack(seq, kv, step);
    }
  });
  const int64_t tiles = (s.query_len + TILE - 1) / TILE, per_seq = s.kv_heads * tiles;
  at::parallel_for(0, s.num_seqs * per_seq, 1, [&](int64_t begin, int64_t end) {
    Scratch scratch;
    for (int64_t i = begin; i < end; ++i) {
      const int64_t seq = i / per_seq, item = i % per_seq;
      attend(seq, item % s.kv_heads, balanced(item / s.kv_heads, tiles), scratch);
    }
  });
}

// The whole chunk for elements of type T: the keys of every (sequence, KV head) transposed slab by slab
// ([seq][kv][step][d][KEYS]), then the tiles.
template <typename T>
void run(const Shape& s, const Chunk<T>& c, double scale) {
  const int64_t max_steps = max_steps_of(s, c.ctx), slab = s.head_dim * KEYS, per_head = max_steps * slab;
  const float sc = static_cast<float>(scale);
  std::vector<float> kt(s.num_seqs * s.kv_heads * per_head);
  slabs_then_tiles<Scratch<T>>(
      s, c.ctx, max_steps,
      [&](int64_t seq, int64_t kv, int64_t step) {
        transpose_slab(s, c.k_cache, c.tables + seq * s.table_stride, c.ctx[seq], kv, step * KEYS,
                       kt.data() + (seq * s.kv_heads + kv) * per_head + step * slab);
      },
      [&](int64_t seq, int64_t kv, int64_t tile, Scratch<T>& scratch) {
        attend_tile(s, seq, kv, tile, c.q, kt.data() + (seq * s.kv_heads + kv) * per_head, c.v_cache,
                    c.tables + seq * s.table_stride, c.ctx[seq], sc, c.out, scratch);
      });
}

#ifdef __AVX512BF16__
// The whole bf16 chunk: keys and values packed slab by slab (`bf16::pack_slab`), then the tiles.
inline void run_bf16(const Shape& s, const Chunk<uint16_t>& c, double scale) {
  const int64_t max_steps = max_steps_of(s, c.ctx), slab = s.head_dim * KEYS / 2, per_head = max_steps * slab;
  const float sc = static_cast<float>(scale) * 1.44269504088896341f;   // base-2 scores for exp2_nonpositive
  // words, as bf16 pairs; left uninitialized, as every slab a tile reads is packed first
  const std::unique_ptr<uint32_t[]> kt(new uint32_t[s.num_seqs * s.kv_heads * per_head]),
      vt(new uint32_t[s.num_seqs * s.kv_heads * per_head]);
  slabs_then_tiles<bf16::Scratch>(
      s, c.ctx, max_steps,
      [&](int64_t seq, int64_t kv, int64_t step) {
        const int64_t at = (seq * s.kv_heads + kv) * per_head + step * slab;
        bf16::pack_slab(s, c.k_cache, c.v_cache, c.tables + seq * s.table_stride, c.ctx[seq], kv, step * KEYS,
                        &kt[at], &vt[at]);
      },
      [&](int64_t seq, int64_t kv, int64_t tile, bf16::Scratch& scratch) {
        const int64_t at = (seq * s.kv_heads + kv) * per_head;
        bf16::attend_tile(s, seq, kv, tile, c.q, &kt[at], &vt[at], c.ctx[seq], sc, c.out, scratch);
      });
}
#endif

}  // namespace specfleet_prefill
#endif

void check_paged_inputs(const torch::Tensor& q, const torch::Tensor& k_cache, const torch::Tensor& v_cache,
                        const torch::Tensor& block_tables, const torch::Tensor& context_lens);   // paged_attention.cpp

// q/out [num_seqs * query_len, q_heads, head_dim] float32 or bfloat16; caches of that dtype [num_blocks,
// block_size, kv_heads, head_dim]; block_tables [num_seqs, max_blocks] int32; context_lens [num_seqs] int32 (keys visible to
// the last query: a cached prefix, then the chunk). Returns an empty tensor where this build or these
// inputs are not covered (no 8-wide vectors, not fp32 or bf16, head_dim not a multiple of 16): the caller
// uses SDPA.
torch::Tensor paged_attention_prefill(torch::Tensor q, torch::Tensor k_cache, torch::Tensor v_cache,
                                      torch::Tensor block_tables, torch::Tensor context_lens, int64_t query_len,
                                      double scale) {
  check_paged_inputs(q, k_cache, v_cache, block_tables, context_lens);
#ifdef SPECFLEET_VEC8
  namespace pf = specfleet_prefill;
  const int64_t d = q.size(2);
  const auto dtype = q.scalar_type();
  if ((dtype != torch::kFloat32 && dtype != torch::kBFloat16) || k_cache.scalar_type() != dtype ||
      v_cache.scalar_type() != dtype || d % 16 != 0)
    return torch::empty({0});
  q = q.contiguous();
  block_tables = block_tables.contiguous();
  context_lens = context_lens.contiguous();
  pf::Shape s{block_tables.size(0), query_len, q.size(1), k_cache.size(2), d, k_cache.size(1), block_tables.size(1)};
  TORCH_CHECK(q.size(0) == s.num_seqs * query_len, "q rows must be num_seqs * query_len");
  TORCH_CHECK(s.q_heads % s.kv_heads == 0, "query heads must be a multiple of KV heads");
  auto out = torch::empty_like(q);
  if (dtype == torch::kFloat32) {
    pf::run(s, pf::Chunk<float>(q, k_cache, v_cache, block_tables, context_lens, out), scale);
  } else {
    const pf::Chunk<uint16_t> chunk(q, k_cache, v_cache, block_tables, context_lens, out);
#ifdef __AVX512BF16__
    pf::run_bf16(s, chunk, scale);
#else
    pf::run(s, chunk, scale);
#endif
  }
  return out;
#else
  return torch::empty({0});
#endif
}
