#include "gpu/attention_meta.h"

#include <algorithm>
#include <string>

namespace specserve::gpu {

void build_attention_meta(const std::vector<AttentionSeq>& seqs, int64_t block_size, std::vector<int32_t>* meta_out,
                          int32_t* num_items_out, int32_t* seqs_offset_out) {
  std::vector<int32_t>& meta = *meta_out;
  int64_t num_items = 0;
  for (const auto& s : seqs) num_items += s.num_rows;
  meta.assign(static_cast<size_t>(2 * num_items + 4 * static_cast<int64_t>(seqs.size())), 0);
  const int32_t seqs_offset = static_cast<int32_t>(2 * num_items);
  size_t it = 0;
  for (size_t si = 0; si < seqs.size(); ++si) {
    const AttentionSeq& s = seqs[si];
    SPECSERVE_CHECK(static_cast<int64_t>(s.num_blocks) * block_size >= s.num_cached + s.num_rows,
                    "attention: sequence " + std::to_string(si) + " has a block table too short");
    for (int32_t j = 0; j < s.num_rows; ++j) {
      meta[it++] = static_cast<int32_t>(si);
      meta[it++] = j;
    }
    const size_t d = static_cast<size_t>(seqs_offset) + 4 * si;
    meta[d] = s.row_begin;
    meta[d + 1] = s.num_cached;
    meta[d + 2] = static_cast<int32_t>(meta.size());
    meta[d + 3] = -1;
    meta.insert(meta.end(), s.block_table, s.block_table + s.num_blocks);
  }
  for (size_t si = 0; si < seqs.size(); ++si) {
    const AttentionSeq& s = seqs[si];
    if (!s.parents) continue;
    const size_t tree_off = meta.size();
    meta[static_cast<size_t>(seqs_offset) + 4 * si + 3] = static_cast<int32_t>(tree_off);
    meta.resize(tree_off + 2 * static_cast<size_t>(s.num_rows));
    for (int32_t j = 0; j < s.num_rows; ++j) {
      // Visible tree rows of row j: its ancestors, root first, then itself (the CPU's order).
      const size_t start = meta.size();
      for (int32_t a = j; a >= 0; a = s.parents[a]) {
        SPECSERVE_CHECK(s.parents[a] < a, "attention: parents[" + std::to_string(a) + "] is not an earlier row");
        meta.push_back(a);
      }
      std::reverse(meta.begin() + static_cast<std::ptrdiff_t>(start), meta.end());
      meta[tree_off + 2 * static_cast<size_t>(j)] = static_cast<int32_t>(start);
      meta[tree_off + 2 * static_cast<size_t>(j) + 1] = static_cast<int32_t>(meta.size() - start);
    }
  }
  *num_items_out = static_cast<int32_t>(num_items);
  *seqs_offset_out = seqs_offset;
}

}  // namespace specserve::gpu
