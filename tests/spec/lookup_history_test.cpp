// Tests for spec/lookup_history.h: earlier outputs searched by n-gram (longest n first, the most
// recent occurrence, a continuation cut by the output's end), eviction after max_requests, the
// index rebuilt so that it stays bounded, and SequenceOutputs adding a released sequence's output.
#include "spec/lookup_history.h"

#include <gtest/gtest.h>

#include <vector>

namespace specserve {
namespace {

using Tokens = std::vector<int32_t>;

TEST(LookupHistory, LongestNgramThenMostRecentOutput) {
  LookupHistory h(8, 1, 3);
  h.add(Tokens{1, 2, 3, 4, 5});
  h.add(Tokens{9, 3, 7, 8});
  // [2, 3] occurs in the first output only (-> 4, 5); [3] alone most recently in the second (-> 7).
  EXPECT_EQ(h.lookup(Tokens{100, 2, 3}, 4), (Tokens{4, 5}));
  EXPECT_EQ(h.lookup(Tokens{100, 50, 3}, 4), (Tokens{7, 8}));
  EXPECT_EQ(h.lookup(Tokens{100, 50, 3}, 1), (Tokens{7}));
  // An n-gram only at an output's end has nothing after it: no draft from it.
  EXPECT_TRUE(h.lookup(Tokens{7, 8}, 4).empty());
  EXPECT_TRUE(h.lookup(Tokens{42}, 4).empty());
  EXPECT_TRUE(h.lookup(Tokens{2, 3}, 0).empty());
  EXPECT_EQ(h.num_requests(), 2);
}

TEST(LookupHistory, MinNIsRespectedAndShortOutputsAddNothing) {
  LookupHistory h(8, 2, 4);
  h.add(Tokens{5, 6});  // shorter than min_n + 1
  EXPECT_EQ(h.num_requests(), 0);
  h.add(Tokens{5, 6, 7});
  EXPECT_EQ(h.lookup(Tokens{5, 6}, 3), (Tokens{7}));
  EXPECT_TRUE(h.lookup(Tokens{1, 6}, 3).empty()) << "a 1-gram match is under min_n";
}

TEST(LookupHistory, OldestOutputIsEvictedAndTheIndexStaysBounded) {
  LookupHistory h(2, 2, 2);
  h.add(Tokens{1, 2, 3});
  h.add(Tokens{4, 5, 6});
  h.add(Tokens{7, 8, 9});  // evicts {1, 2, 3}
  EXPECT_EQ(h.num_requests(), 2);
  EXPECT_TRUE(h.lookup(Tokens{1, 2}, 1).empty()) << "evicted";
  EXPECT_EQ(h.lookup(Tokens{4, 5}, 1), (Tokens{6}));
  EXPECT_EQ(h.lookup(Tokens{7, 8}, 1), (Tokens{9}));
  // Many distinct outputs through a history of 2: the index never holds much more than theirs.
  for (int32_t i = 0; i < 2000; ++i) h.add(Tokens{1000 + 3 * i, 1001 + 3 * i, 1002 + 3 * i, 1003 + 3 * i});
  EXPECT_LE(h.index_size(), 2u * 2u * 3u + 1024u);
  EXPECT_EQ(h.lookup(Tokens{1000 + 3 * 1999, 1001 + 3 * 1999}, 2), (Tokens{1002 + 3 * 1999, 1003 + 3 * 1999}));
}

TEST(LookupHistory, LongOutputsKeepTheirFirstTokens) {
  LookupHistory h(4, 2, 2);
  Tokens out(LookupHistory::kMaxTokensPerRequest + 10);
  for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<int32_t>(i);
  h.add(out);
  EXPECT_EQ(h.lookup(Tokens{10, 11}, 1), (Tokens{12}));
  const int32_t last = LookupHistory::kMaxTokensPerRequest;
  EXPECT_TRUE(h.lookup(Tokens{last + 1, last + 2}, 1).empty()) << "past the kept tokens";
}

TEST(SequenceOutputs, AReleasedSequencesOutputIsSearched) {
  SequenceOutputs off;
  EXPECT_FALSE(off.enabled());
  off.observe(1, Tokens{1, 2, 3}, 1);
  off.release(1);
  EXPECT_TRUE(off.lookup(Tokens{2, 3}, 1).empty());

  SequenceOutputs on(4, 2, 3);
  ASSERT_TRUE(on.enabled());
  const Tokens prompt_and_output = {50, 51, 52, 1, 2, 3, 4};
  on.observe(7, Tokens(prompt_and_output.begin(), prompt_and_output.end() - 1), 3);  // an earlier step
  on.observe(7, prompt_and_output, 3);
  EXPECT_TRUE(on.lookup(Tokens{2, 3}, 1).empty()) << "not before it is released";
  on.release(7);
  EXPECT_EQ(on.lookup(Tokens{9, 2, 3}, 2), (Tokens{4}));
  EXPECT_TRUE(on.lookup(Tokens{51, 52}, 1).empty()) << "the prompt is not added, only the output";
  on.release(7);  // twice, or never observed: nothing happens
  on.release(8);
  EXPECT_EQ(on.history()->num_requests(), 1);
}

}  // namespace
}  // namespace specserve
