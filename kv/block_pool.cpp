#include "kv/block_pool.h"

#include <string>

namespace specserve {

BlockPool::BlockPool(int32_t num_blocks, int32_t block_size) : block_size_(block_size) {
  SPECSERVE_CHECK(num_blocks >= 1 && block_size >= 1, "BlockPool needs positive sizes");
  ref_.assign(static_cast<size_t>(num_blocks), 0);
  for (int32_t i = num_blocks - 1; i >= 0; --i) free_.push_back(i);
}

Expected<int32_t> BlockPool::allocate() {
  if (free_.empty()) return resource_exhausted("no free KV blocks (" + std::to_string(num_blocks()) + " in use)");
  int32_t b = free_.back();
  free_.pop_back();
  ref_[static_cast<size_t>(b)] = 1;
  return b;
}

void BlockPool::retain(int32_t block) {
  SPECSERVE_CHECK(block >= 0 && block < num_blocks() && ref_[static_cast<size_t>(block)] > 0, "retain of a free block");
  ++ref_[static_cast<size_t>(block)];
}

void BlockPool::release(int32_t block) {
  SPECSERVE_CHECK(block >= 0 && block < num_blocks() && ref_[static_cast<size_t>(block)] > 0, "release of a free block");
  if (--ref_[static_cast<size_t>(block)] == 0) free_.push_back(block);
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
  const int32_t keep = (num_tokens + pool.block_size() - 1) / pool.block_size();
  while (static_cast<int32_t>(blocks_.size()) > keep) {
    pool.release(blocks_.back());
    blocks_.pop_back();
  }
  if (num_tokens_ > num_tokens) num_tokens_ = num_tokens;
}

void BlockTable::release_all(BlockPool& pool) {
  for (int32_t b : blocks_) pool.release(b);
  blocks_.clear();
  num_tokens_ = 0;
}

}  // namespace specserve
