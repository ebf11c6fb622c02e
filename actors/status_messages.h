// specserve actors: a shard's load report (ShardLoad, after every step) and what `specserve
// status`, /metrics and the client's status() read: the head's view of its workers, replicas,
// autoscaler and queue (ClusterStatus, the reply to StatusQuery). Part of actors/messages.h
// (which includes this file and gives these types their CAF type IDs); include that one.
#pragma once

#include <caf/all.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "spec/proposer.h"

namespace specserve {

/// Shard -> scheduler after each step (and when it becomes idle): its load.
struct ShardLoad {
  int32_t replica = 0;
  int32_t free_kv_blocks = 0;  ///< free blocks of the cache, less those migrated requests being fetched need
  int32_t total_kv_blocks = 0;
  int32_t num_running = 0;
  int32_t num_waiting = 0;     ///< waiting in the engine, plus migrated requests whose KV is being fetched
  int32_t num_fetching = 0;    ///< of num_waiting: the migrated requests whose KV is being fetched
  int64_t num_steps = 0;
  int64_t generated_tokens = 0;
  int64_t num_drafts = 0;
  int64_t num_draft_tokens = 0;
  int64_t num_accepted_tokens = 0;
  double forward_seconds = 0;
  double draft_seconds = 0;
  std::vector<int64_t> finished;  ///< request ids that finished in this step
  int64_t received = 0;           ///< WorkItems received so far (the head's in-flight accounting)
  int64_t prompt_tokens = 0;      ///< prompt tokens of every request added (EngineStats::prompt_tokens)
  /// [k]: engine-wide totals of SpecStats::accepted_per_pos — drafts whose token at position i
  /// was accepted (vLLM's spec_decode_num_accepted_tokens_per_pos); sums to num_accepted_tokens.
  /// Counted when a sequence finishes, like the other speculative counters.
  std::vector<int64_t> accepted_per_pos;
  /// Prefix cache, engine-wide totals (EngineStats: vLLM V1's prefix_cache_queries /
  /// prefix_cache_hits): tokens looked up at admission, and tokens found cached.
  int64_t prefix_cache_queries = 0;
  int64_t prefix_cache_hits = 0;
  int64_t kv_imported_tokens = 0;    ///< tokens of migrated sequences whose KV arrived (totals)
  int64_t kv_recomputed_tokens = 0;  ///< tokens of migrated sequences that came without usable KV
  int64_t num_reclaims = 0;          ///< reclaim_atom messages handled so far (the head's in-flight accounting)
  int64_t num_preemptions = 0;       ///< EngineStats::num_preemptions (engine total)
  /// disable_by_goodput, engine totals (EngineStats): sequence-steps that could draft in which the
  /// policy let the sequence draft / left it out. Both 0 when the policy is off.
  int64_t goodput_drafting = 0;
  int64_t goodput_skipped = 0;
  /// [DraftSource] (spec/proposer.h): EngineStats::by_source, engine totals counted at each
  /// verification step. Empty from a worker that sent none.
  std::vector<int64_t> drafts_by_source, draft_tokens_by_source, accepted_by_source;
};

/// The `source` name of entry i of ShardLoad's *_by_source vectors (spec/proposer.h
/// draft_source_name: "model", "prompt_lookup", "cached_requests"); nullptr past the last source.
/// For the front ends, which may not include spec/ (../shared/DESIGN.md).
inline const char* load_source_name(size_t i) {
  return i < static_cast<size_t>(kNumDraftSources) ? draft_source_name(static_cast<DraftSource>(i)) : nullptr;
}

/// into[i] += from[i], into grown to from's size (summing ShardLoad's per-position and
/// per-source counters).
inline void add_counts(std::vector<int64_t>& into, const std::vector<int64_t>& from) {
  if (into.size() < from.size()) into.resize(from.size(), 0);
  for (size_t i = 0; i < from.size(); ++i) into[i] += from[i];
}

/// Anyone with the token -> scheduler. Reply: ClusterStatus.
struct StatusQuery {
  std::string token;
};

struct WorkerStatus {
  std::string node;
  std::string role;
  int32_t replica = 0;
  int32_t rank = 0;
  int32_t pid = 0;
  std::string state;
  std::string error;
  double load_seconds = 0;
  double warmup_seconds = 0;
  std::string compute;  ///< WorkerHello::compute
};

struct ReplicaStatus {
  int32_t replica = 0;
  bool ready = false;
  int32_t assigned = 0;       ///< requests on it now (those on its prefill worker included)
  ShardLoad load;             ///< its target shard's (the decode shard's, with a prefill worker)
  /// Disaggregated prefill: the replica's prefill worker's last load (its engine's totals: the
  /// prompts it took and their first tokens); all zero without one; before its first report,
  /// zero but its KV cache (from its hello: all free).
  bool has_prefill_worker = false;
  ShardLoad prefill_load;
  // Lifecycle (scheduler/autoscale_policy.h ReplicaState): "starting", "loading", "warming",
  // "ready" (routed), "draining", "standby" (loaded, warm, not routed), "stopped".
  std::string state;
  double state_seconds = 0;                 ///< time in the current state
  std::vector<double> state_seconds_total;  ///< [7]: time spent in each state, in the order above
  double cold_start_seconds = 0;            ///< last cold start: process start requested -> ready; 0: none
  /// Its last warm promotion, each measured from the autoscaler's decision (0: none):
  double promotion_routable_seconds = 0;    ///< -> routed (a state flip in the head)
  double promotion_dispatch_seconds = 0;    ///< -> the first request sent to it
  double promotion_seconds = 0;             ///< -> the first token of the first request sent to it with none yet
  int64_t num_promotions = 0;
  int64_t num_cold_starts = 0;
  int32_t num_start_failures = 0;  ///< failed starts in a row (0 once it is ready again)
  std::string last_start_error;    ///< why its last start failed; "" once it is ready
  /// The topology gives it a draft worker, which is down (or failed to load): its target shard
  /// serves without speculation (under an autoscaler, until a standby replica replaces it).
  bool draft_lost = false;
};

/// The head's autoscaler (all zero / empty when it does not run).
struct AutoscaleStatus {
  bool enabled = false;
  int32_t min_replicas = 0;
  int32_t max_replicas = 0;
  int32_t warm_pool = 0;
  int32_t target_ready = 0;        ///< the policy's desired ready replicas
  int32_t wanted = 0;              ///< what the load wants now (no hysteresis; AutoscaleDecision::wanted)
  /// Cold starts are held back (CPU-only host: until the promoted replica's first token, at most
  /// 5 s); afterwards only what the load then wants is started, so ready may stay below target.
  bool starts_held = false;
  int32_t ongoing = 0;             ///< queued + assigned at the last tick, or the mean since the one before rounded up when more
  double ttft_p90_seconds = 0;     ///< over the look-back window, new replicas' grace excluded
  int64_t num_promotions = 0;
  int64_t num_cold_starts = 0;    ///< process starts requested (a failed start is one too)
  /// Starts that failed (the launcher's error, a target shard that failed to load, a start
  /// abandoned after start_timeout_s): never ready.
  int64_t num_failed_starts = 0;
  int64_t num_drains = 0;
  int64_t num_stops = 0;
  std::string last_reason;         ///< why the target last changed
  double last_change_seconds = 0;  ///< head uptime at that change
  std::vector<double> cold_start_seconds;  ///< the last 64 cold starts (process start requested -> ready)
  /// The last 64 warm promotions (the start-up promotion is not one), each measured from the
  /// autoscaler's decision on the head's clock:
  /// decision -> the replica is routed (the head's own share: a state flip, microseconds);
  std::vector<double> promotion_routable_seconds;
  /// decision -> the first request sent to it (queued at the head, or handed back by a busy
  /// replica's engine: reclaim_atom), only when that request had already arrived at the head at
  /// the decision; otherwise the promotion is not measured (num_promotions_without_waiting_work);
  std::vector<double> promotion_dispatch_seconds;
  /// decision -> the first token of that request made on the promoted replica (the rest is the
  /// replica's first engine step: one forward pass, plus the message hops shard -> request actor
  /// -> head); a request that already streamed tokens elsewhere (moved, or re-queued) counts with
  /// the first token it gets there.
  std::vector<double> promotion_seconds;
  /// The last 64 scale-ups covered by a cold start (not the pool): decision -> first token, to
  /// set beside promotion_seconds.
  std::vector<double> cold_scale_up_seconds;
  /// Scale-ups (warm or cold) not measured: the first request the replica got arrived after the
  /// decision (no work waited for it), or it left ready before getting any request.
  int64_t num_promotions_without_waiting_work = 0;
};

struct ClusterStatus {
  std::string cluster;
  std::string model;
  std::string speculative_method;  ///< "" when none
  /// The speculative settings in one line (config/topology.h describe_speculative: method, k,
  /// model, lookup bounds, history), "" when none.
  std::string speculative;
  std::vector<WorkerStatus> workers;
  std::vector<ReplicaStatus> replicas;
  int32_t queued = 0;
  int32_t running = 0;
  int64_t finished = 0;
  int64_t requeued = 0;
  bool draining = false;
  int32_t max_model_len = 0;  ///< smallest max_model_len among registered target shards (WorkerHello::max_model_len); 0 when none
  AutoscaleStatus autoscale;
  /// Sequences handed off their replica (drain, rebalance, KV pressure) with their state,
  /// counted at the hand-off: whether their KV arrived or was recomputed is in the kv_* counters.
  int64_t migrated = 0;
  int64_t kv_migrated_tokens = 0;    ///< tokens whose KV arrived with them (not recomputed)
  int64_t kv_recomputed_tokens = 0;  ///< tokens of migrated sequences whose KV had to be recomputed
  int32_t tensor_parallel_size = 1;  ///< ranks per replica (models.target.tensor_parallel_size)
  /// The counters (tokens, speculative and prefix-cache counters, seconds, accepted_per_pos,
  /// goodput decisions) of replica incarnations that ended: a replica's load starts again from 0
  /// when its shard stops, dies or is retired, and its last totals are added here. The cluster's
  /// totals are these plus every replica's load, and never go back. Gauge fields stay 0.
  ShardLoad ended;
};

// ---- inspect (CAF 0.17's serialization hook) ----

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, ShardLoad& x) {
  return f(caf::meta::type_name("ShardLoad"), x.replica, x.free_kv_blocks, x.total_kv_blocks, x.num_running, x.num_waiting, x.num_fetching,
           x.num_steps, x.generated_tokens, x.num_drafts, x.num_draft_tokens, x.num_accepted_tokens, x.forward_seconds,
           x.draft_seconds, x.finished, x.received, x.prompt_tokens, x.accepted_per_pos, x.prefix_cache_queries,
           x.prefix_cache_hits, x.kv_imported_tokens, x.kv_recomputed_tokens, x.num_reclaims, x.num_preemptions,
           x.goodput_drafting, x.goodput_skipped, x.drafts_by_source, x.draft_tokens_by_source, x.accepted_by_source);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, StatusQuery& x) {
  return f(caf::meta::type_name("StatusQuery"), x.token);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, WorkerStatus& x) {
  return f(caf::meta::type_name("WorkerStatus"), x.node, x.role, x.replica, x.rank, x.pid, x.state, x.error,
           x.load_seconds, x.warmup_seconds, x.compute);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, ReplicaStatus& x) {
  return f(caf::meta::type_name("ReplicaStatus"), x.replica, x.ready, x.assigned, x.load, x.has_prefill_worker,
           x.prefill_load, x.state, x.state_seconds,
           x.state_seconds_total, x.cold_start_seconds, x.promotion_routable_seconds, x.promotion_dispatch_seconds,
           x.promotion_seconds, x.num_promotions, x.num_cold_starts, x.num_start_failures, x.last_start_error, x.draft_lost);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, AutoscaleStatus& x) {
  return f(caf::meta::type_name("AutoscaleStatus"), x.enabled, x.min_replicas, x.max_replicas, x.warm_pool, x.target_ready,
           x.wanted, x.starts_held, x.ongoing, x.ttft_p90_seconds, x.num_promotions, x.num_cold_starts, x.num_failed_starts, x.num_drains, x.num_stops, x.last_reason,
           x.last_change_seconds, x.cold_start_seconds, x.promotion_routable_seconds, x.promotion_dispatch_seconds,
           x.promotion_seconds, x.cold_scale_up_seconds, x.num_promotions_without_waiting_work);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, ClusterStatus& x) {
  return f(caf::meta::type_name("ClusterStatus"), x.cluster, x.model, x.speculative_method, x.speculative, x.workers, x.replicas, x.queued,
           x.running, x.finished, x.requeued, x.draining, x.max_model_len, x.autoscale, x.migrated, x.kv_migrated_tokens,
           x.kv_recomputed_tokens, x.tensor_parallel_size, x.ended);
}

}  // namespace specserve
