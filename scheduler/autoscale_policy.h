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
// with a simulated clock as a table of traces (tests/scheduler/autoscale_{policy,trace}_test.cpp).
// The signal names follow Ray Serve's autoscaling config (target_ongoing_requests, upscale_delay_s,
// downscale_delay_s, look_back_period_s) and KServe's scale-to-zero behaviour.
//
// Rules of tick(), in order (times in seconds on the caller's clock):
//   0. Stuck starts. A replica starting, loading or warming that has not changed state for
//      start_timeout_s is given up (`abandon`: the head stops it and counts a failed start). A
//      stopped replica is cold-startable only when the head says it can be (`startable`: no
//      process of it is still stopping) and its backoff after `num_start_failures` consecutive
//      failed starts has passed: start_backoff_s * 2^(failures - 1), at most start_backoff_max_s,
//      counted from when it stopped (state_since_s).
//   1. Load. ongoing = queued at the head + requests assigned to ready and draining replicas, or
//      the time-weighted mean of the requests the head held since the previous tick, rounded up,
//      when that is more (mean_ongoing: requests shorter than a tick, which come and go between
//      two, still count, for the share of the tick they took); wanted_by_load =
//      ceil(ongoing / target_ongoing_requests) (Ray Serve's formula). Zero traffic gives 0: a
//      valid input, never a division by zero or a stall.
//      NOTE: without mean_ongoing, steady traffic of short requests (15 ms each, one a second)
//      read as "no ongoing request" on most ticks: idle held for downscale_delay_s and scale
//      from zero stopped the only replica every few seconds, each next request paying a cold
//      start. A mean, not the peak: 50 requests a second of 15 ms each (0.75 at once on average)
//      want one replica at target_ongoing_requests 1; their peak in a tick is often 2.
//   2. Pressure (a reason to add a replica) holds when any of:
//        a. wanted_by_load > target (the target, not the ready count: replicas already decided
//           and on their way are not asked for twice);
//      and, only while the decision is settled (target <= ready: a shortage the signals below
//      show is being fixed while decided replicas are still on their way):
//        b. the oldest queued request has waited longer than ttft_slo_ms;
//        c. the p90 of the TTFT samples in the last look_back_period_s is above ttft_slo_ms and
//           ongoing > target (one request per replica cannot be helped by another replica).
//           Only samples from ready replicas count, and samples from a replica younger than
//           new_replica_grace_s when the sample was taken (seconds since it became ready —
//           promotion counts) are ignored: a new replica's first slow samples (cold caches, a
//           backlog handed to it at once) do not scale up; and so are samples taken before the
//           last change of the target: the next step up needs latency measured since the last
//           one (else a window full of the burst's first samples asks for a second replica a
//           moment after the first);
//        d. the mean KV-cache usage of ready replicas is above target_kv_cache_usage.
//      Pressure asks for max(wanted_by_load, target + 1) replicas.
//   3. Idle (a reason to remove replicas) holds when there is no pressure, wanted_by_load <
//      target, and removing one ready replica would not create pressure at once: the KV usage
//      projected onto one replica fewer (sum of ready usage / (ready - 1)) stays below
//      target_kv_cache_usage, and the TTFT p90 (when there are samples, an SLO and anything
//      ongoing) is below kIdleTtftMargin x ttft_slo_ms. Idle asks for the largest wanted_by_load seen since idle
//      began (so a brief lull inside steady load does not drop capacity it will need again).
//   4. Hysteresis. The target changes up only after pressure held on every tick for
//      upscale_delay_s, and down only after idle held on every tick for downscale_delay_s; a tick
//      without the condition restarts its timer. After any change of the target both timers
//      restart (the cooldown): the next change needs a full delay of fresh evidence.
//      Two exceptions act at once: the target is raised to min_replicas when below it, and from
//      zero to one when anything is queued (scale from zero, KServe's activator).
//   5. Bounds. The target stays in [min_replicas, max_replicas], and never above the replicas
//      that exist (declared slots the head offers).
//   6. Reconcile (every tick, no delay: the decision is already made):
//        a. ready < target: first un-drain draining replicas (back to ready: they are loaded and
//           their process lives; starting the same slot again would run two processes of one
//           replica), lowest id first; then promote standby replicas, lowest id first. What is
//           left is covered by replicas already starting (they become standby, then are
//           promoted on a later tick), then by cold starts of startable stopped replicas, lowest
//           id first.
//        b. ready > target: drain the surplus, the replica with the fewest assigned requests
//           first (ties: the highest id), so the fewest requests wait for a drain. A drained
//           replica goes to standby while the warm pool (standby + draining to standby) is short
//           of warm_pool, else it stops: a warm replica is kept over one still starting.
//        c. Pool: when standby + starting + draining-to-standby (less what 6a takes from them)
//           is short of warm_pool, startable stopped replicas start cold, lowest id first; when
//           the warm ones (standby + draining to standby) exceed warm_pool and the decision is
//           settled, the surplus standby replicas stop, highest id first (a replica still
//           starting finishes its warm-up first and is trimmed then if still surplus).
//      A replica is never both promoted and stopped in one tick; draining replicas are left
//      alone (unless 6a un-drains them) until the head reports them standby or stopped.
//   The reason of a change reads "pressure: ... (held N s)", "idle: ...", "min_replicas N",
//   "bounded by ...", or "scale from zero: N queued".
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
  double start_timeout_s = 300.0;        ///< > 0: starting/loading/warming this long without progress: given up
  double start_backoff_s = 1.0;          ///< first wait before a replica whose start failed is started again
  double start_backoff_max_s = 60.0;     ///< the doubling backoff's cap
};

/// Idle needs the TTFT p90 below this fraction of the SLO (rule 3): a p90 just under the SLO
/// with one replica more would cross it with one fewer.
inline constexpr double kIdleTtftMargin = 0.8;

/// One replica in the tick's snapshot.
struct ReplicaView {
  int32_t id = 0;
  ReplicaState state = ReplicaState::kStopped;
  double ready_since_s = 0;     ///< kReady: when it became ready (promotion counts)
  int32_t num_assigned = 0;     ///< requests on it now (running + waiting in its engine)
  double kv_cache_usage = 0;    ///< used / total KV blocks, [0, 1]
  bool draining_to_standby = false;  ///< kDraining: it will join the pool
  double state_since_s = 0;     ///< when it entered its current state (rule 0)
  int32_t num_start_failures = 0;  ///< consecutive failed starts (rule 0's backoff)
  /// kStopped: false while a process of it is still stopping (the head waits for its workers'
  /// down messages): it is not cold-started until then.
  bool startable = true;
  /// kDraining: it cannot be routed again (its worker is stopping, or its draft worker died and
  /// it is being replaced): its requests count as ongoing, but it is never undrained.
  bool leaving = false;
  /// kReady: its draft worker died (the head replaces it): a scale-down drains it first, and
  /// never into the pool.
  bool draftless = false;
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
  /// The time-weighted mean of the requests the head held (queued, moving or on a replica) since
  /// the previous tick, >= 0 (rule 1).
  double mean_ongoing = 0;
  double oldest_wait_s = 0;      ///< seconds the oldest queued request has waited (0: none)
  std::vector<ReplicaView> replicas;  ///< every declared replica, any state
  std::vector<TtftSample> ttft;  ///< recent samples (older than look_back_period_s are skipped)
  /// False when the head cannot start processes (no launcher): cold starts are not planned.
  bool can_start = true;
  /// The caller held cold starts back and released them: ready < target is covered (undrain,
  /// promotion, starting replicas, cold starts) only up to what the load wants now
  /// (AutoscaleDecision::wanted), not up to the target, which keeps a burst's value until the
  /// downscale delay: load that went away meanwhile (clients gone) starts nothing.
  bool deficit_by_wanted = false;
};

struct DrainAction {
  int32_t replica = 0;
  bool to_standby = false;  ///< true: standby once drained; false: stop
};

/// What tick() decided. The head executes the actions in this order: abandon, stop, drain,
/// undrain, promote, start.
struct AutoscaleDecision {
  int32_t target_ready = 0;          ///< desired ready replicas after this tick
  /// What the load wants now (rule 1: ceil(ongoing / target_ongoing_requests)), within
  /// [min_replicas, slots / max_replicas]; no hysteresis (target_ready has it).
  int32_t wanted = 0;
  std::vector<int32_t> abandon;      ///< starting/loading/warming too long -> stopped (rule 0)
  std::vector<int32_t> undrain;      ///< draining -> ready (routed again now)
  std::vector<int32_t> promote;      ///< standby -> ready (routed now)
  std::vector<int32_t> start;        ///< stopped -> starting (cold start; joins the pool when ready)
  int32_t num_start_for_deficit = 0; ///< the first this many of `start` cover ready < target (6a); the rest refill the pool
  /// Replicas already starting (starting/loading/warming, e.g. a pool refill) counted for
  /// ready < target in this tick, lowest id first: the scale-up now waits on them (the cold path),
  /// so the caller times it from this decision.
  std::vector<int32_t> starting_for_deficit;
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
  /// Seconds a replica waits to be started again after `num_failures` failed starts in a row
  /// (0 for none): start_backoff_s * 2^(failures - 1), at most start_backoff_max_s.
  double start_backoff_s(int32_t num_failures) const;

 private:
  bool startable_now(const ReplicaView& r, double now_s) const;

  AutoscaleOptions options_;
  int32_t target_ = 0;
  std::optional<double> pressure_since_;
  std::optional<double> idle_since_;
  std::optional<double> last_change_s_;  ///< when the target last changed (TTFT samples before it are ignored)
  int32_t idle_max_wanted_ = 0;
};

/// The median of `values` (seconds or any unit): the middle value of an odd count, the mean of
/// the two middle values of an even count; 0 when empty.
double median_of(std::vector<double> values);

/// p90 (nearest rank) of `values`; 0 for an empty list. Helper, exposed for tests.
double percentile90(std::vector<double> values);

}  // namespace specserve
