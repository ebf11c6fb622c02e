#include "actors/scheduler.h"

#include <algorithm>
#include <chrono>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "actors/messages.h"
#include "actors/prompt.h"
#include "actors/request_actor.h"
#include "actors/runtime.h"
#include "actors/scheduler_internal.h"
#include "core/logging.h"

namespace specserve {
namespace scheduler_internal {
namespace {

void log_tp_broken(int32_t rid, int32_t rank) {
  get_logger("actors")->error("replica {}: tensor-parallel rank {} is down; the replica's other ranks are stopped", rid, rank);
}

Expected<WorkItem> to_work_item(SchedulerState& s, GenerateRequest& req) {
  WorkItem w;
  auto prompt = tokenize_prompt(*s.cfg.gguf, *s.cfg.tokenizer, req);
  if (!prompt.ok()) return prompt.status();
  w.prompt = std::move(*prompt);
  if (req.max_tokens < 1) return invalid_argument("max_tokens = " + std::to_string(req.max_tokens) + ": must be >= 1");
  SPECSERVE_RETURN_IF_ERROR(req.sampling.validate());
  if (req.sampling.min_tokens > req.max_tokens) {
    return invalid_argument("min_tokens = " + std::to_string(req.sampling.min_tokens) + ": must be <= max_tokens = " +
                            std::to_string(req.max_tokens));
  }
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
    o.start_backoff_s = as.start_backoff_s;
    o.start_backoff_max_s = as.start_backoff_max_s;
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
    // A worker refused its slot, or one gone while it waited for it: never registered.
    if (s.refused.erase(m.source) + s.slot_conflicts.erase(m.source) > 0) {
      s.tp.forget(m.source);
      return;
    }
    if (auto rit = s.retired.find(m.source); rit != s.retired.end()) {  // a worker the autoscaler stopped
      s.tp.forget(m.source);
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
    if (it->second.hello.state != "failed") {
      it->second.hello.state = "down";  // kept for `status`, with why (a failed one keeps its own error)
      if (m.reason != caf::exit_reason::normal) it->second.hello.error = "went down: " + self->system().render(m.reason);
    }
    get_logger("actors")->warn("worker {} {} of replica {} (node {}, pid {}) is down: {}", h.role, h.rank, h.replica, h.node,
                               h.pid, self->system().render(m.reason));
    auto& r = s.replicas[h.replica];
    if (h.role == worker_role_name(WorkerRole::kTargetShard)) {
      // NOTE: a tensor-parallel group lives only whole. Ranks in other processes learn of each
      // other's death late or never (their actor handles route through the head), so the head,
      // which sees every worker go down, stops the rest of the group itself.
      if (h.rank > 0 && r.shard) {
        log_tp_broken(h.replica, h.rank);
        // Rank 0 may be blocked waiting for this rank's answer, where the exit below waits too.
        if (r.tp_waiter) {
          self->send(r.tp_waiter, tp_abort_atom::value,
                     "tensor parallel rank " + std::to_string(h.rank) + " went down (" + self->system().render(m.reason) + ")");
          r.tp_waiter = caf::actor{};
        }
        self->send_exit(r.shard, caf::exit_reason::user_shutdown);
        replica_lost(self, h.replica, m.reason != caf::exit_reason::normal);
      } else if (r.shard && r.shard.address() == m.source) {
        for (const caf::actor& f : tp_followers(s, h.replica)) self->send_exit(f, caf::exit_reason::user_shutdown);
        replica_lost(self, h.replica, m.reason != caf::exit_reason::normal);
      }
    } else if (h.role == worker_role_name(WorkerRole::kPrefillWorker)) {
      if (r.prefill && r.prefill.address() == m.source) {
        r.prefill = caf::actor{};
        r.prefill_ready = false;
        // Its counters stay in the cluster's totals (a restarted one counts from 0 again).
        add_load_counters(s.ended, r.prefill_load);
        r.prefill_load = ShardLoad{};
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
      if (m.reason != caf::exit_reason::normal) draft_lost(self, h.replica);
    }
    dispatch(self);
  });
  return {
      [self](WorkerHello& h) { register_worker(self, h); },
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
        note_ongoing_change(s, now_s(self));
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
        note_ongoing_change(s, now_s(self));
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
      [self](const KvSendMsg& m) {
        // A receiver asks the source to send an offer over their NCCL KV channel (two-sided).
        // Only a registered worker may ask.
        const auto sender = self->current_sender();
        if (!sender || !self->state.workers.count(sender->address())) return;
        if (auto src = kv_peer(self->state, m.source)) self->send(src, m);
      },
      [self](slot_check_atom, const caf::actor& who) {
        // A slot conflict's wait ended: its newest hello again, now decided (registered, or refused).
        auto& s = self->state;
        auto it = s.slot_conflicts.find(who.address());
        if (it == s.slot_conflicts.end()) return;
        it->second.since = -1e9;  // the wait is over
        self->send(self, it->second.hello);
      },
      [self](drain_rep_atom, const std::string& token, int32_t replica, bool then_quit, const caf::actor& worker) -> int32_t {
        // One replica drains (its worker is stopping, or the autoscaler scales down): its running
        // sequences move to other replicas with their KV. -1: nothing to do here (the whole
        // cluster drains, the replica is unknown, the asking worker is not one of the replica's,
        // or no other replica is ready to take them).
        auto& s = self->state;
        if (!token_matches(token, s.cfg.token) || s.draining) return -1;
        if (auto w = worker ? s.workers.find(worker.address()) : s.workers.end(); w == s.workers.end() || w->second.hello.replica != replica) {
          get_logger("actors")->warn("replica {}: drain asked by a worker that is not one of its own; ignored", replica);
          return -1;
        }
        auto it = s.replicas.find(replica);
        if (it == s.replicas.end() || !it->second.shard) return -1;
        bool other = false;
        for (const auto& [rid, r] : s.replicas) other = other || (rid != replica && r.routed());
        // With none routed but a warm standby one (the autoscaler's pool), that one is promoted
        // now and takes the requests with their KV: they finished here before while it sat idle,
        // and the leaving replica ran out of KV and preempted.
        // (only for a routed replica with requests to hand over: a pool member stopping, or an
        // idle replica, would have routed a standby for nothing)
        const ReplicaEntry& leaving = it->second;
        if (!other && s.autoscaler && leaving.state == ReplicaState::kReady && !leaving.assigned.empty()) {
          for (auto& [rid, o] : s.replicas) {
            if (rid == replica || o.state != ReplicaState::kStandby || !o.ready()) continue;
            get_logger("actors")->info("replica {}: promoted from the warm pool to take the requests of replica {}, "
                                       "which is stopping", rid, replica);
            promote(self, rid, now_s(self), /*measured=*/false);  // a swap, not a scale-up
            other = true;
            break;
          }
        }
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
      [self](launch_err_atom, int32_t replica, const std::string& why, bool permanent) {
        // Only a replica still waiting for its first worker hello: one that registered is
        // covered by its workers' down messages.
        auto& s = self->state;
        auto it = s.replicas.find(replica);
        if (it == s.replicas.end() || it->second.state != ReplicaState::kStarting || it->second.shard) return;
        start_failed(self, replica, why, permanent);
      },
      [self](restart_due_atom) { dispatch(self); },
      [self](no_restart_atom, const std::string& token) {
        if (!token_matches(token, self->state.cfg.token)) return;
        self->state.no_restarts = true;
        dispatch(self);  // the queue fails now if it was waiting for a restart only
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
      [self](tp_waiter_atom, const std::string& token, int32_t replica, const caf::actor& waiter) {
        auto& s = self->state;
        if (!token_matches(token, s.cfg.token)) return;
        // (Every replica of the topology has its entry from the start.)
        if (auto it = s.replicas.find(replica); it != s.replicas.end()) it->second.tp_waiter = waiter;
      },
      [self](const TpJoinMsg& m) -> caf::result<TpGroupMsg> {
        auto& s = self->state;
        if (!token_matches(m.token, s.cfg.token)) {
          get_logger("actors")->warn("refused a tensor-parallel join: wrong cluster token");
          return caf::make_error(caf::sec::request_receiver_down, "refused: wrong cluster token");
        }
        // A rank refused its slot, waiting for it or told to quit has no place in a group.
        if (const auto sender = self->current_sender()) {
          const auto addr = sender->address();
          if (s.refused.count(addr) || s.slot_conflicts.count(addr) || s.retired.count(addr)) {
            get_logger("actors")->warn("replica {}: tensor-parallel join of rank {} refused: that worker has no slot", m.replica, m.rank);
            return caf::make_error(caf::sec::request_receiver_down, "refused: this worker has no slot in replica " + std::to_string(m.replica));
          }
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

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

double now_s(SchedSelf self) { return seconds_since(self->state.t0); }

void keep_last(std::vector<double>* v, double x, size_t n) {
  v->push_back(x);
  if (v->size() > n) v->erase(v->begin());
}

}  // namespace scheduler_internal

caf::actor spawn_scheduler(caf::actor_system& sys, SchedulerConfig config) {
  return sys.spawn(scheduler_internal::scheduler_actor, std::move(config));
}

}  // namespace specserve
