// Token-tree speculation in the Engine on the synthetic target (tests/spec/spec_engine_fixtures.h):
// greedy output identical to plain decoding for several tree shapes at batch 1 and 4 (the
// right token hidden among wrong siblings at random ranks), the KV of an accepted
// off-first-branch path equal to a plain recompute after compaction, acceptance counted by
// depth, and Medusa's typical acceptance (lossy by design, sane).
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <numeric>

#include "spec/tree_verify.h"
#include "tests/spec/spec_engine_fixtures.h"
#include "tests/spec/tree_test_util.h"

namespace specserve {
namespace {

using namespace spec_engine_testing;
using tree_testing::OracleTreeProposer;

TokenTree tree_of(const char* text) {
  auto t = parse_token_tree(text);
  EXPECT_TRUE(t.ok()) << t.status().to_string();
  return t.ok() ? *t : TokenTree{};
}

std::unique_ptr<OracleTreeProposer> oracle(const TokenTree& shape, double miss_rate, uint64_t seed) {
  auto p = std::make_unique<OracleTreeProposer>(shape, static_cast<int32_t>(target().config().vocab_size), miss_rate, seed);
  for (size_t i = 0; i < requests().size(); ++i) p->add(requests()[i].prompt, reference().requests[i].tokens);
  return p;
}

struct Shape {
  const char* name;
  TokenTree tree;
};

std::vector<Shape> shapes() {
  return {
      {"medusa-8", default_medusa_tree(8)},
      {"medusa-24", default_medusa_tree(24)},
      {"wide-4x2", tree_of("[(0,),(1,),(2,),(3,),(0,0),(1,0),(2,0),(3,0)]")},
      {"binary-deep", tree_of("[(0,),(1,),(0,0),(0,1),(1,0),(0,0,0),(0,0,1),(0,1,0),(0,0,0,0),(0,0,0,0,0)]")},
  };
}

TEST(TreeEngine, GreedyTreesEqualPlainDecoding) {
  const auto t0 = std::chrono::steady_clock::now();
  for (const Shape& sh : shapes()) {
    for (int32_t batch : {1, 4}) {
      auto p = oracle(sh.tree, 0.2, 77 + static_cast<uint64_t>(batch));
      EngineOptions o = spec_options(sh.tree.num_nodes(), batch);
      o.adaptive_k = batch == 4;  // trees keep their node budget either way
      const std::string where = std::string(sh.name) + " batch " + std::to_string(batch);
      const RunResult got = run_engine(target(), tokenizer(), p.get(), o, requests());
      expect_same_outputs(got, reference(), where);
      const SpecStats& st = got.stats.spec;
      EXPECT_GT(st.num_drafts, 100) << where;
      EXPECT_GT(st.num_accepted_tokens, st.num_drafts) << where << ": trees should accept more than one token per step on average";
      EXPECT_GT(p->num_right_off_first(), 50) << where << ": the right token should often sit off the first branch";
      std::printf("[ tree     ] %-22s drafts %5lld  nodes %6lld  accepted %5lld  mean acceptance length %.2f\n", where.c_str(),
                  static_cast<long long>(st.num_drafts), static_cast<long long>(st.num_draft_tokens),
                  static_cast<long long>(st.num_accepted_tokens), st.mean_acceptance_length());
    }
  }
  std::printf("[ tree     ] %.1f s\n", std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
}

// Trees on the greedy fast path (argmax_rows, no logit rows) give the full path's output.
TEST(TreeEngine, GreedyTreesOnArgmaxRowsEqualTheFullPath) {
  std::vector<GenerateParams> reqs = requests();
  for (size_t i = 0; i < reqs.size(); ++i) {
    if (i % 4) reqs[i].sampling.logprobs = 0;
  }
  const TokenTree shape = default_medusa_tree(8);
  EngineOptions on = spec_options(shape.num_nodes(), 4), off = on;
  off.argmax_on_device = false;
  auto p1 = oracle(shape, 0.2, 91), p2 = oracle(shape, 0.2, 91);
  const RunResult a = run_engine(target(), tokenizer(), p1.get(), on, reqs);
  const RunResult b = run_engine(target(), tokenizer(), p2.get(), off, reqs);
  expect_same_outputs(a, b, "medusa-8 batch 4");
  EXPECT_GT(a.stats.argmax_rows, 0);
  EXPECT_EQ(b.stats.argmax_rows, 0);
  EXPECT_GT(a.stats.spec.num_accepted_tokens, a.stats.spec.num_drafts);
}

/// KV of `blocks` as packed host floats (Backend::kv_export_blocks layout).
std::vector<float> export_kv(KvStorage& kv, const std::vector<int32_t>& blocks) {
  std::vector<float> bytes(static_cast<size_t>(kv_block_bytes(kv, 0, kv.num_layers()) / 4) * blocks.size());
  target().backend().kv_export_blocks(kv, 0, kv.num_layers(), blocks.data(), static_cast<int64_t>(blocks.size()), bytes.data());
  return bytes;
}

TEST(TreeEngine, CompactedPathKvEqualsPlainRecompute) {
  // The right token always on the last rank: root -> node 2 -> node 4 -> node 5, computed at
  // rows 3, 5, 6 and moved to rows 1, 2, 3 (one move reads a slot a later one writes).
  const TokenTree shape = tree_of("[(0,),(1,),(2,),(2,0),(2,1),(2,1,0)]");
  std::mt19937 rng(3);
  const Tokens prompt = random_tokens(rng, 21, 512);
  EngineOptions plain_o = spec_options(0, 1);
  const RunResult plain = run_engine(target(), nullptr, nullptr, plain_o, {greedy_request(prompt, 40)});
  OracleTreeProposer p(shape, 512, 0.0, 5);
  p.set_last_rank(true);
  p.add(prompt, plain.requests[0].tokens);
  EngineOptions o = spec_options(shape.num_nodes(), 1);
  o.block_size = 4;  // the moves cross block boundaries
  o.enable_prefix_caching = false;
  auto e = Engine::create(target(), nullptr, &p, o);
  ASSERT_TRUE(e.ok()) << e.status().to_string();
  auto id = (*e)->add_request(greedy_request(prompt, 40));
  ASSERT_TRUE(id.ok());
  Tokens got;
  int checked = 0;
  const int64_t bs = o.block_size;
  while ((*e)->has_work()) {
    std::vector<SeqEvent> evs;
    ASSERT_TRUE((*e)->step(&evs).ok());
    for (const auto& ev : evs) got.insert(got.end(), ev.tokens.begin(), ev.tokens.end());
    auto ex = (*e)->export_sequence(*id);
    if (!ex.ok()) break;  // finished
    // The KV the engine holds for every cached position ...
    const std::vector<float> have = export_kv((*e)->kv_storage(), ex->blocks);
    // ... against a plain prefill of the same tokens into a fresh cache.
    Tokens all = ex->prompt;
    all.insert(all.end(), ex->output.begin(), ex->output.end());
    auto kv = target().create_kv(static_cast<int64_t>(ex->blocks.size()), bs);
    ASSERT_TRUE(kv.ok());
    ForwardBatch b;
    SequenceInput in;
    in.tokens.assign(all.begin(), all.begin() + ex->num_cached);
    for (size_t i = 0; i < ex->blocks.size(); ++i) in.block_table.push_back(static_cast<int32_t>(i));
    b.seqs.push_back(in);
    ForwardOutput out;
    ASSERT_TRUE(target().forward(b, **kv, &out).ok());
    std::vector<int32_t> ids(ex->blocks.size());
    std::iota(ids.begin(), ids.end(), 0);
    const std::vector<float> want = export_kv(**kv, ids);
    const int64_t L = target().config().num_layers, D = (*kv)->kv_dim();
    int64_t mismatched = 0;
    double worst = 0;
    for (int64_t blk = 0; blk < static_cast<int64_t>(ids.size()); ++blk)
      for (int64_t l = 0; l < L; ++l)
        for (int64_t kvi = 0; kvi < 2; ++kvi)
          for (int64_t s = 0; s < bs; ++s) {
            if (blk * bs + s >= ex->num_cached) continue;
            const size_t at = static_cast<size_t>((((blk * L + l) * 2 + kvi) * bs + s) * D);
            for (int64_t d = 0; d < D; ++d) {
              const double diff = std::abs(have[at + static_cast<size_t>(d)] - want[at + static_cast<size_t>(d)]);
              worst = std::max(worst, diff);
              mismatched += diff > 1e-5;
            }
          }
    EXPECT_EQ(mismatched, 0) << "step " << checked << ": KV of " << ex->num_cached << " cached positions differs from a recompute (worst " << worst << ")";
    ++checked;
  }
  EXPECT_EQ(got, plain.requests[0].tokens);
  EXPECT_GT(checked, 5);
  EXPECT_GT(p.num_right_off_first(), 5) << "no off-first-branch path was accepted: nothing was compacted";
  EXPECT_GT((*e)->stats().spec.num_accepted_tokens, 2 * (*e)->stats().spec.num_drafts);
}

TEST(TreeEngine, AcceptanceIsCountedByDepth) {
  // Right token always present, on the last rank: a full depth-3 path every step but near the end.
  const TokenTree shape = tree_of("[(0,),(1,),(2,),(2,0),(2,1),(2,1,0)]");
  std::mt19937 rng(4);
  std::vector<GenerateParams> reqs;
  for (int i = 0; i < 4; ++i) reqs.push_back(greedy_request(random_tokens(rng, 10 + i, 512), 41));
  const RunResult plain = run_engine(target(), nullptr, nullptr, spec_options(0, 1), reqs);
  OracleTreeProposer p(shape, 512, 0.0, 6);
  p.set_last_rank(true);
  for (size_t i = 0; i < reqs.size(); ++i) p.add(reqs[i].prompt, plain.requests[i].tokens);
  const RunResult got = run_engine(target(), nullptr, &p, spec_options(6, 4), reqs);
  for (size_t i = 0; i < reqs.size(); ++i) EXPECT_EQ(got.requests[i].tokens, plain.requests[i].tokens);
  for (size_t i = 0; i < reqs.size(); ++i) {
    const SpecStats& s = got.requests[i].spec;
    // 41 tokens: the prefill step (1 token), 9 steps of the whole tree (3 accepted + 1 bonus:
    // 36 tokens), then the budget shrinks with the output left (k <= tokens left - 1): 4 left ->
    // 3 nodes (the root's children; the right one is the last: depth 1 + bonus), 2 left -> 1 node.
    EXPECT_EQ(s.num_drafts, 11) << i;
    EXPECT_EQ(s.num_draft_tokens, 9 * 6 + 3 + 1) << i << ": every node counts as a draft token";
    EXPECT_EQ(s.num_accepted_tokens, 9 * 3 + 1 + 1) << i;
    ASSERT_EQ(s.accepted_per_pos.size(), 6u);
    EXPECT_EQ(s.accepted_per_pos, (std::vector<int64_t>{11, 9, 9, 0, 0, 0})) << i << ": by depth, not by node index";
    // How deep each tree went: 9 trees of depth 3, then two of depth 1.
    EXPECT_EQ(s.drafted_per_pos, (std::vector<int64_t>{11, 9, 9, 0, 0, 0})) << i;
    EXPECT_DOUBLE_EQ(s.mean_acceptance_length(), 1.0 + 29.0 / 11.0);
  }
}

// ---- typical acceptance (lossy) -------------------------------------------------------------

/// Proposes, as a one-node tree (or a one-token chain), the token the target finds most (or
/// least) likely after the known tokens, computed with its own forward pass; records whether
/// Medusa's typical acceptance with default settings should accept it.
class ArgProposer final : public Proposer {
 public:
  ArgProposer(bool most_likely, bool as_tree) : most_likely_(most_likely), as_tree_(as_tree) {}
  std::string name() const override { return "arg"; }
  Status propose(const std::vector<DraftRequest>& reqs, std::vector<DraftTree>* out) override {
    out->assign(reqs.size(), DraftTree{});
    for (size_t i = 0; i < reqs.size(); ++i) {
      const DraftRequest& r = reqs[i];
      ForwardBatch b;
      SequenceInput in;
      in.tokens.assign(r.tokens.begin(), r.tokens.end());
      for (int32_t blk = 0; blk * 16 < static_cast<int32_t>(in.tokens.size()); ++blk) in.block_table.push_back(blk);
      b.seqs.push_back(in);
      if (!kv_) kv_ = target().create_kv(16, 16).value();
      ForwardOutput fo;
      SPECSERVE_RETURN_IF_ERROR(target().forward(b, *kv_, &fo));
      const int32_t V = static_cast<int32_t>(fo.vocab_size);
      Sampler smp(*r.sampling);
      std::vector<float> p;
      const std::span<const int32_t> all(r.tokens);
      smp.compute_probs(fo.row(0, 0), V, all.first(static_cast<size_t>(r.prompt_len)), all.subspan(static_cast<size_t>(r.prompt_len)), &p);
      const int32_t tok = most_likely_ ? Sampler::argmax(p.data(), V)
                                       : static_cast<int32_t>(std::min_element(p.begin(), p.end()) - p.begin());
      expected_accepts_ += p[static_cast<size_t>(tok)] > typical_threshold(p, TypicalAcceptanceParams{});
      proposed_.push_back(tok);
      (*out)[i].tokens = {tok};
      if (as_tree_) (*out)[i].parents = {-1};
    }
    return Status();
  }
  int64_t expected_accepts() const { return expected_accepts_; }

 private:
  bool most_likely_, as_tree_;
  std::unique_ptr<KvStorage> kv_;
  int64_t expected_accepts_ = 0;
  std::vector<int32_t> proposed_;
};

/// `n` seeded temperature-1 requests of 3 tokens each: the prefill step samples token 0, the next
/// step verifies a one-token draft for token 1 and samples token 2.
RunResult sampled_runs(Proposer* p, const EngineOptions& o, int n) {
  std::mt19937 rng(21);
  std::vector<GenerateParams> reqs;
  for (int i = 0; i < n; ++i) {
    GenerateParams g;
    g.prompt = random_tokens(rng, 5 + i % 7, 512);
    g.max_tokens = 3;
    g.sampling.temperature = 1.0f;
    g.sampling.seed = 1000 + static_cast<uint64_t>(i);
    g.sampling.has_seed = true;
    reqs.push_back(g);
  }
  RunResult r = run_engine(target(), nullptr, p, o, reqs);
  EXPECT_EQ(r.final_blocks_used, 0);
  for (const auto& rr : r.requests) EXPECT_EQ(rr.tokens.size(), 3u);
  return r;
}

TEST(TreeEngine, TypicalAcceptanceFollowsItsThresholdAndIsLossy) {
  const int n = 200;
  EngineOptions lossless = spec_options(1, 16);
  EngineOptions typical = lossless;
  typical.typical_acceptance = true;  // Medusa's defaults: 0.09, 0.3
  EngineOptions any = typical;        // threshold 0: every token the target allows passes
  any.posterior_threshold = 1e-9f;
  any.posterior_alpha = 0.0f;
  for (bool as_tree : {true, false}) {
    const std::string where = as_tree ? "one-node tree" : "one-token chain";
    {
      ArgProposer top(true, as_tree);
      const RunResult r = sampled_runs(&top, typical, n);
      EXPECT_EQ(r.stats.spec.num_drafts, n) << where;
      EXPECT_EQ(r.stats.spec.num_accepted_tokens, top.expected_accepts()) << where << ": the argmax passes exactly when above the threshold";
      EXPECT_GT(top.expected_accepts(), n / 4) << where << ": premise: the argmax often passes";
    }
    {
      ArgProposer low(false, as_tree);
      const RunResult r = sampled_runs(&low, typical, n);
      EXPECT_EQ(low.expected_accepts(), 0) << where << ": premise";
      EXPECT_EQ(r.stats.spec.num_accepted_tokens, 0) << where << ": the least likely token never passes";
    }
    {
      // Lossy: with a zero threshold the least likely token is always taken, which lossless
      // verification (almost) never does.
      ArgProposer low(false, as_tree);
      const RunResult r = sampled_runs(&low, any, n);
      EXPECT_EQ(r.stats.spec.num_accepted_tokens, n) << where;
      ArgProposer low2(false, as_tree);
      const RunResult r2 = sampled_runs(&low2, lossless, n);
      EXPECT_LE(r2.stats.spec.num_accepted_tokens, 2) << where;
    }
  }
}

TEST(TreeEngine, TypicalAcceptanceLeavesGreedyAlone) {
  auto p = oracle(default_medusa_tree(12), 0.2, 3);
  EngineOptions o = spec_options(12, 4);
  o.typical_acceptance = true;
  const RunResult got = run_engine(target(), tokenizer(), p.get(), o, requests());
  expect_same_outputs(got, reference(), "typical acceptance, greedy requests");
  EXPECT_GT(got.stats.spec.num_accepted_tokens, got.stats.spec.num_drafts);
}

TEST(TreeEngine, TypicalAcceptanceOptionsAreValidated) {
  EngineOptions o;
  o.posterior_threshold = 0.0f;
  EXPECT_NE(o.validate().message().find("posterior_threshold = 0"), std::string::npos) << o.validate().message();
  o.posterior_threshold = 1.5f;
  EXPECT_FALSE(o.validate().ok());
  o.posterior_threshold = 0.09f;
  o.posterior_alpha = -0.1f;
  EXPECT_NE(o.validate().message().find("posterior_alpha"), std::string::npos) << o.validate().message();
  o.posterior_alpha = 0.3f;
  EXPECT_TRUE(o.validate().ok());
}

}  // namespace
}  // namespace specserve
