// specserve kv: bookkeeping of the paged KV cache — which blocks are free, who holds them, and
// which full blocks are cached for reuse by later sequences with the same prefix.
//
// Pure logic (no threads, no I/O, no storage): the storage lives in a Backend's KvStorage;
// this class hands out block ids. A block is referenced by every sequence whose block table
// holds it. When the last reference is dropped, a block without a registered hash returns to
// the free list; a block with one (a full block of valid KV, kv/block_hash.h) stays cached in
// an LRU evictable list, where a later sequence whose prefix hashes to it may take it back
// (a prefix-cache hit), until allocate() needs it and evicts it.
// Sources: vLLM's PagedAttention block manager (Kwon et al. 2023) and vLLM V1's automatic
// prefix caching (vllm/v1/core/block_pool.py, kv_cache_manager.py).
#pragma once

#include <cstdint>
#include <list>
#include <span>
#include <unordered_map>
#include <vector>

#include "core/status.h"
#include "kv/block_hash.h"

namespace specserve {

/// A fixed set of `num_blocks` blocks of `block_size` tokens each.
class BlockPool {
 public:
  /// num_blocks >= 1, block_size >= 1 (aborts otherwise: callers validate config first).
  BlockPool(int32_t num_blocks, int32_t block_size);

  int32_t num_blocks() const { return static_cast<int32_t>(ref_.size()); }
  int32_t block_size() const { return block_size_; }
  /// Blocks allocate() can hand out: never-used or unhashed free blocks plus cached blocks
  /// nobody holds (evictable: taking one drops its cached prefix).
  int32_t num_free() const { return static_cast<int32_t>(free_.size() + evictable_.size()); }
  /// Cached blocks nobody holds (counted in num_free()).
  int32_t num_evictable() const { return static_cast<int32_t>(evictable_.size()); }
  /// Fraction of blocks in use (held by a sequence), 0..1; evictable blocks count as free.
  double usage() const { return 1.0 - static_cast<double>(num_free()) / num_blocks(); }

  /// Takes one block (ref count 1): a never-used or unhashed free block (lowest id first),
  /// else the least recently used evictable block, whose hash is dropped (eviction).
  /// kResourceExhausted when none is free.
  Expected<int32_t> allocate();
  /// Adds a reference to a held block (sharing it between sequences). Aborts on a block with
  /// ref count 0: a cached block nobody holds is taken back with touch().
  void retain(int32_t block);
  /// Drops a reference. At zero the block is free again: cached blocks go to the most recently
  /// used end of the evictable list, others to the free list.
  void release(int32_t block);
  int32_t ref_count(int32_t block) const { return ref_[static_cast<size_t>(block)]; }

  // ---- automatic prefix caching ----

  /// Registers `block` (held, ref count >= 1, full of valid KV) under `hash`, so that later
  /// look-ups find it. Returns false and changes nothing when `hash` already names another
  /// block (the same prefix computed twice: the first stays the cached one, vLLM's choice) or
  /// `block` already has a hash. Aborts on a block nobody holds.
  bool cache_block(int32_t block, BlockHash hash);
  /// True when `block` is registered under a hash (held or evictable).
  bool has_hash(int32_t block) const { return hashed_[static_cast<size_t>(block)]; }
  /// The longest cached prefix of `hashes` (a sequence's full-block hashes, in order): the
  /// blocks of hashes[0..n) for the largest n with every one cached. No side effect.
  std::vector<int32_t> find_cached_prefix(std::span<const BlockHash> hashes) const;
  /// Takes a reference to each of `blocks` (a prefix-cache hit): a held one is retained, an
  /// evictable one leaves the evictable list (it is no longer free). Aborts on a block that is
  /// neither held nor cached.
  void touch(std::span<const int32_t> blocks);
  /// Counts one prefix look-up of `num_query_tokens` tokens that found `num_hit_tokens` of
  /// them cached (vLLM V1's prefix_cache_queries / prefix_cache_hits).
  void record_prefix_lookup(int64_t num_query_tokens, int64_t num_hit_tokens);
  int64_t prefix_cache_queries() const { return num_queries_; }  ///< tokens looked up, total
  int64_t prefix_cache_hits() const { return num_hits_; }        ///< tokens found cached, total

 private:
  int32_t block_size_;
  std::vector<int32_t> ref_;
  std::vector<int32_t> free_;  // stack of unhashed free ids; lowest ids handed out first
  // Cached blocks with ref count 0, least recently used at the front (evicted first).
  std::list<int32_t> evictable_;
  std::vector<std::list<int32_t>::iterator> evictable_pos_;  // [num_blocks]; valid while in evictable_
  std::vector<bool> hashed_;          // [num_blocks]: registered in cached_
  std::vector<BlockHash> hash_of_;    // [num_blocks]: its hash while hashed_
  std::unordered_map<BlockHash, int32_t> cached_;  // hash -> block
  int64_t num_queries_ = 0;
  int64_t num_hits_ = 0;
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
  /// Aborts when the cut falls inside a block this table cached (cache_full_blocks): cached
  /// KV is never overwritten.
  void truncate(BlockPool& pool, int32_t num_tokens);
  /// Frees every block, the last first, so that a sequence's tail blocks are evicted before its
  /// head blocks (a shared prefix outlives its suffixes, as in vLLM V1).
  void release_all(BlockPool& pool);
  int32_t capacity(const BlockPool& pool) const { return static_cast<int32_t>(blocks_.size()) * pool.block_size(); }

  /// Prefix-cache hit at admission: on an empty table, takes the longest cached prefix of
  /// `hashes` (the sequence's full-block hashes) from `pool`, at most `max_blocks` blocks, as the
  /// head of this table (pool.touch), sets num_tokens to the hit tokens and counts the look-up
  /// (`num_query_tokens` asked). Returns the hit tokens (a multiple of block_size). The hit
  /// blocks count as cached by this table.
  int32_t acquire_cached_prefix(BlockPool& pool, std::span<const BlockHash> hashes, int32_t max_blocks,
                                int32_t num_query_tokens);
  /// Registers every block wholly within the first num_tokens() tokens that is not yet
  /// registered by this table under its hash (hashes[j] for block j; blocks past hashes.size()
  /// wait). Only blocks of valid KV that will never be rewritten may be cached: the caller keeps
  /// num_tokens() at its valid KV (never slots of draft tokens that may be rejected).
  void cache_full_blocks(BlockPool& pool, std::span<const BlockHash> hashes);
  /// Leading blocks already registered (or hit) by this table.
  int32_t num_cached_blocks() const { return num_cached_blocks_; }

 private:
  std::vector<int32_t> blocks_;
  int32_t num_tokens_ = 0;
  int32_t num_cached_blocks_ = 0;
};

}  // namespace specserve
