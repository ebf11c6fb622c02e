// specserve scheduler: the head's rebalance policy — which routed replica hands requests back so
// that another routed replica with room serves them.
//
// Dispatch (scheduler/dispatch.h) places each new request well, but it cannot undo an earlier
// placement: a burst that arrived while one replica was routed sits on that replica after a
// scale-up promotes a second one, and the promoted replica idles until the next arrival. The head
// therefore asks busy replicas to hand requests back (reclaim_atom; they re-enter dispatch as
// MigratedSeq "rebalance" and go where they run at once). Pure: no clock, no I/O; tested as a
// table of `loads -> plan` (tests/scheduler/rebalance_test.cpp).
//
// Rules (all counts are requests on the replica's decode engine: running + waiting there):
//   1. Waiting first. A replica holding more than max_num_seqs (some wait in its engine's local
//      queue), or whose KV cache is full while requests wait in its engine for room (kv_waiting:
//      sequences preempted back into the queue, prompts not admitted), hands back up to that
//      excess, bounded by the batch slots free on the other routed replicas whose cache is not
//      full (sum of max(0, max_num_seqs - assigned)), in replica-id order. Those requests have no
//      KV in the cache, so moving them costs one message round-trip.
//   2. Running second (only when rule 1 planned nothing, and RebalanceOptions::running is on):
//      live migration for load balance, as in Llumnix (Sun et al., OSDI 2024): with A requests on
//      N routed replicas the share is ceil(A / N); a replica whose count exceeds the least-loaded
//      one's by at least min_imbalance hands back (count - share) running sequences, bounded by
//      the receivers' room (sum over replicas below the share of min(share - count, free batch
//      slots)). The sequences move with their KV (kv/, actors/kv_data_plane.h) or recompute
//      where it is unusable; either way the stream goes on and greedy output is unchanged. The
//      replica picks which (actors/target_shard.cpp: most recently admitted first, never one
//      with few tokens left).
//   3. A replica not `eligible` (a hand-back still in flight, or one recently refused) neither
//      gives nor is asked again; it still counts as a receiver and in the share. A replica whose
//      cache is full (kv_full) is no receiver under either rule: what it took would wait or
//      preempt there.
// NOTE: before kv_waiting, a replica preempting under KV pressure with fewer requests than its
// batch kept them all while a replica promoted for that pressure sat idle; and a full replica
// counted its free batch slots as room.
#pragma once

#include <cstdint>
#include <vector>

namespace specserve {

/// One routed (ready, receiving work) replica as the head sees it now.
struct RebalanceLoad {
  int32_t replica = 0;
  int32_t max_num_seqs = 0;  ///< its engine's batch size; <= 0: not reported yet (ignored)
  int32_t assigned = 0;      ///< requests on its decode engine (running + waiting there), >= 0
  bool eligible = true;      ///< may be asked to hand requests back now (rule 3)
  /// Its KV-cache usage is above the pressure threshold (the autoscaler's
  /// target_kv_cache_usage): it receives nothing (rule 3).
  bool kv_full = false;
  /// With kv_full: requests waiting in its engine while its batch has free slots (waiting for
  /// KV room), from its last load report, >= 0; rule 1 hands them back.
  int32_t kv_waiting = 0;
};

struct RebalanceOptions {
  /// Rule 2 on: running sequences migrate to even out the load (topology
  /// `scheduler.rebalance_running`).
  bool running = true;
  /// Rule 2 acts only when the busiest replica holds at least this many more requests than the
  /// least loaded one (>= 1). NOTE: 4 by default: smaller gaps come and go as requests finish,
  /// and each move costs a KV transfer and a scheduling round-trip.
  int32_t min_imbalance = 4;
};

/// One hand-back to ask for.
struct Reclaim {
  int32_t replica = 0;
  int32_t count = 0;           ///< requests to hand back, > 0 (the replica may give fewer)
  bool running = false;        ///< false: only requests still waiting in its engine (rule 1)
};

/// Plans the hand-backs of one rebalance (rules in the file comment). `loads`: every routed
/// replica, any order. Deterministic; replicas with max_num_seqs <= 0 are ignored. Returns the
/// hand-backs in replica-id order, empty when the load is balanced enough.
std::vector<Reclaim> plan_rebalance(std::vector<RebalanceLoad> loads, const RebalanceOptions& options);

}  // namespace specserve
