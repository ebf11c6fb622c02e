// Tests for spec/ngram_proposer.h: the prompt-lookup rules (longest n first, most recent match,
// a continuation cut short by the end of the tokens, no match -> no draft) and propose().
#include "spec/ngram_proposer.h"

#include <gtest/gtest.h>

#include <vector>

namespace specserve {
namespace {

using Tokens = std::vector<int32_t>;

Tokens lookup(const Tokens& t, int32_t min_n, int32_t max_n, int32_t k) { return NgramProposer::lookup(t, min_n, max_n, k); }

TEST(NgramLookup, LongestNgramWins) {
  // Last 2-gram [2, 3] occurs at 0 (followed by 9); the last 1-gram [3] occurs more recently
  // at 4 (followed by 7). The 2-gram match is taken whenever n = 2 is allowed.
  const Tokens t = {2, 3, 9, 4, 3, 7, 2, 3};
  EXPECT_EQ(lookup(t, 1, 2, 3), (Tokens{9, 4, 3}));
  EXPECT_EQ(lookup(t, 1, 3, 3), (Tokens{9, 4, 3}));  // no 3-gram match: falls back to n = 2
  EXPECT_EQ(lookup(t, 1, 1, 3), (Tokens{7, 2, 3}));  // n = 1 only
}

TEST(NgramLookup, MostRecentMatchWins) {
  // [5, 1] occurs at 0 (-> 6) and at 3 (-> 7): the later one is used.
  const Tokens t = {5, 1, 6, 5, 1, 7, 5, 1};
  EXPECT_EQ(lookup(t, 2, 2, 2), (Tokens{7, 5}));
  EXPECT_EQ(lookup(t, 1, 4, 1), (Tokens{7}));
}

TEST(NgramLookup, ContinuationShorterThanK) {
  // The only earlier [4] is at 0; only two tokens follow it.
  EXPECT_EQ(lookup({4, 8, 4}, 1, 3, 5), (Tokens{8, 4}));
  // Overlapping self-match: [1, 1, 1] at 0 is followed by one token.
  EXPECT_EQ(lookup({1, 1, 1, 1}, 3, 3, 4), (Tokens{1}));
  EXPECT_EQ(lookup({1, 1, 1, 1}, 1, 1, 4), (Tokens{1}));  // most recent [1] is at 2
}

TEST(NgramLookup, KLimitsTheDraft) {
  const Tokens t = {1, 2, 3, 4, 5, 6, 1};
  EXPECT_EQ(lookup(t, 1, 1, 3), (Tokens{2, 3, 4}));
  EXPECT_EQ(lookup(t, 1, 1, 1), (Tokens{2}));
  EXPECT_TRUE(lookup(t, 1, 1, 0).empty());
}

TEST(NgramLookup, NoMatchIsEmpty) {
  EXPECT_TRUE(lookup({1, 2, 3, 4}, 1, 3, 4).empty());
  EXPECT_TRUE(lookup({7}, 1, 3, 4).empty());  // nothing before the tail
  EXPECT_TRUE(lookup({}, 1, 3, 4).empty());
  // A 1-gram match exists but min_n = 2 forbids it.
  EXPECT_TRUE(lookup({3, 9, 5, 3}, 2, 4, 4).empty());
  EXPECT_EQ(lookup({3, 9, 5, 3}, 1, 4, 4), (Tokens{9, 5, 3}));
}

TEST(NgramLookup, MaxNClampedToTheTokens) {
  // max_n larger than len - 1 must not read before the start.
  EXPECT_EQ(lookup({6, 6}, 1, 10, 3), (Tokens{6}));
  EXPECT_TRUE(lookup({6, 7}, 2, 10, 3).empty());
}

TEST(NgramProposer, ProposeFillsEveryRequest) {
  NgramProposer p(1, 3);
  EXPECT_EQ(p.name(), "ngram");
  const Tokens a = {1, 2, 3, 1, 2}, b = {4, 5, 6}, c = {9, 8, 9, 8, 9};
  std::vector<DraftRequest> reqs(3);
  reqs[0].seq_id = 1, reqs[0].tokens = a, reqs[0].prompt_len = 3, reqs[0].num_tokens = 2;
  reqs[1].seq_id = 2, reqs[1].tokens = b, reqs[1].prompt_len = 3, reqs[1].num_tokens = 4;
  reqs[2].seq_id = 3, reqs[2].tokens = c, reqs[2].prompt_len = 1, reqs[2].num_tokens = 8;
  std::vector<DraftTree> out(1);  // wrong size on purpose: propose resizes
  ASSERT_TRUE(p.propose(reqs, &out).ok());
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(out[0].tokens, (Tokens{3, 1}));
  EXPECT_TRUE(out[1].tokens.empty());
  EXPECT_EQ(out[2].tokens, (Tokens{8, 9}));  // [9, 8, 9] at 0 -> [8, 9]
  for (const DraftTree& d : out) {
    EXPECT_TRUE(d.parents.empty());  // a chain
    EXPECT_TRUE(d.probs.empty());    // deterministic: q is one-hot
  }
}

TEST(NgramProposer, CachedRequestsAreSearchedAndTheLongerMatchDrafts) {
  // lookup_cached_requests 4: a released sequence's output drafts for a later one.
  NgramProposer p(2, 3, 4);
  DraftRequest r1;
  r1.seq_id = 1;
  const Tokens t1 = {1, 2, 40, 41, 42, 43};
  r1.tokens = t1;
  r1.prompt_len = 2;
  r1.num_tokens = 3;
  std::vector<DraftTree> out;
  ASSERT_TRUE(p.propose({r1}, &out).ok());
  EXPECT_TRUE(out[0].tokens.empty());
  p.release(1);
  DraftRequest r2 = r1;
  r2.seq_id = 2;
  const Tokens t2 = {9, 8, 40, 41, 42};
  r2.tokens = t2;
  ASSERT_TRUE(p.propose({r2}, &out).ok());
  EXPECT_EQ(out[0].tokens, (Tokens{43}));
  EXPECT_EQ(out[0].source, DraftSource::kCachedRequests);
  // The longer match wins: [41, 42] recurs in the sequence's own text (-> 7), but the history
  // holds all of [40, 41, 42] (-> 43).
  const Tokens t3 = {41, 42, 7, 40, 41, 42};
  r2.tokens = t3;
  ASSERT_TRUE(p.propose({r2}, &out).ok());
  EXPECT_EQ(out[0].tokens, (Tokens{43}));
  EXPECT_EQ(out[0].source, DraftSource::kCachedRequests);
  // A tie goes to the sequence's own text: [40, 41, 42] recurs in it (-> 7) and in the history.
  const Tokens t4 = {40, 41, 42, 7, 40, 41, 42};
  r2.tokens = t4;
  ASSERT_TRUE(p.propose({r2}, &out).ok());
  EXPECT_EQ(out[0].tokens, (Tokens{7, 40, 41}));
  EXPECT_EQ(out[0].source, DraftSource::kPromptLookup);
  NgramProposer plain(2, 3);
  r2.tokens = t2;
  ASSERT_TRUE(plain.propose({r1}, &out).ok());
  plain.release(1);
  ASSERT_TRUE(plain.propose({r2}, &out).ok());
  EXPECT_TRUE(out[0].tokens.empty()) << "without the option nothing is kept";
}

}  // namespace
}  // namespace specserve
