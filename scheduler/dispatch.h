// specserve scheduler: the head's dispatch policy — which queued request goes to which replica.
//
// The head keeps one global queue of requests and several replicas (DESIGN.md section 5: one
// target model plus its proposer, each running its own continuous-batching Engine). Each tick
// the head's actor snapshots the queue and the replicas' last reported load, calls
// plan_dispatch(), and sends each assigned request to its replica. The function is pure: no
// threads, no I/O, no clock (the time is an argument), so every rule below is tested as a
// table of `queue, replicas, now -> plan` (tests/scheduler/dispatch_test.cpp).
//
// Rules, in order:
//   1. Reject: a request that no listed replica, ready or not, could ever hold — its
//      num_tokens + 1 positions exceed every replica's max_model_len, or its KV blocks exceed
//      every replica's whole cache — is rejected with a reason naming the numbers. Rejected
//      requests never block the queue. An empty replica list rejects nothing (replicas may
//      still be starting).
//   2. Order: by effective priority, then arrival_seq, then id. Effective priority is
//      `priority - floor(waited_s / aging_s)`: lower runs first (vLLM's meaning), and a waiting
//      request gains one level per aging_s waited, so no priority class starves forever.
//      Re-queued requests (their replica died) keep their original arrival_seq and so go first
//      among equals.
//   3. Head-of-line blocking: requests are placed in that order; the first one that fits no
//      ready replica now stops the plan — nothing behind it jumps ahead. A big prompt therefore
//      waits for room instead of being overtaken forever by small ones.
//   4. Fit: only ready replicas receive work. A request needs
//      ceil((num_tokens + 1) / block_size) free KV blocks of the replica (its known tokens plus
//      the slot of the first new token; the same rule as Engine::add_request), counting blocks
//      promised to earlier requests of the same plan; num_tokens + 1 <= max_model_len; and a
//      free slot: num_assigned + (assigned in this plan) < max_num_seqs + max_queued_per_replica.
//   5. Choice: among the replicas a request fits, first those where it runs at once (num_assigned
//      + planned < max_num_seqs: a free batch slot) over those where it would wait in the engine's
//      local queue; then the one with the most free blocks left after this plan's earlier
//      assignments; ties: fewest requests (num_assigned + planned), then the lowest replica id.
//      NOTE: without the first key a replica with a full batch but a large cache took requests
//      that would wait there while a replica with a smaller cache idled (a promoted replica
//      handed requests back by a busy one got them sent back: actors/scheduler_dispatch.cpp rebalance).
//   6. Hand-backs: a request with avoid_replica set (a busy replica handed it back to even out
//      the load: scheduler/rebalance.h) goes to any other replica it fits before that one; it
//      goes back there only when it fits nowhere else now.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace specserve {

/// One request waiting in the head's global queue.
struct QueuedRequest {
  int64_t id = 0;
  int32_t priority = 0;        ///< lower runs first (vLLM's meaning); may be negative
  int64_t arrival_seq = 0;     ///< order of first arrival; a re-queued request keeps its own
  double enqueued_at_s = 0.0;  ///< when it (first) entered the queue, seconds, same clock as now_s
  int32_t num_tokens = 0;      ///< prompt + tokens already generated (a re-queued request carries them)
  /// Carried for the replica; the policy does not use it (a request whose prompt fits but whose
  /// max_new_tokens does not is admitted and finishes with reason "length", as in vLLM's engine).
  int32_t max_new_tokens = 0;
  /// The replica that handed it back to balance load (rule 6), or -1.
  int32_t avoid_replica = -1;
};

/// One replica's load as it last reported it.
struct ReplicaLoad {
  int32_t replica = 0;         ///< replica id
  bool ready = false;          ///< weights loaded and warmed up: may receive work
  /// Free KV blocks of the target's cache, net of what the replica's own waiting requests will
  /// need (the replica's actor reports it that way, or the head subtracts its in-flight
  /// assignments before calling plan_dispatch; the plan itself only counts its own promises).
  int32_t free_kv_blocks = 0;
  int32_t total_kv_blocks = 0; ///< the whole cache, in blocks
  int32_t block_size = 16;     ///< tokens per KV block; a replica with block_size <= 0 is ignored
  int32_t num_assigned = 0;    ///< requests on the replica now: running + waiting in its engine
  int32_t max_num_seqs = 0;    ///< the replica engine's batch size (EngineOptions::max_num_seqs)
  int32_t max_model_len = 0;   ///< positions per sequence (prompt + output)
};

struct DispatchOptions {
  /// Seconds of waiting that improve a request's effective priority by one level. <= 0: off
  /// (pure priority, then arrival).
  double aging_s = 10.0;
  /// Requests a replica may hold beyond max_num_seqs, waiting in its own engine.
  /// NOTE: 2 by default. A small local queue keeps the replica's batch full: when a sequence
  /// finishes, its engine admits the next one in the same step instead of idling for a
  /// head tick and a message round-trip. Keeping it small leaves the rest at the head, where
  /// priorities and aging apply across all replicas and a request goes to whichever replica
  /// frees first. 0 makes the head the only queue.
  int32_t max_queued_per_replica = 2;
};

struct Assignment {
  int64_t request_id = 0;
  int32_t replica = 0;
};

/// What plan_dispatch decided. Requests neither assigned nor rejected stay queued.
struct DispatchPlan {
  std::vector<Assignment> assign;  ///< in dispatch order (effective priority, then arrival)
  /// Requests no replica could ever hold, with a reason naming the numbers, e.g.
  /// "needs 5001 token positions (5000 known + 1 new) but the largest max_model_len of any replica is 4096".
  /// In queue order (effective priority, then arrival).
  std::vector<std::pair<int64_t, std::string>> reject;
  /// The head-of-line request that fits no ready replica now (nothing behind it was assigned),
  /// or -1 when the plan assigned everything it did not reject.
  int64_t blocked_request_id = -1;
};

/// The effective priority of a request that has waited `now_s - enqueued_at_s` seconds:
/// `priority - floor(waited / aging_s)` (waited < 0 counts as 0; aging_s <= 0: `priority`).
/// Saturates instead of overflowing for absurd waits.
int64_t effective_priority(const QueuedRequest& request, double now_s, const DispatchOptions& options);

/// KV blocks a sequence of `num_tokens` known tokens needs to take one more:
/// ceil((num_tokens + 1) / block_size). block_size must be > 0.
int64_t blocks_needed(int64_t num_tokens, int32_t block_size);

/// Plans one dispatch tick (rules in the file comment). `queue`: the waiting requests in any
/// order (taken by value: the function sorts its copy). `replicas`: every replica the head
/// knows, ready or not. `now_s`: the current time in seconds on the clock of enqueued_at_s.
/// Deterministic: the same inputs give the same plan.
DispatchPlan plan_dispatch(std::vector<QueuedRequest> queue, const std::vector<ReplicaLoad>& replicas, double now_s,
                           const DispatchOptions& options);

}  // namespace specserve
