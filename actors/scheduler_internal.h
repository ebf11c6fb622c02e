// specserve actors: what the scheduler actor's .cpp files share (not part of the public API).
//
// scheduler.cpp (the actor's behavior: worker hellos, submissions, cancels, shard loads, down
// messages, drains, status, tensor-parallel rendezvous), scheduler_dispatch.cpp (the queue:
// dispatch, rebalance, re-queueing and migration between replicas) and scheduler_lifecycle.cpp
// (replica lifecycle and autoscaling: start, promote, drain, undrain, retire; the autoscaler's
// tick; `status`) all work on SchedulerState, defined here. Include only from actors/scheduler*.cpp.
#pragma once

#include <caf/all.hpp>

#include <array>
#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "actors/messages.h"
#include "actors/scheduler.h"
#include "actors/tp_group.h"
#include "scheduler/autoscale_policy.h"

namespace specserve {
namespace scheduler_internal {

using Clock = std::chrono::steady_clock;

/// Seconds from `t0` to now (steady clock).
double seconds_since(Clock::time_point t0);

// ---------------------------------------------------------------- scheduler actor

struct WorkerEntry {
  WorkerHello hello;
  Clock::time_point since;
};

struct ReplicaEntry {
  caf::actor shard;
  caf::actor draft;
  bool shard_ready = false;
  bool needs_draft = false;   // the topology gives it a draft worker
  bool draft_settled = false; // the draft worker is ready, failed or gone
  bool draft_attached = false;
  // Its draft worker died (under an autoscaler that starts processes): it serves without drafts
  // until a standby replica replaces it (replace_draftless); cleared when it stops.
  bool draft_lost = false;
  // Drained by replace_draftless (a swap, not a scale-down): its stop is not counted as one.
  bool swapped_out = false;
  bool lost = false;          // its target shard died
  double lost_at = 0;         // when (now_s); with scheduler.worker_restarts its node may restart it
  bool restart_possible = false;  // it died abnormally (a worker that quit on its own is not restarted)
  WorkerHello shard_hello, draft_hello;
  ShardLoad load;
  int32_t pending_blocks = 0;  // promised to WorkItems the shard has not confirmed yet
  int64_t sent = 0;            // WorkItems sent
  std::deque<std::pair<int64_t, int32_t>> in_flight;  // (sequence number, blocks) not yet confirmed
  std::set<int64_t> assigned;
  // Disaggregated prefill: the replica's prefill worker takes fresh requests and hands them to
  // a decode replica (MigratedSeq) once their prompt is in its KV cache.
  caf::actor tp_waiter;  // rank 0's ActorTensorParallelPeers::waiter() (tensor parallelism), or none
  caf::actor prefill;
  WorkerHello prefill_hello;
  bool prefill_ready = false;
  ShardLoad prefill_load;
  std::set<int64_t> on_prefill;  // requests on the prefill worker now
  bool draining_out = false;     // its sequences are moving away: it takes no new work
  bool ready() const { return shard && shard_ready && (!needs_draft || draft_settled) && !draining_out; }
  // Lifecycle (scheduler/autoscale_policy.h); times on the scheduler's clock (now_s).
  ReplicaState state = ReplicaState::kStopped;
  double state_since = 0;
  std::array<double, kNumReplicaStates> state_seconds{};
  double ready_since = 0;           // became ready (routed) last
  double start_requested_at = -1;   // cold start asked for (or first seen registering)
  double promoted_at = -1;
  // Scale-up measurement: armed by a promotion, set on the first request dispatch gives it.
  bool awaiting_assign = false;     // promoted (scale-up); no request dispatched to it yet
  double scale_decision_at = -1;    // when the scale-up that routes it was decided
  bool cold_path = false;           // that scale-up started it cold (not a warm promotion)
  int64_t measured_request = 0;     // its first request after the scale-up with no token yet; 0: none
  bool awaiting_first_token = false;  // a request was sent to it; measured_request's first token not seen yet
  double promotion_routable_s = 0, promotion_dispatch_s = 0;  // its last warm promotion (decision -> ...)
  // Rebalance (reclaim_atom): asked of its shard so far, and handled as its ShardLoad says.
  int64_t reclaims_sent = 0;
  int64_t reclaims_done = 0;
  int64_t handed_back = 0;           // MigratedSeq "rebalance" received from it
  int64_t handed_back_at_reclaim = 0;  // handed_back when the last reclaim was sent
  double no_reclaim_until = 0;      // a reclaimed request came straight back: not asked again before this
  // The head's launcher started its processes (last start): while it is stopped, a worker hello
  // for it belongs to a start the head gave up, never to a new one.
  bool head_launched = false;
  bool drain_to_standby = false;
  bool not_startable = false;       // start_replica refused it (no worker of it on this host): for good
  // kMaxStartFailures failed starts in a row, or its worker failed to load: the queue does not
  // wait for it (it fails at once when nothing else can serve it), but the autoscaler starts it
  // again after its backoff (start_backoff_s doubling up to start_backoff_max_s), so a cause that
  // is fixed (a model file put back, memory freed) heals the cluster. Cleared once it is ready.
  bool parked = false;
  double start_failed_at = -1;      // its last failed start (the backoff counts from there)
  std::string last_start_error;     // why it last failed to start ("" once ready)
  int32_t num_retiring = 0;         // its workers told to quit whose down message has not come
  int32_t num_start_failures = 0;   // consecutive failed starts (the policy's backoff)
  bool can_serve_later() const { return !not_startable && !parked; }
  double cold_start_s = 0, promotion_s = 0;
  int64_t num_promotions = 0, num_cold_starts = 0;
  bool routed() const { return state == ReplicaState::kReady && ready(); }
};

struct Pending {
  WorkItem item;
  int64_t arrival = 0;
  double enqueued_at = 0;
};

struct SchedulerState {
  SchedulerConfig cfg;
  Clock::time_point t0 = Clock::now();
  std::map<caf::actor_addr, WorkerEntry> workers;
  std::map<int32_t, ReplicaEntry> replicas;
  std::map<int64_t, Pending> queue;            // by request id
  std::map<int64_t, int32_t> running;          // request id -> replica
  std::map<int64_t, caf::actor> request_actors;
  std::map<int64_t, double> arrived_at;        // request id -> its first arrival at the head (now_s)
  int64_t next_id = 1;
  int64_t next_arrival = 1;
  int64_t finished = 0;
  int64_t requeued = 0;
  int64_t migrated = 0;
  // Requests between replicas: their request actor is asked for the next attempt's WorkItem, so
  // they are neither queued nor running. A cancel meanwhile is remembered and applied on arrival.
  std::set<int64_t> in_transit;
  std::map<std::string, caf::actor> retiring_peers;  // data-plane name -> a retired shard not down yet
  std::set<int64_t> cancelled_in_transit;
  bool draining = false;
  bool no_restarts = false;  // no_restart_atom: no node is left to restart a worker
  // The time-weighted mean of request_actors.size() since the last autoscaler tick
  // (AutoscaleInput::mean_ongoing): request-seconds so far, since when, and the count's last change.
  double ongoing_area = 0;
  double ongoing_window_start = 0;
  double ongoing_changed_at = 0;
  std::vector<caf::response_promise> drain_waiters;
  TpRegistry tp;  // tensor-parallel groups forming, and their rendezvous keys (actors/tp_group.h)
  int32_t max_model_len = 0;
  // Autoscaler (null when the topology does not enable it).
  std::unique_ptr<Autoscaler> autoscaler;
  bool cpu_only = true;                 // every declared worker runs on a CPU device
  bool ever_routed = false;             // a replica was routed once (the start-up promotion is no scale-up)
  std::deque<TtftSample> ttft;          // recent first-token samples, pruned to the look-back window
  std::map<caf::actor_addr, int32_t> retired;  // workers told to quit -> replica: their down message is expected
  /// A new worker for a slot a live worker holds (scheduler.cpp slot_holder): its newest hello,
  /// waiting (kSlotWaitS) for the holder to be found down before it is refused.
  struct SlotConflict {
    WorkerHello hello;
    double since = 0;
  };
  std::map<caf::actor_addr, SlotConflict> slot_conflicts;
  std::set<caf::actor_addr> refused;  // workers refused their slot and told to quit: their down is expected
  std::map<int64_t, int32_t> rebalanced_from;  // request handed back by a busy replica -> that replica
  double held_deficit_since = -1;       // a scale-up's cold start held back (CPU host) since this decision
  bool deficit_by_wanted = false;       // cold starts were held: AutoscaleInput::deficit_by_wanted
  AutoscaleStatus as;                   // counters and recent measurements for `status`
  ShardLoad ended;                      // ClusterStatus::ended: counters of replica loads that were reset
};

using SchedSelf = caf::stateful_actor<SchedulerState>*;

/// Seconds since the scheduler started: the clock of every `*_s`, `*_at` and `*_since` field above.
double now_s(SchedSelf self);

/// Appends `x` to `v`, keeping its last `n` values (recent measurements for `status`).
void keep_last(std::vector<double>* v, double x, size_t n = 64);

// A request a busy replica handed back (rebalance) that dispatch placed on that replica again:
// the replica is not asked again for this long.
constexpr double kNoReclaimAfterReturnS = 1.0;

// ---------------------------------------------------------------- the queue (scheduler_dispatch.cpp)

/// The worker whose data-plane name is `name` (kv_peer_name), or an invalid handle.
caf::actor kv_peer(SchedulerState& s, const std::string& name);

/// Tells the worker holding a KV offer that nobody will read it.
void release_offer(SchedSelf self, const KvOffer& kv);

/// Puts `item` in the queue. `arrival` is its arrival_seq, its order among equal priorities
/// (scheduler/dispatch.h rule 2): 0 puts it ahead of every request that arrived after it.
void enqueue(SchedSelf self, WorkItem item, int64_t arrival);

/// Ends queued request `id` (its request actor gets `reason` and `error`) and releases its KV offer;
/// nothing when it is not queued.
void fail_queued(SchedSelf self, int64_t id, const std::string& reason, const std::string& error);

/// Answers the drain waiters once the server drains and no request is queued, running or alive.
void maybe_drained(SchedSelf self);

/// Runs the dispatch policy (scheduler/dispatch.h) over the queue and sends what it assigns (or
/// fails the queue when no replica is left), then rebalance().
void dispatch(SchedSelf self);
/// A worker's hello (registration, and each state change after it): checks the token and its
/// slot (a live holder makes a newcomer wait, then be refused), records it in its replica and
/// acts on it (draft attached, KV peers told, start-up state, dispatch). scheduler_register.cpp.
void register_worker(SchedSelf self, WorkerHello& h);

/// Busy replicas hand requests back to the head when another routed replica has room
/// (scheduler/rebalance.h: first requests waiting beyond a batch, then running sequences toward
/// an even share, with their KV), typically right after a promotion, when the burst that caused
/// it already sits on the busy replicas. The hand-back is reclaim_atom -> MigratedSeq
/// "rebalance", and dispatch sends them where they run at once (scheduler/dispatch.h rule 5), so a
/// promoted replica serves at once instead of idling until the next arrival.
void rebalance(SchedSelf self);

/// Adds the request-seconds since the count of request_actors last changed to the autoscaler's
/// mean (SchedulerState::ongoing_area); call at `now_s` (head clock) before the count changes.
void note_ongoing_change(SchedulerState& s, double now_s);

/// The replica's target shard is gone: its requests go back to the queue, first in line.
/// `abnormal`: the target shard died (its process killed, its connection lost), rather than quit
/// on its own (drained, stopped): only then may its node restart it.
void replica_lost(SchedSelf self, int32_t replica_id, bool abnormal);
/// True while a lost replica's node may still restart its target shard (static topology,
/// scheduler.worker_restarts > 0, tensor-parallel size 1, within worker_restart_timeout_s of the
/// loss, and no no_restart_atom came: a node is left): the queue waits for it instead of failing.
bool awaiting_restart(SchedSelf self, const ReplicaEntry& r);

/// Requests whose worker died go back to the queue, first in line.
void requeue(SchedSelf self, const std::set<int64_t>& lost);

/// A sequence left replica m.replica with its state: the request actor hands back its WorkItem
/// (every token streamed so far) and it is dispatched, first in line, with the state and KV offer.
void migrated(SchedSelf self, MigratedSeq m);

// ---------------------------------------------------------------- lifecycle and autoscaling (scheduler_lifecycle.cpp)

/// Moves replica `rid` to `to`, adding the time spent in its old state.
void set_state(SchedSelf self, int32_t rid, ReplicaState to);

/// Tells replica `rid`'s workers to quit (the autoscaler stops it; their down messages are
/// expected) and moves it to stopped; counted as a stop unless it is being replaced.
void retire(SchedSelf self, int32_t rid);

/// Stops routing new requests to replica `rid` (ready -> draining); its running sequences move
/// to the routed replicas that stay when they have KV room for them, else finish there. Then it
/// parks in standby (`to_standby`) or stops (finish_drain_if_idle).
void begin_drain(SchedSelf self, int32_t rid, bool to_standby);

/// Starts replica `rid`'s processes (the launcher); `for_deficit`: for a scale-up (its promotion
/// is timed from the decision), not a pool refill.
void start_cold(SchedSelf self, int32_t rid, bool for_deficit);

/// A draining replica routed again (a burst during a scale-down).
void undrain(SchedSelf self, int32_t rid);

/// Routes a standby replica (the decision was taken at `decided_at`, head clock): a state flip,
/// timed as a warm promotion (or as the cold path of a scale-up it was started for).
/// `measured` false: a swap (replace_draftless), not a scale-up: not counted or timed.
void promote(SchedSelf self, int32_t rid, double decided_at, bool measured = true);

/// The tensor-parallel ranks > 0 of replica `rid` that registered and are not down (actors/tp_rank.h).
std::vector<caf::actor> tp_followers(const SchedulerState& s, int32_t rid);

/// The replica's startup states follow its workers' hellos; a replica that finished warming up
/// (its draft worker settled too) is routed at once without an autoscaler, else parked in standby
/// for the policy to promote.
void update_startup_state(SchedSelf self, int32_t rid);

/// A draining replica whose last request finished parks in standby or stops.
void finish_drain_if_idle(SchedSelf self, int32_t rid);

// (The two below: scheduler_replace.cpp.)

/// Replica `rid`'s draft worker died (abnormally). Under an autoscaler that starts processes the
/// replica is replaced, since nothing restarts a draft worker alone there (worker_restarts is
/// off): a replica not routed (standby, starting) stops and the pool refills it; a routed one
/// keeps serving without drafts (lossless: the target alone decides) and is marked draft_lost
/// for replace_draftless. Without such an autoscaler nothing changes (scheduler.worker_restarts
/// restarts the draft worker, which attaches again).
void draft_lost(SchedSelf self, int32_t rid);

/// Each routed replica whose draft worker died is replaced: a warm standby is promoted and the
/// draftless replica drains (its sequences move there with their KV), then stops; with no
/// standby ready, a stopped replica is started cold for it (it is promoted once warm). Runs on
/// every autoscaler tick before the policy, so the policy sees the swap done.
void replace_draftless(SchedSelf self);

/// A start failed (the launcher said so, or the policy gave up on it): stopped, one more failure
/// for the backoff.
void start_failed(SchedSelf self, int32_t rid, const std::string& why, bool permanent = false);

/// One autoscaler tick: runs the policy (scheduler/autoscale_policy.h) on the replicas and the load,
/// applies its decision (stop, drain, undrain, promote, cold starts), then dispatch(). Nothing
/// without an autoscaler.
void autoscale_tick(SchedSelf self);

/// The cluster as `status` shows it (StatusQuery): workers, replicas, queue and autoscaler.
ClusterStatus make_status(SchedSelf self);

/// Adds the counters of `l` (ClusterStatus::ended lists them) to `into`; gauges are left alone.
void add_load_counters(ShardLoad& into, const ShardLoad& l);

}  // namespace scheduler_internal
}  // namespace specserve
