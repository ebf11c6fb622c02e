// specserve actors: the scheduler's queue: dispatch to ready replicas, rebalance between them,
// re-queueing after a failure and migration of running sequences (actors/scheduler.h).
#include <algorithm>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "actors/scheduler_internal.h"
#include "core/logging.h"
#include "scheduler/dispatch.h"
#include "scheduler/rebalance.h"

namespace specserve {
namespace scheduler_internal {
namespace {

// A migrated item's KV offer is used only if it is dispatched within this long of arriving
// (the source keeps offers 60 s: actors/target_shard.cpp kOfferLifetime).
constexpr double kMaxOfferWait_s = 40.0;

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

}  // namespace

void release_offer(SchedSelf self, const KvOffer& kv) {
  if (kv.source.empty()) return;
  if (auto src = kv_peer(self->state, kv.source)) self->send(src, KvReleaseMsg{kv.source, kv.offer_id});
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
  // kMaxStartFailures bounds that wait (a parked replica is started again, but not waited for).
  // Without it, a lost replica whose node restarts workers (scheduler.worker_restarts) keeps the
  // queue waiting until worker_restart_timeout_s has passed since the loss, or until up says that
  // no node is left to restart it (no_restart_atom).
  const bool can_start = s.autoscaler && s.cfg.start_replica;
  // Under scale from zero (min_replicas 0) only demand starts a replica: a request that comes
  // after a parked replica's backoff waits for one retry (it failed at once, and nothing ever
  // started the replica again).
  const bool from_zero = s.autoscaler && s.autoscaler->options().min_replicas == 0;
  const double now = now_s(self);
  bool none_left = !s.replicas.empty();
  for (const auto& [rid, r] : s.replicas) {
    // Under an autoscaler a parked replica starting again is not waited for (it serves once
    // ready, if it gets there). NOTE: without one (a static cluster whose node restarts a
    // worker) the queue waits for the restart as before.
    const bool unwaited = r.parked && s.autoscaler && !from_zero;
    const bool alive = r.state != ReplicaState::kStopped && !(unwaited && !r.ready());
    const bool retry_due = from_zero && r.parked && !r.not_startable &&
                           now - std::max(r.state_since, r.start_failed_at) >= s.autoscaler->start_backoff_s(r.num_start_failures);
    const bool startable = r.state == ReplicaState::kStopped && can_start && (r.can_serve_later() || retry_due);
    if (alive || startable || awaiting_restart(self, r)) none_left = false;
  }
  if (none_left) {
    // Say so when a restart was waited for in vain.
    std::string why = "no replica is left: every target shard is down and none can be started";
    const SchedulerSpec& spec = s.cfg.topology.scheduler;
    // The cause of the replica lost last (whose loss left nothing to serve).
    const ReplicaEntry* lost = nullptr;
    int32_t lost_id = -1;
    for (const auto& [rid, r] : s.replicas) {
      if (r.lost && (lost == nullptr || r.lost_at > lost->lost_at)) {
        lost = &r;
        lost_id = rid;
      }
    }
    // NOTE: tensor-parallel ranks are never restarted (awaiting_restart): a killed rank blamed
    // worker_restart_timeout_s, which was never waited for.
    const bool tp = s.cfg.topology.models.target.tensor_parallel_size > 1;
    if (lost && !s.autoscaler) {
      if (tp && spec.worker_restarts > 0) {
        why += fmt::format(" (replica {} lost a tensor-parallel rank; the ranks of a tensor-parallel target are not "
                           "restarted: scheduler.worker_restarts applies to single-shard replicas)",
                           lost_id);
      } else if (!lost->restart_possible) {
        why += fmt::format(" (replica {}'s target shard stopped on its own, by SIGTERM or a drain: it is not restarted)",
                           lost_id);
      } else if (spec.worker_restarts == 0) {
        why += fmt::format(" (replica {}'s target shard went down; scheduler.worker_restarts is 0: its node does not "
                           "restart it)",
                           lost_id);
      } else if (s.no_restarts) {
        why += fmt::format(" (replica {}'s target shard went down and every node process of the head's host has exited: "
                           "no worker restarts)",
                           lost_id);
      } else {
        why += fmt::format(" (replica {}'s target shard was not restarted within scheduler.worker_restart_timeout_s = {:g} s)",
                           lost_id, spec.worker_restart_timeout_s);
      }
    }
    // Why the last start failed (a worker's own reason: a model file gone), so a client does not
    // have to find the head's log: a parked replica's first (what keeps it from serving), else
    // any stopped one's.
    const ReplicaEntry* cause = nullptr;
    int32_t cause_id = -1;
    for (const auto& [rid, r] : s.replicas) {
      if (r.state != ReplicaState::kStopped || r.last_start_error.empty()) continue;
      if (cause == nullptr || (r.parked && !cause->parked)) {
        cause = &r;
        cause_id = rid;
      }
    }
    if (cause) {
      std::string next;
      if (s.autoscaler && can_start && !cause->not_startable) {
        const double left = s.autoscaler->start_backoff_s(cause->num_start_failures) -
                            (now - std::max(cause->state_since, cause->start_failed_at));
        if (left > 0) next = fmt::format("; it is tried again in {:.1f} s at the earliest", std::max(left, 0.1));
      }
      why += fmt::format(" (replica {}: its last start failed: {}{})", cause_id, cause->last_start_error, next);
    }
    std::vector<int64_t> ids;
    for (const auto& [id, p] : s.queue) ids.push_back(id);
    for (int64_t id : ids) fail_queued(self, id, "error", why);
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
    // KV pressure as the autoscaler measures it (target_kv_cache_usage): such a replica takes
    // nothing, and what waits in its engine for cache room while its batch has slots goes back.
    const ShardLoad& ld = r.load;
    if (ld.total_kv_blocks > 0) {
      const double usage = static_cast<double>(ld.total_kv_blocks - ld.free_kv_blocks) / ld.total_kv_blocks;
      l.kv_full = usage > s.cfg.topology.autoscale.target_kv_cache_usage;
      if (l.kv_full && ld.num_running < l.max_num_seqs) l.kv_waiting = std::max(0, ld.num_waiting - ld.num_fetching);
    }
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

void replica_lost(SchedSelf self, int32_t replica_id, bool abnormal) {
  auto& s = self->state;
  auto& r = s.replicas[replica_id];
  auto log = get_logger("actors");
  // Requests still on the replica's prefill worker stay there: their hand-over goes elsewhere.
  std::set<int64_t> lost;
  for (int64_t id : r.assigned) {
    if (!r.on_prefill.count(id)) lost.insert(id);
  }
  // NOTE: the count said all assigned requests, those staying on the prefill worker included.
  log->warn("replica {}: target shard down; re-queueing {} request(s){}", replica_id, lost.size(),
            r.on_prefill.empty() ? "" : fmt::format(" ({} on its prefill worker stay there)", r.on_prefill.size()));
  r.assigned = r.on_prefill;
  r.shard = caf::actor{};
  r.tp_waiter = caf::actor{};  // (its rank 0 went with it)
  r.shard_ready = false;
  r.lost = true;
  r.draft_lost = false;  // its next incarnation (a restart) comes with a draft worker again
  r.swapped_out = false;
  r.lost_at = now_s(self);
  r.restart_possible = abnormal;
  r.draft_attached = false;
  r.pending_blocks = 0;
  r.sent = 0;
  r.in_flight.clear();
  add_load_counters(s.ended, r.load);
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
  } else if (r.draft) {
    // It stays for the shard a node may restart (scheduler.worker_restarts), which numbers its
    // sequences afresh: the dead shard's sequences go.
    self->send(r.draft, drop_seqs_atom::value);
  }
  if (awaiting_restart(self, r)) {
    const double wait_s = s.cfg.topology.scheduler.worker_restart_timeout_s;
    log->warn("replica {}: waiting up to {:.0f} s for its node to restart the target shard (scheduler.worker_restarts)",
              replica_id, wait_s);
    // Then the queue is looked at again: failed if nothing serves it by then.
    self->delayed_send(self, std::chrono::milliseconds(static_cast<int64_t>(wait_s * 1000) + 50), restart_due_atom::value);
  }
  requeue(self, lost);
}

bool awaiting_restart(SchedSelf self, const ReplicaEntry& r) {
  const auto& s = self->state;
  const SchedulerSpec& spec = s.cfg.topology.scheduler;
  if (s.autoscaler || s.no_restarts || spec.worker_restarts <= 0 || s.cfg.topology.models.target.tensor_parallel_size > 1) {
    return false;
  }
  return r.lost && r.restart_possible && r.can_serve_later() && now_s(self) - r.lost_at < spec.worker_restart_timeout_s;
}

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

caf::actor kv_peer(SchedulerState& s, const std::string& name) {
  for (const auto& [rid, r] : s.replicas) {
    if (r.shard && kv_peer_name(r.shard_hello.role, rid) == name) return r.shard;
    if (r.prefill && kv_peer_name(r.prefill_hello.role, rid) == name) return r.prefill;
  }
  if (auto it = s.retiring_peers.find(name); it != s.retiring_peers.end()) return it->second;
  return {};
}

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

}  // namespace scheduler_internal
}  // namespace specserve
