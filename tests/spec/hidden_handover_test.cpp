// Hidden hand-over to proposers that need the target's hidden states (spec/proposer.h,
// Proposer::needs_hidden; the Medusa / EAGLE contract): every position's final-norm hidden state
// reaches the proposer exactly once per (re)computation, in order, equal to the target's own
// forward hidden state at that position; prefill rows, then the last known token and the
// accepted tree path each step; starting again from 0 after a preemption; never for proposers
// that do not ask, nor from a prefix-cache hit; through spec/lookup_first_proposer.h too. Greedy
// output stays that of plain decoding.
#include <gtest/gtest.h>

#include <set>

#include "spec/lookup_first_proposer.h"
#include "tests/spec/spec_engine_fixtures.h"
#include "tests/spec/tree_test_util.h"

namespace specserve {
namespace {

using namespace spec_engine_testing;
using tree_testing::OracleTreeProposer;

/// Drafts with an inner proposer (none: never drafts) and records, per sequence, the hidden rows
/// handed over, checking the contract at each call. `every`: asks for every computed row
/// (Proposer::needs_every_hidden_row).
class HiddenRecorder final : public Proposer {
 public:
  HiddenRecorder(Proposer* inner, bool needs, bool every = false) : inner_(inner), needs_(needs), every_(every) {}
  std::string name() const override { return "hidden_recorder"; }
  bool needs_hidden() const override { return needs_; }
  bool needs_every_hidden_row() const override { return every_; }
  bool drafts_trees() const override { return trees_; }
  void release(int64_t seq_id) override {
    if (inner_) inner_->release(seq_id);
    ++releases_;
    released_.insert(seq_id);
  }
  Status propose(const std::vector<DraftRequest>& reqs, std::vector<DraftTree>* out) override {
    const int64_t d = target().config().hidden_size;
    for (const DraftRequest& r : reqs) {
      if (released_.erase(r.seq_id))  // only a preempted sequence comes back, starting afresh
        EXPECT_TRUE(!needs_ || r.hidden_begin == 0) << "seq " << r.seq_id << ": proposed after release() without a restart";
      if (r.num_tokens == 0) ++calls_without_budget_;
      else ++asked_k_[r.num_tokens];
      if (!every_) EXPECT_GE(r.num_tokens, 1) << "only a proposer that wants every row is called without a draft budget";
      if (!needs_) {
        EXPECT_TRUE(r.hidden.empty());
        EXPECT_EQ(r.hidden_size, 0);
        continue;
      }
      EXPECT_EQ(r.hidden_size, d);
      EXPECT_EQ(r.hidden.size() % static_cast<size_t>(d), 0u);
      const int32_t n = static_cast<int32_t>(r.hidden.size() / static_cast<size_t>(d));
      auto& seq = seqs_[r.seq_id];
      if (r.hidden_begin == 0) {
        if (!seq.hidden.empty()) ++restarts_;
        seq.hidden.clear();
        seq.tokens.clear();
      }
      EXPECT_EQ(r.hidden_begin, static_cast<int32_t>(seq.hidden.size())) << "seq " << r.seq_id << ": rows skipped or repeated";
      // The last hand-over of a finished sequence (every_ only) may include the last token's
      // row, when a stop token (not in tokens) followed it.
      const int32_t end = r.hidden_begin + n, known = static_cast<int32_t>(r.tokens.size());
      if (every_) {
        EXPECT_TRUE(end == known - 1 || (r.num_tokens == 0 && end == known)) << "seq " << r.seq_id << ": " << end << " of " << known;
      } else {
        EXPECT_EQ(end, known - 1) << "seq " << r.seq_id << ": hidden must cover every position but the last known token";
      }
      for (int32_t j = 0; j < n; ++j) seq.hidden.emplace_back(r.hidden.begin() + j * d, r.hidden.begin() + (j + 1) * d);
      seq.tokens.assign(r.tokens.begin(), r.tokens.end());
      ++calls_with_hidden_;
      rows_ += n;
    }
    // Only requests with a budget go to the inner proposer; the others get no draft.
    out->assign(reqs.size(), DraftTree{});
    std::vector<DraftRequest> drafting;
    std::vector<size_t> at;
    for (size_t i = 0; i < reqs.size(); ++i) {
      if (reqs[i].num_tokens > 0 && inner_) drafting.push_back(reqs[i]), at.push_back(i);
    }
    if (drafting.empty()) return Status();
    std::vector<DraftTree> got(drafting.size());
    SPECSERVE_RETURN_IF_ERROR(inner_->propose(drafting, &got));
    for (size_t j = 0; j < at.size(); ++j) (*out)[at[j]] = std::move(got[j]);
    return Status();
  }

  struct Seq {
    std::vector<std::vector<float>> hidden;  // [position][d]
    Tokens tokens;                           // the known tokens at the last call
  };
  std::map<int64_t, Seq> seqs_;
  std::set<int64_t> released_;
  int64_t calls_with_hidden_ = 0, rows_ = 0, restarts_ = 0, releases_ = 0, calls_without_budget_ = 0;
  std::map<int32_t, int64_t> asked_k_;  // drafting calls per num_tokens
  bool trees_ = false;                  // what drafts_trees() says

 private:
  Proposer* inner_;
  bool needs_;
  bool every_;
};

/// The target's final-norm hidden state at every position of `tokens` (one prefill).
std::vector<std::vector<float>> forward_hidden(const Tokens& tokens) {
  const int64_t bs = 16;
  auto kv = target().create_kv((static_cast<int64_t>(tokens.size()) + bs - 1) / bs, bs);
  EXPECT_TRUE(kv.ok());
  ForwardBatch b;
  b.return_hidden = true;
  SequenceInput in;
  in.tokens = tokens;
  for (int32_t i = 0; i * bs < static_cast<int64_t>(tokens.size()); ++i) in.block_table.push_back(i);
  for (int32_t r = 0; r < static_cast<int32_t>(tokens.size()); ++r) in.hidden_rows.push_back(r);
  b.seqs.push_back(in);
  ForwardOutput out;
  Status st = target().forward(b, **kv, &out);
  EXPECT_TRUE(st.ok()) << st.to_string();
  std::vector<std::vector<float>> h;
  for (int32_t r = 0; r < static_cast<int32_t>(tokens.size()); ++r) h.emplace_back(out.hidden_row(0, r), out.hidden_row(0, r) + out.hidden_size);
  return h;
}

/// Every recorded position's hidden state equals the target's forward at that position.
void expect_hidden_matches(const HiddenRecorder& rec, const std::string& where) {
  int64_t compared = 0;
  for (const auto& [id, seq] : rec.seqs_) {
    if (seq.hidden.empty()) continue;
    const auto want = forward_hidden(seq.tokens);
    ASSERT_LE(seq.hidden.size(), want.size()) << where;
    for (size_t p = 0; p < seq.hidden.size(); ++p) {
      double worst = 0;
      for (size_t j = 0; j < want[p].size(); ++j) worst = std::max(worst, static_cast<double>(std::abs(seq.hidden[p][j] - want[p][j])));
      EXPECT_LT(worst, 1e-5) << where << ": seq " << id << " position " << p << " of " << seq.tokens.size();
      ++compared;
    }
  }
  EXPECT_GT(compared, 500) << where;
}

std::unique_ptr<OracleTreeProposer> oracle(const TokenTree& shape, uint64_t seed) {
  auto p = std::make_unique<OracleTreeProposer>(shape, static_cast<int32_t>(target().config().vocab_size), 0.2, seed);
  for (size_t i = 0; i < requests().size(); ++i) p->add(requests()[i].prompt, reference().requests[i].tokens);
  return p;
}

TEST(HiddenHandover, ProposerGetsTheTargetsHiddenStatesOfEveryPosition) {
  for (int32_t batch : {1, 4}) {
    auto inner = oracle(default_medusa_tree(10), 31);
    HiddenRecorder rec(inner.get(), true);
    EngineOptions o = spec_options(10, batch);
    const std::string where = "batch " + std::to_string(batch);
    const RunResult got = run_engine(target(), tokenizer(), &rec, o, requests());
    expect_same_outputs(got, reference(), where);
    EXPECT_GT(got.stats.spec.num_accepted_tokens, got.stats.spec.num_drafts) << where << ": tree paths were accepted";
    EXPECT_GT(rec.calls_with_hidden_, 300) << where;
    expect_hidden_matches(rec, where);
  }
}

TEST(HiddenHandover, EveryRowProposerGetsEveryComputedPositionUpToTheEnd) {
  // A proposer that wants every computed row (Proposer::needs_every_hidden_row; what `specserve
  // dump-hidden` records) gets them also on steps without a draft budget (near max_tokens,
  // during a chunked prefill) and after the sequence finished: every position of the output
  // but the last token of a length-finished one (its row is never computed), and every one
  // after a stop token. Greedy output stays that of plain decoding, drafting (k = 4) or not (an
  // empty draft each step, as dump-hidden), also with preemptions.
  struct Case { const char* name; bool drafts; int32_t batch; int64_t num_kv_blocks; };
  for (const Case& c : {Case{"drafting", true, 4, 0}, Case{"never drafting", false, 4, 0},
                        Case{"never drafting, small KV cache", false, 8, 40}}) {
    std::unique_ptr<OracleTreeProposer> inner;
    if (c.drafts) inner = oracle(default_medusa_tree(4), 35);
    HiddenRecorder rec(inner.get(), true, /*every=*/true);
    EngineOptions o = spec_options(c.drafts ? 4 : 1, c.batch);
    if (c.num_kv_blocks > 0) o.num_kv_blocks = c.num_kv_blocks;
    const RunResult got = run_engine(target(), tokenizer(), &rec, o, requests());
    expect_same_outputs(got, reference(), c.name);
    EXPECT_GT(rec.calls_without_budget_, static_cast<int64_t>(requests().size())) << c.name;
    EXPECT_EQ(rec.released_.size(), requests().size()) << c.name << ": each sequence released at its end";
    if (c.num_kv_blocks > 0) EXPECT_GT(rec.restarts_, 0) << c.name << ": no preemption, the case is vacuous";
    // Every request's rows: matched by its final tokens (prompt + output).
    for (size_t i = 0; i < requests().size(); ++i) {
      Tokens all = requests()[i].prompt;
      const RequestResult& want = reference().requests[i];
      all.insert(all.end(), want.tokens.begin(), want.tokens.end());
      const auto it = std::find_if(rec.seqs_.begin(), rec.seqs_.end(), [&](const auto& kv) { return kv.second.tokens == all; });
      ASSERT_NE(it, rec.seqs_.end()) << c.name << ", request " << i << ": its last hand-over did not come with its final tokens";
      // The last token's row exists after a stop token (it predicted the stop), or when the
      // last token was an accepted draft; never for the token a plain decode step produced last.
      const bool by_length = std::string(finish_reason_name(want.finish)) == "length";
      const size_t n = it->second.hidden.size();
      const std::string w = std::string(c.name) + ", request " + std::to_string(i) + " (" + finish_reason_name(want.finish) + ", " +
                            std::to_string(want.tokens.size()) + " generated)";
      if (!by_length) {
        EXPECT_EQ(n, all.size()) << w;
      } else if (!c.drafts) {
        EXPECT_EQ(n, all.size() - 1) << w;
      } else {
        EXPECT_TRUE(n == all.size() - 1 || n == all.size()) << w << ": " << n << " rows of " << all.size();
      }
    }
    expect_hidden_matches(rec, c.name);
  }
}

TEST(HiddenHandover, RestartsFromZeroAfterPreemption) {
  auto inner = oracle(default_medusa_tree(6), 32);
  HiddenRecorder rec(inner.get(), true);
  EngineOptions o = spec_options(6, 8);
  o.num_kv_blocks = 40;  // 640 slots for 8 sequences of up to 256 tokens: preemptions
  const RunResult got = run_engine(target(), tokenizer(), &rec, o, requests());
  expect_same_outputs(got, reference(), "small KV cache");
  EXPECT_GT(rec.restarts_, 0) << "no sequence was preempted after drafting: the test is vacuous";
  expect_hidden_matches(rec, "small KV cache");
}

TEST(HiddenHandover, LookupFirstHandsEveryRowToItsInnerProposer) {
  // spec/lookup_first_proposer.h drafts by prompt lookup on some steps without asking the inner
  // proposer; the rows of those steps must still reach it, once each and in order, with its next
  // call (the recorder checks the hand-over contract at each call), also across preemptions.
  struct Case { const char* name; int32_t batch; int64_t num_kv_blocks; };
  for (const Case& c : {Case{"batch 4", 4, 0}, Case{"batch 8, small KV cache", 8, 40}}) {
    auto inner = oracle(default_medusa_tree(6), 36);
    auto owned = std::make_unique<HiddenRecorder>(inner.get(), true);
    HiddenRecorder& rec = *owned;
    rec.trees_ = true;  // a tree proposer: k is its node budget
    LookupFirstProposer lookup(std::move(owned), 1, 3);
    EngineOptions o = spec_options(6, c.batch);
    o.adaptive_k = true;  // the default (the fixture turns it off)
    if (c.num_kv_blocks > 0) o.num_kv_blocks = c.num_kv_blocks;
    const RunResult got = run_engine(target(), tokenizer(), &lookup, o, requests());
    expect_same_outputs(got, reference(), c.name);
    EXPECT_GT(lookup.num_lookup_drafts(), 20) << c.name << ": the lookup never drafted, the case is vacuous";
    EXPECT_GT(lookup.num_inner_drafts(), 20) << c.name;
    // The engine's drafts by source: the lookup's chains and the inner proposer's trees, adding
    // up to the totals (also across preemptions); no history configured.
    const auto& by = got.stats.by_source;
    const DraftSourceStats& model = by[static_cast<size_t>(DraftSource::kModel)];
    const DraftSourceStats& own = by[static_cast<size_t>(DraftSource::kPromptLookup)];
    EXPECT_EQ(own.num_drafts, lookup.num_lookup_drafts()) << c.name;
    EXPECT_GT(model.num_drafts, 20) << c.name;
    EXPECT_EQ(by[static_cast<size_t>(DraftSource::kCachedRequests)].num_drafts, 0) << c.name;
    EXPECT_EQ(model.num_drafts + own.num_drafts, got.stats.spec.num_drafts) << c.name;
    EXPECT_EQ(model.num_accepted_tokens + own.num_accepted_tokens, got.stats.spec.num_accepted_tokens) << c.name;
    if (c.num_kv_blocks > 0) EXPECT_GT(rec.restarts_, 0) << c.name << ": no preemption, the case is vacuous";
    expect_hidden_matches(rec, c.name);
    // The lookup's chains (often rejected at 1-grams) must not shrink the tree's budget through
    // adaptive k: the inner proposer is asked for the full 6 nodes but near the end of a request.
    int64_t calls = 0;
    std::string hist;
    for (const auto& [k, n] : rec.asked_k_) calls += n, hist += " k" + std::to_string(k) + ":" + std::to_string(n);
    EXPECT_GT(rec.asked_k_[6], calls * 8 / 10) << c.name << ": drafting calls per k:" << hist;
  }
}

TEST(HiddenHandover, OnlyForProposersThatAskAndNeverFromThePrefixCache) {
  // Requests sharing a 48-token prefix (3 blocks): a plain proposer hits the prefix cache; one
  // that needs hidden states does not (a cached prefix has no hidden states) and still gets
  // every position.
  std::mt19937 rng(8);
  const Tokens shared = random_tokens(rng, 48, 512);
  std::vector<GenerateParams> reqs;
  for (int i = 0; i < 6; ++i) {
    Tokens p = shared;
    const Tokens tail = random_tokens(rng, 3 + i, 512);
    p.insert(p.end(), tail.begin(), tail.end());
    reqs.push_back(greedy_request(p, 12));
  }
  const RunResult plain = run_engine(target(), nullptr, nullptr, spec_options(0, 1), reqs);
  for (bool needs : {false, true}) {
    OracleTreeProposer inner(default_medusa_tree(6), 512, 0.2, 33);
    for (size_t i = 0; i < reqs.size(); ++i) inner.add(reqs[i].prompt, plain.requests[i].tokens);
    HiddenRecorder rec(&inner, needs);
    EngineOptions o = spec_options(6, 1);  // one at a time: later requests find the prefix cached
    const RunResult got = run_engine(target(), nullptr, &rec, o, reqs);
    for (size_t i = 0; i < reqs.size(); ++i) EXPECT_EQ(got.requests[i].tokens, plain.requests[i].tokens) << needs << " " << i;
    if (needs) {
      EXPECT_EQ(got.stats.prefix_cache_hits, 0);
      EXPECT_GT(rec.rows_, 6 * 48);
      for (const auto& [id, seq] : rec.seqs_) {
        const auto want = forward_hidden(seq.tokens);
        for (size_t p = 0; p < seq.hidden.size(); ++p) EXPECT_NEAR(seq.hidden[p][0], want[p][0], 1e-5) << id << " " << p;
      }
    } else {
      EXPECT_GE(got.stats.prefix_cache_hits, 5 * 48) << "premise: the shared prefix is cached for plain proposers";
      EXPECT_EQ(rec.calls_with_hidden_, 0);
    }
  }
}

TEST(HiddenHandover, MigratedSequencesRecomputeForProposersThatNeedHidden) {
  // A migrated sequence's KV arrives without hidden states: with such a proposer it recomputes.
  for (bool needs : {false, true}) {
    OracleTreeProposer inner(default_medusa_tree(4), 512, 0.2, 34);
    HiddenRecorder rec(&inner, needs);
    auto e = Engine::create(target(), nullptr, &rec, spec_options(4, 2));
    ASSERT_TRUE(e.ok());
    GenerateParams g = greedy_request(Tokens(40, 7), 20);
    g.resume_output = {1, 2, 3};
    SequenceImport imp;
    imp.num_cached = 32;
    int loads = 0;
    imp.load_kv = [&](KvStorage&, std::span<const int32_t>) {
      ++loads;
      return Status();
    };
    bool loaded = false;
    auto id = (*e)->add_migrated(g, imp, &loaded);
    ASSERT_TRUE(id.ok()) << id.status().to_string();
    EXPECT_EQ(loaded, !needs);
    EXPECT_EQ(loads, needs ? 0 : 1);
    (*e)->remove_sequence(*id);
  }
}

}  // namespace
}  // namespace specserve
