// Statistical test of lossless speculative sampling over TOKEN TREES (multi-candidate
// recursive rejection sampling, SpecInfer / EAGLE; spec/tree_verify.h): at temperature 1 the
// tokens the engine emits with tree drafts follow the target's own distribution. Same method,
// model and threshold as spec_distribution_test.cpp (exact joint of the first three generated
// tokens, chi-square over pairs at 1 - 1e-6, cells with expected count < 5 pooled).
//
// Proposers, over the synthetic draft model (q differs from the target's p):
//  - top-k siblings (deterministic, like Medusa / EAGLE-2): the children of a vertex are the
//    draft's most likely tokens in rank order; no q is sent (one-hot), so siblings are verified
//    without replacement;
//  - sampled siblings (SpecInfer): each child drawn independently from the draft's q at its
//    parent, q sent with it.
// Power: the sampled-sibling counts are also tested against the draft's own distribution (what
// a verifier that accepted every first child would emit), and Medusa's typical acceptance
// (lossy) with the top-k proposer must fail the fit to the target. A verifier that does not
// update p to the residual after a rejected sibling fails both fits by far (chi-square
// ~3000 and ~2300 against thresholds of 352; checked by hand on 2026-12-01).
#include <gtest/gtest.h>

#include <map>
#include <numeric>
#include <random>

#include "spec/token_tree.h"
#include "tests/spec/spec_distribution_util.h"

namespace specserve {
namespace {

using namespace dist_testing;

// 7 nodes, depth 3: three root children, two under the first, one under the second, one deeper.
const char* kShape = "[(0,),(1,),(2,),(0,0),(0,1),(1,0),(0,0,0)]";

/// Drafts kShape from the synthetic draft model (see the file comment).
class DraftTreeProposer final : public Proposer {
 public:
  DraftTreeProposer(Transformer& draft, bool sampled, uint64_t seed) : draft_(draft), sampled_(sampled), rng_(seed) {
    shape_ = parse_token_tree(kShape).value();
    kv_ = draft_.create_kv(4, 16).value();
  }
  std::string name() const override { return sampled_ ? "tree_sampled" : "tree_topk"; }
  Status propose(const std::vector<DraftRequest>& reqs, std::vector<DraftTree>* out) override {
    out->assign(reqs.size(), DraftTree{});
    for (size_t i = 0; i < reqs.size(); ++i) {
      const DraftRequest& r = reqs[i];
      const TokenTree t = trim_token_tree(shape_, r.num_tokens);
      DraftTree& d = (*out)[i];
      std::map<int32_t, std::vector<float>> q_at;  // vertex -> the draft's q after it
      std::map<int32_t, std::vector<int32_t>> order_at;
      for (int32_t c = 0; c < t.num_nodes(); ++c) {
        const int32_t par = t.parents[static_cast<size_t>(c)];
        if (!q_at.count(par)) {
          Tokens ctx(r.tokens.begin(), r.tokens.end());
          for (int32_t a = par; a >= 0; a = t.parents[static_cast<size_t>(a)]) ctx.insert(ctx.begin() + static_cast<std::ptrdiff_t>(r.tokens.size()), d.tokens[static_cast<size_t>(a)]);
          std::vector<double> qd = next_token_probs_on(ctx);
          std::vector<float> q(qd.begin(), qd.end());
          std::vector<int32_t> order(q.size());
          std::iota(order.begin(), order.end(), 0);
          std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return q[static_cast<size_t>(a)] > q[static_cast<size_t>(b)]; });
          q_at[par] = q;
          order_at[par] = order;
        }
        int32_t tok;
        if (sampled_) {
          const auto& q = q_at[par];
          tok = std::discrete_distribution<int32_t>(q.begin(), q.end())(rng_);
          d.probs.push_back(q);
        } else {
          tok = order_at[par][static_cast<size_t>(t.rank(c))];
        }
        d.tokens.push_back(tok);
        d.parents.push_back(par);
      }
    }
    return Status();
  }

 private:
  /// softmax of the draft's logits after ctx (its own small cache, recomputed each call).
  std::vector<double> next_token_probs_on(const Tokens& ctx) {
    ForwardBatch b;
    SequenceInput in;
    in.tokens = ctx;
    for (int32_t blk = 0; blk * 16 < static_cast<int32_t>(ctx.size()); ++blk) in.block_table.push_back(blk);
    b.seqs.push_back(in);
    ForwardOutput out;
    Status st = draft_.forward(b, *kv_, &out);
    EXPECT_TRUE(st.ok()) << st.to_string();
    const float* row = out.row(0, 0);
    const double mx = *std::max_element(row, row + kVocab);
    std::vector<double> p(kVocab);
    double sum = 0;
    for (int32_t v = 0; v < kVocab; ++v) sum += p[static_cast<size_t>(v)] = std::exp(row[v] - mx);
    for (double& x : p) x /= sum;
    return p;
  }

  Transformer& draft_;
  bool sampled_;
  std::mt19937_64 rng_;
  TokenTree shape_;
  std::unique_ptr<KvStorage> kv_;
};

constexpr int32_t kNodes = 7;
// NOTE: max_tokens kNodes + 2: an admitted sequence's first step samples token 0 without drafts
// (spec/step_policy.h rule 2), and k <= output tokens left - 1, so the second step gets the
// whole tree: token 1 comes from the tree's verification, token 2 from it or the next step.

TEST(TreeDistribution, TopKSiblingsMatchTarget) {
  DraftTreeProposer p(*models().draft.model, false, 1);
  SpecStats spec;
  const auto runs = sample_runs(&p, kNodes, kShortPrompt, kN, 20000000, &spec, kNodes + 2);
  const std::string where = "tree top-k siblings (7 nodes)";
  expect_fits(pair_counts(runs, 0), pair_marginal(short_joint(), 0), where + ", tokens 0-1");
  expect_fits(pair_counts(runs, 1), pair_marginal(short_joint(), 1), where + ", tokens 1-2");
  EXPECT_GE(spec.num_drafts, kN);
  EXPECT_GT(spec.mean_acceptance_length(), 1.25) << where << ": siblings should be accepted often";
  std::printf("[ tree     ] accepted by depth:");
  for (auto a : spec.accepted_per_pos) std::printf(" %lld", static_cast<long long>(a));
  std::printf(" of %lld drafts\n", static_cast<long long>(spec.num_drafts));
  ASSERT_GE(spec.accepted_per_pos.size(), 3u);
  EXPECT_GT(spec.accepted_per_pos[1], spec.num_drafts / 50) << where << ": depth 2 is reached";
  EXPECT_GT(spec.accepted_per_pos[2], 20) << where << ": depth 3 is reached";
}

TEST(TreeDistribution, SampledSiblingsMatchTarget) {
  DraftTreeProposer p(*models().draft.model, true, 2);
  SpecStats spec;
  const auto runs = sample_runs(&p, kNodes, kShortPrompt, kN, 30000000, &spec, kNodes + 2);
  const std::string where = "tree sampled siblings (7 nodes)";
  expect_fits(pair_counts(runs, 0), pair_marginal(short_joint(), 0), where + ", tokens 0-1");
  expect_fits(pair_counts(runs, 1), pair_marginal(short_joint(), 1), where + ", tokens 1-2");
  EXPECT_GT(spec.mean_acceptance_length(), 1.25) << where;
  const std::vector<double> draft_pair = pair_marginal(exact_joint(*models().draft.model, kShortPrompt), 0);
  const ChiSquare vs_draft = chi_square(pair_counts(runs, 0), draft_pair);
  EXPECT_GT(vs_draft.stat, vs_draft.threshold) << where << ": the samples also fit the draft; the test has no power";
}

TEST(TreeDistribution, TypicalAcceptanceIsLossyAndTheTestSeesIt) {
  // Medusa's typical acceptance accepts a draft token whenever the target gives it more than a
  // threshold, so the draft's likely tokens are over-represented: the fit to the target fails.
  DraftTreeProposer p(*models().draft.model, false, 3);
  std::vector<GenerateParams> reqs(static_cast<size_t>(kN));
  for (int i = 0; i < kN; ++i) {
    GenerateParams& g = reqs[static_cast<size_t>(i)];
    g.prompt = kShortPrompt;
    g.max_tokens = kNodes + 2;
    g.sampling.temperature = 1.0f;
    g.sampling.seed = 40000000 + static_cast<uint64_t>(i);
    g.sampling.has_seed = true;
  }
  EngineOptions o;
  o.max_num_seqs = 64;
  o.num_kv_blocks = 64 * 4;
  o.num_speculative_tokens = kNodes;
  o.typical_acceptance = true;
  RunResult r = run_engine(*models().target.model, nullptr, &p, o, reqs);
  EXPECT_EQ(r.final_blocks_used, 0);
  std::vector<Tokens> runs;
  for (const auto& rr : r.requests) runs.push_back(rr.tokens);
  const ChiSquare c = chi_square(pair_counts(runs, 0), pair_marginal(short_joint(), 0));
  std::printf("[ chi2     ] %-44s stat %7.1f  df %3d  threshold %6.1f (must exceed)\n", "typical acceptance, tokens 0-1", c.stat, c.df,
              c.threshold);
  EXPECT_GT(c.stat, c.threshold) << "typical acceptance (lossy) fits the target: the test cannot tell lossy from lossless";
}

}  // namespace
}  // namespace specserve
