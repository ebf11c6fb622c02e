// The autoscaler's policy: rules in scheduler/autoscale_policy.h.
#include "scheduler/autoscale_policy.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>

namespace specserve {

const char* replica_state_name(ReplicaState state) {
  switch (state) {
    case ReplicaState::kStarting: return "starting";
    case ReplicaState::kLoading: return "loading";
    case ReplicaState::kWarming: return "warming";
    case ReplicaState::kReady: return "ready";
    case ReplicaState::kDraining: return "draining";
    case ReplicaState::kStandby: return "standby";
    case ReplicaState::kStopped: return "stopped";
  }
  return "?";
}

double median_of(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

double percentile90(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  // Nearest rank: the smallest value with at least 90% of the values at or below it.
  const size_t rank = static_cast<size_t>(std::ceil(0.9 * static_cast<double>(values.size())));
  return values[std::max<size_t>(rank, 1) - 1];
}

Autoscaler::Autoscaler(AutoscaleOptions options, int32_t initial_ready)
    : options_(std::move(options)), target_(std::max(0, initial_ready)) {}

double Autoscaler::start_backoff_s(int32_t num_failures) const {
  if (num_failures <= 0) return 0;
  const double b = options_.start_backoff_s * std::pow(2.0, std::min(num_failures - 1, 30));
  return std::min(b, options_.start_backoff_max_s);
}

bool Autoscaler::startable_now(const ReplicaView& r, double now_s) const {
  return r.startable && now_s - r.state_since_s >= start_backoff_s(r.num_start_failures);
}

AutoscaleDecision Autoscaler::tick(const AutoscaleInput& in) {
  const AutoscaleOptions& o = options_;
  AutoscaleDecision d;
  std::vector<const ReplicaView*> ready, standby, stopped, draining, starting_views;
  std::map<int32_t, const ReplicaView*> by_id;
  int32_t starting = 0, draining_to_standby = 0;
  int64_t ongoing = in.num_queued;
  double kv_sum = 0;
  for (const ReplicaView& r : in.replicas) {
    by_id[r.id] = &r;
    switch (r.state) {
      case ReplicaState::kReady:
        ready.push_back(&r);
        ongoing += r.num_assigned;
        kv_sum += r.kv_cache_usage;
        break;
      case ReplicaState::kStandby: standby.push_back(&r); break;
      case ReplicaState::kStarting:
      case ReplicaState::kLoading:
      case ReplicaState::kWarming:
        // Rule 0: a start without progress for start_timeout_s is given up.
        if (in.now_s - r.state_since_s >= o.start_timeout_s) {
          d.abandon.push_back(r.id);
        } else {
          ++starting;
          starting_views.push_back(&r);
        }
        break;
      case ReplicaState::kDraining:
        ongoing += r.num_assigned;
        if (r.leaving) break;  // never routed again: not one to undrain, nor a pool member
        draining.push_back(&r);
        if (r.draining_to_standby) ++draining_to_standby;
        break;
      case ReplicaState::kStopped:
        if (startable_now(r, in.now_s)) stopped.push_back(&r);
        break;
    }
  }
  const auto num_ready = static_cast<int32_t>(ready.size());
  if (in.mean_ongoing > 0) {
    ongoing = std::max<int64_t>(ongoing, static_cast<int64_t>(std::ceil(std::min(in.mean_ongoing, 1e9))));
  }
  d.ongoing = static_cast<int32_t>(std::min<int64_t>(ongoing, INT32_MAX));

  // Rule 1: load.
  const double per_replica = o.target_ongoing_requests > 0 ? o.target_ongoing_requests : 1.0;
  const auto wanted = static_cast<int32_t>(
      std::min<double>(std::ceil(static_cast<double>(ongoing) / per_replica), static_cast<double>(INT32_MAX)));

  // Rule 5: bounds (the slots are the declared replicas).
  const int32_t upper = std::max(0, std::min(o.max_replicas, static_cast<int32_t>(in.replicas.size())));
  const int32_t lower = std::min(std::max(0, o.min_replicas), upper);
  d.wanted = std::clamp(wanted, lower, upper);

  // Rule 2: pressure. Signals measured on the serving replicas only count while no decided
  // replica is still on its way (target <= ready): the shortage they show is being fixed.
  std::vector<double> ttfts;
  for (const TtftSample& s : in.ttft) {
    if (s.at_s < in.now_s - o.look_back_period_s) continue;
    auto it = by_id.find(s.replica);
    if (it == by_id.end() || it->second->state != ReplicaState::kReady) continue;
    if (s.at_s - it->second->ready_since_s < o.new_replica_grace_s) continue;  // a new replica's first samples
    if (last_change_s_ && s.at_s <= *last_change_s_) continue;  // taken up to the last change of the target
    ttfts.push_back(s.ttft_s);
  }
  d.ttft_p90_s = percentile90(ttfts);
  const double slo_s = o.ttft_slo_ms / 1000.0;
  const bool settled = target_ <= num_ready;
  std::string why_up;
  if (wanted > target_) {
    why_up = fmt::format("pressure: {} ongoing request(s) want {} replica(s) at {:g} per replica", ongoing, wanted, per_replica);
  } else if (settled && slo_s > 0 && in.num_queued > 0 && in.oldest_wait_s > slo_s) {
    why_up = fmt::format("pressure: the oldest queued request waited {:.3f} s > ttft_slo_ms {:g}", in.oldest_wait_s, o.ttft_slo_ms);
  } else if (settled && slo_s > 0 && !ttfts.empty() && d.ttft_p90_s > slo_s && ongoing > target_) {
    why_up = fmt::format("pressure: TTFT p90 {:.3f} s > ttft_slo_ms {:g} with {} ongoing on {} replica(s)", d.ttft_p90_s,
                         o.ttft_slo_ms, ongoing, target_);
  } else if (settled && num_ready > 0 && o.target_kv_cache_usage < 1.0 &&
             kv_sum / num_ready > o.target_kv_cache_usage) {
    why_up = fmt::format("pressure: mean KV-cache usage {:.2f} > target_kv_cache_usage {:g}", kv_sum / num_ready,
                         o.target_kv_cache_usage);
  }
  d.pressure = !why_up.empty();
  // Rule 3: idle.
  // NOTE: without the two projections a replica whose KV (or TTFT) pressure raised the target
  // is removed as soon as the load count allows, and the pressure returns at once: a trace of 2
  // long requests at 95% of one replica's KV flipped the target 1 <-> 2 every few seconds.
  const bool kv_fits_one_fewer = o.target_kv_cache_usage >= 1.0 || kv_sum <= 0 ||
                                 (num_ready > 1 && kv_sum / (num_ready - 1) < o.target_kv_cache_usage);
  // With nothing ongoing, latency samples of requests that are gone hold nothing up.
  const bool ttft_fits = slo_s <= 0 || ttfts.empty() || ongoing == 0 || d.ttft_p90_s < kIdleTtftMargin * slo_s;
  d.idle = !d.pressure && wanted < target_ && kv_fits_one_fewer && ttft_fits;

  // Rule 4: hysteresis, with the two immediate exceptions.
  const int32_t before = target_;
  if (target_ < lower) {
    target_ = lower;
    d.reason = fmt::format("min_replicas {}", lower);
  } else if (target_ > upper) {
    target_ = upper;
    d.reason = fmt::format("bounded by {} replica slot(s) / max_replicas {}", upper, o.max_replicas);
  } else if (target_ == 0 && in.num_queued > 0 && upper > 0) {
    target_ = 1;
    d.reason = fmt::format("scale from zero: {} queued", in.num_queued);
  }
  if (target_ == before) {
    if (d.pressure && target_ < upper) {
      if (!pressure_since_) pressure_since_ = in.now_s;
      if (in.now_s - *pressure_since_ >= o.upscale_delay_s) {
        target_ = std::min(upper, std::max(wanted, target_ + 1));
        d.reason = why_up + fmt::format(" (held {:.1f} s)", in.now_s - *pressure_since_);
      }
    } else {
      pressure_since_.reset();
    }
    if (d.idle) {
      if (!idle_since_) {
        idle_since_ = in.now_s;
        idle_max_wanted_ = wanted;
      }
      idle_max_wanted_ = std::max(idle_max_wanted_, wanted);
      const int32_t down = std::max(lower, idle_max_wanted_);
      if (in.now_s - *idle_since_ >= o.downscale_delay_s && down < target_) {
        d.reason = idle_max_wanted_ > 0
                       ? fmt::format("idle: the load wanted at most {} replica(s) for {:.1f} s", idle_max_wanted_,
                                     in.now_s - *idle_since_)
                       : fmt::format("idle: no ongoing request for {:.1f} s", in.now_s - *idle_since_);
        target_ = down;
      }
    } else {
      idle_since_.reset();
    }
  }
  d.changed = target_ != before;
  if (d.changed) {  // the cooldown: fresh evidence for the next change
    pressure_since_.reset();
    idle_since_.reset();
    last_change_s_ = in.now_s;
  }
  d.target_ready = target_;

  // Rule 6: reconcile.
  auto by_id_asc = [](const ReplicaView* a, const ReplicaView* b) { return a->id < b->id; };
  std::sort(standby.begin(), standby.end(), by_id_asc);
  std::sort(stopped.begin(), stopped.end(), by_id_asc);
  size_t next_stopped = 0;
  auto cold_start = [&](int32_t n) {
    if (!in.can_start) return;
    for (; n > 0 && next_stopped < stopped.size(); --n) d.start.push_back(stopped[next_stopped++]->id);
  };
  int32_t standby_left = static_cast<int32_t>(standby.size());
  int32_t starting_left = starting;
  int32_t deficit = target_ - num_ready;
  if (in.deficit_by_wanted && deficit > 0) deficit = std::max(0, std::min(target_, d.wanted) - num_ready);
  if (deficit > 0) {
    // A draining replica is loaded and its process lives: routing it again is instant, and
    // cold-starting its slot instead would run a second process of the same replica.
    std::sort(draining.begin(), draining.end(), by_id_asc);
    for (size_t i = 0; i < draining.size() && deficit > 0; ++i, --deficit) {
      d.undrain.push_back(draining[i]->id);
      if (draining[i]->draining_to_standby) --draining_to_standby;
    }
    const int32_t n = std::min(deficit, standby_left);
    for (int32_t i = 0; i < n; ++i) d.promote.push_back(standby[static_cast<size_t>(i)]->id);
    standby_left -= n;
    deficit -= n;
    const int32_t from_starting = std::min(deficit, starting_left);
    std::sort(starting_views.begin(), starting_views.end(), by_id_asc);
    for (int32_t i = 0; i < from_starting; ++i) d.starting_for_deficit.push_back(starting_views[static_cast<size_t>(i)]->id);
    starting_left -= from_starting;
    deficit -= from_starting;
    cold_start(deficit);  // they join the pool when ready and are promoted on a later tick
    d.num_start_for_deficit = static_cast<int32_t>(d.start.size());
  } else if (deficit < 0) {
    std::vector<const ReplicaView*> order = ready;
    // A draftless replica (its draft worker died) first, then the emptiest.
    std::sort(order.begin(), order.end(), [](const ReplicaView* a, const ReplicaView* b) {
      if (a->draftless != b->draftless) return a->draftless;
      return a->num_assigned != b->num_assigned ? a->num_assigned < b->num_assigned : a->id > b->id;
    });
    for (int32_t i = 0; i < -deficit; ++i) {
      // NOTE: warm replicas only: a replica still starting is not counted, so a drained replica
      // (loaded and warm) refills the pool rather than stopping while a cold start is under way;
      // the surplus is trimmed below once the starting one is warm. A draftless one never joins it.
      const bool to_standby = !order[static_cast<size_t>(i)]->draftless && standby_left + draining_to_standby < o.warm_pool;
      if (to_standby) ++draining_to_standby;
      d.drain.push_back({order[static_cast<size_t>(i)]->id, to_standby});
    }
  }
  const int32_t pool = standby_left + starting_left + draining_to_standby;
  const int32_t warm = standby_left + draining_to_standby;
  if (pool < o.warm_pool) {
    cold_start(o.warm_pool - pool);
  } else if (warm > o.warm_pool && target_ <= num_ready) {
    // Surplus standby replicas stop, highest id first (never one promoted in this tick). Only
    // warm replicas count: a warm standby is never stopped for one still starting.
    const int32_t surplus = std::min(warm - o.warm_pool, standby_left);
    for (int32_t i = 0; i < surplus; ++i) d.stop.push_back(standby[standby.size() - 1 - static_cast<size_t>(i)]->id);
  }
  return d;
}

}  // namespace specserve
