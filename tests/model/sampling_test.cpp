// Tests for model/sampling.h: greedy, temperature, top-k / top-p / min-p exactness on small
// vocabularies, seeds, penalties, logprobs and parameter validation. Every random check uses a
// fixed seed, so each run draws the same numbers.
#include "model/sampling.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

namespace specserve {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

SamplingParams seeded(uint64_t seed = 1234) {
  SamplingParams p;
  p.seed = seed;
  p.has_seed = true;
  return p;
}

std::vector<float> probs_of(const SamplingParams& params, const std::vector<float>& logits,
                            std::vector<int32_t> prompt = {}, std::vector<int32_t> output = {}) {
  Sampler s(params);
  std::vector<float> probs;
  s.compute_probs(logits.data(), static_cast<int32_t>(logits.size()), prompt, output, &probs);
  return probs;
}

// Logits whose softmax (temperature 1) is exactly `p` up to rounding.
std::vector<float> log_of(const std::vector<double>& p) {
  std::vector<float> out;
  for (double x : p) out.push_back(static_cast<float>(std::log(x)));
  return out;
}

std::vector<double> softmax(const std::vector<float>& logits, double temperature) {
  double m = *std::max_element(logits.begin(), logits.end());
  std::vector<double> p;
  double sum = 0;
  for (float l : logits) {
    p.push_back(std::exp((l - m) / temperature));
    sum += p.back();
  }
  for (double& x : p) x /= sum;
  return p;
}

void expect_probs(const std::vector<float>& got, const std::vector<double>& want, double tol = 1e-6) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], tol) << "token " << i;
}

// --- greedy -----------------------------------------------------------------------------------

TEST(Sampling, ArgmaxTiesGoToLowestId) {
  std::vector<float> l = {1.0f, 3.0f, -2.0f, 3.0f, 3.0f};
  EXPECT_EQ(Sampler::argmax(l.data(), 5), 1);
  std::vector<float> single = {-kInf};
  EXPECT_EQ(Sampler::argmax(single.data(), 1), 0);
}

TEST(Sampling, GreedyIsOneHotAndDrawsNoUniform) {
  SamplingParams p = seeded(7);
  p.temperature = 0.0f;
  std::vector<float> l = {0.5f, 2.0f, 2.0f, -1.0f};
  expect_probs(probs_of(p, l), {0, 1, 0, 0}, 0);

  Sampler s(p), fresh(p);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(s.sample(l.data(), 4, {}, {}).token, 1);
  // Greedy must not consume the RNG: the verifier relies on one seed giving one stream.
  EXPECT_EQ(s.next_uniform(), fresh.next_uniform());
}

// greedy_pick is what Backend::argmax_rows must give: the greedy sampler's token and logprob.
TEST(Sampling, RowPickIsTheGreedySamplersTokenAndLogprob) {
  SamplingParams p = seeded(3);
  p.temperature = 0.0f;
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.0f, 4.0f);
  for (int32_t n : {1, 7, 8, 1023, 1024, 1025, 49152}) {
    std::vector<float> l(static_cast<size_t>(n));
    for (float& x : l) x = nd(rng);
    if (n > 9) {  // an excluded token, and a tie at the maximum: the lower id wins
      l[3] = -kInf;
      const float mx = *std::max_element(l.begin(), l.end());
      l[static_cast<size_t>(n / 2)] = l[static_cast<size_t>(n - 2)] = mx + 1.0f;
    }
    Sampler s(p);
    const SampleResult want = s.sample(l.data(), n, {}, {});
    const RowPick got = greedy_pick(l.data(), n);
    EXPECT_EQ(got.token, want.token) << n;
    EXPECT_EQ(got.logprob, want.logprob) << n;  // the same normaliser, bit for bit
    // ... and the definition, in double.
    double z = 0;
    for (float x : l) z += std::exp(static_cast<double>(x) - l[static_cast<size_t>(got.token)]);
    EXPECT_NEAR(got.logprob, -std::log(z), 1e-5) << n;
  }
}

TEST(Sampling, RowPickRejectsRowsThatCannotBeSampled) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (const std::vector<float>& l : std::vector<std::vector<float>>{
           {0.0f, nan, 1.0f}, {0.0f, kInf, 1.0f}, {-kInf, -kInf}, {nan}}) {
    const RowPick g = greedy_pick(l.data(), static_cast<int32_t>(l.size()));
    EXPECT_EQ(g.token, -1);
    EXPECT_EQ(g.logprob, 0.0f);
  }
  const std::vector<float> tie = {-kInf, 2.0f, 2.0f};
  const RowPick g = greedy_pick(tie.data(), 3);
  EXPECT_EQ(g.token, 1);
  EXPECT_NEAR(g.logprob, -std::log(2.0), 1e-7);
  EXPECT_EQ(log_sum_exp(tie.data(), 1), -kInf);  // no finite value: the max comes back
}

// temperature_pick is what Backend::sample_rows must give: the token Sampler::sample draws for a
// temperature-only request when its next uniform is u, and that token's raw logprob.
TEST(Sampling, TemperaturePickIsTheSamplersDrawForItsUniform) {
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  int differ_from_argmax = 0;
  for (int32_t n : {2, 9, 1024, 1500, 49152}) {
    std::vector<float> l(static_cast<size_t>(n));
    for (float& x : l) x = nd(rng);
    if (n > 9) l[4] = -kInf;
    for (float t : {0.0f, 0.3f, 1.0f, 1.7f}) {
      for (uint64_t seed = 0; seed < 6; ++seed) {
        SamplingParams p = seeded(seed);
        p.temperature = t;
        Sampler draw(p), twin(p);
        const SampleResult want = draw.sample(l.data(), n, {}, {});
        const double u = t == 0.0f ? 0.0 : twin.next_uniform();  // greedy draws none
        const RowPick got = temperature_pick(l.data(), n, t, u);
        EXPECT_EQ(got.token, want.token) << "n " << n << " t " << t << " seed " << seed;
        EXPECT_EQ(got.logprob, want.logprob) << "n " << n << " t " << t << " seed " << seed;
        differ_from_argmax += got.token != Sampler::argmax(l.data(), n);
      }
    }
  }
  EXPECT_GT(differ_from_argmax, 20) << "the draws should not all be the argmax";
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> bad = {0.0f, nan};
  EXPECT_EQ(temperature_pick(bad.data(), 2, 1.0f, 0.5).token, -1);
}

// draw_inverse_cdf's chunked order: the token whose cumulative weight first exceeds u * total,
// across chunk boundaries, never a zero weight, and the last positive weight when u is at the top.
TEST(Sampling, DrawInverseCdfFollowsTheCumulativeWeights) {
  std::vector<float> p(3000, 0.0f);
  p[10] = 1.0f;
  p[1023] = 1.0f;  // last of chunk 0
  p[1024] = 2.0f;  // first of chunk 1
  p[2999] = 4.0f;  // the partial last chunk
  const double total = 8.0;
  EXPECT_EQ(draw_inverse_cdf(p.data(), p.size(), 0.0), 10);
  EXPECT_EQ(draw_inverse_cdf(p.data(), p.size(), 0.99 / total), 10);
  EXPECT_EQ(draw_inverse_cdf(p.data(), p.size(), 1.0 / total), 1023);
  EXPECT_EQ(draw_inverse_cdf(p.data(), p.size(), 2.5 / total), 1024);
  EXPECT_EQ(draw_inverse_cdf(p.data(), p.size(), 4.0 / total), 2999);
  EXPECT_EQ(draw_inverse_cdf(p.data(), p.size(), std::nextafter(1.0, 0.0)), 2999);
  // Against a plain running sum in double over many random rows (they may differ only where
  // rounding puts u * total on a boundary, which random draws do not hit).
  std::mt19937 rng(9);
  std::uniform_real_distribution<float> w(0.0f, 1.0f);
  std::uniform_real_distribution<double> ud(0.0, 1.0);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<float> q(1 + rng() % 5000);
    for (float& x : q) x = (rng() % 3 == 0) ? 0.0f : w(rng);
    q[rng() % q.size()] = 1.0f;
    const double u = ud(rng);
    double sum = 0;
    for (float x : q) sum += x;
    double cum = 0;
    int32_t want = -1;
    for (size_t i = 0; i < q.size() && want < 0; ++i) {
      cum += q[i];
      if (q[i] > 0 && cum > u * sum) want = static_cast<int32_t>(i);
    }
    const int32_t got = draw_inverse_cdf(q.data(), q.size(), u);
    EXPECT_EQ(got, want) << "trial " << trial;
    EXPECT_GT(q[static_cast<size_t>(got)], 0.0f);
  }
}

TEST(Sampling, TinyTemperatureIsGreedy) {
  SamplingParams p = seeded();
  p.temperature = 1e-6f;
  EXPECT_TRUE(p.is_greedy());
  expect_probs(probs_of(p, {0.0f, 0.1f, 0.05f}), {0, 1, 0}, 0);
}

// --- temperature ------------------------------------------------------------------------------

TEST(Sampling, TemperatureScalesSoftmax) {
  std::vector<float> l = {1.0f, 2.0f, 0.5f, -1.0f, 3.0f, -kInf};
  for (float t : {0.3f, 0.7f, 1.0f, 1.8f}) {
    SamplingParams p = seeded();
    p.temperature = t;
    std::vector<float> got = probs_of(p, l);
    expect_probs(got, softmax(l, t), 1e-6);
    EXPECT_EQ(got[5], 0.0f) << "-inf logit must get probability 0";
  }
}

TEST(Sampling, DrawsFollowTheDistributionChiSquare) {
  SamplingParams p = seeded(20240601);
  p.temperature = 0.7f;
  std::vector<float> l = {1.0f, 0.2f, -0.5f, 0.8f, 0.0f, 1.3f};
  std::vector<double> want = softmax(l, 0.7);
  Sampler s(p);
  constexpr int kDraws = 30000;
  std::vector<int> counts(l.size(), 0);
  for (int i = 0; i < kDraws; ++i) ++counts[s.sample(l.data(), 6, {}, {}).token];
  double chi2 = 0;
  for (size_t i = 0; i < l.size(); ++i) {
    double e = want[i] * kDraws;
    chi2 += (counts[i] - e) * (counts[i] - e) / e;
  }
  // 5 degrees of freedom: P(chi2 > 20.52) = 0.001. Deterministic given the seed.
  EXPECT_LT(chi2, 20.52);
}

// sample() draws from exactly the distribution compute_probs reports, with every filter on.
TEST(Sampling, SampleFollowsComputeProbsWithAllFilters) {
  SamplingParams p = seeded(777);
  p.temperature = 0.8f;
  p.top_k = 7;
  p.top_p = 0.9f;
  p.min_p = 0.05f;
  p.repetition_penalty = 1.3f;
  p.presence_penalty = 0.2f;
  std::vector<float> l = {1.2f, 0.4f, -0.3f, 0.9f, 1.5f, 0.0f, 0.7f, -1.0f, 1.1f, 0.2f};
  std::vector<int32_t> prompt = {4, 4, 2}, output = {0};
  Sampler s(p);
  std::vector<float> want;
  s.compute_probs(l.data(), 10, prompt, output, &want);
  double total = 0;
  int nonzero = 0;
  for (float x : want) {
    total += x;
    nonzero += x > 0;
  }
  EXPECT_NEAR(total, 1.0, 1e-6);
  ASSERT_GE(nonzero, 3);  // the filters must leave a real choice for the check to mean much
  ASSERT_LT(nonzero, 7);  // ... and must have removed something beyond top-k

  constexpr int kDraws = 30000;
  std::vector<int> counts(10, 0);
  for (int i = 0; i < kDraws; ++i) ++counts[s.sample(l.data(), 10, prompt, output).token];
  double chi2 = 0;
  for (int i = 0; i < 10; ++i) {
    if (want[i] == 0.0f) {
      EXPECT_EQ(counts[i], 0) << "filtered token " << i << " was drawn";
      continue;
    }
    double e = want[i] * kDraws;
    chi2 += (counts[i] - e) * (counts[i] - e) / e;
  }
  // At most 5 degrees of freedom here: P(chi2 > 20.52) = 0.001.
  EXPECT_LT(chi2, 20.52);
}

TEST(Sampling, SampleFromSkipsZerosAndAcceptsUnnormalisedWeights) {
  Sampler s(seeded(99));
  std::vector<float> w = {0.0f, 1.0f, 0.0f, 3.0f, 0.0f};
  int c1 = 0, c3 = 0;
  for (int i = 0; i < 8000; ++i) {
    int32_t t = s.sample_from(w);
    ASSERT_TRUE(t == 1 || t == 3) << t;
    (t == 1 ? c1 : c3)++;
  }
  EXPECT_NEAR(c1 / 8000.0, 0.25, 0.02);
}

// --- top-k / top-p / min-p ------------------------------------------------------------------

TEST(Sampling, TopKKeepsExactlyKWithLowIdTieBreak) {
  SamplingParams p = seeded();
  p.top_k = 2;
  // Three tokens tie at the maximum: the two lowest ids survive, equally likely.
  expect_probs(probs_of(p, {3.0f, 1.0f, 3.0f, 2.0f, 3.0f}), {0.5, 0, 0.5, 0, 0});

  p.top_k = 3;
  std::vector<float> l = {0.1f, 2.0f, -1.0f, 1.5f, 1.0f};
  std::vector<double> want = softmax({2.0f, 1.5f, 1.0f}, 1.0);
  expect_probs(probs_of(p, l), {0, want[0], 0, want[1], want[2]});

  p.top_k = 5;  // == vocab: off
  expect_probs(probs_of(p, l), softmax(l, 1.0));
  p.top_k = 100;  // > vocab: off
  expect_probs(probs_of(p, l), softmax(l, 1.0));
}

TEST(Sampling, TopPKeepsSmallestNucleus) {
  std::vector<float> l = log_of({0.1, 0.5, 0.05, 0.3, 0.05});
  SamplingParams p = seeded();

  p.top_p = 0.8f;  // 0.5 + 0.3 reaches 0.8 exactly: two tokens
  expect_probs(probs_of(p, l), {0, 0.625, 0, 0.375, 0});

  p.top_p = 0.81f;  // needs the 0.1 as well
  expect_probs(probs_of(p, l), {0.1 / 0.9, 0.5 / 0.9, 0, 0.3 / 0.9, 0});

  p.top_p = 0.5f;
  expect_probs(probs_of(p, l), {0, 1, 0, 0, 0});

  p.top_p = 0.01f;  // always at least the most likely token
  expect_probs(probs_of(p, l), {0, 1, 0, 0, 0});

  p.top_p = 0.93f;  // the two 0.05 tokens tie: the lower id (2) goes first
  expect_probs(probs_of(p, l), {0.1 / 0.95, 0.5 / 0.95, 0.05 / 0.95, 0.3 / 0.95, 0});
}

// Bug: a top_p below the nucleus slack (1e-6), e.g. 1e-9 from an HTTP request, kept no token at
// all and aborted the process ("sampling: all probabilities filtered out"): one request took the
// whole server down. The most likely token must survive, as for any small top_p.
TEST(Sampling, TopPBelowTheSlackKeepsTheMostLikelyToken) {
  std::vector<float> l = log_of({0.1, 0.5, 0.05, 0.3, 0.05});
  for (float top_p : {1e-6f, 1e-9f, 1e-30f, std::numeric_limits<float>::denorm_min()}) {
    SamplingParams p = seeded();
    p.top_p = top_p;
    ASSERT_TRUE(p.validate().ok()) << top_p;
    expect_probs(probs_of(p, l), {0, 1, 0, 0, 0});
    Sampler s(p);
    EXPECT_EQ(s.sample(l.data(), static_cast<int32_t>(l.size()), {}, {}).token, 1) << top_p;
  }
}

TEST(Sampling, TopPAppliesAfterTemperatureAndTopK) {
  std::vector<float> l = log_of({0.4, 0.3, 0.2, 0.1});
  SamplingParams p = seeded();
  p.top_k = 3;    // {0.4, 0.3, 0.2} -> {4/9, 3/9, 2/9}
  p.top_p = 0.7f; // 4/9 + 3/9 = 0.78 >= 0.7
  expect_probs(probs_of(p, l), {4.0 / 7, 3.0 / 7, 0, 0});

  p.top_k = -1;
  p.temperature = 0.5f;  // squares the ratios: {16, 9, 4, 1} / 30
  p.top_p = 0.8f;        // 16/30 + 9/30 = 0.833
  expect_probs(probs_of(p, l), {16.0 / 25, 9.0 / 25, 0, 0});
}

TEST(Sampling, MinPKeepsRelativeToMax) {
  std::vector<float> l = log_of({0.4, 0.3, 0.2, 0.1});
  SamplingParams p = seeded();
  p.min_p = 0.6f;  // threshold 0.24
  expect_probs(probs_of(p, l), {4.0 / 7, 3.0 / 7, 0, 0});
  p.min_p = 0.3f;  // threshold 0.12
  expect_probs(probs_of(p, l), {4.0 / 9, 3.0 / 9, 2.0 / 9, 0});
  p.min_p = 1.0f;  // only the maximum
  expect_probs(probs_of(p, l), {1, 0, 0, 0});
}

// The incremental nucleus (nth_element in growing chunks) against a full sort on a real vocab
// size, with a nucleus of thousands of tokens so several chunks are needed.
TEST(Sampling, TopPMatchesFullSortOnLargeVocab) {
  constexpr int32_t kVocab = 49152;
  std::mt19937 gen(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> l(kVocab);
  for (float& x : l) x = normal(gen);
  for (int i = 0; i < 50; ++i) l[gen() % kVocab] = l[gen() % kVocab];  // some exact ties

  for (float top_p : {0.05f, 0.5f, 0.9f, 0.99f}) {
    SamplingParams p = seeded();
    p.top_p = top_p;
    p.temperature = 0.8f;
    std::vector<float> got = probs_of(p, l);

    std::vector<double> full = softmax(l, 0.8);
    std::vector<int32_t> order(kVocab);
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
      return l[a] != l[b] ? l[a] > l[b] : a < b;
    });
    double cum = 0;
    size_t keep = 0;
    while (keep < order.size() && cum < top_p - 1e-6) cum += full[order[keep++]];
    ASSERT_GT(keep, 0u);
    std::vector<double> want(kVocab, 0.0);
    for (size_t i = 0; i < keep; ++i) want[order[i]] = full[order[i]] / cum;
    int32_t nonzero = 0;
    for (int32_t i = 0; i < kVocab; ++i) {
      if (got[i] > 0) ++nonzero;
      ASSERT_NEAR(got[i], want[i], 1e-6) << "top_p " << top_p << " token " << i;
    }
    EXPECT_EQ(nonzero, static_cast<int32_t>(keep)) << "top_p " << top_p;
  }
}

// --- seeds ------------------------------------------------------------------------------------

TEST(Sampling, SameSeedSameTokens) {
  std::vector<float> l = {0.3f, 0.1f, 0.5f, 0.2f, 0.4f, 0.0f, 0.25f, 0.35f};
  auto run = [&](SamplingParams p) {
    Sampler s(p);
    std::vector<int32_t> out;
    for (int i = 0; i < 200; ++i) out.push_back(s.sample(l.data(), 8, {}, out).token);
    return out;
  };
  SamplingParams a = seeded(42);
  a.top_k = 6;
  a.frequency_penalty = 0.1f;
  EXPECT_EQ(run(a), run(a));
  SamplingParams b = a;
  b.seed = 43;
  EXPECT_NE(run(a), run(b));
  SamplingParams unseeded = a;
  unseeded.has_seed = false;
  EXPECT_EQ(run(unseeded).size(), 200u);
}

TEST(Sampling, NextUniformIsInUnitInterval) {
  Sampler s(seeded(3));
  double sum = 0;
  for (int i = 0; i < 10000; ++i) {
    double u = s.next_uniform();
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    sum += u;
  }
  EXPECT_NEAR(sum / 10000, 0.5, 0.01);
}

// --- penalties --------------------------------------------------------------------------------

TEST(Sampling, RepetitionPenaltyCoversPromptAndOutputOncePerToken) {
  SamplingParams p = seeded();
  p.repetition_penalty = 2.0f;
  Sampler s(p);
  std::vector<float> l = {2.0f, -2.0f, 1.0f, 0.5f}, z;
  std::vector<int32_t> prompt = {0, 0}, output = {1, 1, 2};
  s.apply_penalties(l.data(), 4, prompt, output, &z);
  EXPECT_EQ(z, (std::vector<float>{1.0f, -4.0f, 0.5f, 0.5f}));
}

TEST(Sampling, FrequencyAndPresenceOverOutputOnly) {
  SamplingParams p = seeded();
  p.frequency_penalty = 0.5f;
  p.presence_penalty = 0.25f;
  Sampler s(p);
  std::vector<float> l = {2.0f, -2.0f, 1.0f, 0.5f}, z;
  std::vector<int32_t> prompt = {0, 3}, output = {1, 1, 2};
  s.apply_penalties(l.data(), 4, prompt, output, &z);
  // token 1: -2 - (0.5*2 + 0.25); token 2: 1 - (0.5 + 0.25); prompt tokens untouched.
  EXPECT_EQ(z, (std::vector<float>{2.0f, -3.25f, 0.25f, 0.5f}));

  p.frequency_penalty = -1.0f;  // negative values encourage repetition
  p.presence_penalty = 0.0f;
  Sampler s2(p);
  s2.apply_penalties(l.data(), 4, prompt, output, &z);
  EXPECT_EQ(z, (std::vector<float>{2.0f, 0.0f, 2.0f, 0.5f}));
}

TEST(Sampling, PenaltiesCombineRepetitionFirst) {
  SamplingParams p = seeded();
  p.repetition_penalty = 2.0f;
  p.frequency_penalty = 1.0f;
  Sampler s(p);
  std::vector<float> l = {3.0f, 1.0f}, z;
  std::vector<int32_t> output = {0};
  s.apply_penalties(l.data(), 2, {}, output, &z);
  EXPECT_EQ(z, (std::vector<float>{0.5f, 1.0f}));  // 3 / 2 - 1
}

TEST(Sampling, PenaltiesChangeTheGreedyChoice) {
  SamplingParams p = seeded();
  p.temperature = 0.0f;
  p.presence_penalty = 0.5f;
  Sampler s(p);
  std::vector<float> l = {3.0f, 2.9f};
  std::vector<int32_t> output = {0};
  EXPECT_EQ(s.sample(l.data(), 2, {}, {}).token, 0);
  EXPECT_EQ(s.sample(l.data(), 2, {}, output).token, 1);
  std::vector<float> probs;
  s.compute_probs(l.data(), 2, {}, output, &probs);
  EXPECT_EQ(probs, (std::vector<float>{0.0f, 1.0f}));
}

// --- logprobs ---------------------------------------------------------------------------------

TEST(Sampling, LogprobsAreRawSortedAndComplete) {
  std::vector<float> l = {0.5f, 2.0f, -1.0f, 2.0f, 1.0f};
  std::vector<double> raw = softmax(l, 1.0);
  SamplingParams p = seeded(11);
  p.logprobs = 5;
  p.temperature = 0.3f;         // must not change the reported logprobs
  p.repetition_penalty = 1.7f;  // nor must penalties
  Sampler s(p);
  std::vector<int32_t> prompt = {1};
  for (int i = 0; i < 20; ++i) {
    SampleResult r = s.sample(l.data(), 5, prompt, {});
    EXPECT_NEAR(r.logprob, std::log(raw[r.token]), 1e-5);
    ASSERT_EQ(r.top_logprobs.size(), 5u);
    std::vector<int32_t> ids;
    double mass = 0;
    for (const TokenLogprob& t : r.top_logprobs) {
      ids.push_back(t.token);
      EXPECT_NEAR(t.logprob, std::log(raw[t.token]), 1e-5);
      mass += std::exp(t.logprob);
    }
    EXPECT_EQ(ids, (std::vector<int32_t>{1, 3, 4, 0, 2}));  // tie 1/3 by id
    EXPECT_NEAR(mass, 1.0, 1e-5);
  }
}

TEST(Sampling, TopLogprobsPartialOnLargeVocab) {
  constexpr int32_t kVocab = 49152;
  std::vector<float> l(kVocab);
  std::mt19937 gen(17);
  std::uniform_real_distribution<float> u(-5.0f, 5.0f);
  for (float& x : l) x = u(gen);
  SamplingParams p = seeded();
  p.logprobs = 20;
  Sampler s(p);
  SampleResult r = s.sample(l.data(), kVocab, {}, {});
  ASSERT_EQ(r.top_logprobs.size(), 20u);
  std::vector<float> sorted = l;
  std::sort(sorted.begin(), sorted.end(), std::greater<float>());
  for (size_t i = 0; i + 1 < r.top_logprobs.size(); ++i)
    EXPECT_GE(r.top_logprobs[i].logprob, r.top_logprobs[i + 1].logprob);
  EXPECT_EQ(l[r.top_logprobs[0].token], sorted[0]);
  EXPECT_EQ(l[r.top_logprobs[19].token], sorted[19]);
  EXPECT_LE(r.logprob, r.top_logprobs[0].logprob);

  p.logprobs = 0;
  Sampler s0(p);
  EXPECT_TRUE(s0.sample(l.data(), kVocab, {}, {}).top_logprobs.empty());
}

// --- validation -------------------------------------------------------------------------------

void expect_invalid(const SamplingParams& p, const std::string& field, const std::string& value) {
  Status st = p.validate();
  ASSERT_FALSE(st.ok()) << field;
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find(field + " = " + value), std::string::npos) << st.message();
  Expected<Sampler> s = Sampler::create(p);
  EXPECT_FALSE(s.ok());
}

TEST(Sampling, ValidateNamesFieldAndValue) {
  EXPECT_TRUE(SamplingParams().validate().ok());
  SamplingParams p;
  p.temperature = -0.5f;
  expect_invalid(p, "temperature", "-0.5");
  p = {};
  p.temperature = std::nanf("");
  expect_invalid(p, "temperature", "nan");
  p = {};
  p.top_p = 0.0f;
  expect_invalid(p, "top_p", "0");
  p.top_p = 1.5f;
  expect_invalid(p, "top_p", "1.5");
  p = {};
  p.min_p = -0.25f;
  expect_invalid(p, "min_p", "-0.25");
  p.min_p = 1.5f;
  expect_invalid(p, "min_p", "1.5");
  p = {};
  p.repetition_penalty = 0.0f;
  expect_invalid(p, "repetition_penalty", "0");
  p = {};
  p.presence_penalty = 2.5f;
  expect_invalid(p, "presence_penalty", "2.5");
  p = {};
  p.frequency_penalty = -3.0f;
  expect_invalid(p, "frequency_penalty", "-3");
  p = {};
  p.logprobs = 21;
  expect_invalid(p, "logprobs", "21");
  p.logprobs = -1;
  expect_invalid(p, "logprobs", "-1");

  p = {};  // the edges are valid
  p.temperature = 0.0f;
  p.top_p = 1.0f;
  p.min_p = 1.0f;
  p.presence_penalty = -2.0f;
  p.frequency_penalty = 2.0f;
  p.logprobs = 20;
  p.top_k = -7;
  EXPECT_TRUE(p.validate().ok());
}

}  // namespace
}  // namespace specserve
