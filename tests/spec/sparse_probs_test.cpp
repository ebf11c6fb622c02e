// Sparse draft distributions (spec/sparse_probs.h): exact round trip, range checks, and
// truncation that keeps the top mass, honours max_entries, breaks ties by id and renormalises.
#include "spec/sparse_probs.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "model/sampling.h"

namespace specserve {
namespace {

double sum_of(const std::vector<float>& v) { return std::accumulate(v.begin(), v.end(), 0.0); }

int count_nonzero(const std::vector<float>& v) {
  return static_cast<int>(std::count_if(v.begin(), v.end(), [](float x) { return x != 0.0f; }));
}

/// A random distribution over `vocab` ids with a softmax of N(0, scale) logits, some entries 0.
std::vector<float> random_dist(int32_t vocab, float scale, uint64_t seed, double zero_fraction = 0.0) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> n(0.0f, scale);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  std::vector<float> q(static_cast<size_t>(vocab));
  double s = 0;
  for (float& x : q) {
    x = u(rng) < zero_fraction ? 0.0f : std::exp(n(rng));
    s += x;
  }
  for (float& x : q) x = static_cast<float>(x / s);
  return q;
}

// ---- to_sparse / to_dense -----------------------------------------------------------------

TEST(SparseProbs, RoundTripIsBitExact) {
  std::vector<float> q = random_dist(49152, 3.0f, 7, 0.5);
  q[0] = 0.0f;
  q[49151] = std::numeric_limits<float>::denorm_min();  // tiny but nonzero: kept
  const SparseProbs s = to_sparse(q);
  EXPECT_EQ(s.ids.size(), s.probs.size());
  EXPECT_EQ(static_cast<int>(s.ids.size()), count_nonzero(q));
  EXPECT_TRUE(std::is_sorted(s.ids.begin(), s.ids.end()));
  EXPECT_EQ(s.ids.back(), 49151);
  std::vector<float> back;
  ASSERT_TRUE(to_dense(s, 49152, &back).ok());
  ASSERT_EQ(back.size(), q.size());
  EXPECT_EQ(std::memcmp(back.data(), q.data(), q.size() * sizeof(float)), 0);
}

TEST(SparseProbs, OneHotAndEmpty) {
  std::vector<float> q(10, 0.0f);
  EXPECT_TRUE(to_sparse(q).ids.empty());
  q[3] = 1.0f;
  const SparseProbs s = to_sparse(q);
  EXPECT_EQ(s.ids, std::vector<int32_t>{3});
  EXPECT_EQ(s.probs, std::vector<float>{1.0f});
  std::vector<float> back = {9.0f};  // resized and overwritten
  ASSERT_TRUE(to_dense(SparseProbs{}, 4, &back).ok());
  EXPECT_EQ(back, std::vector<float>(4, 0.0f));
}

TEST(SparseProbs, ToSparseDropsNegativeZeroAndNan) {
  const std::vector<float> q = {-0.0f, std::nanf(""), 0.5f, 0.0f, 0.5f};
  const SparseProbs s = to_sparse(q);
  EXPECT_EQ(s.ids, (std::vector<int32_t>{2, 4}));
}

struct BadCase {
  const char* name;
  SparseProbs s;
  int32_t vocab;
  const char* message_has;
};

TEST(SparseProbs, ToDenseRejectsBadInput) {
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<BadCase> cases = {
      {"id_too_large", {{1, 10}, {0.5f, 0.5f}}, 10, "ids[1] = 10 is outside the vocabulary [0, 10)"},
      {"negative_id", {{-1}, {1.0f}}, 10, "ids[0] = -1"},
      {"duplicate", {{2, 2}, {0.5f, 0.5f}}, 10, "strictly increasing"},
      {"unsorted", {{5, 2}, {0.5f, 0.5f}}, 10, "ids[1] = 2 does not follow ids[0] = 5"},
      {"length_mismatch", {{1, 2}, {1.0f}}, 10, "2 ids but 1 probabilities"},
      {"negative_prob", {{1}, {-0.5f}}, 10, "probs[0]"},
      {"nan_prob", {{1}, {std::nanf("")}}, 10, "must be finite"},
      {"inf_prob", {{1}, {inf}}, 10, "must be finite"},
      {"zero_vocab", {{}, {}}, 0, "vocab = 0"},
  };
  for (const BadCase& c : cases) {
    std::vector<float> out = {42.0f};
    Status st = to_dense(c.s, c.vocab, &out);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << c.name;
    EXPECT_NE(st.message().find(c.message_has), std::string::npos) << c.name << ": " << st.message();
    EXPECT_EQ(out, std::vector<float>{42.0f}) << c.name << ": out must be untouched on error";
  }
}

// ---- truncate_probs -----------------------------------------------------------------------

TEST(TruncateProbs, KeepsTopMassAndRenormalises) {
  std::vector<float> q = {0.1f, 0.4f, 0.05f, 0.3f, 0.15f};
  truncate_probs(&q, 0.8, 0);  // 0.4 + 0.3 = 0.7 < 0.8; + 0.15 = 0.85 >= 0.8: keep 3
  EXPECT_EQ(q[0], 0.0f);
  EXPECT_EQ(q[2], 0.0f);
  EXPECT_NEAR(q[1], 0.4 / 0.85, 1e-6);
  EXPECT_NEAR(q[3], 0.3 / 0.85, 1e-6);
  EXPECT_NEAR(q[4], 0.15 / 0.85, 1e-6);
  EXPECT_NEAR(sum_of(q), 1.0, 1e-6);
}

TEST(TruncateProbs, MaxEntriesFirst) {
  std::vector<float> q = {0.1f, 0.4f, 0.05f, 0.3f, 0.15f};
  truncate_probs(&q, 1.0, 2);
  EXPECT_EQ(count_nonzero(q), 2);
  EXPECT_NEAR(q[1], 0.4 / 0.7, 1e-6);
  EXPECT_NEAR(q[3], 0.3 / 0.7, 1e-6);
}

TEST(TruncateProbs, TiesBrokenByLowerId) {
  std::vector<float> q = {0.2f, 0.2f, 0.2f, 0.2f, 0.2f};
  truncate_probs(&q, 1.0, 3);
  EXPECT_EQ(q, (std::vector<float>{1.0f / 3, 1.0f / 3, 1.0f / 3, 0, 0}));
  std::vector<float> r = {0.1f, 0.3f, 0.3f, 0.3f};
  truncate_probs(&r, 0.5, 0);  // 0.3 < 0.5, 0.6 >= 0.5: ids 1 and 2, not 3
  EXPECT_EQ(count_nonzero(r), 2);
  EXPECT_GT(r[1], 0.0f);
  EXPECT_GT(r[2], 0.0f);
  EXPECT_EQ(r[3], 0.0f);
}

TEST(TruncateProbs, AlwaysKeepsOne) {
  std::vector<float> q = {0.25f, 0.5f, 0.25f};
  truncate_probs(&q, 1e-9, 0);
  EXPECT_EQ(q, (std::vector<float>{0, 1.0f, 0}));
  std::vector<float> r = {0.25f, 0.5f, 0.25f};
  truncate_probs(&r, 0.0, 1);
  EXPECT_EQ(r, (std::vector<float>{0, 1.0f, 0}));
}

TEST(TruncateProbs, OffOrNothingDroppedLeavesBitsUnchanged) {
  const std::vector<float> q0 = random_dist(1000, 2.0f, 3, 0.3);
  std::vector<float> q = q0;
  truncate_probs(&q, 1.0, 0);
  EXPECT_EQ(std::memcmp(q.data(), q0.data(), q.size() * sizeof(float)), 0);
  truncate_probs(&q, 1.0, 5000);  // more than the nonzeros
  EXPECT_EQ(std::memcmp(q.data(), q0.data(), q.size() * sizeof(float)), 0);
}

TEST(TruncateProbs, UnnormalisedInputUsesRelativeMass) {
  std::vector<float> q = {2.0f, 6.0f, 2.0f};  // sum 10: 6 is 60%
  truncate_probs(&q, 0.6, 0);
  EXPECT_EQ(q, (std::vector<float>{0, 1.0f, 0}));
}

TEST(TruncateProbs, MatchesFullSortOnLargeVocab) {
  // The chunked partial sort must pick exactly what a full sort would, across chunk boundaries.
  for (uint64_t seed = 1; seed <= 6; ++seed) {
    const float scale = seed % 2 ? 1.0f : 4.0f;
    const std::vector<float> q0 = random_dist(49152, scale, seed, seed % 3 == 0 ? 0.5 : 0.0);
    for (auto [mass, max_entries] : {std::pair{0.9, 0}, std::pair{1.0, 512}, std::pair{0.999, 300}, std::pair{0.5, 70}}) {
      std::vector<float> q = q0;
      truncate_probs(&q, mass, max_entries);
      // Reference: full sort.
      std::vector<int32_t> idx(q0.size());
      std::iota(idx.begin(), idx.end(), 0);
      std::sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) { return q0[a] != q0[b] ? q0[a] > q0[b] : a < b; });
      double total = 0;
      for (float x : q0) total += x;
      double acc = 0;
      size_t kept = 0;
      while (kept < idx.size() && q0[idx[kept]] > 0 && (max_entries <= 0 || kept < static_cast<size_t>(max_entries))) {
        acc += q0[idx[kept++]];
        if (mass < 1.0 && acc >= mass * total) break;
      }
      std::vector<bool> keep(q0.size(), false);
      for (size_t i = 0; i < kept; ++i) keep[idx[i]] = true;
      for (size_t i = 0; i < q0.size(); ++i) {
        ASSERT_EQ(q[i] > 0.0f, static_cast<bool>(keep[i])) << "seed " << seed << " mass " << mass << " id " << i;
      }
      EXPECT_EQ(count_nonzero(q), static_cast<int>(kept));
      if (max_entries > 0) EXPECT_LE(count_nonzero(q), max_entries);
      EXPECT_NEAR(sum_of(q), 1.0, 1e-5);
    }
  }
}

TEST(TruncateProbs, SampledIdsAlwaysHavePositiveQ) {
  // What the drafter does: truncate, then draw with Sampler::sample_from; every draw lands on a
  // kept entry, and the reported (sparse) q round-trips exactly.
  SamplingParams sp;
  sp.seed = 11;
  sp.has_seed = true;
  Sampler sampler(sp);
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    std::vector<float> q = random_dist(4096, 2.5f, seed);
    truncate_probs(&q, 0.95, 64);
    EXPECT_LE(count_nonzero(q), 64);
    EXPECT_NEAR(sum_of(q), 1.0, 1e-5);
    for (int i = 0; i < 200; ++i) {
      const int32_t t = sampler.sample_from(q);
      ASSERT_GT(q[static_cast<size_t>(t)], 0.0f) << "seed " << seed;
    }
    std::vector<float> back;
    ASSERT_TRUE(to_dense(to_sparse(q), 4096, &back).ok());
    EXPECT_EQ(back, q);
  }
}

}  // namespace
}  // namespace specserve
