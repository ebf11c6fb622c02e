// See goodput.h.
#include "spec/goodput.h"

#include <algorithm>
#include <cmath>

namespace specserve {

namespace {
constexpr int64_t kCalibrationSteps = 16;  // see goodput.h, Calibration
}  // namespace

GoodputModel::GoodputModel(double forget, int32_t explore_every, double min_spread)
    : forget_(forget > 0 && forget <= 1 ? forget : 1.0),
      explore_every_(std::max(1, explore_every)),
      min_spread_(min_spread >= 0 ? min_spread : 0.0) {}

void GoodputModel::observe_forward(int64_t rows, double seconds) {
  if (rows <= 0 || !(seconds > 0) || !std::isfinite(seconds)) return;
  const double r = static_cast<double>(rows);
  s0_ = forget_ * s0_ + 1;
  s1_ = forget_ * s1_ + r;
  s2_ = forget_ * s2_ + r * r;
  sy_ = forget_ * sy_ + seconds;
  sxy_ = forget_ * sxy_ + r * seconds;
  r_min_ = any_ ? std::min(r_min_, r) : r;
  r_max_ = any_ ? std::max(r_max_, r) : r;
  any_ = true;
  refit();
}

void GoodputModel::refit() {
  if (!have_fit_ && !(r_max_ - r_min_ >= min_spread_ && r_max_ > r_min_)) return;
  // The weighted variance of the row counts fades when every recent step had the same rows: then
  // b cannot be told again, and the last fit stays.
  const double mean = s1_ / s0_;
  const double var = s2_ / s0_ - mean * mean;
  if (!(var > 1e-6 * std::max(1.0, mean * mean))) return;
  double b = (s0_ * sxy_ - s1_ * sy_) / (s0_ * s2_ - s1_ * s1_);
  double a = (sy_ - b * s1_) / s0_;
  // A step costs something and a row never saves time: noise or a curve that is not a line
  // could say otherwise; the nearest model that does not is used.
  if (!(b >= 0)) {
    b = 0;
    a = sy_ / s0_;
  } else if (!(a >= 0)) {
    a = 0;
    b = sxy_ / s2_;
  }
  a_ = a;
  b_ = b;
  have_fit_ = true;
}

void GoodputModel::observe_draft(int64_t seqs, double seconds) {
  if (seqs <= 0 || !(seconds >= 0) || !std::isfinite(seconds)) return;
  draft_per_seq_ = ema(draft_per_seq_, seconds / static_cast<double>(seqs));
}

void GoodputModel::observe_acceptance(int32_t drafted, int32_t accepted) {
  mean_drafted_ = ema(mean_drafted_, drafted);
  mean_accepted_ = ema(mean_accepted_, accepted);
  // Jumps to a new high, fades towards lower values by 1 % of the gap per observation.
  accepted_high_ = std::max<double>(accepted, accepted_high_ < 0 ? accepted : 0.99 * accepted_high_ + 0.01 * accepted);
}

std::vector<bool> GoodputModel::choose(const std::vector<GoodputCandidate>& c, int64_t base_rows, int64_t base_tokens,
                                       std::vector<bool>* explored) {
  std::vector<bool> out(c.size(), false);
  if (explored) explored->assign(c.size(), false);
  if (c.empty()) return out;
  if (!have_fit_ && calibration_steps_ >= kCalibrationSteps && any_) {
    // Drafts never added rows: b cannot matter; the mean step time is a.
    a_ = sy_ / s0_;
    b_ = 0;
    have_fit_ = true;
  }
  if (!have_fit_ && calibration_steps_ >= kCalibrationSteps && !any_) {
    // No step without prefill rows was timed (arrivals in every step): nothing to judge by, so
    // every candidate drafts, as without the policy, until such steps come.
    out.assign(c.size(), true);
    return out;
  }
  if (!have_fit_) {
    // Calibration: whole steps with drafts (the 1st, 3rd, ... with candidates) and without.
    std::fill(out.begin(), out.end(), calibration_steps_ % 2 == 0);
    ++calibration_steps_;
    return out;
  }
  const double d = std::max(0.0, draft_per_seq_);
  double t = std::max(a_ + b_ * static_cast<double>(base_rows), 1e-9);
  double n = static_cast<double>(base_tokens);
  const double t_base = t, n_base = n;
  struct Item {
    size_t i;
    double gain, cost;
  };
  std::vector<Item> items;
  for (size_t i = 0; i < c.size(); ++i) {
    const double e = c[i].accepted >= 0 ? c[i].accepted : mean_accepted_;
    double rows = c[i].drafted >= 0 ? c[i].drafted : (mean_drafted_ >= 0 ? mean_drafted_ : c[i].max_rows);
    rows = std::min(rows, static_cast<double>(c[i].max_rows));
    const double cost = b_ * rows + d;
    const bool turn = c[i].skipped >= (c[i].explore_after > 0 ? c[i].explore_after : explore_every_);
    // The best lately, but at least one token: a run whose first drafts found nothing (n-gram
    // lookup early in a text) must not lock every later sequence out.
    const double best = std::max(1.0, accepted_high_);
    const bool explore = e >= 0 && turn && best * t_base > n_base * cost;
    if (e < 0 || explore) {
      // Nothing known yet, or its turn to explore and a draft as good as the best lately would
      // pay: it drafts, and the others are judged against the step with it.
      out[i] = true;
      if (explored) (*explored)[i] = explore;
      n += std::max(0.0, e);
      t += cost;
      continue;
    }
    if (e > 0) items.push_back({i, e, cost});  // accepting nothing, it never joins
  }
  // Best ratio first; a free draft (cost 0) first of all, ties by index (deterministic).
  std::stable_sort(items.begin(), items.end(), [](const Item& x, const Item& y) { return x.gain * y.cost > y.gain * x.cost; });
  for (const Item& it : items) {
    if (!(it.gain * t > n * it.cost)) break;  // joins only while it raises tokens / second
    out[it.i] = true;
    n += it.gain;
    t += it.cost;
  }
  return out;
}

}  // namespace specserve
