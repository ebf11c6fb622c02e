// Helpers of the autoscaler policy tests (autoscale_policy_test.cpp: single ticks;
// autoscale_trace_test.cpp: traces through a simulated head): the options every test starts
// from and a replica's view.
#pragma once

#include <cstdint>

#include "scheduler/autoscale_policy.h"

namespace specserve::autoscale_testing {

inline AutoscaleOptions opts(int32_t min_r, int32_t max_r, int32_t pool, double up_s = 1.0, double down_s = 3.0) {
  AutoscaleOptions o;
  o.min_replicas = min_r;
  o.max_replicas = max_r;
  o.warm_pool = pool;
  o.upscale_delay_s = up_s;
  o.downscale_delay_s = down_s;
  o.target_ongoing_requests = 2;
  o.ttft_slo_ms = 0;
  o.target_kv_cache_usage = 1.0;
  o.look_back_period_s = 10;
  o.new_replica_grace_s = 2;
  return o;
}

inline ReplicaView rv(int32_t id, ReplicaState st, int32_t assigned = 0, double ready_since = 0) {
  ReplicaView r;
  r.id = id;
  r.state = st;
  r.num_assigned = assigned;
  r.ready_since_s = ready_since;
  return r;
}

using S = ReplicaState;

}  // namespace specserve::autoscale_testing
