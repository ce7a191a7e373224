// Paged attention for short queries (decodes, speculative verifications) on CPU.
//
// Reads K/V straight from the block-table cache [num_blocks, block_size, kv_heads, head_dim]: no gather,
// no padding to the longest context, one pass over each sequence's keys with all of its query heads
// (GQA) and query tokens at once. Work items are sequences, spread over torch's intra-op threads.
// Arithmetic is fp32 whatever the cache dtype; float32 and bfloat16 caches take the vector paths
// (bfloat16 widened as it is loaded, so the cache is half the bytes to read). The keys a step reads
// are asked for 16 keys ahead of use (`prefetch`): SmolLM2 at batch 32 and 256-token contexts reads
// ~0.2 GB of fp32 K/V per step, scattered in 12 KB blocks that the hardware prefetchers stop at.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstring>
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
using specfleet_vec::dot8_rows;
using specfleet_vec::load8;
using specfleet_vec::v8f;
#endif

// With 32 vector registers (AVX-512) the sums of three query rows fit at once (a 64-wide head's values,
// or 8 keys' dot products), with 16 one.
#ifdef __AVX512F__
constexpr int kRowsPerPass = 3;
#else
constexpr int kRowsPerPass = 1;
#endif

// The cache element the vector paths read: float as is, bfloat16 as its 16 bits (`vec_math.h` widens them).
template <typename T>
using Stored = std::conditional_t<std::is_same_v<T, c10::BFloat16>, uint16_t, T>;
template <typename T>
constexpr bool kVectorCache = std::is_same_v<T, float> || std::is_same_v<T, c10::BFloat16>;

// Asks for `bytes` at `p` a cache line at a time into L2, ahead of the loop that reads them: the keys of a
// paged sequence sit in blocks anywhere in the pool, and the hardware prefetchers stop at each block.
inline void prefetch(const void* p, int64_t bytes) {
  for (int64_t b = 0; b < bytes; b += 64) __builtin_prefetch(static_cast<const char*>(p) + b, 0, 2);
}
constexpr int64_t kAhead = 16;   // keys ahead; chosen by ad hoc timing on one Zen 4 host

struct Shape {
  int64_t num_seqs, query_len, q_heads, kv_heads, head_dim, block_size, table_stride;
  int64_t group() const { return q_heads / kv_heads; }
  int64_t rows() const { return q_heads * query_len; }
};

// Row r = token i * q_heads + head reads KV head (head / group) and sees keys [0, ctx - query_len + i].
inline int64_t visible_keys(const Shape& s, int64_t r, int64_t ctx) { return ctx - s.query_len + r / s.q_heads + 1; }

#ifdef SPECFLEET_VEC8
// scores[r * stride, + 8) = q_r . keys[0..8) for the rows [first, first + n) of one KV head, kRowsPerPass
// rows at a time, so that each key vector is loaded (and widened) once for them all.
template <typename K>
void score_rows(const float* qf, const K* const* keys, int64_t first, int64_t n, int64_t d, float* scores,
                int64_t stride) {
  for (int64_t r0 = first; r0 < first + n; r0 += kRowsPerPass) {
    const int64_t m = std::min<int64_t>(kRowsPerPass, first + n - r0);
    v8f sc[kRowsPerPass];
    if (m == 3) dot8_rows<kRowsPerPass < 3 ? 1 : 3>(qf + r0 * d, d, keys, sc);
    else if (m == 2) dot8_rows<kRowsPerPass < 2 ? 1 : 2>(qf + r0 * d, d, keys, sc);
    else dot8_rows<1>(qf + r0 * d, d, keys, sc);
    for (int64_t i = 0; i < m; ++i) __builtin_memcpy(scores + (r0 + i) * stride, &sc[i], sizeof sc[i]);
  }
}
#endif

// scores[r * stride + pos] = q_r . k_pos for every row and key [0, ctx); `slots[pos]` is where key pos's
// heads start in the cache, `offsets[r]` where row r's KV head sits among them. Keys past a row's causal
// limit get a score too, which the softmax never reads.
template <typename T>
void score_keys(const Shape& s, const float* qf, const T* k_cache, const int64_t* slots, const int64_t* offsets,
                int64_t ctx, int64_t stride, float* scores) {
  const int64_t d = s.head_dim, rows = s.rows();
#ifdef SPECFLEET_VEC8
  if constexpr (kVectorCache<T>) {
    if (d % 8 == 0) {
      const auto* cache = reinterpret_cast<const Stored<T>*>(k_cache);
      for (int64_t first = 0; first < ctx; first += 8) {
        const Stored<T>* slot_keys[8];
        for (int j = 0; j < 8; ++j) slot_keys[j] = cache + slots[std::min(first + j, ctx - 1)];
        for (int64_t j = first + kAhead; j < std::min(first + kAhead + 8, ctx); ++j)
          prefetch(cache + slots[j], s.kv_heads * d * sizeof(Stored<T>));
        for (int64_t r = 0; r < rows; r += s.group()) {   // a query token's rows of one KV head: the same keys
          const Stored<T>* keys[8];
          for (int j = 0; j < 8; ++j) keys[j] = slot_keys[j] + offsets[r];
          score_rows(qf, keys, r, s.group(), d, scores + first, stride);
        }
      }
      return;
    }
  }
#endif
  for (int64_t pos = 0; pos < ctx; ++pos)
    for (int64_t r = 0; r < rows; ++r) scores[r * stride + pos] = dot(qf + r * d, k_cache + slots[pos] + offsets[r], d);
}

#ifdef SPECFLEET_VEC8
// out[r] += sum over keys p in [begin, end) of w[r][p] * v_p for R rows of one KV head at once, a head
// of 8 * C values: each value vector is loaded once for all R rows, the sums held in registers.
template <int C, int R, typename V>
void weighted_sum(const float* const* w, const V* v_cache, const int64_t* slots, int64_t begin, int64_t end,
                  float* const* out) {
  v8f acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = load8(out[r] + 8 * c);
  for (int64_t p = begin; p < end; ++p) {
    const V* v = v_cache + slots[p];
    for (int c = 0; c < C; ++c) {
      const v8f x = load8(v + 8 * c);
      for (int r = 0; r < R; ++r) acc[r][c] += w[r][p] * x;
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) __builtin_memcpy(out[r] + 8 * c, &acc[r][c], sizeof acc[r][c]);
}

// The rows [first, first + n) of one query token and KV head over keys [begin, end), kRowsPerPass at a time.
template <int C, typename V>
void weigh_rows(const float* scores, int64_t stride, const V* v_cache, const int64_t* slots, int64_t begin,
                int64_t end, int64_t first, int64_t n, int64_t d, float* acc) {
  for (int64_t r0 = first; r0 < first + n; r0 += kRowsPerPass) {
    const int64_t m = std::min<int64_t>(kRowsPerPass, first + n - r0);
    const float* w[kRowsPerPass];
    float* out[kRowsPerPass];
    for (int64_t r = 0; r < m; ++r) {
      w[r] = scores + (r0 + r) * stride;
      out[r] = acc + (r0 + r) * d;
    }
    if (m == 3) weighted_sum<C, kRowsPerPass < 3 ? 1 : 3>(w, v_cache, slots, begin, end, out);
    else if (m == 2) weighted_sum<C, kRowsPerPass < 2 ? 1 : 2>(w, v_cache, slots, begin, end, out);
    else weighted_sum<C, 1>(w, v_cache, slots, begin, end, out);
  }
}
#endif

constexpr int64_t kValueTile = 16;   // keys whose values (all heads) are summed while they sit in L1

// acc[r] = sum over row r's visible keys of weight * value (weights: the softmax numerators in `scores`).
template <typename T>
void weigh_values(const Shape& s, const float* scores, int64_t stride, const T* v_cache, const int64_t* slots,
                  const int64_t* offsets, int64_t ctx, float* acc) {
  const int64_t d = s.head_dim, rows = s.rows(), group = s.group();
  std::fill(acc, acc + rows * d, 0.f);
#ifdef SPECFLEET_VEC8
  if constexpr (kVectorCache<T>) {
    using V = Stored<T>;
    void (*weigh)(const float*, int64_t, const V*, const int64_t*, int64_t, int64_t, int64_t, int64_t, int64_t,
                  float*) = d == 16 ? weigh_rows<2, V> : d == 32 ? weigh_rows<4, V> : d == 64 ? weigh_rows<8, V>
                          : d == 128 ? weigh_rows<16, V> : nullptr;
    if (weigh != nullptr) {
      const auto* cache = reinterpret_cast<const V*>(v_cache);
      for (int64_t begin = 0; begin < ctx; begin += kValueTile) {
        for (int64_t j = begin + kAhead; j < std::min(begin + kAhead + kValueTile, ctx); ++j)
          prefetch(cache + slots[j], s.kv_heads * d * sizeof(V));
        for (int64_t r = 0; r < rows; r += group) {     // a query token's rows of one KV head: the same keys
          const int64_t end = std::min(begin + kValueTile, visible_keys(s, r, ctx));
          if (end > begin) weigh(scores, stride, cache + offsets[r], slots, begin, end, r, group, d, acc);
        }
      }
      return;
    }
  }
#endif
  for (int64_t pos = 0; pos < ctx; ++pos) {
    const int64_t first_token = std::max<int64_t>(0, pos - (ctx - s.query_len));
    for (int64_t r = first_token * s.q_heads; r < rows; ++r)
      axpy(scores[r * stride + pos], v_cache + slots[pos] + offsets[r], acc + r * d, d);
  }
}

// Per-thread buffers, reused across the sequences a thread takes.
struct Scratch {
  std::vector<float> qf, scores, acc, sums;
  std::vector<int64_t> slots, offsets;
};

// One sequence, all heads and query tokens: scores, softmax, weighted values. Keys are read in order,
// each block's [block_size, kv_heads, head_dim] slab front to back, which the prefetchers stream.
template <typename T>
void attend_one(const Shape& s, int64_t seq, const T* q, const T* k_cache, const T* v_cache,
                const int32_t* table, int64_t ctx, float scale, T* out, Scratch& w) {
  const int64_t d = s.head_dim, rows = s.rows(), stride = (ctx + 7) / 8 * 8;
  w.qf.resize(rows * d);
  w.scores.resize(rows * stride);
  w.acc.resize(rows * d);
  w.sums.resize(rows);
  w.slots.resize(ctx);
  w.offsets.resize(rows);
  const int64_t record = s.kv_heads * d;    // one key's heads, contiguous in the cache
  for (int64_t block = 0, pos = 0; pos < ctx; ++block) {
    const int64_t first = static_cast<int64_t>(table[block]) * s.block_size * record;
    for (int64_t j = 0; j < s.block_size && pos < ctx; ++j, ++pos) w.slots[pos] = first + j * record;
  }
  for (int64_t r = 0; r < rows; ++r) w.offsets[r] = ((r % s.q_heads) / s.group()) * d;
  const T* q_seq = q + seq * rows * d;
  for (int64_t x = 0; x < rows * d; ++x) w.qf[x] = static_cast<float>(q_seq[x]) * scale;
  score_keys<T>(s, w.qf.data(), k_cache, w.slots.data(), w.offsets.data(), ctx, stride, w.scores.data());
  for (int64_t r = 0; r < rows; ++r) {
    w.sums[r] = specfleet_vec::softmax_numerators(&w.scores[r * stride], visible_keys(s, r, ctx));
  }
  weigh_values<T>(s, w.scores.data(), stride, v_cache, w.slots.data(), w.offsets.data(), ctx, w.acc.data());
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

// k/v [tokens, kv_heads, head_dim] into their cache slots (caches [blocks, block_size, kv_heads, head_dim],
// slots int64 [tokens]), as `attention.write_kv`'s index_copy_: one copy of a token's heads per tensor,
// spread over the intra-op threads for prefill chunks. The rows may be views into the fused QKV output
// (a token stride of their own, its heads contiguous); other layouts and dtypes take index_copy_.
void write_kv(torch::Tensor k_cache, torch::Tensor v_cache, torch::Tensor k, torch::Tensor v, torch::Tensor slots) {
  const int64_t tokens = k.size(0), row = k_cache.size(2) * k_cache.size(3), num_slots = k_cache.size(0) * k_cache.size(1);
  auto rows_in_place = [&](const torch::Tensor& x, const torch::Tensor& cache) {
    return x.dim() == 3 && x.scalar_type() == cache.scalar_type() && x.size(1) == cache.size(2) && x.size(2) == cache.size(3) &&
           x.stride(2) == 1 && x.stride(1) == x.size(2) && cache.is_contiguous();
  };
  if (!rows_in_place(k, k_cache) || !rows_in_place(v, v_cache) || slots.scalar_type() != torch::kInt64 ||
      v.size(0) != tokens || slots.numel() != tokens) {
    k_cache.view({num_slots, k.size(1), k.size(2)}).index_copy_(0, slots, k);
    v_cache.view({num_slots, v.size(1), v.size(2)}).index_copy_(0, slots, v);
    return;
  }
  slots = slots.contiguous();
  const int64_t* slot = slots.data_ptr<int64_t>();
  for (int64_t t = 0; t < tokens; ++t)
    TORCH_CHECK(slot[t] >= 0 && slot[t] < num_slots, "KV slot ", slot[t], " out of range [0, ", num_slots, ")");
  const int64_t bytes = row * k.element_size();
  char *kc = static_cast<char*>(k_cache.data_ptr()), *vc = static_cast<char*>(v_cache.data_ptr());
  const char *kp = static_cast<const char*>(k.data_ptr()), *vp = static_cast<const char*>(v.data_ptr());
  const int64_t k_stride = k.stride(0) * k.element_size(), v_stride = v.stride(0) * v.element_size();
  at::parallel_for(0, tokens, 256, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      std::memcpy(kc + slot[t] * bytes, kp + t * k_stride, bytes);
      std::memcpy(vc + slot[t] * bytes, vp + t * v_stride, bytes);
    }
  });
}
