// Tests for spec/lookup_first_proposer.h: the lookup drafts when it matches (a chain as deep
// as the inner proposer's drafts), the inner proposer otherwise; hidden rows of lookup steps are
// kept and reach the inner proposer once each, in order, with its next call; a failing inner
// call is undone (the engine hands the same rows over again); a restart (hidden_begin 0) drops
// what was kept; the kept rows are bounded; release() reaches the inner proposer.
// The engine-level checks (greedy identity, every hidden row) are in hidden_handover_test.cpp
// and heads_engine_test.cpp.
#include "spec/lookup_first_proposer.h"

#include <gtest/gtest.h>

#include <vector>

namespace specserve {
namespace {

using Tokens = std::vector<int32_t>;
constexpr int32_t kHidden = 2;  // floats per hidden row

/// Records what it is asked; drafts {77} (a chain of at most 3: max_draft_depth), or fails.
class FakeInner final : public Proposer {
 public:
  struct Call {
    int64_t seq_id;
    int32_t num_tokens;
    int32_t hidden_begin;
    std::vector<float> hidden;
  };
  std::string name() const override { return "fake"; }
  bool needs_hidden() const override { return true; }
  bool drafts_trees() const override { return true; }
  int32_t max_draft_depth(int32_t k) const override { return std::min(k, 3); }
  Status propose(const std::vector<DraftRequest>& reqs, std::vector<DraftTree>* out) override {
    for (const DraftRequest& r : reqs) calls.push_back({r.seq_id, r.num_tokens, r.hidden_begin, {r.hidden.begin(), r.hidden.end()}});
    if (fail_next) {
      fail_next = false;
      return internal_error("fake failure");
    }
    out->assign(reqs.size(), DraftTree{});
    for (DraftTree& d : *out) d.tokens = {77};
    return Status();
  }
  void release(int64_t seq_id) override { released.push_back(seq_id); }
  std::vector<Call> calls;
  std::vector<int64_t> released;
  bool fail_next = false;
};

/// Rows [begin, end) whose floats are their position (both floats), as the engine hands them over.
std::vector<float> rows(int32_t begin, int32_t end) {
  std::vector<float> h;
  for (int32_t p = begin; p < end; ++p) h.insert(h.end(), kHidden, static_cast<float>(p));
  return h;
}

DraftRequest request(int64_t id, const Tokens& tokens, int32_t k, int32_t hidden_begin, const std::vector<float>& hidden) {
  DraftRequest r;
  r.seq_id = id;
  r.tokens = tokens;
  r.prompt_len = 2;
  r.num_tokens = k;
  r.hidden_begin = hidden_begin;
  r.hidden = hidden;
  r.hidden_size = kHidden;
  return r;
}

struct Fixture {
  FakeInner* inner;
  LookupFirstProposer p;
  Fixture(int32_t min_n, int32_t max_n) : Fixture(std::make_unique<FakeInner>(), min_n, max_n) {}
  Fixture(std::unique_ptr<FakeInner> f, int32_t min_n, int32_t max_n) : inner(f.get()), p(std::move(f), min_n, max_n) {}
  std::vector<DraftTree> propose(const std::vector<DraftRequest>& reqs, Status* st = nullptr) {
    std::vector<DraftTree> out;
    Status s = p.propose(reqs, &out);
    if (st) *st = s;
    else EXPECT_TRUE(s.ok()) << s.to_string();
    return out;
  }
};

// [5, 6] occurred before, followed by 7 8 9 5 6: the lookup matches.
const Tokens kRepeats = {5, 6, 7, 8, 9, 5, 6};
// Every token new: no n-gram recurs.
const Tokens kFresh = {1, 2, 3, 4, 10, 11, 12};

TEST(LookupFirst, MatchDraftsAChainAsDeepAsTheInnerDraftsWithoutAskingIt) {
  Fixture f(2, 4);
  const auto h = rows(0, 6);
  const auto out = f.propose({request(1, kRepeats, 8, 0, h)});
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].tokens, (Tokens{7, 8, 9}));  // depth 3 = FakeInner::max_draft_depth(8)
  EXPECT_TRUE(out[0].parents.empty()) << "a chain";
  EXPECT_TRUE(out[0].probs.empty()) << "deterministic: q one-hot";
  EXPECT_TRUE(f.inner->calls.empty());
  EXPECT_EQ(f.p.num_lookup_drafts(), 1);
  EXPECT_EQ(f.p.num_inner_drafts(), 0);
  // k smaller than the inner depth: the chain is k long.
  EXPECT_EQ(f.propose({request(2, kRepeats, 2, 0, h)})[0].tokens, (Tokens{7, 8}));
  EXPECT_EQ(f.p.name(), "fake+ngram");
  EXPECT_TRUE(f.p.needs_hidden());
  EXPECT_TRUE(f.p.drafts_trees());
  EXPECT_EQ(f.p.max_draft_depth(8), 3);
}

TEST(LookupFirst, NoMatchOrAShorterMatchThanTheMinimumAsksTheInnerProposer) {
  Fixture f(3, 4);  // kRepeats' match is a 2-gram: under the minimum
  const auto out = f.propose({request(1, kRepeats, 8, 0, rows(0, 6)), request(2, kFresh, 4, 0, rows(0, 6))});
  ASSERT_EQ(f.inner->calls.size(), 2u);
  EXPECT_EQ(out[0].tokens, (Tokens{77}));
  EXPECT_EQ(out[1].tokens, (Tokens{77}));
  EXPECT_EQ(f.inner->calls[0].num_tokens, 8);
  EXPECT_EQ(f.inner->calls[1].seq_id, 2);
  EXPECT_EQ(f.inner->calls[1].hidden, rows(0, 6));
  EXPECT_EQ(f.p.num_inner_drafts(), 2);
}

TEST(LookupFirst, RowsOfLookupStepsReachTheInnerProposerWithItsNextCallOnceInOrder) {
  Fixture f(2, 4);
  // Step 1: the prompt's rows 0..5; the lookup drafts.
  f.propose({request(1, kRepeats, 4, 0, rows(0, 6))});
  // Step 2: two more rows, still a match.
  Tokens t = kRepeats;
  t.insert(t.end(), {7, 8});
  f.propose({request(1, t, 4, 6, rows(6, 8))});
  EXPECT_TRUE(f.inner->calls.empty());
  // Step 3: no match: the inner proposer gets rows 0..8 at once, from position 0.
  t.push_back(42);
  f.propose({request(1, t, 4, 8, rows(8, 9))});
  ASSERT_EQ(f.inner->calls.size(), 1u);
  EXPECT_EQ(f.inner->calls[0].hidden_begin, 0);
  EXPECT_EQ(f.inner->calls[0].hidden, rows(0, 9));
  // Step 4: only the new row.
  t.push_back(43);
  f.propose({request(1, t, 4, 9, rows(9, 10))});
  ASSERT_EQ(f.inner->calls.size(), 2u);
  EXPECT_EQ(f.inner->calls[1].hidden_begin, 9);
  EXPECT_EQ(f.inner->calls[1].hidden, rows(9, 10));
}

TEST(LookupFirst, AFailedInnerCallIsUndoneSoTheResentRowsAreNotRepeated) {
  Fixture f(2, 4);
  f.propose({request(1, kRepeats, 4, 0, rows(0, 6))});  // lookup: rows 0..5 kept
  f.inner->fail_next = true;
  Status st;
  f.propose({request(1, kFresh, 4, 6, rows(6, 7)), request(2, kRepeats, 4, 0, rows(0, 6))}, &st);
  EXPECT_FALSE(st.ok());
  EXPECT_EQ(f.p.num_lookup_drafts(), 1) << "seq 2's lookup draft of the failed call is not counted";
  // The engine hands the same rows over again (spec/engine_step.cpp), plus the next one.
  f.propose({request(1, kFresh, 4, 6, rows(6, 8)), request(2, kFresh, 4, 0, rows(0, 7))});
  ASSERT_EQ(f.inner->calls.size(), 3u);  // the failed call (seq 1), then seq 1 and seq 2
  EXPECT_EQ(f.inner->calls[1].seq_id, 1);
  EXPECT_EQ(f.inner->calls[1].hidden_begin, 0);
  EXPECT_EQ(f.inner->calls[1].hidden, rows(0, 8));
  EXPECT_EQ(f.inner->calls[2].seq_id, 2);
  EXPECT_EQ(f.inner->calls[2].hidden_begin, 0);
  EXPECT_EQ(f.inner->calls[2].hidden, rows(0, 7)) << "seq 2, new in the failed call, starts from what is sent again";
}

TEST(LookupFirst, HiddenBeginZeroDropsWhatWasKept) {
  Fixture f(2, 4);
  f.propose({request(1, kRepeats, 4, 0, rows(0, 6))});  // kept 0..5
  // Preempted and recomputed: the engine starts again from 0 with other values.
  std::vector<float> again = rows(0, 7);
  for (float& v : again) v += 100;
  f.propose({request(1, kFresh, 4, 0, again)});
  ASSERT_EQ(f.inner->calls.size(), 1u);
  EXPECT_EQ(f.inner->calls[0].hidden_begin, 0);
  EXPECT_EQ(f.inner->calls[0].hidden, again);
}

TEST(LookupFirst, AGapInTheRowsDropsWhatWasKept) {
  // Never sent by the engine, but the contract allows it: rows 6..7 never arrive. The inner
  // proposer gets what came after the gap (its own gap rule restarts its feature sequence).
  Fixture f(2, 4);
  f.propose({request(1, kRepeats, 4, 0, rows(0, 6))});
  f.propose({request(1, kFresh, 4, 8, rows(8, 10))});
  ASSERT_EQ(f.inner->calls.size(), 1u);
  EXPECT_EQ(f.inner->calls[0].hidden_begin, 8);
  EXPECT_EQ(f.inner->calls[0].hidden, rows(8, 10));
}

TEST(LookupFirst, WithoutHiddenStatesNothingIsKept) {
  // An inner proposer that needs no hidden states (draft model, layer skip): requests carry none.
  Fixture f(2, 4);
  DraftRequest match = request(1, kRepeats, 4, 0, {});
  match.hidden_size = 0;
  DraftRequest miss = request(2, kFresh, 4, 0, {});
  miss.hidden_size = 0;
  const auto out = f.propose({match, miss});
  EXPECT_EQ(out[0].tokens, (Tokens{7, 8, 9}));
  EXPECT_EQ(out[1].tokens, (Tokens{77}));
  ASSERT_EQ(f.inner->calls.size(), 1u);
  EXPECT_EQ(f.inner->calls[0].seq_id, 2);
  EXPECT_TRUE(f.inner->calls[0].hidden.empty());
  match.tokens = kFresh;  // then the inner proposer for seq 1 too, still without rows
  f.propose({match});
  ASSERT_EQ(f.inner->calls.size(), 2u);
  EXPECT_TRUE(f.inner->calls[1].hidden.empty());
}

TEST(LookupFirst, KeptRowsAreBoundedByAskingTheInnerProposer) {
  Fixture at_bound(2, 4);
  at_bound.propose({request(1, kRepeats, 4, 0, rows(0, LookupFirstProposer::kMaxKeptRows))});
  EXPECT_TRUE(at_bound.inner->calls.empty()) << "kMaxKeptRows rows may be kept";
  Fixture f(2, 4);
  const int32_t n = LookupFirstProposer::kMaxKeptRows + 1;
  f.propose({request(1, kRepeats, 4, 0, rows(0, n))});
  ASSERT_EQ(f.inner->calls.size(), 1u) << "over kMaxKeptRows kept: the inner proposer is asked despite the match";
  EXPECT_EQ(f.inner->calls[0].hidden, rows(0, n));
  f.propose({request(1, kRepeats, 4, n, rows(n, n + 1))});
  EXPECT_EQ(f.inner->calls.size(), 1u) << "after the hand-over the lookup drafts again";
}

TEST(LookupFirst, ReleaseReachesTheInnerProposerAndDropsTheKeptRows) {
  Fixture f(2, 4);
  f.propose({request(1, kRepeats, 4, 0, rows(0, 6))});
  f.p.release(1);
  EXPECT_EQ(f.inner->released, (std::vector<int64_t>{1}));
  // A sequence id that comes back starts from what the engine sends.
  f.propose({request(1, kFresh, 4, 3, rows(3, 6))});
  ASSERT_EQ(f.inner->calls.size(), 1u);
  EXPECT_EQ(f.inner->calls[0].hidden_begin, 3);
  EXPECT_EQ(f.inner->calls[0].hidden, rows(3, 6));
}

TEST(LookupFirst, HandOverOnlyCallsGoToTheInnerProposer) {
  // k = 0 (an inner proposer that wants every hidden row): never a lookup draft.
  Fixture f(1, 4);
  f.propose({request(1, kRepeats, 0, 0, rows(0, 6))});
  ASSERT_EQ(f.inner->calls.size(), 1u);
  EXPECT_EQ(f.inner->calls[0].num_tokens, 0);
  EXPECT_EQ(f.p.num_inner_drafts(), 0) << "a hand-over is not a draft";
}

TEST(LookupFirst, CachedRequestsAreSearchedBeforeTheInnerProposer) {
  // lookup_cached_requests: seq 1's output, once released, drafts for seq 2, whose own text has
  // no match.
  Fixture f(std::make_unique<FakeInner>(), 2, 4);  // without: the inner proposer
  LookupFirstProposer with(std::make_unique<FakeInner>(), 2, 4, /*lookup_cached_requests=*/8);
  const Tokens first = {1, 2, 30, 31, 32, 33, 34};  // prompt {1, 2}, output 30..34
  std::vector<DraftTree> out;
  ASSERT_TRUE(with.propose({request(1, first, 4, 0, rows(0, 6))}, &out).ok());
  with.release(1);
  const Tokens second = {5, 6, 30, 31, 32};  // ends with [30, 31, 32]: in seq 1's output
  ASSERT_TRUE(with.propose({request(2, second, 4, 0, rows(0, 4))}, &out).ok());
  EXPECT_EQ(out[0].tokens, (Tokens{33, 34}));
  EXPECT_EQ(out[0].source, DraftSource::kCachedRequests);
  // A tie goes to the sequence's own text: [30, 31, 32] recurs in it (-> 9) and in the history
  // (-> 33).
  const Tokens own = {30, 31, 32, 9, 30, 31, 32};
  ASSERT_TRUE(with.propose({request(3, own, 4, 0, rows(0, 6))}, &out).ok());
  EXPECT_EQ(out[0].tokens, (Tokens{9, 30, 31}));
  EXPECT_EQ(out[0].source, DraftSource::kPromptLookup);
  EXPECT_EQ(with.num_lookup_drafts(), 2);
  EXPECT_EQ(with.num_inner_drafts(), 1) << "seq 1 itself had no match";
  ASSERT_TRUE(f.p.propose({request(1, first, 4, 0, rows(0, 6))}, &out).ok());
  f.p.release(1);
  const std::vector<DraftTree> inner = f.propose({request(2, second, 4, 0, rows(0, 4))});
  EXPECT_EQ(inner[0].tokens, (Tokens{77})) << "no history without the option";
  EXPECT_EQ(inner[0].source, DraftSource::kModel);
}

TEST(LookupFirstDeathTest, ASequenceTwiceInOneCallIsABug) {
  // The engine asks once per sequence and step; twice would hand rows over twice.
  EXPECT_DEATH(
      {
        Fixture f(2, 4);
        f.propose({request(1, kFresh, 4, 0, rows(0, 6)), request(1, kFresh, 4, 0, rows(0, 6))});
      },
      "asked twice");
}

}  // namespace
}  // namespace specserve
