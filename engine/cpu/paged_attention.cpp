// Paged attention for short queries (decodes, speculative verifications) on CPU.
//
// Reads K/V straight from the block-table cache [num_blocks, block_size, kv_heads, head_dim]: no gather,
// no padding to the longest context, one pass over each sequence's keys with all of its query heads
// (GQA) and query tokens at once. Work items are sequences, spread over torch's intra-op threads. Arithmetic is fp32 whatever the cache dtype.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "vec_math.h"

namespace {

template <typename T>
inline float dot(const float* q, const T* k, int64_t d) {
  float acc = 0.f;
#pragma omp simd reduction(+ : acc)
  for (int64_t x = 0; x < d; ++x) acc += q[x] * static_cast<float>(k[x]);
  return acc;
}

template <typename T>
inline void axpy(float w, const T* v, float* out, int64_t d) {
#pragma omp simd
  for (int64_t x = 0; x < d; ++x) out[x] += w * static_cast<float>(v[x]);
}

#ifdef SPECFLEET_VEC8
using specfleet_vec::dot8;
using specfleet_vec::load8;
using specfleet_vec::v8f;
#endif

struct Shape {
  int64_t num_seqs, query_len, q_heads, kv_heads, head_dim, block_size, table_stride;
};

// Row r = token i * q_heads + head reads KV head (head / group) and sees keys [0, ctx - query_len + i].
inline int64_t head_offset(const Shape& s, int64_t r) {
  return ((r % s.q_heads) / (s.q_heads / s.kv_heads)) * s.head_dim;
}
inline int64_t visible_keys(const Shape& s, int64_t r, int64_t ctx) { return ctx - s.query_len + r / s.q_heads + 1; }

// scores[r * stride + pos] = q_r . k_pos for every row and key [0, ctx); `slots[pos]` is where key pos
// starts in the cache. Keys past a row's causal limit get a score too, which the softmax never reads.
template <typename T>
void score_keys(const Shape& s, const float* qf, const T* k_cache, const int64_t* slots, int64_t ctx,
                int64_t stride, float* scores) {
  const int64_t d = s.head_dim, rows = s.q_heads * s.query_len;
#ifdef SPECFLEET_VEC8
  if constexpr (std::is_same_v<T, float>) {
    if (d % 8 == 0) {
      for (int64_t first = 0; first < ctx; first += 8) {
        const float* slot_keys[8];
        for (int j = 0; j < 8; ++j) slot_keys[j] = k_cache + slots[std::min(first + j, ctx - 1)];
        for (int64_t r = 0; r < rows; ++r) {
          const float* keys[8];
          const int64_t offset = head_offset(s, r);
          for (int j = 0; j < 8; ++j) keys[j] = slot_keys[j] + offset;
          const v8f sc = dot8(qf + r * d, keys, d);
          __builtin_memcpy(scores + r * stride + first, &sc, sizeof sc);
        }
      }
      return;
    }
  }
#endif
  for (int64_t pos = 0; pos < ctx; ++pos)
    for (int64_t r = 0; r < rows; ++r)
      scores[r * stride + pos] = dot(qf + r * d, k_cache + slots[pos] + head_offset(s, r), d);
}

#ifdef SPECFLEET_VEC8
// out = sum over keys p < count of w[p] * v_p for a head of 8 * C values, the sums held in registers.
template <int C>
void weighted_sum(const float* w, const float* v_cache, const int64_t* slots, int64_t count, float* out) {
  v8f acc[C] = {};
  for (int64_t p = 0; p < count; ++p) {
    const float* v = v_cache + slots[p];
    for (int c = 0; c < C; ++c) acc[c] += w[p] * load8(v + 8 * c);
  }
  for (int c = 0; c < C; ++c) __builtin_memcpy(out + 8 * c, &acc[c], sizeof acc[c]);
}
#endif

// acc[r] = sum over row r's visible keys of weight * value (weights: the softmax numerators in `scores`).
template <typename T>
void weigh_values(const Shape& s, const float* scores, int64_t stride, const T* v_cache, const int64_t* slots,
                  int64_t ctx, float* acc) {
  const int64_t d = s.head_dim, rows = s.q_heads * s.query_len;
#ifdef SPECFLEET_VEC8
  if constexpr (std::is_same_v<T, float>) {
    void (*sum)(const float*, const float*, const int64_t*, int64_t, float*) =
        d == 16 ? weighted_sum<2> : d == 32 ? weighted_sum<4> : d == 64 ? weighted_sum<8>
        : d == 128 ? weighted_sum<16> : nullptr;
    if (sum != nullptr) {
      for (int64_t r = 0; r < rows; ++r)
        sum(scores + r * stride, v_cache + head_offset(s, r), slots, visible_keys(s, r, ctx), acc + r * d);
      return;
    }
  }
#endif
  std::fill(acc, acc + rows * d, 0.f);
  for (int64_t pos = 0; pos < ctx; ++pos) {
    const int64_t first_token = std::max<int64_t>(0, pos - (ctx - s.query_len));
    for (int64_t r = first_token * s.q_heads; r < rows; ++r)
      axpy(scores[r * stride + pos], v_cache + slots[pos] + head_offset(s, r), acc + r * d, d);
  }
}

// Per-thread buffers, reused across the sequences a thread takes.
struct Scratch {
  std::vector<float> qf, scores, acc, sums;
  std::vector<int64_t> slots;
};

// One sequence, all heads and query tokens: scores, softmax, weighted values. Keys are read in order,
// each block's [block_size, kv_heads, head_dim] slab front to back, which the prefetchers stream.
template <typename T>
void attend_one(const Shape& s, int64_t seq, const T* q, const T* k_cache, const T* v_cache,
                const int32_t* table, int64_t ctx, float scale, T* out, Scratch& w) {
  const int64_t d = s.head_dim, rows = s.q_heads * s.query_len, stride = (ctx + 7) / 8 * 8;
  w.qf.resize(rows * d);
  w.scores.resize(rows * stride);
  w.acc.resize(rows * d);
  w.sums.resize(rows);
  w.slots.resize(ctx);
  for (int64_t pos = 0; pos < ctx; ++pos)
    w.slots[pos] = (table[pos / s.block_size] * s.block_size + pos % s.block_size) * s.kv_heads * d;
  const T* q_seq = q + seq * rows * d;
  for (int64_t x = 0; x < rows * d; ++x) w.qf[x] = static_cast<float>(q_seq[x]) * scale;
  score_keys<T>(s, w.qf.data(), k_cache, w.slots.data(), ctx, stride, w.scores.data());
  for (int64_t r = 0; r < rows; ++r) {
    w.sums[r] = specfleet_vec::softmax_numerators(&w.scores[r * stride], visible_keys(s, r, ctx));
  }
  weigh_values<T>(s, w.scores.data(), stride, v_cache, w.slots.data(), ctx, w.acc.data());
  T* out_seq = out + seq * rows * d;
  for (int64_t r = 0; r < rows; ++r) {
    const float inv = 1.f / w.sums[r];
    for (int64_t x = 0; x < d; ++x) out_seq[r * d + x] = static_cast<T>(w.acc[r * d + x] * inv);
  }
}

template <typename T>
void attend(const Shape& s, const torch::Tensor& q, const torch::Tensor& k_cache, const torch::Tensor& v_cache,
            const torch::Tensor& block_tables, const torch::Tensor& context_lens, float scale, torch::Tensor& out) {
  const T* qp = q.data_ptr<T>();
  const T* kp = k_cache.data_ptr<T>();
  const T* vp = v_cache.data_ptr<T>();
  const int32_t* tables = block_tables.data_ptr<int32_t>();
  const int32_t* ctx = context_lens.data_ptr<int32_t>();
  T* op = out.data_ptr<T>();
  at::parallel_for(0, s.num_seqs, 1, [&](int64_t begin, int64_t end) {
    Scratch scratch;
    for (int64_t seq = begin; seq < end; ++seq)
      attend_one<T>(s, seq, qp, kp, vp, tables + seq * s.table_stride, ctx[seq], scale, op, scratch);
  });
}

}  // namespace

// The argument checks both paged kernels (this one and prefill_attention.cpp's) make.
void check_paged_inputs(const torch::Tensor& q, const torch::Tensor& k_cache, const torch::Tensor& v_cache,
                        const torch::Tensor& block_tables, const torch::Tensor& context_lens) {
  TORCH_CHECK(q.dim() == 3 && k_cache.dim() == 4, "q [tokens, heads, dim] and cache [blocks, slots, heads, dim]");
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous(), "KV cache must be contiguous");
  TORCH_CHECK(block_tables.scalar_type() == torch::kInt32 && context_lens.scalar_type() == torch::kInt32,
              "block tables and context lengths must be int32");
}

// q/out [num_seqs * query_len, q_heads, head_dim]; caches [num_blocks, block_size, kv_heads, head_dim];
// block_tables [num_seqs, max_blocks] int32; context_lens [num_seqs] int32 (keys visible to the last query).
torch::Tensor paged_attention_short(torch::Tensor q, torch::Tensor k_cache, torch::Tensor v_cache,
                                    torch::Tensor block_tables, torch::Tensor context_lens, int64_t query_len,
                                    double scale) {
  check_paged_inputs(q, k_cache, v_cache, block_tables, context_lens);
  q = q.contiguous();
  block_tables = block_tables.contiguous();
  context_lens = context_lens.contiguous();
  Shape s{block_tables.size(0), query_len, q.size(1), k_cache.size(2), q.size(2), k_cache.size(1),
          block_tables.size(1)};
  TORCH_CHECK(q.size(0) == s.num_seqs * query_len, "q rows must be num_seqs * query_len");
  TORCH_CHECK(s.q_heads % s.kv_heads == 0, "query heads must be a multiple of KV heads");
  auto out = torch::empty_like(q);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::ScalarType::BFloat16, at::ScalarType::Half, q.scalar_type(),
                                  "paged_attention_short", [&] {
    attend<scalar_t>(s, q, k_cache, v_cache, block_tables, context_lens, static_cast<float>(scale), out);
  });
  return out;
}
