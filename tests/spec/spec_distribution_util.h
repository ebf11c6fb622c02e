// Helpers of the statistical tests of lossless speculative sampling (spec_distribution_test.cpp
// for chains, tree_distribution_test.cpp for token trees): a tiny synthetic target with a
// spread distribution, the exact distribution of its first generated tokens, Pearson's
// chi-square with a 1 - 1e-6 threshold, and a driver that samples through the Engine. The
// method is described in spec_distribution_test.cpp.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <string>
#include <vector>

#include "spec/engine.h"
#include "tests/spec/spec_test_util.h"

namespace specserve::dist_testing {

using namespace spec_testing;
using Tokens = std::vector<int32_t>;

inline constexpr int32_t kVocab = 16;
inline constexpr int kDepth = 3;                 // exact distribution of the first 3 generated tokens
inline constexpr double kFalseFailure = 1e-6;

inline SyntheticModelSpec tiny_spec() {
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

inline Models& models() {
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
inline std::vector<double> next_token_probs(Transformer& model, const Tokens& prefix) {
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
inline std::vector<double> exact_joint(Transformer& model, const Tokens& prompt) {
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
inline std::vector<double> pair_marginal(const std::vector<double>& joint, int i) {
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
inline double normal_upper_quantile(double tail) {
  double lo = 0, hi = 40;
  for (int i = 0; i < 200; ++i) {
    const double mid = 0.5 * (lo + hi);
    (0.5 * std::erfc(mid / std::sqrt(2.0)) > tail ? lo : hi) = mid;
  }
  return 0.5 * (lo + hi);
}

/// Wilson–Hilferty approximation of the chi-square quantile with `df` degrees of freedom at 1 - tail.
inline double chi2_upper_quantile(int df, double tail) {
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
inline ChiSquare chi_square(const std::vector<int64_t>& counts, const std::vector<double>& probs) {
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

// ---- the engine, sampling ------------------------------------------------------------------

/// Runs `n` seeded temperature-1 requests of `prompt` and returns the first kDepth tokens of each.
/// `max_tokens` 0: max(kDepth, k + 1), so the first speculative block is a full k long.
inline std::vector<Tokens> sample_runs(Proposer* proposer, int32_t k, const Tokens& prompt, int n, uint64_t seed0, SpecStats* spec,
                                int32_t max_tokens = 0) {
  std::vector<GenerateParams> reqs(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    GenerateParams& p = reqs[static_cast<size_t>(i)];
    p.prompt = prompt;
    p.max_tokens = max_tokens > 0 ? max_tokens : std::max(kDepth, k + 1);
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

inline std::vector<int64_t> pair_counts(const std::vector<Tokens>& runs, int i) {
  std::vector<int64_t> c(static_cast<size_t>(kVocab * kVocab), 0);
  for (const Tokens& t : runs) {
    if (t.size() < static_cast<size_t>(i + 2)) continue;
    ++c[static_cast<size_t>(t[static_cast<size_t>(i)] * kVocab + t[static_cast<size_t>(i + 1)])];
  }
  return c;
}

inline void expect_fits(const std::vector<int64_t>& counts, const std::vector<double>& probs, const std::string& where) {
  const ChiSquare c = chi_square(counts, probs);
  EXPECT_LT(c.stat, c.threshold) << where << ": chi-square " << c.stat << " with " << c.df
                                 << " df exceeds the 1 - 1e-6 quantile " << c.threshold;
  EXPECT_GT(c.df, 100) << where << ": too few cells left after merging; raise N";
  std::printf("[ chi2     ] %-44s stat %7.1f  df %3d  threshold %6.1f\n", where.c_str(), c.stat, c.df, c.threshold);
}

inline constexpr int kN = 16000;  // samples per configuration

// One-token prompt: the very first decode step speculates, so generated tokens 0 and 1 are the
// draft's positions 0 and 1 (k >= 2), or position 0 and the bonus token (k = 1).
inline const Tokens kShortPrompt = {5};

inline const std::vector<double>& short_joint() {
  static const std::vector<double> j = exact_joint(*models().target.model, kShortPrompt);
  return j;
}


}  // namespace specserve::dist_testing
