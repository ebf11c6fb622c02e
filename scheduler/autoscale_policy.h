// specserve scheduler: the autoscaler's policy — how many replicas serve (are routed to), which
// standby replica is promoted, which replica is started cold to refill the warm pool, and which
// is drained back to standby or stopped.
//
// The head keeps every replica the topology declares in one of the lifecycle states below and
// a warm pool of `warm_pool` standby replicas (loaded and warmed up, not routed). Scaling up is a
// promotion — a state flip in the head, so the promoted replica serves its first token one engine
// step after the decision — and the pool is refilled by a cold start in the background. Scaling
// down drains a replica (no new requests; its in-flight requests finish) and parks it in the pool
// or stops it. The head's scheduler actor calls Autoscaler::tick() on a timer with a snapshot of
// the queue, the replicas and recent TTFT samples, and executes the returned actions.
//
// Pure: no threads, no I/O, no clock of its own (`now_s` is an argument); the only state is the
// pair of hysteresis timers and the target kept in the Autoscaler object, so every rule is tested
// with a simulated clock as a table of traces (tests/scheduler/autoscale_policy_test.cpp). The
// signal names follow Ray Serve's autoscaling config (target_ongoing_requests, upscale_delay_s,
// downscale_delay_s, look_back_period_s) and KServe's scale-to-zero behaviour.
//
// Rules of tick(), in order (times in seconds on the caller's clock):
//   1. Load. ongoing = queued at the head + requests assigned to ready and draining replicas;
//      wanted_by_load = ceil(ongoing / target_ongoing_requests) (Ray Serve's formula). Zero
//      traffic gives 0: a valid input, never a division by zero or a stall.
//   2. Pressure (a reason to add a replica) holds when any of:
//        a. wanted_by_load > ready;
//        b. the oldest queued request has waited longer than ttft_slo_ms;
//        c. the p90 of the TTFT samples in the last look_back_period_s is above ttft_slo_ms and
//           ongoing > ready (one request per replica cannot be helped by another replica).
//           Samples from a replica younger than new_replica_grace_s when the sample was taken
//           (seconds since it became ready — promotion counts) are ignored: a new replica's
//           first slow samples (cold caches, a backlog handed to it at once) do not scale up;
//        d. the mean KV-cache usage of ready replicas is above target_kv_cache_usage.
//      Pressure asks for max(wanted_by_load, ready + 1) replicas.
//   3. Idle (a reason to remove replicas) holds when there is no pressure and
//      wanted_by_load < target; it asks for the largest wanted_by_load seen since idle began
//      (so a brief lull inside steady load does not drop capacity it will need again).
//   4. Hysteresis. The target changes up only after pressure held on every tick for
//      upscale_delay_s, and down only after idle held on every tick for downscale_delay_s; a tick
//      without the condition restarts its timer. After any change of the target both timers
//      restart (the cooldown): the next change needs a full delay of fresh evidence.
//      Two exceptions act at once: the target is raised to min_replicas when below it, and from
//      zero ready replicas to one when anything is queued (scale from zero, KServe's activator).
//   5. Bounds. The target stays in [min_replicas, max_replicas], and never above the replicas
//      that exist (declared slots).
//   6. Reconcile (every tick, no delay: the decision is already made):
//        a. ready < target: promote standby replicas, lowest id first. What standby cannot
//           cover is covered by replicas already starting (they become standby, then are
//           promoted on a later tick), then by cold starts of stopped replicas, lowest id first.
//        b. ready > target: drain the surplus, the replica with the fewest assigned requests
//           first (ties: the highest id), so the fewest requests wait for a drain. A drained
//           replica goes to standby while the pool (standby + starting + draining to standby)
//           is short of warm_pool, else it stops.
//        c. Pool: when standby + starting + draining-to-standby (less what 6a takes from them)
//           is short of warm_pool, stopped replicas start cold, lowest id first; when standby
//           exceeds warm_pool and nothing is short, the surplus standby replicas stop,
//           highest id first.
//      A replica is never both promoted and stopped in one tick; draining replicas are left
//      alone until the head reports them standby or stopped.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace specserve {

/// A replica's lifecycle state as the head tracks it.
enum class ReplicaState {
  kStarting,  ///< process start requested, not registered yet
  kLoading,   ///< registered; loading weights, allocating KV
  kWarming,   ///< running its warm-up pass
  kReady,     ///< loaded, warm and routed
  kDraining,  ///< not routed; its in-flight requests finish (or, later, migrate)
  kStandby,   ///< loaded and warm, not routed: the warm pool
  kStopped,   ///< no process (never started, stopped, or lost)
};
inline constexpr int kNumReplicaStates = 7;
/// "starting", "loading", "warming", "ready", "draining", "standby", "stopped".
const char* replica_state_name(ReplicaState state);

/// Autoscaler options: `autoscale:` in the topology (config/topology.h AutoscaleSpec).
struct AutoscaleOptions {
  int32_t min_replicas = 1;
  int32_t max_replicas = 1;              ///< bound on ready (routed) replicas
  int32_t warm_pool = 0;                 ///< standby replicas kept loaded and warm
  double upscale_delay_s = 30.0;
  double downscale_delay_s = 600.0;
  double target_ongoing_requests = 2.0;  ///< > 0; queued + running per ready replica (Ray Serve)
  double ttft_slo_ms = 0;                ///< 0: no TTFT / waiting-time signal
  double target_kv_cache_usage = 0.9;    ///< (0, 1]; 1: the KV signal never fires
  double look_back_period_s = 30.0;      ///< TTFT samples older than this are ignored
  double new_replica_grace_s = 10.0;     ///< TTFT samples of younger replicas are ignored
};

/// One replica in the tick's snapshot.
struct ReplicaView {
  int32_t id = 0;
  ReplicaState state = ReplicaState::kStopped;
  double ready_since_s = 0;     ///< kReady: when it became ready (promotion counts)
  int32_t num_assigned = 0;     ///< requests on it now (running + waiting in its engine)
  double kv_cache_usage = 0;    ///< used / total KV blocks, [0, 1]
  bool draining_to_standby = false;  ///< kDraining: it will join the pool
};

/// A time-to-first-token observation.
struct TtftSample {
  double at_s = 0;      ///< when the first token arrived
  double ttft_s = 0;    ///< seconds from submission to the first token
  int32_t replica = 0;  ///< the replica that produced it
};

struct AutoscaleInput {
  double now_s = 0;
  int32_t num_queued = 0;        ///< requests in the head's queue
  double oldest_wait_s = 0;      ///< seconds the oldest queued request has waited (0: none)
  std::vector<ReplicaView> replicas;  ///< every declared replica, any state
  std::vector<TtftSample> ttft;  ///< recent samples (older than look_back_period_s are skipped)
  /// False when the head cannot start processes (no launcher): cold starts are not planned.
  bool can_start = true;
};

struct DrainAction {
  int32_t replica = 0;
  bool to_standby = false;  ///< true: standby once drained; false: stop
};

/// What tick() decided. The head executes the actions in this order: stop, drain, promote, start.
struct AutoscaleDecision {
  int32_t target_ready = 0;          ///< desired ready replicas after this tick
  std::vector<int32_t> promote;      ///< standby -> ready (routed now)
  std::vector<int32_t> start;        ///< stopped -> starting (cold start; joins the pool when ready)
  std::vector<DrainAction> drain;    ///< ready -> draining -> standby | stopped
  std::vector<int32_t> stop;         ///< standby -> stopped
  bool changed = false;              ///< target_ready changed in this tick
  /// Why the target changed ("pressure: 7 ongoing > 2 per replica x 1 ready", "idle ...",
  /// "min_replicas", "scale from zero"); empty when it did not.
  std::string reason;
  double ttft_p90_s = 0;             ///< p90 of the samples used (0: none)
  int32_t ongoing = 0;               ///< rule 1
  bool pressure = false;             ///< rule 2 held this tick
  bool idle = false;                 ///< rule 3 held this tick
};

/// The autoscaler's policy with its hysteresis memory. Not thread-safe; one per head.
class Autoscaler {
 public:
  /// `initial_ready`: the target before the first tick (the ready replicas the launch aims at,
  /// normally min_replicas).
  Autoscaler(AutoscaleOptions options, int32_t initial_ready);

  /// One decision (rules in the file comment). `input.now_s` must not go backwards.
  AutoscaleDecision tick(const AutoscaleInput& input);

  int32_t target_ready() const { return target_; }
  const AutoscaleOptions& options() const { return options_; }

 private:
  AutoscaleOptions options_;
  int32_t target_ = 0;
  std::optional<double> pressure_since_;
  std::optional<double> idle_since_;
  int32_t idle_max_wanted_ = 0;
};

/// p90 (nearest rank) of `values`; 0 for an empty list. Helper, exposed for tests.
double percentile90(std::vector<double> values);

}  // namespace specserve
