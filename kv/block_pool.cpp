#include "kv/block_pool.h"

#include <algorithm>
#include <string>

namespace specserve {

BlockPool::BlockPool(int32_t num_blocks, int32_t block_size) : block_size_(block_size) {
  SPECSERVE_CHECK(num_blocks >= 1 && block_size >= 1, "BlockPool needs positive sizes");
  ref_.assign(static_cast<size_t>(num_blocks), 0);
  evictable_pos_.resize(static_cast<size_t>(num_blocks));
  hashed_.assign(static_cast<size_t>(num_blocks), false);
  hash_of_.assign(static_cast<size_t>(num_blocks), 0);
  for (int32_t i = num_blocks - 1; i >= 0; --i) free_.push_back(i);
}

Expected<int32_t> BlockPool::allocate() {
  int32_t b;
  if (!free_.empty()) {
    // NOTE: unhashed free blocks go first, so cached prefixes survive as long as possible.
    b = free_.back();
    free_.pop_back();
  } else if (!evictable_.empty()) {
    b = evictable_.front();
    evictable_.pop_front();
    const size_t i = static_cast<size_t>(b);
    cached_.erase(hash_of_[i]);
    hashed_[i] = false;
  } else {
    return resource_exhausted("no free KV blocks (" + std::to_string(num_blocks()) + " in use)");
  }
  ref_[static_cast<size_t>(b)] = 1;
  return b;
}

void BlockPool::retain(int32_t block) {
  SPECSERVE_CHECK(block >= 0 && block < num_blocks() && ref_[static_cast<size_t>(block)] > 0, "retain of a free block");
  ++ref_[static_cast<size_t>(block)];
}

void BlockPool::release(int32_t block) {
  SPECSERVE_CHECK(block >= 0 && block < num_blocks() && ref_[static_cast<size_t>(block)] > 0, "release of a free block");
  const size_t i = static_cast<size_t>(block);
  if (--ref_[i] > 0) return;
  if (hashed_[i]) {
    evictable_pos_[i] = evictable_.insert(evictable_.end(), block);
  } else {
    free_.push_back(block);
  }
}

bool BlockPool::cache_block(int32_t block, BlockHash hash) {
  SPECSERVE_CHECK(block >= 0 && block < num_blocks() && ref_[static_cast<size_t>(block)] > 0, "cache_block of a free block");
  const size_t i = static_cast<size_t>(block);
  if (hashed_[i] || cached_.count(hash)) return false;
  hashed_[i] = true;
  hash_of_[i] = hash;
  cached_.emplace(hash, block);
  return true;
}

std::vector<int32_t> BlockPool::find_cached_prefix(std::span<const BlockHash> hashes) const {
  std::vector<int32_t> hit;
  for (BlockHash h : hashes) {
    auto it = cached_.find(h);
    if (it == cached_.end()) break;
    hit.push_back(it->second);
  }
  return hit;
}

void BlockPool::touch(std::span<const int32_t> blocks) {
  for (int32_t b : blocks) {
    SPECSERVE_CHECK(b >= 0 && b < num_blocks(), "touch of block " + std::to_string(b));
    const size_t i = static_cast<size_t>(b);
    if (ref_[i] == 0) {
      SPECSERVE_CHECK(hashed_[i], "touch of free block " + std::to_string(b) + " that is not cached");
      evictable_.erase(evictable_pos_[i]);
    }
    ++ref_[i];
  }
}

void BlockPool::record_prefix_lookup(int64_t num_query_tokens, int64_t num_hit_tokens) {
  num_queries_ += num_query_tokens;
  num_hits_ += num_hit_tokens;
}

Status BlockTable::reserve(BlockPool& pool, int32_t num_tokens) {
  const int32_t need = (num_tokens + pool.block_size() - 1) / pool.block_size();
  const int32_t more = need - static_cast<int32_t>(blocks_.size());
  if (more <= 0) return Status();
  if (more > pool.num_free()) {
    return resource_exhausted("need " + std::to_string(more) + " more KV blocks, " + std::to_string(pool.num_free()) + " free");
  }
  for (int32_t i = 0; i < more; ++i) blocks_.push_back(*pool.allocate());
  return Status();
}

void BlockTable::truncate(BlockPool& pool, int32_t num_tokens) {
  SPECSERVE_CHECK(num_tokens >= num_cached_blocks_ * pool.block_size(),
                  "truncate to " + std::to_string(num_tokens) + " tokens cuts into " + std::to_string(num_cached_blocks_) +
                      " cached blocks");
  const int32_t keep = (num_tokens + pool.block_size() - 1) / pool.block_size();
  while (static_cast<int32_t>(blocks_.size()) > keep) {
    pool.release(blocks_.back());
    blocks_.pop_back();
  }
  if (num_tokens_ > num_tokens) num_tokens_ = num_tokens;
}

void BlockTable::release_all(BlockPool& pool) {
  for (auto it = blocks_.rbegin(); it != blocks_.rend(); ++it) pool.release(*it);
  blocks_.clear();
  num_tokens_ = 0;
  num_cached_blocks_ = 0;
}

int32_t BlockTable::acquire_cached_prefix(BlockPool& pool, std::span<const BlockHash> hashes, int32_t max_blocks,
                                          int32_t num_query_tokens) {
  SPECSERVE_CHECK(blocks_.empty(), "acquire_cached_prefix on a table that holds blocks");
  const size_t n = std::min(hashes.size(), static_cast<size_t>(std::max(max_blocks, 0)));
  std::vector<int32_t> hit = pool.find_cached_prefix(hashes.first(n));
  pool.touch(hit);
  blocks_ = std::move(hit);
  num_cached_blocks_ = static_cast<int32_t>(blocks_.size());
  num_tokens_ = num_cached_blocks_ * pool.block_size();
  pool.record_prefix_lookup(num_query_tokens, num_tokens_);
  return num_tokens_;
}

void BlockTable::cache_full_blocks(BlockPool& pool, std::span<const BlockHash> hashes) {
  const int32_t full = std::min(num_tokens_ / pool.block_size(), static_cast<int32_t>(blocks_.size()));
  const int32_t upto = std::min(full, static_cast<int32_t>(hashes.size()));
  for (int32_t j = num_cached_blocks_; j < upto; ++j) {
    pool.cache_block(blocks_[static_cast<size_t>(j)], hashes[static_cast<size_t>(j)]);
  }
  num_cached_blocks_ = std::max(num_cached_blocks_, upto);
}

}  // namespace specserve
