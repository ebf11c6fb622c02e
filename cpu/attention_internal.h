// specserve cpu: helpers shared by the tiled attention kernel (cpu/attention.cpp) and the
// row-wise one (cpu/attention_rowwise.cpp). Not part of the backend's interface.
#pragma once

#include <cstdint>
#include <vector>

#include "model/backend.h"

namespace specserve::attention_internal {

/// Slot of every logical position of each sequence: [num_cached + num_rows] per sequence
/// (block_table[p / block_size] * block_size + p % block_size).
std::vector<std::vector<int32_t>> logical_slots(const std::vector<AttentionSeq>& seqs, int64_t block_size);

/// Aborts (SPECSERVE_CHECK) unless num_kv_heads > 0 divides num_heads and head_dim > 0.
void check_heads(int64_t num_heads, int64_t num_kv_heads, int64_t head_dim);

}  // namespace specserve::attention_internal
