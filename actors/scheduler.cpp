#include "actors/scheduler.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <deque>
#include <map>
#include <set>

#include "actors/messages.h"
#include "actors/prompt.h"
#include "actors/request_actor.h"
#include "actors/tp_group.h"
#include "actors/runtime.h"
#include "core/logging.h"
#include "scheduler/autoscale_policy.h"
#include "scheduler/dispatch.h"
#include "scheduler/rebalance.h"

namespace specserve {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

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
  bool lost = false;          // its target shard died (shards are not restarted yet)
  WorkerHello shard_hello, draft_hello;
  ShardLoad load;
  int32_t pending_blocks = 0;  // promised to WorkItems the shard has not confirmed yet
  int64_t sent = 0;            // WorkItems sent
  std::deque<std::pair<int64_t, int32_t>> in_flight;  // (sequence number, blocks) not yet confirmed
  std::set<int64_t> assigned;
  // Disaggregated prefill: the replica's prefill worker takes fresh requests and hands them to
  // a decode replica (MigratedSeq) once their prompt is in its KV cache.
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
  bool not_startable = false;       // start_replica failed, its worker failed to load, or too many failed starts
  int32_t num_retiring = 0;         // its workers told to quit whose down message has not come
  int32_t num_start_failures = 0;   // consecutive failed starts (the policy's backoff)
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
  std::vector<caf::response_promise> drain_waiters;
  TpRegistry tp;  // tensor-parallel groups forming, and their rendezvous keys (actors/tp_group.h)
  int32_t max_model_len = 0;
  // Autoscaler (null when the topology does not enable it).
  std::unique_ptr<Autoscaler> autoscaler;
  bool cpu_only = true;                 // every declared worker runs on a CPU device
  bool ever_routed = false;             // a replica was routed once (the start-up promotion is no scale-up)
  std::deque<TtftSample> ttft;          // recent first-token samples, pruned to the look-back window
  std::map<caf::actor_addr, int32_t> retired;  // workers told to quit -> replica: their down message is expected
  std::map<int64_t, int32_t> rebalanced_from;  // request handed back by a busy replica -> that replica
  double held_deficit_since = -1;       // a scale-up's cold start held back (CPU host) since this decision
  bool deficit_by_wanted = false;       // cold starts were held: AutoscaleInput::deficit_by_wanted
  AutoscaleStatus as;                   // counters and recent measurements for `status`
};

using SchedSelf = caf::stateful_actor<SchedulerState>*;

double now_s(SchedSelf self) { return seconds_since(self->state.t0); }

void keep_last(std::vector<double>* v, double x, size_t n = 64) {
  v->push_back(x);
  if (v->size() > n) v->erase(v->begin());
}

// Moves replica `rid` to `to`, adding the time spent in its old state.
void set_state(SchedSelf self, int32_t rid, ReplicaState to) {
  auto& r = self->state.replicas[rid];
  if (r.state == to) return;
  const double now = now_s(self);
  r.state_seconds[static_cast<size_t>(r.state)] += now - r.state_since;
  get_logger("actors")->info("replica {}: {} -> {} (after {:.3f} s)", rid, replica_state_name(r.state),
                             replica_state_name(to), now - r.state_since);
  // A scale-up measurement still open ends with the ready state: a later routing of this
  // replica is another decision (it would time idle time from this one).
  if (r.state == ReplicaState::kReady && to != ReplicaState::kReady) {
    if (r.awaiting_assign) ++self->state.as.num_promotions_without_waiting_work;
    r.awaiting_assign = false;
    r.awaiting_first_token = false;
    r.measured_request = 0;
    r.scale_decision_at = -1;
  }
  r.state = to;
  r.state_since = now;
  if (to == ReplicaState::kReady) r.ready_since = now;
}

// The first start-up routing (min_replicas > 0, before any replica was routed) is no scale-up.
// With min_replicas 0 the first routing is a scale from zero: a scale-up like any other.
bool at_startup(const SchedulerState& s) {
  return !s.ever_routed && (!s.autoscaler || s.autoscaler->options().min_replicas > 0);
}

// A scale-up measurement counts only a request that already waited at the decision (queued at
// the head or waiting in a busy engine: its first arrival at the head at or before it); one that
// arrived later would time the idle gap between two bursts.
bool waited_for(const SchedulerState& s, int64_t request_id, double decided_at) {
  auto it = s.arrived_at.find(request_id);
  return decided_at >= 0 && it != s.arrived_at.end() && it->second <= decided_at;
}

// The replica's scale-up got a request that arrived after its decision: not measured, counted.
void drop_scale_up_measurement(SchedulerState& s, ReplicaEntry& r, int32_t rid, int64_t request_id) {
  get_logger("actors")->info("replica {}: its scale-up is not measured: request {} arrived after the decision "
                             "(no work waited for it)", rid, request_id);
  ++s.as.num_promotions_without_waiting_work;
  r.awaiting_assign = false;
  r.awaiting_first_token = false;
  r.measured_request = 0;
  r.scale_decision_at = -1;
}

caf::actor kv_peer(SchedulerState& s, const std::string& name);

// A migrated item's KV offer is used only if it is dispatched within this long of arriving
// (the source keeps offers 60 s: actors/target_shard.cpp kOfferLifetime).
constexpr double kMaxOfferWait_s = 40.0;

// Tells the worker holding a KV offer that nobody will read it.
void release_offer(SchedSelf self, const KvOffer& kv) {
  if (kv.source.empty()) return;
  if (auto src = kv_peer(self->state, kv.source)) self->send(src, KvReleaseMsg{kv.source, kv.offer_id});
}

void enqueue(SchedSelf self, WorkItem item, int64_t arrival);
void fail_queued(SchedSelf self, int64_t id, const std::string& reason, const std::string& error);
void dispatch(SchedSelf self);
void rebalance(SchedSelf self);

// A request a busy replica handed back (rebalance) that dispatch placed on that replica again:
// the replica is not asked again for this long.
constexpr double kNoReclaimAfterReturnS = 1.0;

// A request re-entering the queue after a move (requeue or migration): queued, unless it was
// cancelled while its request actor was asked for it.
void arrive(SchedSelf self, WorkItem w) {
  auto& s = self->state;
  const int64_t id = w.request_id;
  s.in_transit.erase(id);
  // NOTE: arrival 0 puts it ahead of every request that arrived after it.
  enqueue(self, std::move(w), 0);
  if (s.cancelled_in_transit.erase(id)) fail_queued(self, id, "abort", "");
  dispatch(self);
}

void fail_queued(SchedSelf self, int64_t id, const std::string& reason, const std::string& error) {
  auto& s = self->state;
  auto it = s.queue.find(id);
  if (it == s.queue.end()) return;
  ShardEvent ev;
  ev.request_id = id;
  ev.attempt = it->second.item.attempt;
  ev.finish_reason = reason;
  ev.error = error;
  self->send(it->second.item.request_actor, std::move(ev));
  release_offer(self, it->second.item.kv);
  s.queue.erase(it);
}

void maybe_drained(SchedSelf self) {
  auto& s = self->state;
  if (!s.draining || !s.queue.empty() || !s.running.empty() || !s.request_actors.empty()) return;
  for (auto& rp : s.drain_waiters) rp.deliver(true);
  s.drain_waiters.clear();
}

void dispatch(SchedSelf self) {
  auto& s = self->state;
  if (s.queue.empty()) {
    rebalance(self);
    return;
  }
  // No replica serves, will serve (standby, starting, draining) or can be started: nothing will
  // serve the queue, so fail it now instead of letting clients wait forever.
  // NOTE: with an autoscaler that can start processes, a stopped replica that can be started
  // (possibly after its backoff, or once its old workers are gone) keeps the queue waiting;
  // kMaxStartFailures bounds that wait.
  const bool can_start = s.autoscaler && s.cfg.start_replica;
  bool none_left = !s.replicas.empty();
  for (const auto& [rid, r] : s.replicas) {
    const bool alive = r.state != ReplicaState::kStopped;
    const bool startable = r.state == ReplicaState::kStopped && can_start && !r.not_startable;
    if (alive || startable) none_left = false;
  }
  if (none_left) {
    std::vector<int64_t> ids;
    for (const auto& [id, p] : s.queue) ids.push_back(id);
    for (int64_t id : ids) {
      fail_queued(self, id, "error", "no replica is left: every target shard is down and none can be started");
    }
    return;
  }
  std::vector<QueuedRequest> q;
  for (const auto& [id, p] : s.queue) {
    QueuedRequest r;
    r.id = id;
    r.priority = p.item.priority;
    r.arrival_seq = p.arrival;
    r.enqueued_at_s = p.enqueued_at;
    r.num_tokens = static_cast<int32_t>(p.item.prompt.size() + p.item.resume_output.size());
    r.max_new_tokens = p.item.max_tokens - static_cast<int32_t>(p.item.resume_output.size());
    if (auto rb = s.rebalanced_from.find(id); rb != s.rebalanced_from.end()) r.avoid_replica = rb->second;
    q.push_back(r);
  }
  std::vector<ReplicaLoad> loads;
  for (const auto& [rid, r] : s.replicas) {
    if (!r.shard) continue;
    ReplicaLoad l;
    l.replica = rid;
    l.ready = r.routed();
    l.total_kv_blocks = r.shard_hello.total_kv_blocks;
    l.free_kv_blocks = (r.load.total_kv_blocks ? r.load.free_kv_blocks : r.shard_hello.total_kv_blocks) - r.pending_blocks;
    l.block_size = r.shard_hello.block_size;
    l.num_assigned = static_cast<int32_t>(r.assigned.size());
    l.max_num_seqs = r.shard_hello.max_num_seqs;
    l.max_model_len = r.shard_hello.max_model_len;
    if (l.block_size <= 0 || l.max_model_len <= 0) continue;  // still loading: limits unknown
    loads.push_back(l);
  }
  DispatchOptions opts;
  opts.aging_s = s.cfg.aging_s;
  DispatchPlan plan = plan_dispatch(std::move(q), loads, now_s(self), opts);
  for (const auto& [id, why] : plan.reject) fail_queued(self, id, "error", "prompt too long: " + why);
  for (const Assignment& a : plan.assign) {
    auto it = s.queue.find(a.request_id);
    if (it == s.queue.end()) continue;
    ReplicaEntry& r = s.replicas[a.replica];
    WorkItem item = std::move(it->second.item);
    if (!item.kv.source.empty() && !kv_peer(s, item.kv.source)) {
      // Its source went down meanwhile: the KV died with it (reading it could only fail).
      item.kv = KvOffer{};
    } else if (!item.kv.source.empty() && now_s(self) - it->second.enqueued_at > kMaxOfferWait_s) {
      // NOTE: the source frees an offer nobody read within its lifetime (60 s): an item that
      // waited in the queue close to that recomputes instead of racing the expiry.
      release_offer(self, item.kv);
      item.kv = KvOffer{};
    }
    s.queue.erase(it);
    r.assigned.insert(item.request_id);
    s.running[item.request_id] = a.replica;
    if (auto rb = s.rebalanced_from.find(item.request_id); rb != s.rebalanced_from.end()) {
      // Handed back by a busy replica and placed on it again (no other replica could take it
      // now, e.g. for its KV): do not ask that replica again for a while, or the request would
      // go back and forth.
      if (rb->second == a.replica) r.no_reclaim_until = now_s(self) + kNoReclaimAfterReturnS;
      s.rebalanced_from.erase(rb);
    }
    const bool waited = waited_for(s, item.request_id, r.scale_decision_at);
    if (r.awaiting_assign) {  // the first request sent to it since the scale-up
      if (!waited) {
        drop_scale_up_measurement(s, r, a.replica, item.request_id);
      } else {
        r.awaiting_assign = false;
        r.awaiting_first_token = true;
        if (!r.cold_path) {
          r.promotion_dispatch_s = now_s(self) - r.scale_decision_at;
          keep_last(&s.as.promotion_dispatch_seconds, r.promotion_dispatch_s);
        }
      }
    }
    // The first token is measured on the first request sent to it: a fresh one, or one moved
    // here after streaming tokens elsewhere (a running sequence rebalanced to a promoted
    // replica) — the request actor reports the first token of every attempt.
    if (r.awaiting_first_token && r.measured_request == 0) {
      if (waited) {
        r.measured_request = item.request_id;
      } else {
        drop_scale_up_measurement(s, r, a.replica, item.request_id);
      }
    }
    const bool fresh = item.resume_output.empty() && item.rng_state.empty() && item.kv.source.empty();
    if (fresh && r.prefill && r.prefill_ready) {
      // NOTE: the prefill worker's KV is its own: the decode shard's block accounting is untouched.
      r.on_prefill.insert(item.request_id);
      self->send(r.prefill, std::move(item));
      continue;
    }
    const auto blocks = static_cast<int32_t>(
        blocks_needed(static_cast<int64_t>(item.prompt.size() + item.resume_output.size()), r.shard_hello.block_size));
    r.pending_blocks += blocks;
    r.in_flight.emplace_back(++r.sent, blocks);
    self->send(r.shard, std::move(item));
  }
  rebalance(self);
}

// Busy replicas hand requests back to the head when another routed replica has room
// (scheduler/rebalance.h: first requests waiting beyond a batch, then running sequences toward
// an even share, with their KV), typically right after a promotion, when the burst that caused
// it already sits on the busy replicas. The hand-back is reclaim_atom -> MigratedSeq
// "rebalance", and dispatch sends them where they run at once (scheduler/dispatch.h rule 5), so a
// promoted replica serves at once instead of idling until the next arrival.
void rebalance(SchedSelf self) {
  auto& s = self->state;
  // Queued requests fill the free slots first, and so do requests on their way back to the queue
  // (a hand-back, a drain): counting those slots free would take a second request from a busy
  // replica for the same slot.
  if (!s.queue.empty() || !s.in_transit.empty() || s.draining) return;
  const double now = now_s(self);
  std::vector<RebalanceLoad> loads;
  for (const auto& [rid, r] : s.replicas) {
    if (!r.routed() || r.shard_hello.max_num_seqs <= 0) continue;
    RebalanceLoad l;
    l.replica = rid;
    l.max_num_seqs = r.shard_hello.max_num_seqs;
    // On its decode shard (requests on its prefill worker are not there).
    l.assigned = static_cast<int32_t>(r.assigned.size() - std::min(r.assigned.size(), r.on_prefill.size()));
    l.eligible = r.reclaims_sent <= r.reclaims_done && now >= r.no_reclaim_until;
    loads.push_back(l);
  }
  RebalanceOptions opts;
  opts.running = s.cfg.topology.scheduler.rebalance_running;
  for (const Reclaim& c : plan_rebalance(std::move(loads), opts)) {
    auto& r = s.replicas[c.replica];
    get_logger("actors")->info("replica {}: holds {} request(s) while other replicas have room; asking for up to {} {} back",
                               c.replica, r.assigned.size(), c.count, c.running ? "running or waiting" : "waiting");
    ++r.reclaims_sent;
    r.handed_back_at_reclaim = r.handed_back;
    self->send(r.shard, reclaim_atom::value, c.count, c.running);
  }
}

void enqueue(SchedSelf self, WorkItem item, int64_t arrival) {
  auto& s = self->state;
  Pending p;
  p.arrival = arrival;
  p.enqueued_at = now_s(self);
  const int64_t id = item.request_id;
  p.item = std::move(item);
  s.queue[id] = std::move(p);
}

void requeue(SchedSelf self, const std::set<int64_t>& lost);

void log_tp_broken(int32_t rid, int32_t rank) {
  get_logger("actors")->error("replica {}: tensor-parallel rank {} is down; the replica's other ranks are stopped", rid, rank);
}

// The tensor-parallel ranks > 0 of replica `rid` that registered and are not down (actors/tp_rank.h).
std::vector<caf::actor> tp_followers(const SchedulerState& s, int32_t rid) {
  std::vector<caf::actor> out;
  for (const auto& [addr, w] : s.workers) {
    const WorkerHello& h = w.hello;
    if (h.replica == rid && h.rank > 0 && h.role == worker_role_name(WorkerRole::kTargetShard) && h.self &&
        h.state != "down" && h.state != "failed") {
      out.push_back(h.self);
    }
  }
  return out;
}

// The replica's target shard is gone: its requests go back to the queue, first in line.
void replica_lost(SchedSelf self, int32_t replica_id) {
  auto& s = self->state;
  auto& r = s.replicas[replica_id];
  auto log = get_logger("actors");
  log->warn("replica {}: target shard down; re-queueing {} request(s)", replica_id, r.assigned.size());
  // Requests still on the replica's prefill worker stay there: their hand-over goes elsewhere.
  std::set<int64_t> lost;
  for (int64_t id : r.assigned) {
    if (!r.on_prefill.count(id)) lost.insert(id);
  }
  r.assigned = r.on_prefill;
  r.shard = caf::actor{};
  r.shard_ready = false;
  r.lost = true;
  r.draft_attached = false;
  r.pending_blocks = 0;
  r.sent = 0;
  r.in_flight.clear();
  r.load = ShardLoad{};
  r.reclaims_sent = r.reclaims_done = 0;
  set_state(self, replica_id, ReplicaState::kStopped);
  r.awaiting_first_token = false;
  r.awaiting_assign = false;  // a later undrain or restart must not time itself from this decision
  if (s.autoscaler && r.draft) {
    // A restart starts the replica's draft worker afresh: the old one goes.
    s.retired[r.draft.address()] = replica_id;
    ++r.num_retiring;
    self->send(r.draft, retire_atom::value);
    r.draft = caf::actor{};
    r.draft_settled = false;
  }
  requeue(self, lost);
}

// Requests whose worker died go back to the queue, first in line.
void requeue(SchedSelf self, const std::set<int64_t>& lost) {
  auto& s = self->state;
  for (int64_t id : lost) {
    s.running.erase(id);
    auto ra = s.request_actors.find(id);
    if (ra == s.request_actors.end()) continue;
    ++s.requeued;
    s.in_transit.insert(id);
    // The request actor answers with its WorkItem: prompt, tokens streamed so far, next attempt.
    self->request(ra->second, caf::infinite, requeue_atom::value)
        .then(
            [self, id](WorkItem& w) {
              get_logger("actors")->info("request {}: re-queued after its replica failed", id);
              arrive(self, std::move(w));
            },
            [self, id](caf::error&) {
              self->state.in_transit.erase(id);
              self->state.cancelled_in_transit.erase(id);
            });
  }
}

void attach_draft_if_ready(SchedSelf self, ReplicaEntry& r) {
  if (!r.shard || !r.shard_ready || !r.draft || r.draft_attached || r.draft_hello.state != "ready") return;
  AttachDraftMsg a;
  a.draft_port = r.draft_hello.draft_port;
  a.draft_host = r.draft_hello.draft_host;
  if (a.draft_port == 0) a.draft = r.draft;
  self->send(r.shard, std::move(a));
  r.draft_attached = true;
}

Expected<WorkItem> to_work_item(SchedulerState& s, GenerateRequest& req) {
  WorkItem w;
  auto prompt = tokenize_prompt(*s.cfg.gguf, *s.cfg.tokenizer, req);
  if (!prompt.ok()) return prompt.status();
  w.prompt = std::move(*prompt);
  if (req.max_tokens < 1) return invalid_argument("max_tokens = " + std::to_string(req.max_tokens) + ": must be >= 1");
  SPECSERVE_RETURN_IF_ERROR(req.sampling.validate());
  if (s.max_model_len > 0 && static_cast<int32_t>(w.prompt.size()) >= s.max_model_len) {
    return out_of_range("prompt: " + std::to_string(w.prompt.size()) + " tokens leave no room in max_model_len " +
                        std::to_string(s.max_model_len));
  }
  for (const auto& st : req.stop) {
    if (st.empty()) return invalid_argument("stop: an empty stop string never matches");
  }
  if (!(req.timeout_s >= 0 && req.timeout_s <= 1e6)) {
    return invalid_argument("timeout_s = " + std::to_string(req.timeout_s) + ": must be in [0, 1e6] seconds (0: none)");
  }
  w.sampling = std::move(req.sampling);
  w.max_tokens = req.max_tokens;
  w.stop = std::move(req.stop);
  w.include_stop_str = req.include_stop_str;
  w.priority = req.priority;
  if (req.num_speculative_tokens < -1 || req.num_speculative_tokens > 64) {
    return invalid_argument("num_speculative_tokens = " + std::to_string(req.num_speculative_tokens) +
                            ": must be -1 (the server's setting), 0 (no speculation) or 1..64");
  }
  w.num_speculative_tokens = req.num_speculative_tokens;
  return w;
}

void send_cancel(SchedSelf self, int64_t id) {
  auto& s = self->state;
  if (auto ra = s.request_actors.find(id); ra != s.request_actors.end()) self->send(ra->second, cancel_atom::value);
  if (s.queue.count(id)) {
    fail_queued(self, id, "abort", "");
    return;
  }
  if (s.in_transit.count(id)) {
    s.cancelled_in_transit.insert(id);
    return;
  }
  auto it = s.running.find(id);
  if (it == s.running.end()) return;
  auto& r = s.replicas[it->second];
  if (r.on_prefill.count(id) && r.prefill) {
    self->send(r.prefill, AbortMsg{id});
  } else if (r.shard) {
    self->send(r.shard, AbortMsg{id});
  }
}

// Every ready worker with a data plane learns the others' addresses, so that each connects its
// KV endpoints up front (kv/ucx_transport.h), not when the first sequence migrates.
void broadcast_kv_peers(SchedSelf self) {
  auto& s = self->state;
  KvPeersMsg m;
  std::vector<caf::actor> to;
  for (const auto& [rid, r] : s.replicas) {
    if (r.shard && r.shard_ready && !r.shard_hello.kv_address.empty()) {
      m.peers.push_back({kv_peer_name(r.shard_hello.role, rid), r.shard_hello.kv_address});
      to.push_back(r.shard);
    }
    if (r.prefill && r.prefill_ready && !r.prefill_hello.kv_address.empty()) {
      m.peers.push_back({kv_peer_name(r.prefill_hello.role, rid), r.prefill_hello.kv_address});
      to.push_back(r.prefill);
    }
  }
  for (const auto& a : to) self->send(a, m);
}

// The worker whose data-plane name is `name` (kv_peer_name), or an invalid handle.
caf::actor kv_peer(SchedulerState& s, const std::string& name) {
  for (const auto& [rid, r] : s.replicas) {
    if (r.shard && kv_peer_name(r.shard_hello.role, rid) == name) return r.shard;
    if (r.prefill && kv_peer_name(r.prefill_hello.role, rid) == name) return r.prefill;
  }
  if (auto it = s.retiring_peers.find(name); it != s.retiring_peers.end()) return it->second;
  return {};
}

void finish_drain_if_idle(SchedSelf self, int32_t rid);

// A sequence left replica m.replica with its state: the request actor hands back its WorkItem
// (every token streamed so far) and it is dispatched, first in line, with the state and KV offer.
void migrated(SchedSelf self, MigratedSeq m) {
  auto& s = self->state;
  auto& r = s.replicas[m.replica];
  if (!r.assigned.count(m.request_id)) {
    // Not on that replica any more (re-queued when it was declared lost): a stale hand-over.
    release_offer(self, m.kv);
    return;
  }
  r.assigned.erase(m.request_id);
  if (m.reason == "rebalance") ++r.handed_back;
  r.on_prefill.erase(m.request_id);
  s.running.erase(m.request_id);
  finish_drain_if_idle(self, m.replica);
  auto ra = s.request_actors.find(m.request_id);
  if (ra == s.request_actors.end()) {
    release_offer(self, m.kv);
    return;
  }
  ++s.migrated;
  s.in_transit.insert(m.request_id);
  self->request(ra->second, caf::infinite, migrate_atom::value, m.attempt)
      .then(
          [self, m](WorkItem& w) {
            w.rng_state = m.rng_state;
            w.spec_k = m.spec_k;
            w.kv = m.kv;
            w.num_drafts = m.num_drafts;
            w.num_draft_tokens = m.num_draft_tokens;
            w.num_accepted_tokens = m.num_accepted_tokens;
            w.accepted_per_pos = m.accepted_per_pos;
            get_logger("actors")->info("request {}: moved off replica {} ({}), {} tokens of KV offered", m.request_id,
                                       m.replica, m.reason, m.kv.source.empty() ? 0 : m.kv.num_cached);
            if (m.reason == "rebalance") self->state.rebalanced_from[m.request_id] = m.replica;
            arrive(self, std::move(w));
            maybe_drained(self);
          },
          [self, m](caf::error&) {
            self->state.in_transit.erase(m.request_id);
            self->state.cancelled_in_transit.erase(m.request_id);
            release_offer(self, m.kv);
          });
}

// ---------------------------------------------------------------- lifecycle and autoscaling

void autoscale_tick(SchedSelf self);

// The replica's startup states follow its workers' hellos; a replica that finished warming up
// (its draft worker settled too) is routed at once without an autoscaler, else parked in standby
// for the policy to promote.
void update_startup_state(SchedSelf self, int32_t rid) {
  auto& s = self->state;
  auto& r = s.replicas[rid];
  if (!r.shard) return;
  const ReplicaState st = r.state;
  if (st == ReplicaState::kReady || st == ReplicaState::kDraining || st == ReplicaState::kStandby) return;
  const std::string& hs = r.shard_hello.state;
  ReplicaState to = st;
  if (hs == "loading") to = ReplicaState::kLoading;
  if (hs == "warming") to = ReplicaState::kWarming;
  if (hs == "ready") to = r.ready() ? (s.autoscaler ? ReplicaState::kStandby : ReplicaState::kReady) : ReplicaState::kWarming;
  if (to == st) return;
  if (st == ReplicaState::kStopped && r.start_requested_at < 0) r.start_requested_at = now_s(self);  // started by someone else
  set_state(self, rid, to);
  if (to == ReplicaState::kStandby || to == ReplicaState::kReady) {
    r.num_start_failures = 0;
    if (r.start_requested_at >= 0) {
      r.cold_start_s = now_s(self) - r.start_requested_at;
      keep_last(&s.as.cold_start_seconds, r.cold_start_s);
      get_logger("actors")->info("replica {}: cold start (process start -> ready) {:.2f} s", rid, r.cold_start_s);
      r.start_requested_at = -1;
    }
    if (s.autoscaler) autoscale_tick(self);  // promote now if the policy wants it, not on the next tick
    // Not promoted at once: the scale-up it was started for is over; a later promotion is warm.
    if (r.state == ReplicaState::kStandby) r.scale_decision_at = -1;
  }
}

// Tells a replica's workers to quit (the autoscaler stops it). Their down messages are expected.
void retire(SchedSelf self, int32_t rid) {
  auto& s = self->state;
  auto& r = s.replicas[rid];
  // A retired shard keeps serving the KV of the sequences that just moved off it until receivers
  // have read it: it stays reachable as a data-plane peer until its down message.
  if (r.shard && !r.shard_hello.kv_address.empty()) s.retiring_peers[kv_peer_name(r.shard_hello.role, rid)] = r.shard;
  // Tensor-parallel ranks > 0 are told too: rank 0's end may never reach them across processes.
  std::vector<caf::actor> followers = tp_followers(s, rid);
  for (caf::actor& f : followers) {
    s.retired[f.address()] = rid;
    ++r.num_retiring;
    self->send(f, retire_atom::value);
  }
  for (caf::actor* a : {&r.shard, &r.draft}) {
    if (!*a) continue;
    s.retired[a->address()] = rid;
    ++r.num_retiring;  // not startable until its down message comes: never two processes of it
    self->send(*a, retire_atom::value);
    *a = caf::actor{};
  }
  r.shard_ready = false;
  r.shard_hello = WorkerHello{};
  r.draft_hello = WorkerHello{};
  r.load = ShardLoad{};
  r.lost = false;
  r.draining_out = false;
  r.start_requested_at = -1;
  r.draft_settled = false;
  r.draft_attached = false;
  r.pending_blocks = 0;
  r.sent = 0;
  r.in_flight.clear();
  r.reclaims_sent = r.reclaims_done = 0;
  r.awaiting_first_token = false;
  r.awaiting_assign = false;  // a later undrain or restart must not time itself from this decision
  ++s.as.num_stops;
  set_state(self, rid, ReplicaState::kStopped);
}

// A draining replica whose last request finished parks in standby or stops.
void finish_drain_if_idle(SchedSelf self, int32_t rid) {
  auto& r = self->state.replicas[rid];
  if (r.state != ReplicaState::kDraining || !r.assigned.empty()) return;
  if (r.drain_to_standby) {
    set_state(self, rid, ReplicaState::kStandby);
  } else {
    retire(self, rid);
  }
}

// Stops routing new requests to the replica; its in-flight requests finish there and their
// streams go on.
// When another replica is routed, the running requests move there at once with their KV
// (migrate_atom: the shard exports each sequence, MigratedSeq re-dispatches it, streams go on), so
// a drain takes one step instead of the longest request; otherwise they finish here.
void begin_drain(SchedSelf self, int32_t rid, bool to_standby) {
  auto& s = self->state;
  auto& r = s.replicas[rid];
  r.drain_to_standby = to_standby;
  // Leaving ready ends a scale-up measurement still open (set_state): a later undrain or restart
  // must not time itself from this decision.
  ++s.as.num_drains;
  set_state(self, rid, ReplicaState::kDraining);
  bool other = false;
  for (const auto& [id, o] : s.replicas) other = other || (id != rid && o.routed());
  if (other && r.shard && !r.assigned.empty()) self->send(r.shard, migrate_atom::value, false);
  finish_drain_if_idle(self, rid);
}

// Routes a standby replica (the policy decided so at `decided_at`, head clock): a state flip here,
// so the dispatch that follows in the same tick can give it queued work, and rebalance() can ask
// busy replicas for the requests waiting in their engines. No message to the replica, no
// warm-up, no KV allocation, no draft-worker handshake: all of that happened before standby.
void promote(SchedSelf self, int32_t rid, double decided_at) {
  auto& s = self->state;
  auto& r = s.replicas[rid];
  // The cold path belongs to the scale-up, not to the replica its start was issued for: a replica
  // that reached standby just now (its cold start finished) and is routed at once takes over the
  // decision time of any other not-routed replica started for that scale-up (they finish in any
  // order). One that waited in standby is a warm promotion, whatever its own start was for.
  constexpr double kFreshStandbyS = 0.5;
  const bool fresh = r.state == ReplicaState::kStandby && now_s(self) - r.state_since < kFreshStandbyS;
  if (!fresh) {
    r.scale_decision_at = -1;
  } else if (r.scale_decision_at < 0) {
    for (auto& [oid, o] : s.replicas) {
      if (oid == rid || o.routed() || o.scale_decision_at < 0 || o.state == ReplicaState::kStopped) continue;
      r.scale_decision_at = o.scale_decision_at;
      o.scale_decision_at = -1;
      break;
    }
  }
  set_state(self, rid, ReplicaState::kReady);
  r.promoted_at = now_s(self);
  // NOTE: the first replica(s) routed at start-up are no scale-up: not counted, not measured.
  const bool startup = at_startup(s);
  s.ever_routed = true;
  r.awaiting_first_token = false;
  r.measured_request = 0;
  r.awaiting_assign = !startup;
  // A replica started cold for a scale-up deficit and promoted once ready is the cold path:
  // measured from that decision, and not a warm promotion.
  r.cold_path = r.scale_decision_at >= 0;
  if (!r.cold_path) r.scale_decision_at = decided_at;
  if (startup) r.scale_decision_at = -1;
  if (startup || r.cold_path) return;
  ++r.num_promotions;
  ++s.as.num_promotions;
  r.promotion_dispatch_s = r.promotion_s = 0;  // this promotion's, once measured
  r.promotion_routable_s = r.promoted_at - decided_at;
  keep_last(&s.as.promotion_routable_seconds, r.promotion_routable_s);
}

void start_cold(SchedSelf self, int32_t rid, bool for_deficit) {
  auto& s = self->state;
  auto& r = s.replicas[rid];
  Status st = s.cfg.start_replica ? s.cfg.start_replica(rid) : unavailable("no launcher");
  if (!st.ok()) {
    get_logger("actors")->warn("replica {}: cannot start it: {}", rid, st.message());
    r.not_startable = true;
    return;
  }
  r.lost = false;
  r.head_launched = true;
  r.start_requested_at = now_s(self);
  // A scale-up's cold start (not a pool refill, nor the start-up): its promotion is measured
  // from now.
  r.scale_decision_at = !for_deficit || at_startup(s) ? -1
                        : s.held_deficit_since >= 0  ? s.held_deficit_since
                                                     : r.start_requested_at;
  ++r.num_cold_starts;
  ++s.as.num_cold_starts;
  set_state(self, rid, ReplicaState::kStarting);
}

// A replica routed again before its drain finished (a burst during a scale-down): its shard
// keeps its running sequences (those already sent away migrate on as usual).
void undrain(SchedSelf self, int32_t rid) {
  auto& r = self->state.replicas[rid];
  if (r.state != ReplicaState::kDraining || !r.ready()) return;  // its worker is leaving on its own
  r.drain_to_standby = false;
  set_state(self, rid, ReplicaState::kReady);
}

// After this many consecutive failed starts a replica is not started again (the queue is failed
// when no other replica can serve it, instead of waiting for restarts that keep failing).
constexpr int32_t kMaxStartFailures = 5;
// The longest a cold start waits for a promoted replica's first token on a CPU host.
constexpr double kRefillHoldS = 5.0;

// A start failed (the launcher said so, or the policy gave up on it): stopped, one more failure
// for the backoff.
void start_failed(SchedSelf self, int32_t rid, const std::string& why) {
  auto& s = self->state;
  auto& r = s.replicas[rid];
  ++r.num_start_failures;
  if (r.num_start_failures >= kMaxStartFailures) r.not_startable = true;
  get_logger("actors")->warn("replica {}: start failed ({} in a row{}): {}", rid, r.num_start_failures,
                             r.not_startable ? ", not started again" : "", why);
  if (r.shard || r.draft) {
    retire(self, rid);
    --s.as.num_stops;  // not a scale-down
  } else {
    set_state(self, rid, ReplicaState::kStopped);
  }
  r.start_requested_at = -1;
  dispatch(self);  // the queue fails if nothing is left to serve it
}

void autoscale_tick(SchedSelf self) {
  auto& s = self->state;
  if (!s.autoscaler) return;
  const double now = now_s(self);
  // While the server drains (SIGTERM) the policy is not consulted (its target would change and
  // be logged for a cluster that is going away), except when queued or moving requests have no
  // routed replica left (below).
  bool any_routed = false;
  for (const auto& [rid, r] : s.replicas) any_routed = any_routed || r.routed();
  const bool stranded = !any_routed && (!s.queue.empty() || !s.in_transit.empty());
  if (s.draining && !stranded) {
    s.held_deficit_since = -1;
    dispatch(self);
    return;
  }
  const AutoscaleOptions& o = s.autoscaler->options();
  while (!s.ttft.empty() && s.ttft.front().at_s < now - o.look_back_period_s) s.ttft.pop_front();
  AutoscaleInput in;
  in.now_s = now;
  in.num_queued = static_cast<int32_t>(s.queue.size());
  for (const auto& [id, p] : s.queue) in.oldest_wait_s = std::max(in.oldest_wait_s, now - p.enqueued_at);
  for (const auto& [rid, r] : s.replicas) {
    if (r.not_startable && r.state == ReplicaState::kStopped) continue;  // not a slot the policy can use
    ReplicaView v;
    v.id = rid;
    v.state = r.state;
    // A ready replica whose shard has not confirmed ready (cannot happen) or a standby one whose
    // draft worker has not settled is still warming for the policy.
    if ((v.state == ReplicaState::kReady || v.state == ReplicaState::kStandby) && !r.ready()) v.state = ReplicaState::kWarming;
    v.ready_since_s = r.ready_since;
    v.num_assigned = static_cast<int32_t>(r.assigned.size());
    if (r.load.total_kv_blocks > 0) {
      v.kv_cache_usage = static_cast<double>(r.load.total_kv_blocks - r.load.free_kv_blocks) / r.load.total_kv_blocks;
    }
    v.draining_to_standby = r.drain_to_standby;
    v.state_since_s = r.state_since;
    v.num_start_failures = r.num_start_failures;
    v.startable = r.num_retiring == 0;
    in.replicas.push_back(v);
  }
  in.ttft.assign(s.ttft.begin(), s.ttft.end());
  in.can_start = static_cast<bool>(s.cfg.start_replica);
  in.deficit_by_wanted = s.deficit_by_wanted;
  AutoscaleDecision d = s.autoscaler->tick(in);
  if (s.deficit_by_wanted) {
    int32_t routed = 0;
    for (const auto& [rid, r] : s.replicas) routed += r.routed();
    if (d.changed || d.target_ready <= routed) s.deficit_by_wanted = false;  // a new target, or it is met
  }
  const double decided_at = now_s(self);  // promotions are measured from here
  s.as.target_ready = d.target_ready;
  s.as.wanted = d.wanted;
  s.as.ongoing = d.ongoing;
  s.as.ttft_p90_seconds = d.ttft_p90_s;
  if (d.changed) {
    s.as.last_reason = d.reason;
    s.as.last_change_seconds = now;
    get_logger("actors")->info("autoscaler: target {} ready replica(s): {}", d.target_ready, d.reason);
  }
  for (int32_t rid : d.abandon) start_failed(self, rid, "no progress for start_timeout_s");
  if (s.draining) {
    // NOTE: while the server drains (SIGTERM) nothing is scaled: no scale-down, no promotion, no
    // cold start. The one exception (we are here only then): queued or moving requests with no
    // routed replica left (its last one was lost) get one replica back, or the drain would fail them.
    d.stop.clear();
    d.drain.clear();
    d.starting_for_deficit.clear();
    if (!d.undrain.empty()) {
      d.undrain.resize(1);
      d.promote.clear();
      d.start.clear();
    } else if (!d.promote.empty()) {
      d.promote.resize(1);
      d.start.clear();
    } else {
      d.start.resize(d.num_start_for_deficit > 0 && !d.start.empty() ? 1 : 0);
    }
    d.num_start_for_deficit = static_cast<int32_t>(d.start.size());
  }
  for (int32_t rid : d.stop) retire(self, rid);
  for (const DrainAction& a : d.drain) begin_drain(self, a.replica, a.to_standby);
  for (int32_t rid : d.undrain) undrain(self, rid);
  for (int32_t rid : d.promote) promote(self, rid, decided_at);
  // A replica already starting (a pool refill) that now covers the scale-up is its cold path:
  // timed from this decision (the first one, when an earlier tick already counted it).
  for (int32_t rid : d.starting_for_deficit) {
    auto& r = s.replicas[rid];
    if (r.scale_decision_at < 0 && !at_startup(s)) {
      r.scale_decision_at = s.held_deficit_since >= 0 ? s.held_deficit_since : decided_at;
    }
  }
  // NOTE: on CPU hosts a cold start (loading weights, a warm-up pass) competes for the cores with
  // the promoted replica's first prefill (not measured apart yet; the bench shows it); it waits
  // (at most kRefillHoldS) until that replica served its first token. This holds the pool refill
  // and also a cold start for the rest of a scale-up: it takes seconds, the promotion should take
  // one prefill, and the policy asks for it again on every tick until it happens.
  bool hold_starts = false;
  if (s.cpu_only) {
    for (const auto& [rid, r] : s.replicas) {
      hold_starts = hold_starts || ((r.awaiting_assign || r.awaiting_first_token) && r.state == ReplicaState::kReady &&
                                    now - r.promoted_at < kRefillHoldS);
    }
  }
  // Held scale-up starts: once released, the deficit counts only what the load wants then (the
  // clients may have gone meanwhile), until the target changes or is met.
  if (hold_starts && d.num_start_for_deficit > 0) s.deficit_by_wanted = true;
  for (size_t i = 0; i < d.start.size(); ++i) {
    const bool for_deficit = static_cast<int32_t>(i) < d.num_start_for_deficit;
    if (hold_starts) {
      // Measured from the decision, not from the held start.
      if (for_deficit && s.held_deficit_since < 0) s.held_deficit_since = decided_at;
      continue;
    }
    start_cold(self, d.start[i], for_deficit);
  }
  if (!hold_starts) s.held_deficit_since = -1;
  s.as.starts_held = hold_starts || s.deficit_by_wanted;
  dispatch(self);
}

ClusterStatus make_status(SchedSelf self) {
  auto& s = self->state;
  ClusterStatus c;
  c.cluster = s.cfg.topology.cluster.name;
  c.model = s.cfg.topology.models.target.path;
  if (s.cfg.topology.models.speculative) c.speculative_method = speculative_method_name(s.cfg.topology.models.speculative->method);
  for (const auto& [addr, w] : s.workers) {
    WorkerStatus ws;
    ws.node = w.hello.node;
    ws.role = w.hello.role;
    ws.replica = w.hello.replica;
    ws.rank = w.hello.rank;
    ws.pid = w.hello.pid;
    ws.state = w.hello.state;
    ws.error = w.hello.error;
    ws.load_seconds = w.hello.load_seconds;
    ws.warmup_seconds = w.hello.warmup_seconds;
    c.workers.push_back(ws);
  }
  std::sort(c.workers.begin(), c.workers.end(), [](const WorkerStatus& a, const WorkerStatus& b) {
    return std::tie(a.replica, a.role, a.rank, a.node) < std::tie(b.replica, b.role, b.rank, b.node);
  });
  for (const auto& [rid, r] : s.replicas) {
    ReplicaStatus rs;
    rs.replica = rid;
    rs.ready = r.routed();
    rs.assigned = static_cast<int32_t>(r.assigned.size());
    rs.load = r.load;
    rs.load.finished.clear();
    rs.state = replica_state_name(r.state);
    rs.state_seconds = now_s(self) - r.state_since;
    rs.state_seconds_total.assign(r.state_seconds.begin(), r.state_seconds.end());
    rs.state_seconds_total[static_cast<size_t>(r.state)] += rs.state_seconds;
    rs.cold_start_seconds = r.cold_start_s;
    rs.promotion_routable_seconds = r.promotion_routable_s;
    rs.promotion_dispatch_seconds = r.promotion_dispatch_s;
    rs.promotion_seconds = r.promotion_s;
    rs.num_promotions = r.num_promotions;
    rs.num_cold_starts = r.num_cold_starts;
    c.replicas.push_back(rs);
  }
  c.queued = static_cast<int32_t>(s.queue.size());
  c.running = static_cast<int32_t>(s.running.size());
  c.finished = s.finished;
  c.requeued = s.requeued;
  c.migrated = s.migrated;
  for (const auto& [rid, r] : s.replicas) {
    c.kv_migrated_tokens += r.load.kv_imported_tokens;
    c.kv_recomputed_tokens += r.load.kv_recomputed_tokens;
  }
  c.draining = s.draining;
  c.autoscale = s.as;
  // NOTE: the smallest limit, not s.max_model_len (the largest, used to refuse prompts that fit
  // nowhere): a front end that checks against this never sends a prompt some replica refuses.
  for (const auto& [rid, r] : s.replicas) {
    const int32_t len = r.shard ? r.shard_hello.max_model_len : 0;
    if (len > 0) c.max_model_len = c.max_model_len ? std::min(c.max_model_len, len) : len;
  }
  return c;
}

caf::behavior scheduler_actor(SchedSelf self, SchedulerConfig cfg) {
  auto& s = self->state;
  s.cfg = std::move(cfg);
  // Replicas the topology declares, and which of them have a draft worker.
  for (const NodeSpec& n : s.cfg.topology.nodes) {
    for (const WorkerSpec& w : n.workers) {
      if (w.role == WorkerRole::kTargetShard) s.replicas[w.replica];
      if (w.role == WorkerRole::kDraftWorker) s.replicas[w.replica].needs_draft = true;
      if (w.device.kind != DeviceKind::kCpu) s.cpu_only = false;
    }
  }
  const AutoscaleSpec& as = s.cfg.topology.autoscale;
  if (as.enabled()) {
    AutoscaleOptions o;
    o.min_replicas = as.min_replicas;
    o.max_replicas = as.max_replicas;
    o.warm_pool = as.warm_pool;
    o.upscale_delay_s = as.upscale_delay_s;
    o.downscale_delay_s = as.downscale_delay_s;
    o.target_ongoing_requests = as.target_ongoing_requests;
    o.ttft_slo_ms = as.ttft_slo_ms;
    o.target_kv_cache_usage = as.target_kv_cache_usage;
    o.look_back_period_s = as.look_back_period_s;
    o.new_replica_grace_s = as.new_replica_grace_s;
    o.start_timeout_s = as.start_timeout_s;
    s.autoscaler = std::make_unique<Autoscaler>(o, as.min_replicas);
    s.as.enabled = true;
    s.as.min_replicas = as.min_replicas;
    s.as.max_replicas = as.max_replicas;
    s.as.warm_pool = as.warm_pool;
    self->send(self, autoscale_atom::value);  // the first tick starts min_replicas + warm_pool
  } else {
    // Static serving: `up` starts every declared replica.
    for (auto& [rid, r] : s.replicas) {
      r.start_requested_at = 0;
      r.state = ReplicaState::kStarting;
    }
  }
  self->set_down_handler([self](caf::down_msg& m) {
    auto& s = self->state;
    if (auto rit = s.retired.find(m.source); rit != s.retired.end()) {  // a worker the autoscaler stopped
      auto& rr = s.replicas[rit->second];
      rr.num_retiring = std::max(0, rr.num_retiring - 1);
      s.retired.erase(rit);
      for (auto p = s.retiring_peers.begin(); p != s.retiring_peers.end();) {
        p = p->second.address() == m.source ? s.retiring_peers.erase(p) : std::next(p);
      }
      s.workers.erase(m.source);
      return;
    }
    s.tp.forget(m.source);
    auto it = s.workers.find(m.source);
    if (it == s.workers.end()) return;
    const WorkerHello h = it->second.hello;
    if (it->second.hello.state != "failed") it->second.hello.state = "down";  // kept for `status`
    get_logger("actors")->warn("worker {} {} of replica {} (node {}, pid {}) is down: {}", h.role, h.rank, h.replica, h.node,
                               h.pid, self->system().render(m.reason));
    auto& r = s.replicas[h.replica];
    if (h.role == worker_role_name(WorkerRole::kTargetShard)) {
      // NOTE: a tensor-parallel group lives only whole. Ranks in other processes learn of each
      // other's death late or never (their actor handles route through the head), so the head,
      // which sees every worker go down, stops the rest of the group itself.
      if (h.rank > 0 && r.shard) {
        log_tp_broken(h.replica, h.rank);
        self->send_exit(r.shard, caf::exit_reason::user_shutdown);
        replica_lost(self, h.replica);
      } else if (r.shard && r.shard.address() == m.source) {
        for (const caf::actor& f : tp_followers(s, h.replica)) self->send_exit(f, caf::exit_reason::user_shutdown);
        replica_lost(self, h.replica);
      }
    } else if (h.role == worker_role_name(WorkerRole::kPrefillWorker)) {
      if (r.prefill && r.prefill.address() == m.source) {
        r.prefill = caf::actor{};
        r.prefill_ready = false;
        std::set<int64_t> lost = std::move(r.on_prefill);
        r.on_prefill.clear();
        for (int64_t id : lost) r.assigned.erase(id);
        get_logger("actors")->warn("replica {}: prefill worker down; re-queueing {} request(s)", h.replica, lost.size());
        requeue(self, lost);
      }
    } else if (r.draft && r.draft.address() == m.source) {
      r.draft = caf::actor{};
      r.draft_settled = true;
      // The replica keeps serving without drafts (lossless: the target alone decides).
      if (r.shard && r.draft_attached) self->send(r.shard, AttachDraftMsg{});
      r.draft_attached = false;
    }
    dispatch(self);
  });
  return {
      [self](WorkerHello& h) {
        auto& s = self->state;
        auto log = get_logger("actors");
        if (!token_matches(h.token, s.cfg.token)) {
          log->warn("refused worker registration from node '{}' (pid {}): wrong cluster token", h.node, h.pid);
          return;
        }
        if (!h.self) return;
        // A worker told to quit whose hello was already on its way: it must not take its
        // replica's place again (its down message follows).
        if (s.retired.count(h.self.address())) return;
        if (s.autoscaler && !s.workers.count(h.self.address())) {
          auto& r = s.replicas[h.replica];
          if (r.head_launched && r.state == ReplicaState::kStopped) {
            // A worker of a start the head gave up (abandoned after start_timeout_s, or stopped
            // because its target shard failed or died) registering late — typically the draft
            // worker, which loads on its own. No start of the replica is in flight (a new one sets
            // `starting` first), so nothing would attach it: told to quit, else its process runs
            // on unused and the launcher (never two processes of one replica) refuses every
            // later start of the slot.
            if (h.state != "failed") {
              log->warn("replica {}: {} (pid {}) registered after its start was given up; telling it to quit", h.replica,
                        h.role, h.pid);
              self->monitor(h.self);
              s.retired[h.self.address()] = h.replica;
              ++r.num_retiring;
              self->send(h.self, retire_atom::value);
            }
            return;
          }
        }
        const bool is_new = !s.workers.count(h.self.address());
        if (is_new) self->monitor(h.self);
        auto& w = s.workers[h.self.address()];
        w.hello = h;
        w.hello.token.clear();
        if (is_new) w.since = Clock::now();
        auto& r = s.replicas[h.replica];
        if (h.role == worker_role_name(WorkerRole::kTargetShard)) {
          if (h.rank != 0) return;  // tensor-parallel ranks > 0 follow rank 0 (issue 9)
          if (r.shard && r.shard.address() != h.self.address() && r.shard_ready) {
            log->warn("replica {}: a second target shard registered (pid {}); keeping the first", h.replica, h.pid);
            return;
          }
          if (!r.shard || r.shard.address() != h.self.address()) {  // a new worker
            r.draining_out = false;
            r.reclaims_sent = r.reclaims_done = 0;
          }
          r.shard = h.self;
          r.lost = false;
          r.shard_hello = h;
          r.shard_ready = h.state == "ready";
          if (r.shard_ready && h.max_model_len > 0) {
            s.max_model_len = s.max_model_len ? std::max(s.max_model_len, h.max_model_len) : h.max_model_len;
          }
        } else if (h.role == worker_role_name(WorkerRole::kPrefillWorker)) {
          r.prefill = h.self;
          r.prefill_hello = h;
          r.prefill_ready = h.state == "ready";
        } else if (h.role == worker_role_name(WorkerRole::kDraftWorker)) {
          r.needs_draft = true;
          r.draft = h.self;
          r.draft_hello = h;
          r.draft_attached = false;
          r.draft_settled = h.state == "ready" || h.state == "failed";
        }
        log->info("worker {} of replica {} on node {} (pid {}): {}{}", h.role, h.replica, h.node, h.pid, h.state,
                  h.state == "ready" ? fmt::format(" (load {:.2f} s, warm-up {:.2f} s)", h.load_seconds, h.warmup_seconds)
                                     : (h.error.empty() ? "" : ": " + h.error));
        // A replica whose target shard cannot load is not restarted in a loop.
        if (h.role == worker_role_name(WorkerRole::kTargetShard)) r.not_startable = h.state == "failed";
        attach_draft_if_ready(self, r);
        if (h.state == "ready" && !h.kv_address.empty()) broadcast_kv_peers(self);
        update_startup_state(self, h.replica);
        dispatch(self);
      },
      [self](SubmitMsg& m) -> std::tuple<int64_t, int32_t, std::string> {
        auto& s = self->state;
        if (!token_matches(m.token, s.cfg.token)) {
          get_logger("actors")->warn("refused a request: wrong cluster token");
          return {0, static_cast<int32_t>(StatusCode::kInvalidArgument), "refused: wrong cluster token"};
        }
        if (s.draining) return {0, static_cast<int32_t>(StatusCode::kUnavailable), "the server is draining: no new requests"};
        if (!m.sink) return {0, static_cast<int32_t>(StatusCode::kInvalidArgument), "request: no sink actor"};
        const double timeout_s = m.request.timeout_s;
        auto w = to_work_item(s, m.request);
        if (!w.ok()) return {0, static_cast<int32_t>(w.status().code()), w.status().message()};
        const int64_t id = s.next_id++;
        w->request_id = id;
        auto ra = self->spawn(request_actor, id, s.cfg.token, caf::actor_cast<caf::actor>(self), m.sink, *w, timeout_s);
        w->request_actor = ra;
        s.request_actors[id] = ra;
        s.arrived_at[id] = now_s(self);
        enqueue(self, std::move(*w), s.next_arrival++);
        dispatch(self);
        return {id, 0, ""};
      },
      [self](const CancelMsg& m) {
        auto& s = self->state;
        if (!token_matches(m.token, s.cfg.token)) return;
        send_cancel(self, m.request_id);
      },
      [self](done_atom, int64_t id) {
        auto& s = self->state;
        auto ra = s.request_actors.find(id);
        if (ra == s.request_actors.end() || self->current_sender() != caf::actor_cast<caf::strong_actor_ptr>(ra->second)) return;
        s.request_actors.erase(ra);
        s.arrived_at.erase(id);
        s.queue.erase(id);
        s.rebalanced_from.erase(id);
        auto it = s.running.find(id);
        if (it != s.running.end()) {
          const int32_t rid = it->second;
          s.replicas[rid].assigned.erase(id);
          s.running.erase(it);
          finish_drain_if_idle(self, rid);
        }
        ++s.finished;
        dispatch(self);
        maybe_drained(self);
      },
      [self](ShardLoad& l) {
        auto& s = self->state;
        auto it = s.replicas.find(l.replica);
        if (it == s.replicas.end()) return;
        ReplicaEntry& r = it->second;
        if (r.prefill && self->current_sender() == caf::actor_cast<caf::strong_actor_ptr>(r.prefill)) {
          for (int64_t id : l.finished) {
            r.assigned.erase(id);
            r.on_prefill.erase(id);
          }
          r.prefill_load = std::move(l);
          return;
        }
        if (!r.shard || self->current_sender() != caf::actor_cast<caf::strong_actor_ptr>(r.shard)) return;
        for (int64_t id : l.finished) r.assigned.erase(id);
        while (!r.in_flight.empty() && r.in_flight.front().first <= l.received) {
          r.pending_blocks -= r.in_flight.front().second;
          r.in_flight.pop_front();
        }
        const int32_t rid = l.replica;
        if (l.num_reclaims > r.reclaims_done && l.num_reclaims >= r.reclaims_sent && r.handed_back == r.handed_back_at_reclaim) {
          // Its last hand-back gave nothing (every sequence too close to its end, or all already
          // gone): not asked again for a while, or the head would ask (and log) every tick.
          r.no_reclaim_until = now_s(self) + kNoReclaimAfterReturnS;
        }
        r.reclaims_done = l.num_reclaims;
        r.load = std::move(l);
        finish_drain_if_idle(self, rid);
        dispatch(self);
      },
      [self](MigratedSeq& m) {
        auto& s = self->state;
        auto it = s.replicas.find(m.replica);
        if (it == s.replicas.end()) return;
        const auto sender = self->current_sender();
        const ReplicaEntry& r = it->second;
        const bool from_shard = r.shard && sender == caf::actor_cast<caf::strong_actor_ptr>(r.shard);
        const bool from_prefill = r.prefill && sender == caf::actor_cast<caf::strong_actor_ptr>(r.prefill);
        if (!from_shard && !from_prefill) return;
        migrated(self, std::move(m));
      },
      [self](const KvReleaseMsg& m) {
        // A receiver has read (or given up on) an offer: its source frees the staging region.
        // Only a registered worker may say so.
        const auto sender = self->current_sender();
        if (!sender || !self->state.workers.count(sender->address())) return;
        if (auto src = kv_peer(self->state, m.source)) self->send(src, m);
      },
      [self](drain_rep_atom, const std::string& token, int32_t replica, bool then_quit) -> int32_t {
        // One replica drains (its worker is stopping, or the autoscaler scales down): its running
        // sequences move to other replicas with their KV. -1: nothing to do here (the whole
        // cluster drains, the replica is unknown, or no other replica is ready to take them).
        auto& s = self->state;
        if (!token_matches(token, s.cfg.token) || s.draining) return -1;
        auto it = s.replicas.find(replica);
        if (it == s.replicas.end() || !it->second.shard) return -1;
        bool other = false;
        for (const auto& [rid, r] : s.replicas) other = other || (rid != replica && r.routed());
        ReplicaEntry& r = it->second;
        if (!other) {
          // Nowhere to move them: the replica takes no new work, finishes what it has, then stops.
          r.draining_out = true;
          get_logger("actors")->info("replica {}: draining; no other replica is ready, its {} request(s) finish here",
                                     replica, r.assigned.size());
          if (then_quit) self->send(r.shard, retire_atom::value);
          return static_cast<int32_t>(r.assigned.size());
        }
        r.draining_out = true;
        get_logger("actors")->info("replica {}: draining; moving its {} request(s) to other replicas", replica, r.assigned.size());
        self->send(r.shard, migrate_atom::value, then_quit);
        return static_cast<int32_t>(r.assigned.size());
      },
      [self](first_tok_atom, int64_t id, double ttft_s, bool first_of_request) {
        auto& s = self->state;
        if (!s.request_actors.count(id) ||
            self->current_sender() != caf::actor_cast<caf::strong_actor_ptr>(s.request_actors[id])) {
          return;
        }
        auto it = s.running.find(id);
        if (it == s.running.end()) return;
        auto& r = s.replicas[it->second];
        const double now = now_s(self);
        if (first_of_request) {  // a TTFT sample only once per request
          s.ttft.push_back({now, ttft_s, it->second});
          if (s.ttft.size() > 4096) s.ttft.pop_front();
        }
        if (r.awaiting_first_token && r.measured_request == id && r.state == ReplicaState::kReady &&
            r.scale_decision_at >= 0) {
          r.awaiting_first_token = false;
          const double took = now - r.scale_decision_at;
          if (r.cold_path) {
            keep_last(&s.as.cold_scale_up_seconds, took);
          } else {
            r.promotion_s = took;
            keep_last(&s.as.promotion_seconds, took);
          }
          get_logger("actors")->info("replica {}: scale-up decision ({}) -> first token {:.3f} s (request {})", it->second,
                                     r.cold_path ? "cold start" : "warm promotion", took, id);
          r.scale_decision_at = -1;
        }
      },
      [self](launch_err_atom, int32_t replica, const std::string& why) {
        // Only a replica still waiting for its first worker hello: one that registered is
        // covered by its workers' down messages.
        auto& s = self->state;
        auto it = s.replicas.find(replica);
        if (it == s.replicas.end() || it->second.state != ReplicaState::kStarting || it->second.shard) return;
        start_failed(self, replica, why);
      },
      [self](autoscale_atom) {
        autoscale_tick(self);
        self->delayed_send(self, std::chrono::milliseconds(100), autoscale_atom::value);
      },
      [self](const StatusQuery& q) -> caf::result<ClusterStatus> {
        if (!token_matches(q.token, self->state.cfg.token)) {
          get_logger("actors")->warn("refused a status query: wrong cluster token");
          return caf::make_error(caf::sec::request_receiver_down, "refused: wrong cluster token");
        }
        return make_status(self);
      },
      [self](const TpJoinMsg& m) -> caf::result<TpGroupMsg> {
        auto& s = self->state;
        if (!token_matches(m.token, s.cfg.token)) {
          get_logger("actors")->warn("refused a tensor-parallel join: wrong cluster token");
          return caf::make_error(caf::sec::request_receiver_down, "refused: wrong cluster token");
        }
        auto rp = self->make_response_promise<TpGroupMsg>();
        auto answers = s.tp.join(m, s.cfg.topology.models.target.tensor_parallel_size, rp);
        for (auto& [p, g] : answers) {
          if (!g.error.empty()) {
            get_logger("actors")->warn("replica {}: tensor-parallel join of rank {} refused: {}", m.replica, m.rank, g.error);
          }
        }
        if (!answers.empty() && answers.front().second.error.empty()) {
          get_logger("actors")->info("replica {}: all {} tensor-parallel ranks joined ({})", m.replica, answers.size(),
                                     answers.front().second.prefix);
        }
        for (auto& [p, g] : answers) p.deliver(std::move(g));
        return rp;
      },
      [self](rdv_set_atom, const std::string& key, std::string& value) -> bool {
        for (auto& p : self->state.tp.set(key, std::move(value))) p.deliver(*self->state.tp.value(key));
        return true;
      },
      [self](rdv_get_atom, const std::string& key) -> caf::result<std::string> {
        auto& s = self->state;
        if (auto v = s.tp.value(key)) return *v;
        auto rp = self->make_response_promise<std::string>();
        s.tp.wait(key, rp);
        return rp;
      },
      [self](drain_atom, const std::string& token) -> caf::result<bool> {
        auto& s = self->state;
        if (!token_matches(token, s.cfg.token)) return caf::make_error(caf::sec::request_receiver_down, "refused: wrong cluster token");
        s.draining = true;
        auto rp = self->make_response_promise<bool>();
        s.drain_waiters.push_back(rp);
        maybe_drained(self);
        return rp;
      },
  };
}

}  // namespace

caf::actor spawn_scheduler(caf::actor_system& sys, SchedulerConfig config) {
  return sys.spawn(scheduler_actor, std::move(config));
}

}  // namespace specserve
