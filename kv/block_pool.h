// specserve kv: bookkeeping of the paged KV cache — which blocks are free, who holds them.
//
// Pure logic (no threads, no I/O, no storage): the storage lives in a Backend's KvStorage;
// this class hands out block ids. A block is referenced by every sequence whose block table
// holds it; it returns to the free list when the last reference is dropped.
// Source: vLLM's PagedAttention block manager (Kwon et al. 2023).
#pragma once

#include <cstdint>
#include <vector>

#include "core/status.h"

namespace specserve {

/// A fixed set of `num_blocks` blocks of `block_size` tokens each.
class BlockPool {
 public:
  /// num_blocks >= 1, block_size >= 1 (aborts otherwise: callers validate config first).
  BlockPool(int32_t num_blocks, int32_t block_size);

  int32_t num_blocks() const { return static_cast<int32_t>(ref_.size()); }
  int32_t block_size() const { return block_size_; }
  int32_t num_free() const { return static_cast<int32_t>(free_.size()); }
  /// Fraction of blocks in use, 0..1.
  double usage() const { return 1.0 - static_cast<double>(num_free()) / num_blocks(); }

  /// Takes one free block (ref count 1). kResourceExhausted when none is free.
  Expected<int32_t> allocate();
  /// Adds a reference (sharing a block between sequences).
  void retain(int32_t block);
  /// Drops a reference; the block is free again at zero.
  void release(int32_t block);
  int32_t ref_count(int32_t block) const { return ref_[static_cast<size_t>(block)]; }

 private:
  int32_t block_size_;
  std::vector<int32_t> ref_;
  std::vector<int32_t> free_;  // stack of free ids; lowest ids handed out first
};

/// The blocks of one sequence, in order, and how many tokens they hold.
class BlockTable {
 public:
  const std::vector<int32_t>& blocks() const { return blocks_; }
  int32_t num_tokens() const { return num_tokens_; }

  /// Makes room for `num_tokens` tokens in total, allocating blocks from `pool` as needed.
  /// On kResourceExhausted nothing is allocated (all-or-nothing).
  Status reserve(BlockPool& pool, int32_t num_tokens);
  /// Records that the first `num_tokens` slots hold valid KV (<= reserved capacity).
  void set_num_tokens(int32_t num_tokens) { num_tokens_ = num_tokens; }
  /// Keeps the first `num_tokens` tokens; frees blocks past them (rollback of rejected drafts).
  void truncate(BlockPool& pool, int32_t num_tokens);
  /// Frees every block.
  void release_all(BlockPool& pool);
  int32_t capacity(const BlockPool& pool) const { return static_cast<int32_t>(blocks_.size()) * pool.block_size(); }

 private:
  std::vector<int32_t> blocks_;
  int32_t num_tokens_ = 0;
};

}  // namespace specserve
