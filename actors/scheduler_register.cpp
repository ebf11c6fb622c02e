// specserve actors: the scheduler registering a worker (WorkerHello): the token, a slot
// that a live worker already holds (a node started twice), the replica's shard, prefill and
// draft workers, and what follows a worker becoming ready (draft attached, KV peers told).
#include <fmt/format.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "actors/messages.h"
#include "actors/runtime.h"
#include "actors/scheduler_internal.h"
#include "core/logging.h"

namespace specserve {
namespace scheduler_internal {
namespace {

// How long a new worker for a taken slot waits for the holder to be found down (CAF's
// connection timeout is 5 s) before it is refused.
constexpr double kSlotWaitS = 6.0;

// The hello of the live worker that already holds the slot `h` asks for (same role, replica
// and rank; registered, not down, failed or told to quit), if any. A topology has one worker
// per slot; a restarted one registers after its predecessor is down.
std::optional<WorkerHello> slot_holder(const SchedulerState& s, const WorkerHello& h) {
  for (const auto& [addr, w] : s.workers) {
    const WorkerHello& o = w.hello;
    if (addr == h.self.address() || o.role != h.role || o.replica != h.replica || o.rank != h.rank) continue;
    if (o.state == "down" || o.state == "failed" || s.retired.count(addr)) continue;
    return o;
  }
  return std::nullopt;
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

// Every ready worker with a data plane learns the others' addresses and places, so that each
// connects its KV endpoints (kv/ucx_transport.h) and NCCL KV channels (between GPU workers, the
// unique ids exchanged through this actor's rendezvous store) up front, not when the first
// sequence migrates.
void broadcast_kv_peers(SchedSelf self) {
  auto& s = self->state;
  KvPeersMsg m;
  std::vector<caf::actor> to;
  auto peer = [](const WorkerHello& h, int32_t rid) {
    return KvPeer{kv_peer_name(h.role, rid), h.kv_address, h.node, h.kv_process, h.kv_cuda_device, h.kv_nccl, h.kv_machine};
  };
  for (const auto& [rid, r] : s.replicas) {
    if (r.shard && r.shard_ready && !r.shard_hello.kv_address.empty()) {
      m.peers.push_back(peer(r.shard_hello, rid));
      to.push_back(r.shard);
    }
    if (r.prefill && r.prefill_ready && !r.prefill_hello.kv_address.empty()) {
      m.peers.push_back(peer(r.prefill_hello, rid));
      to.push_back(r.prefill);
    }
  }
  for (const auto& a : to) self->send(a, m);
}

// A target-shard worker of replica `r` said "failed" (its model did not load): a failed start as
// start_failed counts it (the backoff grows from here), without its retire: the worker quits by
// itself and its down message stops the replica. Parked at once: the queue does not wait for a
// replica whose model does not load. Counted once per start (every rank of a tensor-parallel
// replica may fail for one cause).
// NOTE: only parked, with no failure counted, it was started again on the next tick, in a loop,
// with no backoff (a failing rank > 0 was not even parked).
void count_load_failure(SchedSelf self, ReplicaEntry& r, const WorkerHello& h) {
  auto& s = self->state;
  if (r.start_requested_at > 0 && r.start_failed_at >= r.start_requested_at) return;  // this start already counted
  r.parked = true;
  ++r.num_start_failures;
  r.start_failed_at = now_s(self);
  r.last_start_error = "its target shard" + (h.rank > 0 ? " rank " + std::to_string(h.rank) : std::string()) +
                       " failed to load" + (h.error.empty() ? std::string(" (see that worker's log)") : ": " + h.error);
  if (s.autoscaler) ++s.as.num_failed_starts;  // a start of the autoscaler's that failed
}

}  // namespace

void register_worker(SchedSelf self, WorkerHello& h) {
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
  if (s.refused.count(h.self.address())) return;
  if (is_new) {
    // A second live worker in a slot the topology gives one (a node started twice under
    // one name, or another process claiming its replica) is not registered, so it neither
    // shows in `status` nor, when it stops, drains the replica it never served. It waits
    // kSlotWaitS first: a holder that died (a host rebooted, a rank the head stopped) is
    // found down by then (CAF's 5 s connection timeout) and the newcomer takes its place;
    // a holder still live then makes the newcomer quit, failing, with the reason.
    const auto conflict = s.slot_conflicts.find(h.self.address());
    const std::optional<WorkerHello> holder = slot_holder(s, h);
    if (holder && conflict == s.slot_conflicts.end()) {
      s.slot_conflicts[h.self.address()] = {h, now_s(self)};
      self->monitor(h.self);
      log->warn("{} of replica {} from node '{}' (pid {}): replica {} already has its {} (node '{}', pid {}); waiting "
                "{:.0f} s for that one to be found down before refusing this one",
                h.role, h.replica, h.node, h.pid, h.replica, h.role, holder->node, holder->pid, kSlotWaitS);
      self->delayed_send(self, std::chrono::milliseconds(static_cast<int64_t>(kSlotWaitS * 1000)), slot_check_atom::value, h.self);
      return;
    }
    if (holder && now_s(self) - conflict->second.since < kSlotWaitS) {
      conflict->second.hello = h;  // its newest state, for when the wait ends
      return;
    }
    if (holder) {
      const std::string why = fmt::format(
          "replica {} already has its {}{} (node '{}', pid {}){}", h.replica, h.role,
          h.rank > 0 ? fmt::format(" rank {}", h.rank) : std::string(), holder->node, holder->pid,
          h.node == holder->node ? fmt::format(": is node '{}' running twice?", h.node) : std::string());
      log->error("refused {} of replica {} from node '{}' (pid {}): {}; telling it to quit", h.role, h.replica, h.node,
                 h.pid, why);
      s.slot_conflicts.erase(conflict);
      s.refused.insert(h.self.address());
      self->send(h.self, retire_atom::value, why);
      return;
    }
    // No live holder (any more): registered as any worker.
    if (conflict != s.slot_conflicts.end()) {
      s.slot_conflicts.erase(conflict);  // already monitored
    } else {
      self->monitor(h.self);
    }
  }
  auto& w = s.workers[h.self.address()];
  w.hello = h;
  w.hello.token.clear();
  if (is_new) w.since = Clock::now();
  auto& r = s.replicas[h.replica];
  if (h.role == worker_role_name(WorkerRole::kTargetShard)) {
    if (h.rank != 0) {  // tensor-parallel ranks > 0 follow rank 0 (issue 9)
      if (h.state == "failed") count_load_failure(self, r, h);
      return;
    }
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
            h.state == "ready" ? fmt::format(" (load {:.2f} s, warm-up {:.2f} s, {})", h.load_seconds,
                                             h.warmup_seconds, h.compute.empty() ? "?" : h.compute)
                               : (h.error.empty() ? "" : ": " + h.error));
  // Sequences move between target-side workers (migration, disaggregated prefill) and
  // continue bit for bit only under the same arithmetic: say so when a ready one differs.
  if (h.state == "ready" && h.role != worker_role_name(WorkerRole::kDraftWorker) && !h.compute.empty()) {
    for (const auto& [addr, other] : s.workers) {
      const WorkerHello& o = other.hello;
      if (addr == h.self.address() || o.state != "ready" || o.role == worker_role_name(WorkerRole::kDraftWorker) ||
          o.compute.empty() || o.compute == h.compute) {
        continue;
      }
      log->warn("{} of replica {} (pid {}) computes in {}, {} of replica {} (pid {}) in {}: sequences moved between "
                "them continue under other arithmetic (greedy output may differ from an unmoved run); give every "
                "host one models.target.dtype (float32 or bfloat16) or SPECSERVE_CPU_MATMUL",
                h.role, h.replica, h.pid, h.compute, o.role, o.replica, o.pid, o.compute);
      break;
    }
  }
  // A replica whose target shard cannot load is parked: not waited for, started again only after
  // the autoscaler's backoff (not in a tight loop). A shard of it that registers fine (e.g. a
  // node started by hand for a replica the launcher cannot start) makes it servable again.
  if (h.role == worker_role_name(WorkerRole::kTargetShard)) {
    if (h.state == "failed") {
      count_load_failure(self, r, h);
    } else {
      r.not_startable = false;
    }
  }
  attach_draft_if_ready(self, r);
  if (h.state == "ready" && !h.kv_address.empty()) broadcast_kv_peers(self);
  update_startup_state(self, h.replica);
  dispatch(self);
}

}  // namespace scheduler_internal
}  // namespace specserve
