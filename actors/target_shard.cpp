#include "actors/target_shard.h"

#include <algorithm>
#include <chrono>
#include <string>
#include <utility>
#include <vector>

#include <caf/io/all.hpp>

#include "actors/gateway.h"
#include "actors/target_shard_internal.h"
#include "core/logging.h"

namespace specserve {
namespace target_shard_internal {
namespace {

// A running sequence with fewer tokens than this left to generate is not moved to balance load
// (reclaim_atom): moving it (export, KV offer, fetch, re-admission) costs about as much as
// finishing it here.
constexpr int64_t kMinTokensLeftToRebalance = 16;

// Offers older than this are freed even if no receiver answered (it died or recomputed).
constexpr auto kOfferLifetime = std::chrono::seconds(60);

// Control messages of the data plane and the lifecycle come from the scheduler only.
bool from_scheduler(Self self) {
  return self->current_sender() == caf::actor_cast<caf::strong_actor_ptr>(self->state.cfg.scheduler);
}

caf::behavior target_shard(Self self, WorkerConfig cfg) {
  auto& s = self->state;
  s.cfg = std::move(cfg);
  auto log = get_logger("actors");
  self->monitor(s.cfg.scheduler);
  self->set_down_handler([self, log](caf::down_msg& m) {
    if (m.source == self->state.cfg.scheduler.address()) {
      log->log(scheduler_down_level(m), "replica {}: the scheduler went away; the shard stops", self->state.cfg.replica);
      quit_after_scheduler_down(self, m);
    } else if (self->state.tp_peers && self->state.quit_when_empty) {
      // Retired: the scheduler told the other ranks to quit too.
      log->info("replica {}: a tensor-parallel rank stopped (retired); the shard stops", self->state.cfg.replica);
      self->quit();
    } else if (self->state.tp_peers) {
      // A tensor-parallel rank went down: the group is broken and the replica cannot step. The
      // shard stops; the scheduler re-queues its requests (recomputed on another replica).
      log->error("replica {}: a tensor-parallel rank went down ({}); the replica stops", self->state.cfg.replica,
                 self->system().render(m.reason));
      self->quit(caf::exit_reason::user_shutdown);
    }
  });
  self->send(s.cfg.scheduler, hello(self, "loading"));
  Status st = load_and_warm(self);
  if (!st.ok()) {
    log->error("replica {} target shard: {}", s.cfg.replica, st.to_string());
    self->send(s.cfg.scheduler, hello(self, "failed", st.to_string()));
    self->quit(caf::exit_reason::user_shutdown);
    return {};
  }
  log->info("replica {} target shard ready: loaded in {:.2f} s, warmed up in {:.2f} s, {} KV blocks of {} tokens",
            s.cfg.replica, s.load_s, s.warmup_s, s.engine_options.num_kv_blocks, s.engine_options.block_size);
  self->send(s.cfg.scheduler, hello(self, "ready"));
  return {
      [self](WorkItem& w) {
        ++self->state.received;
        receive_work(self, std::move(w));
      },
      [self](kv_fetched_atom, int64_t serial) { kv_fetched(self, serial); },
      [self](const AbortMsg& a) {
        auto& s = self->state;
        for (auto& [serial, p] : s.fetching) {
          if (p.item.request_id != a.request_id || p.aborted) continue;
          // Not in the engine yet: answered now; the fetch's bytes are dropped when it returns.
          p.aborted = true;
          ShardEvent ev;
          ev.request_id = a.request_id;
          ev.attempt = p.item.attempt;
          ev.finish_reason = finish_reason_name(FinishReason::kAbort);
          // (the load first, as do_step sends a last event: the head's books before the client)
          ShardLoad l = load_of(s);
          l.finished.push_back(a.request_id);
          self->send(s.cfg.scheduler, std::move(l));
          self->send(p.item.request_actor, std::move(ev));
          return;
        }
        auto it = s.by_request.find(a.request_id);
        if (it == s.by_request.end()) return;
        s.engine->abort(it->second.seq_id);
        schedule_step(self);
      },
      [self](const AttachDraftMsg& a) {
        auto& s = self->state;
        if (!s.slot) return;
        if (!a.draft && a.draft_port == 0) {
          s.slot->attach(nullptr);
          get_logger("actors")->warn("replica {}: draft worker gone; decoding without drafts", s.cfg.replica);
          return;
        }
        caf::actor draft = a.draft;
        if (a.draft_port != 0) {
          auto h = connect_through_gateway(self->system(), a.draft_host, static_cast<uint16_t>(a.draft_port), s.cfg.token,
                                           std::chrono::seconds(10));
          if (!h.ok()) {
            get_logger("actors")->warn("replica {}: cannot reach the draft worker: {}; decoding without drafts",
                                       s.cfg.replica, h.status().message());
            return;
          }
          draft = *h;
        }
        const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(s.cfg.draft_timeout_s * 1000));
        s.slot->attach(std::make_unique<RemoteProposer>(self->system(), draft, s.cfg.token, s.method,
                                                        static_cast<int32_t>(s.model.model->config().vocab_size), timeout));
        get_logger("actors")->info("replica {}: draft worker attached ({})", s.cfg.replica,
                                   a.draft_port ? a.draft_host + ":" + std::to_string(a.draft_port) : "in process");
      },
      [self](step_atom) { do_step(self); },
      [self](const KvPeersMsg& m) {
        auto& s = self->state;
        if (!from_scheduler(self)) return;
        if (s.plane) s.plane->connect_peers(m.peers, std::chrono::milliseconds(5000));
      },
      [self](migrate_atom, bool then_quit) {
        // The replica drains: every sequence moves to another replica with its KV.
        auto& s = self->state;
        if (!from_scheduler(self)) return;
        std::vector<int64_t> ids;
        for (const auto& [rid, r] : s.by_request) ids.push_back(rid);
        for (int64_t rid : ids) migrate_out(self, rid, "drain");
        for (auto& [serial, p] : s.fetching) p.drain = true;  // they leave once their KV is here
        self->send(s.cfg.scheduler, load_of(s));
        s.quit_when_empty = s.quit_when_empty || then_quit;
        maybe_quit(self);
      },
      [self](reclaim_atom, int32_t n, bool running) {
        // Another routed replica has room (often one just promoted from standby) while this one
        // holds more than its share (scheduler/rebalance.h): up to n requests go back to the head
        // as MigratedSeq "rebalance". First those still waiting in the engine, from the back of
        // its waiting queue (the most recently queued, or a sequence preempted back into it);
        // with `running`, then running sequences from the back of the running order (the most
        // recently admitted: likely the most tokens left), skipping any with fewer than
        // kMinTokensLeftToRebalance tokens left (moving it would cost more than finishing it here).
        // NOTE: not the step policy's (priority, arrival) order: a younger request handed back
        // may start on the free replica before older ones still waiting here.
        // NOTE: a waiting sequence has no KV in the cache (a migrated one waiting for admission
        // holds its imported KV in host memory, which is dropped here: it recomputes where it
        // lands); it leaves with its sampler state, so output stays the same. A running one
        // leaves with its KV offered on the data plane, as in a drain.
        auto& s = self->state;
        if (!from_scheduler(self)) return;
        ++s.num_reclaims;
        if (prefill_only(s)) {  // the head sends it to decode shards only
          self->send(s.cfg.scheduler, load_of(s));
          return;
        }
        const std::vector<int64_t> live = s.engine->live_sequences();  // running first, then the waiting ones
        const size_t first_waiting = live.size() - std::min(live.size(), static_cast<size_t>(s.engine->num_waiting()));
        const size_t lowest = running ? 0 : first_waiting;
        std::vector<int64_t> give;
        for (size_t i = live.size(); i > lowest && static_cast<int32_t>(give.size()) < n; --i) {
          auto it = s.by_seq.find(live[i - 1]);
          if (it == s.by_seq.end()) continue;
          if (i - 1 < first_waiting) {
            const Running& r = s.by_request.at(it->second);
            if (r.end_tokens - r.num_tokens < kMinTokensLeftToRebalance) continue;
          }
          give.push_back(it->second);
        }
        for (int64_t rid : give) migrate_out(self, rid, "rebalance");
        self->send(s.cfg.scheduler, load_of(s));
      },
      [self](const KvSendMsg& m) {
        // A receiver chose NCCL for an offer of ours and posts its recv: post the matching send
        // (on a thread of the data plane; it ends by the transfer's deadline).
        auto& s = self->state;
        if (!from_scheduler(self) || !s.plane) return;
        const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(s.cfg.kv_transfer_timeout_s * 1000));
        Status st = s.plane->serve_send(m.offer_id, m.to, kv_deadline_after(timeout));
        if (!st.ok()) {
          get_logger("actors")->warn("replica {}: cannot send KV offer {} to {} over NCCL (it retries over UCX): {}",
                                     s.cfg.replica, m.offer_id, m.to, st.to_string());
        }
      },
      [self](const KvReleaseMsg& m) {
        auto& s = self->state;
        if (!from_scheduler(self)) return;
        if (s.plane) s.plane->release(m.offer_id);
        maybe_quit(self);
      },
      [self](tick_atom) {
        auto& s = self->state;
        s.expiry_pending = false;
        if (s.plane && s.plane->expire(kOfferLifetime) > 0) {
          get_logger("actors")->warn("replica {}: freed KV offers nobody fetched within {} s", s.cfg.replica,
                                     std::chrono::seconds(kOfferLifetime).count());
        }
        schedule_expiry(self);
        maybe_quit(self);
      },
      [self](retire_atom, const std::string& why) {
        // Refused by the head (another worker holds its slot): it never served, it fails (its
        // process exits 1, saying why).
        if (!from_scheduler(self)) return;
        get_logger("actors")->error("replica {}: refused by the head: {}", self->state.cfg.replica, why);
        self->quit(caf::exit_reason::user_shutdown);
      },
      [self](retire_atom) {
        // The autoscaler stopped this replica (after draining it): quit normally (the process
        // exits 0) once receivers have read the KV of the sequences that moved away.
        if (!from_scheduler(self)) return;
        get_logger("actors")->info("replica {}: retired by the head (an autoscaler scale-down, or this worker's own drain)", self->state.cfg.replica);
        self->state.quit_when_empty = true;
        maybe_quit(self);
      },
  };
}

}  // namespace
}  // namespace target_shard_internal

caf::actor spawn_target_shard(caf::actor_system& sys, WorkerConfig config) {
  return sys.spawn<caf::detached>(target_shard_internal::target_shard, std::move(config));
}

}  // namespace specserve
