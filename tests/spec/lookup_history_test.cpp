// Tests for spec/lookup_history.h: earlier outputs searched by n-gram (longest n first, the most
// recent occurrence, a continuation cut by the output's end, at least kMinN tokens), eviction
// after max_requests, the index rebuilt so that it stays bounded (the most recent occurrence
// still winning), large n bounds, and SequenceOutputs adding a released sequence's output.
#include "spec/lookup_history.h"

#include <gtest/gtest.h>

#include <vector>

namespace specserve {
namespace {

using Tokens = std::vector<int32_t>;

TEST(LookupHistory, LongestNgramThenMostRecentOutput) {
  LookupHistory h(8, 3, 4);
  h.add(Tokens{1, 2, 3, 4, 5, 6});
  h.add(Tokens{9, 2, 3, 4, 8, 7});
  // [1, 2, 3, 4] occurs in the first output only (-> 5, 6); [2, 3, 4] most recently in the second (-> 8, 7).
  EXPECT_EQ(h.lookup(Tokens{1, 2, 3, 4}, 4), (Tokens{5, 6}));
  EXPECT_EQ(h.lookup(Tokens{100, 2, 3, 4}, 4), (Tokens{8, 7}));
  EXPECT_EQ(h.lookup(Tokens{100, 2, 3, 4}, 1), (Tokens{8}));
  // An n-gram only at an output's end has nothing after it: no draft from it.
  EXPECT_TRUE(h.lookup(Tokens{3, 4, 8, 7}, 4).empty());
  EXPECT_TRUE(h.lookup(Tokens{42, 43, 44}, 4).empty());
  EXPECT_TRUE(h.lookup(Tokens{2, 3, 4}, 0).empty());
  EXPECT_EQ(h.num_requests(), 2);
}

TEST(LookupHistory, AtLeastKMinNTokensMustMatchAndShortOutputsAddNothing) {
  LookupHistory h(8, 1, 5);  // min 1 asked: 3 used (LookupHistory::kMinN)
  h.add(Tokens{5, 6, 7});    // shorter than 3 + 1
  EXPECT_EQ(h.num_requests(), 0);
  h.add(Tokens{5, 6, 7, 8});
  EXPECT_EQ(h.lookup(Tokens{5, 6, 7}, 3), (Tokens{8}));
  EXPECT_TRUE(h.lookup(Tokens{1, 6, 7}, 3).empty()) << "a 2-token match is under kMinN";
  EXPECT_TRUE(h.lookup(Tokens{7}, 3).empty());
}

TEST(LookupHistory, HugeNBoundsAreClamped) {
  // prompt_lookup_max may be large (YAML allows up to 2^31 - 1): the index stays at kMaxN.
  LookupHistory h(4, 3, 2147483647);
  Tokens out;
  for (int32_t i = 0; i < 100; ++i) out.push_back(i);
  h.add(out);
  EXPECT_LE(h.index_size(), static_cast<size_t>(100 * (LookupHistory::kMaxN - LookupHistory::kMinN + 1)));
  EXPECT_EQ(h.lookup(Tokens{50, 51, 52}, 2), (Tokens{53, 54}));
  LookupHistory big_min(4, 1000000, 1000000);
  big_min.add(out);
  EXPECT_TRUE(big_min.lookup(out, 2).empty());
}

TEST(LookupHistory, OldestOutputIsEvictedAndTheIndexStaysBounded) {
  LookupHistory h(2, 3, 3);
  h.add(Tokens{1, 2, 3, 4});
  h.add(Tokens{5, 6, 7, 8});
  h.add(Tokens{9, 10, 11, 12});  // evicts {1, 2, 3, 4}
  EXPECT_EQ(h.num_requests(), 2);
  EXPECT_TRUE(h.lookup(Tokens{1, 2, 3}, 1).empty()) << "evicted";
  EXPECT_EQ(h.lookup(Tokens{5, 6, 7}, 1), (Tokens{8}));
  // Many distinct outputs through a history of 2 (the index is rebuilt many times): it never
  // holds much more than theirs, and the most recent occurrence still wins.
  for (int32_t i = 0; i < 2000; ++i) h.add(Tokens{1000 + 4 * i, 1001 + 4 * i, 1002 + 4 * i, 1003 + 4 * i, 1004 + 4 * i});
  EXPECT_LE(h.index_size(), 2u * 2u * 2u + 1024u + 2u);
  h.add(Tokens{70, 71, 72, 73});
  h.add(Tokens{70, 71, 72, 74});
  EXPECT_EQ(h.lookup(Tokens{70, 71, 72}, 1), (Tokens{74}));
  for (int32_t i = 0; i < 600; ++i) h.add(Tokens{-4 * i, -4 * i - 1, -4 * i - 2, -4 * i - 3});  // rebuilds
  h.add(Tokens{80, 81, 82, 83});
  h.add(Tokens{80, 81, 82, 84});
  EXPECT_EQ(h.lookup(Tokens{80, 81, 82}, 1), (Tokens{84}));
}

TEST(LookupHistory, LongOutputsKeepTheirFirstTokens) {
  LookupHistory h(4, 3, 3);
  Tokens out(LookupHistory::kMaxTokensPerRequest + 10);
  for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<int32_t>(i);
  h.add(out);
  EXPECT_EQ(h.lookup(Tokens{10, 11, 12}, 1), (Tokens{13}));
  const int32_t last = LookupHistory::kMaxTokensPerRequest;
  EXPECT_TRUE(h.lookup(Tokens{last, last + 1, last + 2}, 1).empty()) << "past the kept tokens";
}

TEST(SequenceOutputs, AReleasedSequencesOutputIsSearched) {
  SequenceOutputs off;
  EXPECT_FALSE(off.enabled());
  off.observe(1, Tokens{1, 2, 3, 4, 5}, 1);
  off.release(1);
  EXPECT_TRUE(off.lookup(Tokens{2, 3, 4}, 1).empty());

  SequenceOutputs on(4, 3, 3);
  ASSERT_TRUE(on.enabled());
  const Tokens prompt_and_output = {50, 51, 52, 1, 2, 3, 4};
  on.observe(7, Tokens(prompt_and_output.begin(), prompt_and_output.end() - 2), 3);  // earlier steps
  on.observe(7, Tokens(prompt_and_output.begin(), prompt_and_output.end() - 1), 3);
  on.observe(7, prompt_and_output, 3);
  EXPECT_TRUE(on.lookup(Tokens{1, 2, 3}, 1).empty()) << "not before it is released";
  on.release(7);
  EXPECT_EQ(on.lookup(Tokens{9, 1, 2, 3}, 2), (Tokens{4}));
  EXPECT_TRUE(on.lookup(Tokens{50, 51, 52}, 1).empty()) << "the prompt is not added, only the output";
  on.release(7);  // twice, or never observed: nothing happens
  on.release(8);
  EXPECT_EQ(on.history()->num_requests(), 1);
}

}  // namespace
}  // namespace specserve
