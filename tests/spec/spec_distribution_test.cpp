// Statistical test of lossless speculative sampling (DESIGN.md section 4; Leviathan et al. 2023,
// Chen et al. 2023): at temperature 1 the tokens the engine emits with speculation follow the
// target's own distribution.
//
// Model: a synthetic llama with a 16-token vocabulary and small logits (logit_scale 1), so every
// token has a fair probability. The exact target distribution of the first three generated
// tokens is computed by running the model on every prefix (1 + 16 + 256 forward passes) and
// taking the softmax in double. The engine then generates from N seeds and a chi-square
// goodness-of-fit test compares the counts of a pair of generated tokens (256 cells) with the
// exact pair distribution.
//
// Threshold: the chi-square quantile at 1 - 1e-6 for the degrees of freedom left after merging
// cells whose expected count is below 5 (the usual validity rule for the chi-square
// approximation). The quantile uses the Wilson–Hilferty approximation
//   chi2_q(df) ~= df * (1 - 2/(9 df) + z_q * sqrt(2/(9 df)))^3,   z_q = Phi^-1(q),
// which for df >= 100 is within 0.2% of the exact quantile even this far in the tail (checked
// against mpmath below); z_q is
// found by bisection on erfc. So a correct engine fails one check with probability ~1e-6 (the
// seeds are fixed, so in practice each run draws the same samples and gives the same result).
// To show the test has power, the same counts are also tested against the *draft's*
// distribution, which a verifier that accepted every draft token would produce; that must fail.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "spec/engine.h"
#include "spec/model_drafter.h"
#include "spec/ngram_proposer.h"
#include "tests/spec/spec_test_util.h"

namespace specserve {
namespace {

using namespace spec_testing;
using Tokens = std::vector<int32_t>;

constexpr int32_t kVocab = 16;
constexpr int kDepth = 3;                 // exact distribution of the first 3 generated tokens
constexpr double kFalseFailure = 1e-6;

SyntheticModelSpec tiny_spec() {
  SyntheticModelSpec s;
  s.name = "spec-distribution-target";
  s.num_layers = 2;
  s.hidden_size = 32;
  s.num_heads = 2;
  s.num_kv_heads = 1;
  s.ffn_size = 64;
  s.vocab_size = kVocab;
  s.context_length = 64;
  s.residual_scale = 0.6f;
  s.logit_scale = 1.0f;  // spread distribution: max p ~ 0.2-0.3
  s.seed = 4242;
  return s;
}

struct Models {
  LoadedModel target, draft;
};

Models& models() {
  static Models* m = [] {
    auto* ms = new Models;
    ms->target = make_target(tiny_spec(), "dist_target");
    SyntheticDraftSpec d;
    d.num_layers = 1;
    d.noise = 0.3f;  // q clearly differs from p: rejections and recovered tokens happen
    d.noise_seed = 9;
    ms->draft = make_draft(tiny_spec(), d, "dist_draft");
    return ms;
  }();
  return *m;
}

// ---- exact distributions --------------------------------------------------------------------

/// softmax (double) of `model`'s logits after `prefix`.
std::vector<double> next_token_probs(Transformer& model, const Tokens& prefix) {
  static std::unique_ptr<KvStorage> kv;
  static Transformer* kv_owner = nullptr;
  const int64_t bs = 16;
  if (kv_owner != &model) {
    kv = model.create_kv(8, bs).value();
    kv_owner = &model;
  }
  ForwardBatch b;
  SequenceInput in;
  in.tokens = prefix;
  for (int32_t i = 0; i * bs < static_cast<int64_t>(prefix.size()); ++i) in.block_table.push_back(i);
  b.seqs.push_back(in);
  ForwardOutput out;
  Status st = model.forward(b, *kv, &out);
  EXPECT_TRUE(st.ok()) << st.to_string();
  const float* row = out.row(0, 0);
  const double mx = *std::max_element(row, row + kVocab);
  std::vector<double> p(kVocab);
  double sum = 0;
  for (int32_t t = 0; t < kVocab; ++t) sum += p[t] = std::exp(row[t] - mx);
  for (double& x : p) x /= sum;
  return p;
}

/// P(first kDepth generated tokens = (t0, t1, t2)), indexed t0 * V^2 + t1 * V + t2.
std::vector<double> exact_joint(Transformer& model, const Tokens& prompt) {
  std::vector<double> joint(static_cast<size_t>(kVocab * kVocab * kVocab));
  const std::vector<double> p0 = next_token_probs(model, prompt);
  for (int32_t a = 0; a < kVocab; ++a) {
    Tokens pa = prompt;
    pa.push_back(a);
    const std::vector<double> p1 = next_token_probs(model, pa);
    for (int32_t b = 0; b < kVocab; ++b) {
      Tokens pb = pa;
      pb.push_back(b);
      const std::vector<double> p2 = next_token_probs(model, pb);
      for (int32_t c = 0; c < kVocab; ++c) joint[static_cast<size_t>((a * kVocab + b) * kVocab + c)] = p0[a] * p1[b] * p2[c];
    }
  }
  return joint;
}

/// Marginal of generated tokens (i, i + 1), i in {0, 1}: [V * V].
std::vector<double> pair_marginal(const std::vector<double>& joint, int i) {
  std::vector<double> m(static_cast<size_t>(kVocab * kVocab), 0.0);
  for (int32_t a = 0; a < kVocab; ++a)
    for (int32_t b = 0; b < kVocab; ++b)
      for (int32_t c = 0; c < kVocab; ++c) {
        const double p = joint[static_cast<size_t>((a * kVocab + b) * kVocab + c)];
        m[static_cast<size_t>(i == 0 ? a * kVocab + b : b * kVocab + c)] += p;
      }
  return m;
}

// ---- chi-square -------------------------------------------------------------------------------

/// z with P(N(0,1) > z) = tail, by bisection on erfc (monotone; 200 halvings are exact to double).
double normal_upper_quantile(double tail) {
  double lo = 0, hi = 40;
  for (int i = 0; i < 200; ++i) {
    const double mid = 0.5 * (lo + hi);
    (0.5 * std::erfc(mid / std::sqrt(2.0)) > tail ? lo : hi) = mid;
  }
  return 0.5 * (lo + hi);
}

/// Wilson–Hilferty approximation of the chi-square quantile with `df` degrees of freedom at 1 - tail.
double chi2_upper_quantile(int df, double tail) {
  const double z = normal_upper_quantile(tail);
  const double a = 2.0 / (9.0 * df);
  return df * std::pow(1.0 - a + z * std::sqrt(a), 3.0);
}

struct ChiSquare {
  double stat = 0;
  int df = 0;
  double threshold = 0;
};

/// Pearson's chi-square of `counts` against `probs`, cells with expected < 5 pooled into one
/// (itself merged with the next-smallest cell while below 5).
ChiSquare chi_square(const std::vector<int64_t>& counts, const std::vector<double>& probs) {
  const double n = static_cast<double>(std::accumulate(counts.begin(), counts.end(), int64_t{0}));
  std::vector<size_t> order(counts.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return probs[a] < probs[b]; });
  std::vector<std::pair<double, double>> cells;  // (observed, expected)
  double pool_o = 0, pool_e = 0;
  size_t i = 0;
  for (; i < order.size() && (pool_e + n * probs[order[i]] < 5.0 || n * probs[order[i]] < 5.0); ++i) {
    pool_o += static_cast<double>(counts[order[i]]);
    pool_e += n * probs[order[i]];
  }
  if (pool_e > 0 || pool_o > 0) cells.push_back({pool_o, pool_e});
  for (; i < order.size(); ++i) cells.push_back({static_cast<double>(counts[order[i]]), n * probs[order[i]]});
  ChiSquare r;
  for (const auto& [o, e] : cells) {
    if (e <= 0) {
      r.stat = o > 0 ? INFINITY : r.stat;  // a sample where the target has probability 0
      continue;
    }
    r.stat += (o - e) * (o - e) / e;
  }
  r.df = static_cast<int>(cells.size()) - 1;
  r.threshold = chi2_upper_quantile(r.df, kFalseFailure);
  return r;
}

TEST(ChiSquareQuantile, MatchesTables) {
  // Reference values from mpmath (regularised upper incomplete gamma solved for 1e-6):
  //   python3 -c "import mpmath as m; print(m.findroot(lambda x: m.gammainc(df/2, x/2, m.inf,
  //   regularized=True) - 1e-6, df + 70))"   -> df 100: 182.1268, df 255: 377.0781
  // and z = sqrt(2) * erfinv(1 - 2e-6) = 4.753424309. Wilson–Hilferty is within 0.2% here.
  EXPECT_NEAR(normal_upper_quantile(1e-6), 4.753424309, 1e-8);
  EXPECT_NEAR(chi2_upper_quantile(100, 1e-6), 182.1268, 182.1268 * 0.002);
  EXPECT_NEAR(chi2_upper_quantile(255, 1e-6), 377.0781, 377.0781 * 0.001);
  // A perfect fit passes, a gross misfit fails.
  std::vector<double> p(100, 0.01);
  std::vector<int64_t> c(100, 100);
  EXPECT_LT(chi_square(c, p).stat, 1e-9);
  c[0] = 300;
  c[1] = 0;
  const ChiSquare bad = chi_square(c, p);
  EXPECT_GT(bad.stat, bad.threshold);
}

// ---- the engine, sampling ------------------------------------------------------------------

/// Runs `n` seeded temperature-1 requests of `prompt` and returns the first kDepth tokens of each.
std::vector<Tokens> sample_runs(Proposer* proposer, int32_t k, const Tokens& prompt, int n, uint64_t seed0, SpecStats* spec) {
  std::vector<GenerateParams> reqs(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    GenerateParams& p = reqs[static_cast<size_t>(i)];
    p.prompt = prompt;
    p.max_tokens = std::max(kDepth, k + 1);  // the first speculative block is a full k long
    p.sampling.temperature = 1.0f;
    p.sampling.seed = seed0 + static_cast<uint64_t>(i);
    p.sampling.has_seed = true;
  }
  EngineOptions o;
  o.max_num_seqs = 64;
  o.num_kv_blocks = 64 * 4;  // 64 tokens per sequence: no preemption
  o.num_speculative_tokens = k;
  o.adaptive_k = false;
  RunResult r = run_engine(*models().target.model, nullptr, proposer, o, reqs);
  std::vector<Tokens> out;
  for (const RequestResult& rr : r.requests) {
    EXPECT_GE(rr.tokens.size(), static_cast<size_t>(kDepth));
    out.push_back(rr.tokens);
  }
  EXPECT_EQ(r.final_blocks_used, 0);
  if (spec) *spec = r.stats.spec;
  return out;
}

std::vector<int64_t> pair_counts(const std::vector<Tokens>& runs, int i) {
  std::vector<int64_t> c(static_cast<size_t>(kVocab * kVocab), 0);
  for (const Tokens& t : runs) {
    if (t.size() < static_cast<size_t>(i + 2)) continue;
    ++c[static_cast<size_t>(t[static_cast<size_t>(i)] * kVocab + t[static_cast<size_t>(i + 1)])];
  }
  return c;
}

void expect_fits(const std::vector<int64_t>& counts, const std::vector<double>& probs, const std::string& where) {
  const ChiSquare c = chi_square(counts, probs);
  EXPECT_LT(c.stat, c.threshold) << where << ": chi-square " << c.stat << " with " << c.df
                                 << " df exceeds the 1 - 1e-6 quantile " << c.threshold;
  EXPECT_GT(c.df, 100) << where << ": too few cells left after merging; raise N";
  std::printf("[ chi2     ] %-44s stat %7.1f  df %3d  threshold %6.1f\n", where.c_str(), c.stat, c.df, c.threshold);
}

constexpr int kN = 16000;  // samples per configuration

// One-token prompt: the very first decode step speculates, so generated tokens 0 and 1 are the
// draft's positions 0 and 1 (k >= 2), or position 0 and the bonus token (k = 1).
const Tokens kShortPrompt = {5};

const std::vector<double>& short_joint() {
  static const std::vector<double> j = exact_joint(*models().target.model, kShortPrompt);
  return j;
}

TEST(SpecDistribution, ExactDistributionIsSpread) {
  const std::vector<double> m = pair_marginal(short_joint(), 0);
  EXPECT_NEAR(std::accumulate(m.begin(), m.end(), 0.0), 1.0, 1e-9);
  EXPECT_LT(*std::max_element(m.begin(), m.end()), 0.05) << "the pair distribution is too peaked for a useful test";
  const std::vector<double> p0 = next_token_probs(*models().target.model, kShortPrompt);
  EXPECT_LT(*std::max_element(p0.begin(), p0.end()), 0.4);
}

TEST(SpecDistribution, PlainSamplingControl) {
  const auto runs = sample_runs(nullptr, 0, kShortPrompt, kN, 1, nullptr);
  expect_fits(pair_counts(runs, 0), pair_marginal(short_joint(), 0), "no speculation, tokens 0-1");
  expect_fits(pair_counts(runs, 1), pair_marginal(short_joint(), 1), "no speculation, tokens 1-2");
}

std::unique_ptr<Proposer> draft_proposer() {
  auto d = ModelDrafter::create(*models().draft.model, DrafterOptions{});
  EXPECT_TRUE(d.ok());
  return d.ok() ? std::move(*d) : nullptr;
}

TEST(SpecDistribution, DraftModelMatchesTarget) {
  // The draft's own distribution of the pair: what a verifier that accepted every draft token
  // would emit. The engine's counts must fit the target and not the draft.
  const std::vector<double> draft_pair = pair_marginal(exact_joint(*models().draft.model, kShortPrompt), 0);
  for (int32_t k : {1, 2, 4}) {
    auto proposer = draft_proposer();
    SpecStats spec;
    const auto runs = sample_runs(proposer.get(), k, kShortPrompt, kN, 100000 * static_cast<uint64_t>(k), &spec);
    const std::string where = "draft_model k=" + std::to_string(k);
    expect_fits(pair_counts(runs, 0), pair_marginal(short_joint(), 0), where + ", tokens 0-1");
    expect_fits(pair_counts(runs, 1), pair_marginal(short_joint(), 1), where + ", tokens 1-2");
    // Speculation really happened, with both acceptances and rejections.
    EXPECT_GT(spec.num_accepted_tokens, spec.num_draft_tokens / 10) << where;
    EXPECT_LT(spec.num_accepted_tokens, spec.num_draft_tokens * 9 / 10) << where;
    const ChiSquare vs_draft = chi_square(pair_counts(runs, 0), draft_pair);
    EXPECT_GT(vs_draft.stat, vs_draft.threshold) << where << ": the samples also fit the draft; the test has no power";
  }
}

TEST(SpecDistribution, SparseDraftModelMatchesTarget) {
  // The drafter truncates q to its top entries (at most 4 of 16, 80% of the mass) before drawing
  // its token, as a draft worker in another process does (DrafterOptions::sparse_*): the proposal
  // changes, the output distribution must not. Power: a drafter that drew from the full q and
  // truncated only the q it reports (lossy) fails this test (chi-square ~600 against 352).
  DrafterOptions o;
  o.sparse_keep_mass = 0.8;
  o.sparse_max_entries = 4;
  auto d = ModelDrafter::create(*models().draft.model, o);
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  const int32_t k = 2;
  SpecStats spec;
  const auto runs = sample_runs(d->get(), k, kShortPrompt, kN, 3000000, &spec);
  const std::string where = "sparse draft_model k=2 (mass 0.8, <= 4 ids)";
  expect_fits(pair_counts(runs, 0), pair_marginal(short_joint(), 0), where + ", tokens 0-1");
  expect_fits(pair_counts(runs, 1), pair_marginal(short_joint(), 1), where + ", tokens 1-2");
  EXPECT_GT(spec.num_accepted_tokens, spec.num_draft_tokens / 10) << where;
  EXPECT_LT(spec.num_accepted_tokens, spec.num_draft_tokens * 9 / 10) << where;
}

TEST(SpecDistribution, NgramMatchesTarget) {
  // Every token appears in the prompt, so after the first generated token the n-gram lookup
  // always proposes (q one-hot): tokens 1 and 2 are draft positions 0 and 1.
  Tokens prompt;
  for (int32_t t = 0; t < kVocab; ++t) prompt.push_back((t * 7 + 3) % kVocab);
  const std::vector<double> joint = exact_joint(*models().target.model, prompt);
  for (int32_t k : {2, 4}) {
    NgramProposer ngram(1, 3);
    SpecStats spec;
    const auto runs = sample_runs(&ngram, k, prompt, kN, 7000000 + 100000 * static_cast<uint64_t>(k), &spec);
    const std::string where = "ngram k=" + std::to_string(k);
    expect_fits(pair_counts(runs, 0), pair_marginal(joint, 0), where + ", tokens 0-1");
    expect_fits(pair_counts(runs, 1), pair_marginal(joint, 1), where + ", tokens 1-2");
    EXPECT_GE(spec.num_drafts, kN) << where << ": the n-gram proposer should draft for every request";
    EXPECT_GT(spec.num_accepted_tokens, 0) << where;
  }
}

}  // namespace
}  // namespace specserve
