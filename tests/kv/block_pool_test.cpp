// BlockPool / BlockTable: the paged-KV bookkeeping (pure logic, no storage).
#include "kv/block_pool.h"

#include <gtest/gtest.h>

#include <algorithm>
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

}  // namespace
}  // namespace specserve
