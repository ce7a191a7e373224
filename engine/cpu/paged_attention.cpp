// Paged attention for short queries (decodes, speculative verifications) on CPU.
//
// Reads K/V straight from the block-table cache [num_blocks, block_size, kv_heads, head_dim]: no gather,
// no padding to the longest context, one pass over each sequence's keys with all of its query heads
// (GQA) and query tokens at once. Work items are sequences, spread over torch's intra-op threads. Arithmetic is fp32 whatever the cache dtype.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

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

struct Shape {
  int64_t num_seqs, query_len, q_heads, kv_heads, head_dim, block_size, table_stride;
};

// One sequence, all heads: row r = token i * q_heads + head; row r sees keys [0, ctx - t + i]. Walking the
// keys in order reads each block's [block_size, kv_heads, head_dim] slab front to back, which the
// prefetchers stream; per-head walks would stride through it and wait on memory.
template <typename T>
void attend_one(const Shape& s, int64_t seq, const T* q, const T* k_cache, const T* v_cache,
                const int32_t* table, int64_t ctx, float scale, T* out, std::vector<float>& qf,
                std::vector<float>& scores, std::vector<float>& acc) {
  const int64_t t = s.query_len, d = s.head_dim, hq = s.q_heads, rows = hq * t, group = hq / s.kv_heads;
  const int64_t slot_stride = s.kv_heads * d;
  qf.resize(rows * d);
  scores.resize(rows * ctx);
  acc.assign(rows * d, 0.f);
  const T* q_seq = q + seq * t * hq * d;
  for (int64_t x = 0; x < rows * d; ++x) qf[x] = static_cast<float>(q_seq[x]) * scale;
  std::vector<float> maxes(rows, -std::numeric_limits<float>::infinity()), sums(rows, 0.f);
  int64_t block = 0;
  const T* k_slot = nullptr;
  for (int64_t pos = 0; pos < ctx; ++pos) {
    if (pos % s.block_size == 0) block = table[pos / s.block_size];
    k_slot = k_cache + (block * s.block_size + pos % s.block_size) * slot_stride;
    const int64_t first_token = std::max<int64_t>(0, pos - (ctx - t));   // earliest query token seeing pos
    for (int64_t r = first_token * hq; r < rows; ++r) {
      const float sc = dot(&qf[r * d], k_slot + ((r % hq) / group) * d, d);
      scores[r * ctx + pos] = sc;
      maxes[r] = std::max(maxes[r], sc);
    }
  }
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t visible = ctx - t + r / hq + 1;
    float* row = &scores[r * ctx];
    for (int64_t pos = 0; pos < visible; ++pos) {
      row[pos] = std::exp(row[pos] - maxes[r]);
      sums[r] += row[pos];
    }
  }
  for (int64_t pos = 0; pos < ctx; ++pos) {
    if (pos % s.block_size == 0) block = table[pos / s.block_size];
    const T* v_slot = v_cache + (block * s.block_size + pos % s.block_size) * slot_stride;
    const int64_t first_token = std::max<int64_t>(0, pos - (ctx - t));
    for (int64_t r = first_token * hq; r < rows; ++r)
      axpy(scores[r * ctx + pos], v_slot + ((r % hq) / group) * d, &acc[r * d], d);
  }
  T* out_seq = out + seq * t * hq * d;
  for (int64_t r = 0; r < rows; ++r) {
    const float inv = 1.f / sums[r];
    for (int64_t x = 0; x < d; ++x) out_seq[r * d + x] = static_cast<T>(acc[r * d + x] * inv);
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
    std::vector<float> qf, scores, acc;
    for (int64_t seq = begin; seq < end; ++seq)
      attend_one<T>(s, seq, qp, kp, vp, tables + seq * s.table_stride, ctx[seq], scale, op, qf, scores, acc);
  });
}

}  // namespace

// q/out [num_seqs * query_len, q_heads, head_dim]; caches [num_blocks, block_size, kv_heads, head_dim];
// block_tables [num_seqs, max_blocks] int32; context_lens [num_seqs] int32 (keys visible to the last query).
torch::Tensor paged_attention_short(torch::Tensor q, torch::Tensor k_cache, torch::Tensor v_cache,
                                    torch::Tensor block_tables, torch::Tensor context_lens, int64_t query_len,
                                    double scale) {
  TORCH_CHECK(q.dim() == 3 && k_cache.dim() == 4, "q [tokens, heads, dim] and cache [blocks, slots, heads, dim]");
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous(), "KV cache must be contiguous");
  TORCH_CHECK(block_tables.scalar_type() == torch::kInt32 && context_lens.scalar_type() == torch::kInt32,
              "block tables and context lengths must be int32");
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
