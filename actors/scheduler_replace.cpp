// specserve actors: the replacement of a replica whose draft worker died, under an autoscaler
// that starts processes (actors/scheduler_internal.h draft_lost, replace_draftless). Nothing
// restarts a draft worker alone there (scheduler.worker_restarts is off under the autoscaler), so
// the replica is swapped for a warm standby, or one started cold for it.
#include <algorithm>
#include <string>

#include "actors/scheduler_internal.h"
#include "core/logging.h"

namespace specserve {
namespace scheduler_internal {

void draft_lost(SchedSelf self, int32_t rid) {
  auto& s = self->state;
  auto& r = s.replicas[rid];
  auto log = get_logger("actors");
  if (!s.autoscaler || !s.cfg.start_replica || s.draining) {
    log->warn("replica {}: draft worker down; it serves without speculation", rid);
    return;
  }
  // NOTE: a draft worker that failed to load (it says "failed", then quits) is no death to
  // replace: the next start would fail the same way, and replacing it restarted the replica in a
  // loop (never parked, no backoff) where it used to serve without speculation. It still does.
  if (r.draft_hello.state == "failed") {
    log->warn("replica {}: its draft worker failed to load; the replica serves without speculation", rid);
    return;
  }
  if (r.state == ReplicaState::kReady || r.state == ReplicaState::kDraining) {
    // NOTE: it served on without drafts for good (and a standby whose draft died was promoted
    // as if whole), since under the autoscaler nothing restarts a draft worker alone.
    r.draft_lost = true;
    r.drain_to_standby = false;  // draining: it stops when drained, never a standby without drafts
    log->warn("replica {}: draft worker down; it serves without speculation until a standby replica replaces it", rid);
    replace_draftless(self);
    return;
  }
  if (r.state == ReplicaState::kStandby) {
    log->warn("replica {}: draft worker down while standby; stopped, the autoscaler starts it again", rid);
    retire(self, rid);
    --s.as.num_stops;  // not a scale-down
    return;
  }
  // Starting, loading or warming: a failed start (counted, with its backoff).
  start_failed(self, rid, "its draft worker died while the replica started");
}

void replace_draftless(SchedSelf self) {
  auto& s = self->state;
  if (!s.autoscaler || !s.cfg.start_replica || s.draining) return;
  auto log = get_logger("actors");
  for (auto& [rid, r] : s.replicas) {
    if (!r.draft_lost || !r.routed()) continue;
    int32_t standby = -1;
    bool starting = false;
    for (auto& [oid, o] : s.replicas) {
      if (oid == rid || o.draft_lost) continue;
      // (a replacement whose own draft worker failed to load is no replacement)
      if (o.state == ReplicaState::kStandby && o.ready() && (!o.needs_draft || (o.draft && o.draft_hello.state == "ready")) &&
          standby < 0) {
        standby = oid;
      }
      starting = starting || o.state == ReplicaState::kStarting || o.state == ReplicaState::kLoading ||
                 o.state == ReplicaState::kWarming;
    }
    if (standby >= 0) {
      log->info("replica {}: promoted from the warm pool to replace replica {}, whose draft worker died", standby, rid);
      promote(self, standby, now_s(self), /*measured=*/false);
      r.swapped_out = true;
      begin_drain(self, rid, /*to_standby=*/false);
      --s.as.num_drains;  // not a scale-down
      continue;
    }
    if (starting) continue;  // it is promoted once warm (above, on a later tick)
    const double now = now_s(self);
    for (auto& [oid, o] : s.replicas) {
      if (o.state != ReplicaState::kStopped || o.num_retiring > 0 || !o.can_serve_later()) continue;
      // The policy's backoff after failed starts in a row (else a failing slot was started on
      // every tick).
      if (o.num_start_failures > 0 &&
          now - std::max(o.state_since, o.start_failed_at) < s.autoscaler->start_backoff_s(o.num_start_failures)) {
        continue;
      }
      log->info("replica {}: started cold to replace replica {}, whose draft worker died", oid, rid);
      start_cold(self, oid, /*for_deficit=*/false);
      break;
    }
  }
}

}  // namespace scheduler_internal
}  // namespace specserve
