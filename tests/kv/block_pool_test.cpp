// BlockPool / BlockTable: the paged-KV bookkeeping (pure logic, no storage), and automatic
// prefix caching: the block hash chain, sharing, LRU eviction, the hit counters.
#include "kv/block_pool.h"

#include <xxhash.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <set>

namespace specserve {
namespace {

TEST(BlockPool, StartsEmptyAndHandsOutLowestIdsFirst) {
  BlockPool pool(4, 16);
  EXPECT_EQ(pool.num_blocks(), 4);
  EXPECT_EQ(pool.block_size(), 16);
  EXPECT_EQ(pool.num_free(), 4);
  EXPECT_DOUBLE_EQ(pool.usage(), 0.0);
  for (int32_t want = 0; want < 4; ++want) {
    auto b = pool.allocate();
    ASSERT_TRUE(b.ok()) << b.status().to_string();
    EXPECT_EQ(*b, want);
    EXPECT_EQ(pool.ref_count(*b), 1);
  }
  EXPECT_EQ(pool.num_free(), 0);
  EXPECT_DOUBLE_EQ(pool.usage(), 1.0);
}

TEST(BlockPool, ExhaustionIsResourceExhaustedAndRecoverable) {
  BlockPool pool(2, 8);
  ASSERT_TRUE(pool.allocate().ok());
  ASSERT_TRUE(pool.allocate().ok());
  auto none = pool.allocate();
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), StatusCode::kResourceExhausted);
  EXPECT_FALSE(none.status().message().empty());
  // A failed allocation changes nothing; a release makes room again.
  EXPECT_EQ(pool.num_free(), 0);
  pool.release(1);
  EXPECT_EQ(pool.num_free(), 1);
  auto again = pool.allocate();
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, 1);
}

TEST(BlockPool, ReleasedBlockIsReusedAndEveryIdIsUniqueWhileHeld) {
  BlockPool pool(8, 4);
  std::set<int32_t> held;
  for (int i = 0; i < 8; ++i) held.insert(*pool.allocate());
  EXPECT_EQ(held.size(), 8u);
  EXPECT_EQ(*held.begin(), 0);
  EXPECT_EQ(*held.rbegin(), 7);
  pool.release(5);
  pool.release(2);
  std::set<int32_t> again = {*pool.allocate(), *pool.allocate()};
  EXPECT_EQ(again, (std::set<int32_t>{2, 5}));
  EXPECT_EQ(pool.num_free(), 0);
}

TEST(BlockPool, RetainKeepsABlockUntilTheLastRelease) {
  BlockPool pool(3, 16);
  const int32_t b = *pool.allocate();
  pool.retain(b);
  pool.retain(b);
  EXPECT_EQ(pool.ref_count(b), 3);
  EXPECT_EQ(pool.num_free(), 2);
  pool.release(b);
  pool.release(b);
  EXPECT_EQ(pool.ref_count(b), 1);
  EXPECT_EQ(pool.num_free(), 2);  // still held by one reference
  pool.release(b);
  EXPECT_EQ(pool.ref_count(b), 0);
  EXPECT_EQ(pool.num_free(), 3);
}

TEST(BlockPoolDeathTest, ReleaseOrRetainOfAFreeBlockIsABug) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  BlockPool pool(2, 16);
  EXPECT_DEATH(pool.release(0), "release of a free block");
  EXPECT_DEATH(pool.retain(1), "retain of a free block");
  EXPECT_DEATH(pool.release(7), "release of a free block");
  EXPECT_DEATH(BlockPool(0, 16), "positive sizes");
}

TEST(BlockTable, ReserveAllocatesCeilOfTokensOverBlockSize) {
  BlockPool pool(10, 4);
  BlockTable t;
  EXPECT_TRUE(t.reserve(pool, 0).ok());
  EXPECT_TRUE(t.blocks().empty());
  ASSERT_TRUE(t.reserve(pool, 1).ok());
  EXPECT_EQ(t.blocks().size(), 1u);
  ASSERT_TRUE(t.reserve(pool, 4).ok());  // still fits in one block
  EXPECT_EQ(t.blocks().size(), 1u);
  ASSERT_TRUE(t.reserve(pool, 5).ok());
  EXPECT_EQ(t.blocks().size(), 2u);
  ASSERT_TRUE(t.reserve(pool, 13).ok());
  EXPECT_EQ(t.blocks().size(), 4u);
  EXPECT_EQ(t.capacity(pool), 16);
  ASSERT_TRUE(t.reserve(pool, 3).ok());  // shrinking is not reserve's job
  EXPECT_EQ(t.blocks().size(), 4u);
  EXPECT_EQ(pool.num_free(), 6);
  // Reserving does not claim the tokens are valid.
  EXPECT_EQ(t.num_tokens(), 0);
  std::set<int32_t> ids(t.blocks().begin(), t.blocks().end());
  EXPECT_EQ(ids.size(), 4u);
  for (int32_t b : t.blocks()) EXPECT_EQ(pool.ref_count(b), 1);
}

TEST(BlockTable, ReserveIsAllOrNothing) {
  BlockPool pool(5, 4);
  BlockTable a, b;
  ASSERT_TRUE(a.reserve(pool, 12).ok());  // 3 blocks
  ASSERT_TRUE(b.reserve(pool, 4).ok());   // 1 block
  EXPECT_EQ(pool.num_free(), 1);
  // b needs 2 more blocks for 12 tokens; only 1 is free: nothing may be taken.
  Status st = b.reserve(pool, 12);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(st.message().find("2"), std::string::npos) << st.message();
  EXPECT_EQ(b.blocks().size(), 1u);
  EXPECT_EQ(pool.num_free(), 1);
  // A fresh table asking for more than the whole pool: same.
  BlockTable c;
  EXPECT_EQ(c.reserve(pool, 100).code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(c.blocks().empty());
  EXPECT_EQ(pool.num_free(), 1);
  // What does fit still works.
  EXPECT_TRUE(b.reserve(pool, 8).ok());
  EXPECT_EQ(pool.num_free(), 0);
}

TEST(BlockTable, TruncateFreesBlocksPastTheKeptTokens) {
  BlockPool pool(8, 4);
  BlockTable t;
  ASSERT_TRUE(t.reserve(pool, 14).ok());  // 4 blocks
  t.set_num_tokens(14);
  const std::vector<int32_t> before = t.blocks();
  EXPECT_EQ(pool.num_free(), 4);

  t.truncate(pool, 9);  // 9 tokens -> 3 blocks
  EXPECT_EQ(t.num_tokens(), 9);
  ASSERT_EQ(t.blocks().size(), 3u);
  EXPECT_TRUE(std::equal(t.blocks().begin(), t.blocks().end(), before.begin()));  // prefix kept, in order
  EXPECT_EQ(pool.num_free(), 5);
  EXPECT_EQ(pool.ref_count(before[3]), 0);

  t.truncate(pool, 8);  // exactly two full blocks
  EXPECT_EQ(t.blocks().size(), 2u);
  EXPECT_EQ(t.num_tokens(), 8);
  EXPECT_EQ(pool.num_free(), 6);

  t.truncate(pool, 100);  // past the end: nothing changes
  EXPECT_EQ(t.blocks().size(), 2u);
  EXPECT_EQ(t.num_tokens(), 8);

  t.truncate(pool, 0);
  EXPECT_TRUE(t.blocks().empty());
  EXPECT_EQ(t.num_tokens(), 0);
  EXPECT_EQ(pool.num_free(), 8);
}

TEST(BlockTable, TruncateKeepsNumTokensWhenBelowTheCut) {
  // The engine keeps one reserved slot past the valid tokens: truncate(n + 1) with n valid.
  BlockPool pool(4, 4);
  BlockTable t;
  ASSERT_TRUE(t.reserve(pool, 16).ok());
  t.set_num_tokens(6);
  t.truncate(pool, 7);
  EXPECT_EQ(t.num_tokens(), 6);
  EXPECT_EQ(t.blocks().size(), 2u);
  EXPECT_EQ(pool.num_free(), 2);
}

TEST(BlockTable, SharedBlocksSurviveOneTablesRelease) {
  BlockPool pool(4, 4);
  BlockTable a;
  ASSERT_TRUE(a.reserve(pool, 8).ok());
  a.set_num_tokens(8);
  // Another holder (a prefix-cache hit in another sequence) references a's first block.
  pool.retain(a.blocks()[0]);
  EXPECT_EQ(pool.ref_count(a.blocks()[0]), 2);
  const int32_t shared = a.blocks()[0];
  a.release_all(pool);
  EXPECT_TRUE(a.blocks().empty());
  EXPECT_EQ(a.num_tokens(), 0);
  EXPECT_EQ(pool.ref_count(shared), 1);  // the other reference keeps it
  EXPECT_EQ(pool.num_free(), 3);
  pool.release(shared);
  EXPECT_EQ(pool.num_free(), 4);
}

TEST(BlockTable, ReleaseAllThenReuse) {
  BlockPool pool(3, 2);
  BlockTable t;
  ASSERT_TRUE(t.reserve(pool, 6).ok());
  t.set_num_tokens(5);
  t.release_all(pool);
  EXPECT_EQ(pool.num_free(), 3);
  EXPECT_EQ(t.capacity(pool), 0);
  ASSERT_TRUE(t.reserve(pool, 6).ok());
  EXPECT_EQ(pool.num_free(), 0);
}

// ---- prefix caching ------------------------------------------------------------------------

std::vector<int32_t> iota_tokens(int32_t n, int32_t from = 100) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  std::iota(t.begin(), t.end(), from);
  return t;
}

TEST(BlockHash, ChainCoversTheParentAndTheTokens) {
  const std::vector<int32_t> a = {1, 2, 3, 4}, b = {1, 2, 3, 5};
  EXPECT_EQ(hash_block_tokens(kRootBlockHash, a), hash_block_tokens(kRootBlockHash, a));
  EXPECT_NE(hash_block_tokens(kRootBlockHash, a), hash_block_tokens(kRootBlockHash, b));
  // Same tokens under a different parent: a different block.
  EXPECT_NE(hash_block_tokens(kRootBlockHash, a), hash_block_tokens(hash_block_tokens(kRootBlockHash, b), a));
  // The documented definition: XXH3-64 of the int32 ids seeded with the parent.
  EXPECT_EQ(hash_block_tokens(42, a), XXH3_64bits_withSeed(a.data(), a.size() * sizeof(int32_t), 42));
}

TEST(BlockHash, ExtendHashesOnlyFullBlocksAndIsIncremental) {
  std::vector<int32_t> toks = iota_tokens(10);
  std::vector<BlockHash> h;
  extend_block_hashes(toks, 4, &h);
  ASSERT_EQ(h.size(), 2u);  // 10 tokens: two full blocks of 4, a partial third
  EXPECT_EQ(h[0], hash_block_tokens(kRootBlockHash, std::span<const int32_t>(toks).subspan(0, 4)));
  EXPECT_EQ(h[1], hash_block_tokens(h[0], std::span<const int32_t>(toks).subspan(4, 4)));
  toks.push_back(7);
  toks.push_back(8);
  extend_block_hashes(toks, 4, &h);
  ASSERT_EQ(h.size(), 3u);
  std::vector<BlockHash> fresh;
  extend_block_hashes(toks, 4, &fresh);
  EXPECT_EQ(h, fresh);
  // Two sequences that differ in their first block differ in every later block.
  std::vector<int32_t> other = toks;
  other[0] = 99;
  std::vector<BlockHash> ho;
  extend_block_hashes(other, 4, &ho);
  for (size_t j = 0; j < 3; ++j) EXPECT_NE(ho[j], h[j]) << j;
}

TEST(PrefixCache, FullBlocksAreSharedByReferenceAndCountedAsHits) {
  BlockPool pool(8, 4);
  const std::vector<int32_t> toks = iota_tokens(13);  // 3 full blocks + 1 token
  std::vector<BlockHash> h;
  extend_block_hashes(toks, 4, &h);
  BlockTable a;
  ASSERT_TRUE(a.reserve(pool, 14).ok());
  a.set_num_tokens(13);
  a.cache_full_blocks(pool, h);
  EXPECT_EQ(a.num_cached_blocks(), 3);
  for (int j = 0; j < 3; ++j) EXPECT_TRUE(pool.has_hash(a.blocks()[static_cast<size_t>(j)]));
  EXPECT_FALSE(pool.has_hash(a.blocks()[3]));  // partial block: never cached

  // A second sequence with the same tokens shares a's three full blocks (at most 3 asked).
  BlockTable b;
  EXPECT_EQ(b.acquire_cached_prefix(pool, h, 3, 13), 12);
  EXPECT_EQ(b.num_tokens(), 12);
  ASSERT_EQ(b.blocks().size(), 3u);
  for (int j = 0; j < 3; ++j) {
    EXPECT_EQ(b.blocks()[static_cast<size_t>(j)], a.blocks()[static_cast<size_t>(j)]);
    EXPECT_EQ(pool.ref_count(b.blocks()[static_cast<size_t>(j)]), 2);
  }
  EXPECT_EQ(pool.num_free(), 4);  // sharing took no new block
  EXPECT_EQ(pool.prefix_cache_queries(), 13);
  EXPECT_EQ(pool.prefix_cache_hits(), 12);
  // max_blocks caps the hit (the engine keeps the last known token to compute).
  BlockTable c;
  EXPECT_EQ(c.acquire_cached_prefix(pool, h, 2, 9), 8);
  EXPECT_EQ(pool.prefix_cache_queries(), 22);
  EXPECT_EQ(pool.prefix_cache_hits(), 20);
  // A prefix that differs in block 1 hits only block 0.
  std::vector<int32_t> other = toks;
  other[5] = 1;
  std::vector<BlockHash> ho;
  extend_block_hashes(other, 4, &ho);
  EXPECT_EQ(pool.find_cached_prefix(ho), std::vector<int32_t>{a.blocks()[0]});
  // Releasing every holder leaves the blocks cached and free (evictable).
  a.release_all(pool);
  b.release_all(pool);
  c.release_all(pool);
  EXPECT_EQ(pool.num_free(), 8);
  EXPECT_EQ(pool.num_evictable(), 3);
  EXPECT_DOUBLE_EQ(pool.usage(), 0.0);
  EXPECT_EQ(pool.find_cached_prefix(h).size(), 3u);
}

TEST(PrefixCache, EvictableHitLeavesTheFreeCountWhenTouched) {
  BlockPool pool(4, 2);
  const std::vector<int32_t> toks = iota_tokens(4);
  std::vector<BlockHash> h;
  extend_block_hashes(toks, 2, &h);
  BlockTable a;
  ASSERT_TRUE(a.reserve(pool, 4).ok());
  a.set_num_tokens(4);
  a.cache_full_blocks(pool, h);
  a.release_all(pool);
  ASSERT_EQ(pool.num_evictable(), 2);
  ASSERT_EQ(pool.num_free(), 4);
  BlockTable b;
  EXPECT_EQ(b.acquire_cached_prefix(pool, h, 2, 5), 4);
  EXPECT_EQ(pool.num_evictable(), 0);
  EXPECT_EQ(pool.num_free(), 2);  // the hit blocks are held again
  for (int32_t blk : b.blocks()) EXPECT_EQ(pool.ref_count(blk), 1);
  // The other two blocks are still there to allocate; then the pool is full.
  ASSERT_TRUE(b.reserve(pool, 8).ok());
  EXPECT_EQ(pool.allocate().status().code(), StatusCode::kResourceExhausted);
}

TEST(PrefixCache, AllocateTakesUncachedBlocksFirstThenEvictsLeastRecentlyUsed) {
  BlockPool pool(4, 2);
  // Sequence x caches blocks of tokens {0,1},{2,3}; sequence y caches {10,11}. Freed x first.
  std::vector<BlockHash> hx, hy;
  extend_block_hashes(iota_tokens(4, 0), 2, &hx);
  extend_block_hashes(iota_tokens(2, 10), 2, &hy);
  BlockTable x, y;
  ASSERT_TRUE(x.reserve(pool, 4).ok());
  x.set_num_tokens(4);
  x.cache_full_blocks(pool, hx);
  ASSERT_TRUE(y.reserve(pool, 2).ok());
  y.set_num_tokens(2);
  y.cache_full_blocks(pool, hy);
  const int32_t x0 = x.blocks()[0], x1 = x.blocks()[1], y0 = y.blocks()[0];
  x.release_all(pool);  // tail first: x1 is older in LRU order than x0
  y.release_all(pool);
  EXPECT_EQ(pool.num_free(), 4);
  EXPECT_EQ(pool.num_evictable(), 3);
  // The one never-used block goes first, then x's tail block, then x's head, then y's block.
  const int32_t fresh = *pool.allocate();
  EXPECT_NE(fresh, x0);
  EXPECT_NE(fresh, x1);
  EXPECT_NE(fresh, y0);
  EXPECT_EQ(pool.find_cached_prefix(hx).size(), 2u);
  EXPECT_EQ(*pool.allocate(), x1);
  EXPECT_FALSE(pool.has_hash(x1));
  EXPECT_EQ(pool.find_cached_prefix(hx).size(), 1u);  // x's head block is still a hit
  EXPECT_EQ(*pool.allocate(), x0);
  EXPECT_TRUE(pool.find_cached_prefix(hx).empty());
  EXPECT_EQ(pool.find_cached_prefix(hy).size(), 1u);
  EXPECT_EQ(*pool.allocate(), y0);
  EXPECT_TRUE(pool.find_cached_prefix(hy).empty());
  EXPECT_EQ(pool.num_evictable(), 0);
  EXPECT_EQ(pool.num_free(), 0);
}

TEST(PrefixCache, TouchMovesABlockOutOfTheLruSoItIsEvictedLast) {
  BlockPool pool(2, 1);
  std::vector<BlockHash> h;
  extend_block_hashes(iota_tokens(2), 1, &h);
  BlockTable t;
  ASSERT_TRUE(t.reserve(pool, 2).ok());
  t.set_num_tokens(2);
  t.cache_full_blocks(pool, h);
  const int32_t b0 = t.blocks()[0], b1 = t.blocks()[1];
  t.release_all(pool);  // LRU order: b1 (the tail block), then b0
  // b1 used again (a hit) and released: it is now the most recently used.
  pool.touch(std::vector<int32_t>{b1});
  EXPECT_EQ(pool.ref_count(b1), 1);
  EXPECT_EQ(pool.num_evictable(), 1);
  pool.release(b1);
  EXPECT_EQ(*pool.allocate(), b0);
  EXPECT_EQ(*pool.allocate(), b1);
}

TEST(PrefixCache, TheSamePrefixComputedTwiceKeepsTheFirstBlock) {
  BlockPool pool(4, 2);
  std::vector<BlockHash> h;
  extend_block_hashes(iota_tokens(2), 2, &h);
  BlockTable a, b;
  ASSERT_TRUE(a.reserve(pool, 2).ok());
  ASSERT_TRUE(b.reserve(pool, 2).ok());
  a.set_num_tokens(2);
  b.set_num_tokens(2);
  a.cache_full_blocks(pool, h);
  b.cache_full_blocks(pool, h);  // computed concurrently: not registered a second time
  EXPECT_TRUE(pool.has_hash(a.blocks()[0]));
  EXPECT_FALSE(pool.has_hash(b.blocks()[0]));
  EXPECT_EQ(pool.find_cached_prefix(h), std::vector<int32_t>{a.blocks()[0]});
  b.release_all(pool);  // an unhashed block goes straight back to the free list
  EXPECT_EQ(pool.num_evictable(), 0);
  a.release_all(pool);
  EXPECT_EQ(pool.num_evictable(), 1);
}

TEST(PrefixCache, OnlyBlocksWithinTheValidTokensAreCached) {
  BlockPool pool(4, 4);
  const std::vector<int32_t> toks = iota_tokens(12);
  std::vector<BlockHash> h;
  extend_block_hashes(toks, 4, &h);
  BlockTable t;
  ASSERT_TRUE(t.reserve(pool, 12).ok());  // slots reserved for draft tokens, say
  t.set_num_tokens(7);                    // valid KV: 7 tokens
  t.cache_full_blocks(pool, h);
  EXPECT_EQ(t.num_cached_blocks(), 1);
  EXPECT_EQ(pool.find_cached_prefix(h).size(), 1u);
  t.truncate(pool, 5);  // rejected drafts go; the cached block stays
  t.set_num_tokens(8);
  t.cache_full_blocks(pool, h);
  EXPECT_EQ(t.num_cached_blocks(), 2);
  EXPECT_EQ(pool.find_cached_prefix(h).size(), 2u);
}

TEST(PrefixCacheDeathTest, MisuseIsABug) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  BlockPool pool(2, 2);
  std::vector<BlockHash> h;
  extend_block_hashes(iota_tokens(4), 2, &h);
  BlockTable t;
  ASSERT_TRUE(t.reserve(pool, 4).ok());
  t.set_num_tokens(4);
  t.cache_full_blocks(pool, h);
  EXPECT_DEATH(t.truncate(pool, 3), "cuts into 2 cached blocks");
  EXPECT_DEATH(t.acquire_cached_prefix(pool, h, 2, 4), "holds blocks");
  BlockPool other(2, 2);
  EXPECT_DEATH(other.touch(std::vector<int32_t>{1}), "not cached");
  EXPECT_DEATH(other.cache_block(0, 7), "cache_block of a free block");
}

}  // namespace
}  // namespace specserve
