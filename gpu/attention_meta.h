// specserve gpu: the metadata of paged attention — an AttentionSeq list as one int32 array that
// attention_kernel reads: its layout, the readers the kernel uses (host and device), and the
// host-side builder. No CUDA header: the tests check the layout on the CPU with the kernel's
// own readers (tests/gpu/cuda_backend_test.cpp, CudaAttentionMeta). nvcc sees only the layout
// and the readers (kernels.cu is C++17; model/backend.h is C++20).
#pragma once

#include <cstdint>
#ifndef __CUDACC__
#include <vector>

#include "model/backend.h"
#endif

// The readers below run in attention_kernel and in host code (tests) alike.
#ifdef __CUDACC__
#define SPECSERVE_HOST_DEVICE __host__ __device__
#else
#define SPECSERVE_HOST_DEVICE
#endif

namespace specserve::gpu {

/// Layout of the attention metadata (one int32 array on the device, built on the host by
/// build_attention_meta below):
///   items [num_items][2]: (sequence index, row j within the sequence), one per query row;
///   seqs  [num_seqs][4]:  row_begin, num_cached, block-table offset, tree offset (-1: chain);
///   then the concatenated block tables; then, per tree sequence at its tree offset,
///   [num_rows][2] (start, count) giving each row's visible tree rows (root first, itself last)
///   as the absolute index range meta[start, start + count).
struct AttentionMeta {
  const int32_t* meta;
  int32_t num_items;
  int32_t seqs_offset;
};

/// What one item (query row) of the metadata sees; read by attention_kernel and, on the host,
/// by the tests, so both walk the layout with the same code.
struct AttentionRow {
  int32_t seq, j;               ///< sequence index and row within it
  int32_t row;                  ///< row of q and out (row_begin + j)
  int32_t num_cached;
  int32_t num_keys;             ///< keys visible: prefix + (j + 1 causal | tree rows)
  const int32_t* block_table;   ///< the sequence's block ids
  const int32_t* tree_rows;     ///< visible tree rows, root first (nullptr: causal)
};
SPECSERVE_HOST_DEVICE inline AttentionRow attention_row(const int32_t* meta, int32_t seqs_offset, int32_t item) {
  AttentionRow r;
  r.seq = meta[2 * item];
  r.j = meta[2 * item + 1];
  const int32_t* sq = meta + seqs_offset + 4 * r.seq;
  r.row = sq[0] + r.j;
  r.num_cached = sq[1];
  r.block_table = meta + sq[2];
  if (sq[3] >= 0) {
    r.tree_rows = meta + meta[sq[3] + 2 * r.j];
    r.num_keys = r.num_cached + meta[sq[3] + 2 * r.j + 1];
  } else {
    r.tree_rows = nullptr;
    r.num_keys = r.num_cached + r.j + 1;
  }
  return r;
}
/// Logical position of the t-th visible key (t < num_keys), in the order the CPU visits them.
SPECSERVE_HOST_DEVICE inline int64_t attention_key_position(const AttentionRow& r, int32_t t) {
  return (t < r.num_cached || r.tree_rows == nullptr) ? t : r.num_cached + r.tree_rows[t - r.num_cached];
}
/// Its KV slot: block_table[p / block_size] * block_size + p % block_size.
SPECSERVE_HOST_DEVICE inline int64_t attention_key_slot(const AttentionRow& r, int32_t t, int64_t block_size) {
  const int64_t p = attention_key_position(r, t);
  return static_cast<int64_t>(r.block_table[p / block_size]) * block_size + p % block_size;
}

#ifndef __CUDACC__
/// Builds the metadata of `seqs` into *meta (replaced) for a cache of `block_size`-token blocks:
/// one item per query row, each sequence's block table, and per tree sequence each row's
/// visible tree rows (its ancestors root first, then itself: the CPU's key order).
/// Sets *num_items (rows) and *seqs_offset. A block table shorter than num_cached + num_rows
/// or a parent not earlier than its row is a bug (abort).
void build_attention_meta(const std::vector<AttentionSeq>& seqs, int64_t block_size, std::vector<int32_t>* meta,
                          int32_t* num_items, int32_t* seqs_offset);
#endif

}  // namespace specserve::gpu
