// specserve spec: speculation only where it pays — per step, which decode sequences draft,
// chosen to maximise goodput (tokens out per second of step), after SmartSpec (Liu et al. 2024,
// "Optimizing Speculative Decoding for Serving Large Language Models Using Goodput",
// arXiv:2406.14066): the step's time is modelled as linear in the rows of its forward pass, each
// sequence's payoff from its own acceptance so far.
//
// Model (units: seconds, rows, tokens):
//   forward time  t(R) = a + b * R, R = rows of the target forward pass; a and b fitted by
//                 exponentially weighted least squares over the steps without prefill rows
//                 (a prefill chunk's attention is not linear in its rows), each new step weighing
//                 1 / forget more than the last;
//   draft time    d per drafting sequence (an exponential moving average of the proposer's time
//                 per sequence it drafted for);
//   sequence s    e_s = its accepted draft tokens per drafted step, n_s = the draft rows it
//                 adds per drafted step (both moving averages; the engine-wide averages until it
//                 drafted once).
// A step of R0 rows without drafts yields N0 tokens (one per sequence that samples) in t(R0);
// letting a set S draft yields N0 + sum_S e_s tokens in t(R0 + sum_S n_s) + |S| d. The set of
// best ratio is a prefix of the sequences ordered by e_s / (b n_s + d) (fractional programming:
// a sequence joins while its own ratio beats the set's), which is what choose() returns.
//
// Exploration: a sequence left out for `explore_every` steps (GoodputCandidate::explore_after,
// which the engine doubles after each exploration up to 64 and resets when the sequence drafts
// on its merits) drafts in the next one anyway, so its e_s follows its text (acceptance changes
// along a generation) — provided that the best acceptance seen lately (accepted_high(): the
// largest accepted counts per drafted step, fading slowly; at least 1 token, so that early
// drafts that found nothing cannot shut exploration off for good) would pay for its draft in
// this step.
// A draft that could not pay even then is not tried (8 sequences exploring 9-row trees together
// made a batch-8 step on a CPU several times as long as a plain one): where drafting cannot pay,
// as in large batches on a CPU, a sequence may never draft again while that holds.
//
// Calibration: until the fit has seen two row counts at least `min_spread` apart (1 and 2 rows
// are enough) it cannot tell b, and choose() alternates whole steps with and without drafts
// (counting only the steps that have candidates; the first drafts) to get them. If 16 such
// steps pass without two row counts (every draft came back empty, so drafts add no rows), the
// fit takes b = 0 and the mean step time as a: only the draft time then weighs against drafts.
// If none of those 16 steps was timed at all (every forward pass had prefill rows: requests
// arriving in every step), every candidate drafts, as without the policy, until steps without
// prefill come and give the fit its data.
//
// Greedy output does not depend on which steps draft (every accepted token is the target's own
// argmax). Seeded SAMPLED output is drawn from the target's distribution either way, but the
// tokens a given seed gives depend on which steps drafted, which depends on measured times: it
// repeats only in distribution, not token for token, under this policy.
//
// Pure apart from what it is fed: no clock, no threads (tests/spec/goodput_test.cpp).
#pragma once

#include <cstdint>
#include <vector>

namespace specserve {

/// Steps a sequence is left out of before it explores (GoodputModel's default, the engine's first interval).
inline constexpr int32_t kGoodputExploreEvery = 8;
/// The longest interval the engine backs off to.
inline constexpr int32_t kGoodputExploreMax = 64;

/// One decode sequence that may draft this step.
struct GoodputCandidate {
  double accepted = -1;   ///< e_s: its accepted draft tokens per drafted step; < 0: unknown (engine-wide average)
  double drafted = -1;    ///< n_s: draft rows per drafted step; < 0: unknown (engine-wide average)
  int32_t max_rows = 0;   ///< the draft rows the plan allows it now (n_s is capped by it), > 0
  int32_t skipped = 0;    ///< consecutive decode steps it was left out of (for exploration)
  /// It explores (drafts whatever it is worth) once `skipped` reaches this; 0: the model's
  /// explore_every. The engine doubles it after each exploration, up to 64, and sets it back
  /// when the sequence drafts on its merits (an exploration of 9 rows at 2.5x a plain step's
  /// time, every 8th step, would cost the step rate ~17 % where drafting never pays).
  int32_t explore_after = 0;
};

/// The linear step-time fit and the moving averages, fed by the engine after each step.
class GoodputModel {
 public:
  /// `forget` in (0, 1] (clamped there): weight kept by the past at each new observation;
  /// `explore_every` >= 1; `min_spread` >= 0: rows between the smallest and largest observed row
  /// count before the fit is used.
  explicit GoodputModel(double forget = 0.97, int32_t explore_every = kGoodputExploreEvery, double min_spread = 1.0);

  /// A forward pass of `rows` rows without prefill rows took `seconds` (> 0, finite; others ignored).
  void observe_forward(int64_t rows, double seconds);
  /// The proposer took `seconds` for `seqs` (> 0) drafting sequences.
  void observe_draft(int64_t seqs, double seconds);
  /// A sequence drafted `drafted` rows and `accepted` of them were accepted: the engine-wide
  /// averages (the caller keeps the sequence's own).
  void observe_acceptance(int32_t drafted, int32_t accepted);
  /// The moving-average step of the per-sequence and engine-wide averages (0.3).
  static double ema(double old_value, double x) { return old_value < 0 ? x : old_value + 0.3 * (x - old_value); }

  /// Which candidates draft in a step whose rows without drafts are `base_rows` (prefill chunks
  /// included, priced by the decode-step fit) and which samples `base_tokens` tokens without
  /// drafts (true: it drafts). `explored` (optional) gets, per candidate, whether it drafts as
  /// an exploration (its turn came) rather than on its merits or as unknown. Deterministic in
  /// its inputs and the state fed so far; a call with candidates counts one calibration step.
  std::vector<bool> choose(const std::vector<GoodputCandidate>& c, int64_t base_rows, int64_t base_tokens,
                           std::vector<bool>* explored = nullptr);

  bool fitted() const { return have_fit_; }  ///< see Calibration above
  double a() const { return a_; }  ///< seconds per step (intercept), valid when fitted()
  double b() const { return b_; }  ///< seconds per row, >= 0, valid when fitted()
  double draft_seconds_per_seq() const { return draft_per_seq_; }  ///< < 0 until observed
  double mean_accepted() const { return mean_accepted_; }          ///< < 0 until observed
  double mean_drafted() const { return mean_drafted_; }            ///< < 0 until observed
  double accepted_high() const { return accepted_high_; }          ///< < 0 until observed

 private:
  void refit();
  double forget_;
  int32_t explore_every_;
  double min_spread_;
  // Weighted sums for t = a + b R.
  double s0_ = 0, s1_ = 0, s2_ = 0, sy_ = 0, sxy_ = 0;
  double r_min_ = 0, r_max_ = 0;
  bool any_ = false;
  int64_t calibration_steps_ = 0;
  double a_ = 0, b_ = 0;
  bool have_fit_ = false;
  double draft_per_seq_ = -1;
  double mean_accepted_ = -1, mean_drafted_ = -1, accepted_high_ = -1;
};

}  // namespace specserve
