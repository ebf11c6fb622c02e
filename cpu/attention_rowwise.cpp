// specserve cpu: the row-wise attention (cpu/attention.h attention_f32_rowwise): the oracle of
// the tiled kernel, and the path for head widths it does not cover and for AVX2-only CPUs.
#include "cpu/attention.h"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "cpu/attention_internal.h"
#include "cpu/matmul.h"

namespace specserve {
namespace {

using attention_internal::check_heads;
using attention_internal::logical_slots;

// acc[e] = sum over t ascending of fma(p[t], V_t[e], acc) from 0, e < head_dim: the values of
// `keys` (slots) at column offset `off`. For head_dim 16, 32 or 64 the accumulators stay in
// registers (the same fused multiply-adds in the same order as the scalar loop, so the same bits).
template <int HC>
void accumulate_values_regs(const AttentionCache& cache, const int32_t* keys, int64_t nk, int64_t off, const float* p, float* acc) {
  __m256 a[HC];
  for (int c = 0; c < HC; ++c) a[c] = _mm256_setzero_ps();
  for (int64_t t = 0; t < nk; ++t) {
    const float* vh = cache.v + keys[t] * cache.kv_stride + off;
    const __m256 w = _mm256_set1_ps(p[t]);
    for (int c = 0; c < HC; ++c) a[c] = _mm256_fmadd_ps(w, _mm256_loadu_ps(vh + 8 * c), a[c]);
  }
  for (int c = 0; c < HC; ++c) _mm256_storeu_ps(acc + 8 * c, a[c]);
}

void accumulate_values_rowwise(const AttentionCache& cache, const int32_t* keys, int64_t nk, int64_t off, const float* p,
                               int64_t head_dim, float* acc) {
  switch (head_dim) {
    case 16: return accumulate_values_regs<2>(cache, keys, nk, off, p, acc);
    case 32: return accumulate_values_regs<4>(cache, keys, nk, off, p, acc);
    case 64: return accumulate_values_regs<8>(cache, keys, nk, off, p, acc);
    default: break;
  }
  std::fill(acc, acc + head_dim, 0.0f);
  for (int64_t t = 0; t < nk; ++t) {
    const float* vh = cache.v + keys[t] * cache.kv_stride + off;
    for (int64_t e = 0; e < head_dim; ++e) acc[e] = std::fma(p[t], vh[e], acc[e]);
  }
}

}  // namespace

void attention_f32_rowwise(const AttentionCache& cache, const float* q, const std::vector<AttentionSeq>& seqs,
                           int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, float* out) {
  check_heads(num_heads, num_kv_heads, head_dim);
  const int64_t group = num_heads / num_kv_heads;
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  const auto seq_slots = logical_slots(seqs, cache.block_size);
  // Work items: (sequence, row, a range of KV heads with their query heads). A row's KV heads
  // are split over several items only while there are fewer rows than threads: a
  // batch-1 decode step (one row) then uses more than one core (on a long context its attention
  // was a large share of the step). Ranges follow KV heads, so each K/V row is still read by one
  // item (attention here is bound by reading K and V). Every head is computed exactly as
  // before, so the bits do not depend on the split.
  struct Item { int32_t seq, row, head0, head1; };
  int64_t total_rows = 0;
  for (const AttentionSeq& sq : seqs) total_rows += sq.num_rows;
  const int64_t threads = omp_get_max_threads();
  const int64_t split =
      total_rows > 0 && total_rows < threads ? std::clamp<int64_t>((2 * threads + total_rows - 1) / total_rows, 1, num_kv_heads) : 1;
  const int64_t heads_per_item = (num_kv_heads + split - 1) / split * group;
  std::vector<Item> items;
  for (int32_t si = 0; si < static_cast<int32_t>(seqs.size()); ++si)
    for (int32_t r = 0; r < seqs[si].num_rows; ++r)
      for (int64_t h0 = 0; h0 < num_heads; h0 += heads_per_item)
        items.push_back({si, r, static_cast<int32_t>(h0), static_cast<int32_t>(std::min(num_heads, h0 + heads_per_item))});
  const int64_t num_items = static_cast<int64_t>(items.size());
#pragma omp parallel
  {
    std::vector<int32_t> tree_slots;
    std::vector<float> scores;
    std::vector<const float*> key_rows;
    std::vector<float> acc(static_cast<size_t>(head_dim));
#pragma omp for schedule(dynamic, 1)
    for (int64_t it = 0; it < num_items; ++it) {
      const AttentionSeq& sq = seqs[items[it].seq];
      const std::vector<int32_t>& all = seq_slots[items[it].seq];
      const int32_t j = items[it].row;
      // Visible keys, in logical order: the cached prefix, then ancestors (and self).
      const int32_t* keys = all.data();
      int64_t nk = sq.num_cached + j + 1;
      if (sq.parents) {
        tree_slots.assign(all.begin(), all.begin() + sq.num_cached);
        const size_t mark = tree_slots.size();
        for (int32_t a = j; a >= 0; a = sq.parents[a]) tree_slots.push_back(all[static_cast<size_t>(sq.num_cached + a)]);
        std::reverse(tree_slots.begin() + static_cast<std::ptrdiff_t>(mark), tree_slots.end());
        keys = tree_slots.data();
        nk = static_cast<int64_t>(tree_slots.size());
      }
      scores.resize(static_cast<size_t>(nk));
      key_rows.resize(static_cast<size_t>(nk));
      const int64_t row = sq.row_begin + j;
      for (int64_t h = items[it].head0; h < items[it].head1; ++h) {
        const int64_t off = (h / group) * head_dim;
        const float* qh = q + (row * num_heads + h) * head_dim;
        for (int64_t t = 0; t < nk; ++t) key_rows[static_cast<size_t>(t)] = cache.k + keys[t] * cache.kv_stride + off;
        dot_f32_many(qh, key_rows.data(), nk, head_dim, scores.data());
        for (int64_t t = 0; t < nk; ++t) scores[static_cast<size_t>(t)] *= scale;
        const float z = softmax_numerator(scores.data(), nk);
        accumulate_values_rowwise(cache, keys, nk, off, scores.data(), head_dim, acc.data());
        float* oh = out + (row * num_heads + h) * head_dim;
        const float inv = 1.0f / z;
        for (int64_t e = 0; e < head_dim; ++e) oh[e] = acc[static_cast<size_t>(e)] * inv;
      }
    }
  }
}

}  // namespace specserve
