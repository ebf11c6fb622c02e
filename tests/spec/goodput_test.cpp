// spec/goodput.h: the step-time fit, the calibration before it, and which sequences draft.
#include "spec/goodput.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace specserve {
namespace {

// A model fed noiselessly with t(R) = a + b R at rows 1 and 9.
GoodputModel fitted_model(double a, double b, double draft_s_per_seq = -1) {
  GoodputModel m;
  for (int i = 0; i < 4; ++i) {
    m.observe_forward(1, a + b * 1);
    m.observe_forward(9, a + b * 9);
  }
  if (draft_s_per_seq >= 0) m.observe_draft(1, draft_s_per_seq);
  return m;
}

GoodputCandidate cand(double accepted, double drafted, int32_t max_rows, int32_t skipped = 0) {
  return {accepted, drafted, max_rows, skipped};
}

TEST(Goodput, FitsTheLineOfTheStepTimes) {
  GoodputModel m = fitted_model(0.010, 0.0025);
  ASSERT_TRUE(m.fitted());
  EXPECT_NEAR(m.a(), 0.010, 1e-12);
  EXPECT_NEAR(m.b(), 0.0025, 1e-12);
  // Newer steps weigh more: after a change of machine speed the fit follows it.
  for (int i = 0; i < 200; ++i) {
    m.observe_forward(1, 0.020 + 0.005);
    m.observe_forward(9, 0.020 + 0.045);
  }
  EXPECT_NEAR(m.a(), 0.020, 1e-4);
  EXPECT_NEAR(m.b(), 0.005, 1e-5);
}

TEST(Goodput, NoFitUntilTheRowCountsDifferAndBadObservationsAreIgnored) {
  GoodputModel m;
  for (int i = 0; i < 20; ++i) m.observe_forward(4, 0.02);
  EXPECT_FALSE(m.fitted()) << "one row count cannot tell the cost of a row";
  m.observe_forward(0, 0.01);
  m.observe_forward(9, std::numeric_limits<double>::quiet_NaN());
  m.observe_forward(9, -1.0);
  m.observe_forward(9, 0.0);
  EXPECT_FALSE(m.fitted());
  m.observe_forward(12, 0.05);
  EXPECT_TRUE(m.fitted());
}

TEST(Goodput, ARowNeverSavesTimeAndAStepAlwaysCosts) {
  GoodputModel m;
  for (int i = 0; i < 4; ++i) {
    m.observe_forward(1, 0.030);
    m.observe_forward(9, 0.020);  // noise: more rows, less time
  }
  ASSERT_TRUE(m.fitted());
  EXPECT_EQ(m.b(), 0.0);
  EXPECT_NEAR(m.a(), 0.025, 1e-3);  // the weighted mean step time (newer steps weigh more)
  GoodputModel n;
  for (int i = 0; i < 4; ++i) {
    n.observe_forward(2, 0.001);
    n.observe_forward(10, 0.041);  // a line through a negative intercept
  }
  ASSERT_TRUE(n.fitted());
  EXPECT_EQ(n.a(), 0.0);
  EXPECT_GT(n.b(), 0.0);
}

TEST(Goodput, CalibratesWithWholeStepsWithAndWithoutDraftsFirst) {
  GoodputModel m;
  const std::vector<GoodputCandidate> c = {cand(0.1, 8, 8), cand(3.0, 8, 8)};
  EXPECT_TRUE(m.choose({}, 1, 1).empty());  // a step without candidates (a prefill) does not count
  EXPECT_EQ(m.choose(c, 2, 2), std::vector<bool>({true, true}));
  EXPECT_TRUE(m.choose({}, 1, 1).empty());
  EXPECT_EQ(m.choose(c, 2, 2), std::vector<bool>({false, false}));
  EXPECT_EQ(m.choose(c, 2, 2), std::vector<bool>({true, true}));
}

// Bug (review): with k = 1 at batch 1 the rows alternate 1 and 2, which the first fit's spread
// rule never accepted: the policy calibrated, drafting every other step, forever.
TEST(Goodput, RowsOneAndTwoAreEnoughToFit) {
  GoodputModel m;
  m.observe_forward(1, 0.010);
  EXPECT_FALSE(m.fitted());
  m.observe_forward(2, 0.012);
  ASSERT_TRUE(m.fitted());
  EXPECT_NEAR(m.a(), 0.008, 1e-9);
  EXPECT_NEAR(m.b(), 0.002, 1e-9);
}

// Drafts that never add rows (every one came back empty) leave b unknowable: after 16
// calibration steps the fit is the mean step time with b = 0.
TEST(Goodput, CalibrationEndsWhenDraftsNeverAddRows) {
  GoodputModel m;
  const std::vector<GoodputCandidate> c = {cand(0.0, 0, 4)};
  for (int i = 0; i < 16; ++i) {
    EXPECT_EQ(m.choose(c, 1, 1)[0], i % 2 == 0) << "step " << i;
    m.observe_forward(1, 0.010);
  }
  EXPECT_FALSE(m.fitted());
  m.choose(c, 1, 1);
  ASSERT_TRUE(m.fitted());
  EXPECT_NEAR(m.a(), 0.010, 1e-12);
  EXPECT_EQ(m.b(), 0.0);
}

// Bug (known since the policy landed): when every step had prefill rows (arrivals in every
// step) the fit was never fed and the policy alternated drafting steps forever. After the
// calibration steps without a single timed step, every candidate drafts, until one is timed.
TEST(Goodput, WithoutTimedStepsAfterCalibrationEveryCandidateDrafts) {
  GoodputModel m;
  const std::vector<GoodputCandidate> c = {cand(0.0, 4, 4), cand(2.0, 4, 4)};
  for (int i = 0; i < 16; ++i) EXPECT_EQ(m.choose(c, 2, 2)[0], i % 2 == 0) << "step " << i;
  for (int i = 0; i < 5; ++i) EXPECT_EQ(m.choose(c, 2, 2), std::vector<bool>({true, true})) << "step " << 16 + i;
  EXPECT_FALSE(m.fitted());
  // Timed steps of one row count: the 16 calibration steps are over, so the mean time becomes a.
  m.observe_forward(2, 0.010);
  m.choose(c, 2, 2);
  ASSERT_TRUE(m.fitted());
  EXPECT_EQ(m.b(), 0.0);
}

// a = 10 ms, b = 2.5 ms per row, no draft time: one sequence (1 row, 1 token) alone runs at
// 1 / 12.5 ms; with a draft of 8 rows accepting e tokens, (1 + e) / 32.5 ms: worth it for e > 1.6.
TEST(Goodput, ASequenceDraftsOnlyWhenItRaisesTokensPerSecond) {
  GoodputModel m = fitted_model(0.010, 0.0025);
  EXPECT_EQ(m.choose({cand(1.5, 8, 8)}, 1, 1), std::vector<bool>({false}));
  EXPECT_EQ(m.choose({cand(1.7, 8, 8)}, 1, 1), std::vector<bool>({true}));
  // Fewer rows for the same acceptance pay: 2 rows cost 5 ms, 0.5 tokens are worth 6.25 ms.
  EXPECT_EQ(m.choose({cand(0.5, 2, 8)}, 1, 1), std::vector<bool>({true}));
  // The rows are capped by what the plan allows now.
  EXPECT_EQ(m.choose({cand(0.5, 8, 2)}, 1, 1), std::vector<bool>({true}));
  // A sequence that accepts nothing never drafts (until its turn to explore).
  EXPECT_EQ(m.choose({cand(0.0, 0, 8)}, 1, 1), std::vector<bool>({false}));
}

TEST(Goodput, DraftTimeCountsAgainstTheDraft) {
  GoodputModel m = fitted_model(0.010, 0.0025, /*draft_s_per_seq=*/0.010);
  EXPECT_NEAR(m.draft_seconds_per_seq(), 0.010, 1e-12);
  // 2 rows (5 ms) + 10 ms of drafting for 0.5 tokens (6.25 ms of plain step): not worth it now.
  EXPECT_EQ(m.choose({cand(0.5, 2, 8)}, 1, 1), std::vector<bool>({false}));
  EXPECT_EQ(m.choose({cand(1.3, 2, 8)}, 1, 1), std::vector<bool>({true}));
}

// A batch of 8 at 1 row each: a + 8b = 30 ms for 8 tokens; a draft of n rows costs 2.5 n ms.
TEST(Goodput, InABatchOnlyTheDraftsThatPayAreKeptBestFirst) {
  GoodputModel m = fitted_model(0.010, 0.0025);
  const std::vector<GoodputCandidate> c = {cand(1.0, 8, 8), cand(2.0, 2, 8), cand(1.0, 2, 8), cand(6.0, 8, 8),
                                           cand(0.0, 8, 8), cand(1.4, 2, 8), cand(0.3, 1, 8), cand(1.2, 2, 8)};
  const std::vector<bool> got = m.choose(c, 8, 8);
  // Without drafts: 8 tokens in 30 ms (0.267 a ms). 2.0 tokens for 2 rows (0.4 a ms) joins:
  // 10 in 35 ms (0.286); then 6.0 for 8 rows (0.3): 16 in 55 ms (0.291); then 1.4 for 2 rows
  // (0.28) would lower it, and so would every one after it.
  EXPECT_EQ(got, std::vector<bool>({false, true, false, true, false, false, false, false}));
  // The same candidates in another order get the same answer.
  const std::vector<GoodputCandidate> r(c.rbegin(), c.rend());
  std::vector<bool> back = m.choose(r, 8, 8);
  EXPECT_EQ(std::vector<bool>(back.rbegin(), back.rend()), got);
}

TEST(Goodput, UnknownSequencesAndThoseWhoseTurnItIsExplore) {
  GoodputModel m = fitted_model(0.010, 0.0025);
  // Nothing known engine-wide or of it: it drafts, to learn.
  EXPECT_EQ(m.choose({cand(-1, -1, 8)}, 1, 1), std::vector<bool>({true}));
  // Left out 8 steps in a row: it drafts however poor it looked (a 4-row draft, 10 ms, would
  // pay with one token, 12.5 ms, the least the exploration rule assumes).
  EXPECT_EQ(m.choose({cand(0.0, 4, 8, 7)}, 1, 1), std::vector<bool>({false}));
  EXPECT_EQ(m.choose({cand(0.0, 4, 8, 8)}, 1, 1), std::vector<bool>({true}));
  // A longer interval of its own (the engine backs off after explorations that did not pay).
  GoodputCandidate later = cand(0.0, 4, 8, 8);
  later.explore_after = 16;
  EXPECT_EQ(m.choose({later}, 1, 1), std::vector<bool>({false}));
  later.skipped = 16;
  EXPECT_EQ(m.choose({later}, 1, 1), std::vector<bool>({true}));
  // Once the engine has seen acceptance, an unknown sequence starts from the engine's averages.
  for (int i = 0; i < 30; ++i) m.observe_acceptance(8, 0);
  EXPECT_NEAR(m.mean_accepted(), 0.0, 1e-12);
  EXPECT_EQ(m.choose({cand(-1, -1, 8)}, 1, 1), std::vector<bool>({false}));
  for (int i = 0; i < 30; ++i) m.observe_acceptance(2, 2);
  EXPECT_EQ(m.choose({cand(-1, -1, 8)}, 1, 1), std::vector<bool>({true}));
}

// An exploration is tried only where a draft as good as the best seen lately would pay: at
// batch 8 (30 ms for 8 tokens) a 9-row draft (22.5 ms) needs 6 tokens; at batch 1 (12.5 ms for
// 1 token) it needs 1.8.
TEST(Goodput, ExplorationOnlyWhereTheBestAcceptanceLatelyWouldPay) {
  GoodputModel m = fitted_model(0.010, 0.0025);
  for (int i = 0; i < 5; ++i) m.observe_acceptance(9, i % 2 == 0 ? 4 : 0);
  EXPECT_EQ(m.accepted_high(), 4.0);
  const GoodputCandidate turn = cand(0.1, 9, 9, 8);
  std::vector<bool> explored;
  EXPECT_EQ(m.choose({turn, cand(3.0, 9, 9)}, 1, 1, &explored), std::vector<bool>({true, true}));
  EXPECT_EQ(explored, std::vector<bool>({true, false})) << "the second drafts on its merits";
  EXPECT_EQ(m.choose(std::vector<GoodputCandidate>(8, turn), 8, 8), std::vector<bool>(8, false));
  // The high fades when no draft comes near it again, and jumps with a new one.
  for (int i = 0; i < 400; ++i) m.observe_acceptance(9, 0);
  EXPECT_LT(m.accepted_high(), 0.1);
  // Counted as one token (the floor): a 9-row draft (22.5 ms) does not pay at batch 1 (12.5 ms
  // a token), a 4-row one (10 ms) does.
  EXPECT_EQ(m.choose({turn}, 1, 1), std::vector<bool>({false}));
  EXPECT_EQ(m.choose({cand(0.0, 4, 4, 8)}, 1, 1), std::vector<bool>({true}));
  m.observe_acceptance(9, 7);
  EXPECT_EQ(m.accepted_high(), 7.0);
  EXPECT_EQ(m.choose(std::vector<GoodputCandidate>(8, turn), 8, 8)[0], true);
}

TEST(Goodput, MovingAverageStartsAtTheFirstValue) {
  EXPECT_EQ(GoodputModel::ema(-1, 4.0), 4.0);
  EXPECT_NEAR(GoodputModel::ema(4.0, 0.0), 2.8, 1e-12);
}

}  // namespace
}  // namespace specserve
