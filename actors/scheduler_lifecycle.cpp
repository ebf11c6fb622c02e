// specserve actors: the scheduler's replica lifecycle (starting -> loading -> warming -> ready ->
// draining -> standby -> stopped) and the autoscaler's actions on it (actors/scheduler.h).
#include <algorithm>
#include <string>
#include <tuple>
#include <vector>

#include "actors/scheduler_internal.h"
#include "core/logging.h"

namespace specserve {
namespace scheduler_internal {
namespace {

// The first start-up routing (min_replicas > 0, before any replica was routed) is no scale-up.
// With min_replicas 0 the first routing is a scale from zero: a scale-up like any other.
bool at_startup(const SchedulerState& s) {
  return !s.ever_routed && (!s.autoscaler || s.autoscaler->options().min_replicas > 0);
}

}  // namespace

// Tells a replica's workers to quit (the autoscaler stops it). Their down messages are expected.
void retire(SchedSelf self, int32_t rid) {
  auto& s = self->state;
  auto& r = s.replicas[rid];
  // Swapped for a replica with drafts (replace_draftless), not a scale-down.
  // NOTE: told by draft_lost, a draftless replica the policy drained as a scale-down (or whose
  // draft died during one) was counted as a drain but never as a stop.
  const bool replaced = r.swapped_out;
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
  // A disaggregated prefill worker goes with its replica too (its counters stay in the totals).
  if (r.prefill) {
    add_load_counters(s.ended, r.prefill_load);
    r.prefill_load = ShardLoad{};
    r.prefill_ready = false;
  }
  for (caf::actor* a : {&r.shard, &r.draft, &r.prefill}) {
    if (!*a) continue;
    s.retired[a->address()] = rid;
    ++r.num_retiring;  // not startable until its down message comes: never two processes of it
    self->send(*a, retire_atom::value);
    *a = caf::actor{};
  }
  r.shard_ready = false;
  r.shard_hello = WorkerHello{};
  r.draft_hello = WorkerHello{};
  add_load_counters(s.ended, r.load);
  r.load = ShardLoad{};
  r.lost = false;
  r.draft_lost = false;
  r.swapped_out = false;
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
  if (!replaced) ++s.as.num_stops;
  set_state(self, rid, ReplicaState::kStopped);
}

// Stops routing new requests to the replica; its in-flight requests finish there and their
// streams go on.
// When another replica is routed and the routed replicas that stay have free KV blocks for what
// the draining one holds, the running requests move there at once with their KV (migrate_atom:
// the shard exports each sequence, MigratedSeq re-dispatches it, streams go on), so a drain
// takes one step instead of the longest request; otherwise they finish here.
void begin_drain(SchedSelf self, int32_t rid, bool to_standby) {
  auto& s = self->state;
  auto& r = s.replicas[rid];
  r.drain_to_standby = to_standby;
  // Leaving ready ends a scale-up measurement still open (set_state): a later undrain or restart
  // must not time itself from this decision.
  ++s.as.num_drains;
  set_state(self, rid, ReplicaState::kDraining);
  bool other = false;
  int64_t free_elsewhere = 0;  // KV blocks free on the routed replicas that stay
  for (const auto& [id, o] : s.replicas) {
    if (id == rid || !o.routed()) continue;
    other = true;
    free_elsewhere += (o.load.total_kv_blocks ? o.load.free_kv_blocks : o.shard_hello.total_kv_blocks) - o.pending_blocks;
  }
  // NOTE: the sequences moved into replicas without room for their KV, which then preempted
  // (and recomputed) them or others, and the KV pressure that caused brought the replica back
  // (a scale-down and scale-up in turn). Without room they finish here.
  const int64_t used = r.load.total_kv_blocks > 0 ? r.load.total_kv_blocks - r.load.free_kv_blocks : 0;
  if (other && r.shard && !r.assigned.empty()) {
    if (used <= free_elsewhere) {
      self->send(r.shard, migrate_atom::value, false);
    } else {
      get_logger("actors")->info("replica {}: draining; its {} request(s) finish here: they hold {} KV block(s), the "
                                 "replicas that stay have {} free",
                                 rid, r.assigned.size(), used, free_elsewhere);
    }
  }
  finish_drain_if_idle(self, rid);
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
  r.draft_lost = false;  // a new incarnation, with a new draft worker
  r.swapped_out = false;
  // NOTE: a parked replica stays parked while it starts again (the queue does not wait for its
  // retries: that start cleared it, and queued requests waited up to start_timeout_s each time).
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

// After this many consecutive failed starts a replica is parked (ReplicaEntry::parked): the queue
// fails when no other replica can serve it, instead of waiting for restarts that keep failing,
// and the autoscaler goes on trying it after its capped backoff.
constexpr int32_t kMaxStartFailures = 5;

// The longest a cold start waits for a promoted replica's first token on a CPU host.
constexpr double kRefillHoldS = 5.0;


// Routes a standby replica (the policy decided so at `decided_at`, head clock): a state flip here,
// so the dispatch that follows in the same tick can give it queued work, and rebalance() can ask
// busy replicas for the requests waiting in their engines. No message to the replica, no
// warm-up, no KV allocation, no draft-worker handshake: all of that happened before standby.
void promote(SchedSelf self, int32_t rid, double decided_at, bool measured) {
  auto& s = self->state;
  auto& r = s.replicas[rid];
  if (!measured) {
    // A swap (a replacement), not a scale-up: routed, not counted, timed or held for.
    set_state(self, rid, ReplicaState::kReady);
    r.promoted_at = now_s(self);
    s.ever_routed = true;
    r.awaiting_first_token = false;
    r.measured_request = 0;
    r.awaiting_assign = false;
    r.cold_path = false;
    r.scale_decision_at = -1;
    return;
  }
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
    r.parked = false;
    r.last_start_error.clear();
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

void finish_drain_if_idle(SchedSelf self, int32_t rid) {
  auto& r = self->state.replicas[rid];
  if (r.state != ReplicaState::kDraining || !r.assigned.empty()) return;
  if (r.drain_to_standby) {
    set_state(self, rid, ReplicaState::kStandby);
  } else {
    retire(self, rid);
  }
}

void note_ongoing_change(SchedulerState& s, double now_s) {
  if (now_s > s.ongoing_changed_at) {
    s.ongoing_area += static_cast<double>(s.request_actors.size()) * (now_s - s.ongoing_changed_at);
    s.ongoing_changed_at = now_s;
  }
}

void start_failed(SchedSelf self, int32_t rid, const std::string& why, bool permanent) {
  auto& s = self->state;
  auto& r = s.replicas[rid];
  ++r.num_start_failures;
  ++s.as.num_failed_starts;
  r.start_failed_at = now_s(self);
  r.last_start_error = why;
  // NOTE: a cause a retry cannot mend (a worker that exited kExitConfig: its topology entry, its
  // model file) parks it at once, as a model that fails to load does (count_load_failure): the
  // queue does not wait for kMaxStartFailures starts that fail the same way (15.6 s at the
  // default backoff), and the autoscaler still retries at its backoff's pace.
  if (r.num_start_failures >= kMaxStartFailures || permanent) r.parked = true;
  std::string next;
  if (s.autoscaler && s.cfg.start_replica && !r.not_startable) {
    next = fmt::format("; next try in {:g} s", s.autoscaler->start_backoff_s(r.num_start_failures));
    if (r.parked) next += ", the queue does not wait for it";
  }
  get_logger("actors")->warn("replica {}: start failed ({} in a row{}): {}", rid, r.num_start_failures, next, why);
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
    note_ongoing_change(s, now);  // a new window: the next tick's mean is its own
    s.ongoing_area = 0;
    s.ongoing_window_start = now;
    s.held_deficit_since = -1;
    dispatch(self);
    return;
  }
  replace_draftless(self);
  const AutoscaleOptions& o = s.autoscaler->options();
  while (!s.ttft.empty() && s.ttft.front().at_s < now - o.look_back_period_s) s.ttft.pop_front();
  AutoscaleInput in;
  in.now_s = now;
  in.num_queued = static_cast<int32_t>(s.queue.size());
  // Requests that came and went since the last tick count too, for their share of it (a 15 ms
  // request between two ticks).
  note_ongoing_change(s, now);
  if (now > s.ongoing_window_start) in.mean_ongoing = s.ongoing_area / (now - s.ongoing_window_start);
  s.ongoing_area = 0;
  s.ongoing_window_start = now;
  for (const auto& [id, p] : s.queue) in.oldest_wait_s = std::max(in.oldest_wait_s, now - p.enqueued_at);
  for (const auto& [rid, r] : s.replicas) {
    if (r.not_startable && r.state == ReplicaState::kStopped) continue;  // not a slot the policy can use
    // NOTE: a parked replica stays a slot: the policy starts it again once its backoff is over.
    ReplicaView v;
    v.id = rid;
    v.state = r.state;
    // A replica whose worker is stopping (drain_rep_atom) is leaving: draining, never undrained.
    // NOTE: it read as warming since it became ready, and past start_timeout_s the policy
    // abandoned it as a start that made no progress.
    if (r.draining_out && r.state == ReplicaState::kReady) {
      v.state = ReplicaState::kDraining;
      v.leaving = true;
    }
    // One whose draft worker died is being replaced: drained first, never routed again.
    if (r.draft_lost) {
      v.draftless = v.state == ReplicaState::kReady;
      v.leaving = v.leaving || v.state == ReplicaState::kDraining;
    }
    // A ready replica whose shard has not confirmed ready (cannot happen) or a standby one whose
    // draft worker has not settled is still warming for the policy.
    if ((v.state == ReplicaState::kReady || v.state == ReplicaState::kStandby) && !r.ready()) v.state = ReplicaState::kWarming;
    v.ready_since_s = r.ready_since;
    v.num_assigned = static_cast<int32_t>(r.assigned.size());
    if (r.load.total_kv_blocks > 0) {
      v.kv_cache_usage = static_cast<double>(r.load.total_kv_blocks - r.load.free_kv_blocks) / r.load.total_kv_blocks;
    }
    v.draining_to_standby = r.drain_to_standby;
    // The backoff counts from the last failed start (a load failure can come after the state's
    // last change).
    v.state_since_s = std::max(r.state_since, r.start_failed_at);
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

void add_load_counters(ShardLoad& into, const ShardLoad& l) {
  into.num_steps += l.num_steps;
  into.generated_tokens += l.generated_tokens;
  into.num_drafts += l.num_drafts;
  into.num_draft_tokens += l.num_draft_tokens;
  into.num_accepted_tokens += l.num_accepted_tokens;
  into.forward_seconds += l.forward_seconds;
  into.draft_seconds += l.draft_seconds;
  into.prompt_tokens += l.prompt_tokens;
  add_counts(into.accepted_per_pos, l.accepted_per_pos);
  add_counts(into.drafts_by_source, l.drafts_by_source);
  add_counts(into.draft_tokens_by_source, l.draft_tokens_by_source);
  add_counts(into.accepted_by_source, l.accepted_by_source);
  into.prefix_cache_queries += l.prefix_cache_queries;
  into.prefix_cache_hits += l.prefix_cache_hits;
  into.num_preemptions += l.num_preemptions;
  into.kv_imported_tokens += l.kv_imported_tokens;
  into.kv_recomputed_tokens += l.kv_recomputed_tokens;
  into.goodput_drafting += l.goodput_drafting;
  into.goodput_skipped += l.goodput_skipped;
}

ClusterStatus make_status(SchedSelf self) {
  auto& s = self->state;
  ClusterStatus c;
  c.cluster = s.cfg.topology.cluster.name;
  c.model = s.cfg.topology.models.target.path;
  if (s.cfg.topology.models.speculative) {
    c.speculative_method = speculative_method_name(s.cfg.topology.models.speculative->method);
    c.speculative = describe_speculative(s.cfg.topology);
  }
  c.tensor_parallel_size = s.cfg.topology.models.target.tensor_parallel_size;
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
    ws.compute = w.hello.compute;
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
    // Before the shard's first step report its load is all zeros: the cache it announced in its
    // hello, all free (status showed KV 0/0 until the first request).
    if (rs.load.total_kv_blocks == 0 && r.shard && r.shard_hello.total_kv_blocks > 0) {
      rs.load.total_kv_blocks = r.shard_hello.total_kv_blocks;
      rs.load.free_kv_blocks = r.shard_hello.total_kv_blocks;
    }
    rs.has_prefill_worker = static_cast<bool>(r.prefill);
    rs.prefill_load = r.prefill_load;
    rs.prefill_load.finished.clear();
    if (rs.prefill_load.total_kv_blocks == 0 && r.prefill && r.prefill_hello.total_kv_blocks > 0) {
      rs.prefill_load.total_kv_blocks = r.prefill_hello.total_kv_blocks;
      rs.prefill_load.free_kv_blocks = r.prefill_hello.total_kv_blocks;
    }
    // A replica whose worker is stopping (drain_rep_atom) is still kReady in the lifecycle (it
    // leaves when its worker goes) but routes nothing: shown as draining, not ready.
    rs.state = replica_state_name(r.draining_out && r.state == ReplicaState::kReady ? ReplicaState::kDraining : r.state);
    rs.state_seconds = now_s(self) - r.state_since;
    rs.state_seconds_total.assign(r.state_seconds.begin(), r.state_seconds.end());
    rs.state_seconds_total[static_cast<size_t>(r.state)] += rs.state_seconds;
    rs.cold_start_seconds = r.cold_start_s;
    rs.promotion_routable_seconds = r.promotion_routable_s;
    rs.promotion_dispatch_seconds = r.promotion_dispatch_s;
    rs.promotion_seconds = r.promotion_s;
    rs.num_promotions = r.num_promotions;
    rs.num_cold_starts = r.num_cold_starts;
    rs.num_start_failures = r.num_start_failures;
    rs.last_start_error = r.last_start_error;
    rs.draft_lost = r.needs_draft && !r.draft && r.shard && r.draft_settled;
    c.replicas.push_back(rs);
  }
  c.queued = static_cast<int32_t>(s.queue.size());
  c.running = static_cast<int32_t>(s.running.size());
  c.finished = s.finished;
  c.requeued = s.requeued;
  c.migrated = s.migrated;
  c.ended = s.ended;
  c.kv_migrated_tokens = s.ended.kv_imported_tokens;
  c.kv_recomputed_tokens = s.ended.kv_recomputed_tokens;
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

}  // namespace scheduler_internal
}  // namespace specserve
