// specserve cluster: what `up` and `serve` (cluster/launch.cpp) do around a running head —
// start a replica's worker processes when the autoscaler asks (WorkerLauncher), wait until the
// replicas are ready, announce readiness, then drain and stop. Not part of the public API:
// include only from cluster/launch*.cpp.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "actors/client.h"
#include "actors/head.h"
#include "cluster/process.h"
#include "config/topology.h"
#include "core/status.h"

namespace specserve {

/// CPU threads per worker when none is given: this host's cores / `workers_here` (at least 1).
int32_t default_threads(int32_t workers_here);

// Starts the worker processes of one replica on this host when the head's autoscaler asks
// (a cold start). The request comes on the scheduler actor's thread and is only queued there;
// the launcher's main loop spawns (pump()), so that every worker is a child of the main thread.
// NOTE: PR_SET_PDEATHSIG (exit_with_parent) fires when the *thread* that forked the child
// exits, so children must not be spawned from a CAF worker thread; the queue costs at most one
// poll interval (50 ms) of a cold start that takes seconds, and the head measures it.
//
// A start that fails here is reported to the scheduler (launch_err_atom): spawn_child failed, the
// replica still has a live worker process (a retired one not gone yet: never two processes of one
// replica), or a worker exited before the replica was started again. The scheduler ignores a
// report for a replica that is not `starting` any more (it registered: its down message counts).
// An exited worker's report carries the reason it left (kExitReasonFileEnv: a file per start in
// a private folder of this launcher's) and, when it exited kExitConfig, says that retrying
// cannot help (the scheduler parks the replica at once).
class WorkerLauncher {
 public:
  /// `env`: added to every worker's environment (the topology snapshot: cluster/topology_snapshot.h).
  WorkerLauncher(const Topology& topo, std::string config_path, int32_t threads_per_worker,
                 std::map<std::string, std::string> env = {})
      : topo_(topo), config_path_(std::move(config_path)), threads_per_worker_(threads_per_worker), env_(std::move(env)) {}
  /// Removes the folder of the workers' exit reasons (a launcher killed by a signal leaves it:
  /// $TMPDIR/specserve-up-*, a few bytes).
  ~WorkerLauncher();
  WorkerLauncher(const WorkerLauncher&) = delete;
  WorkerLauncher& operator=(const WorkerLauncher&) = delete;

  /// Where start failures are reported; set once the head runs (before the first pump()).
  void set_scheduler(caf::actor scheduler) { scheduler_ = std::move(scheduler); }

  /// Thread-safe: queues `replica` for pump(). kUnavailable when none of its workers is on a
  /// node this launcher starts (nodes on other hosts start their own workers).
  Status request(int32_t replica);
  /// Main thread: reaps exited workers (their lines go to `exited`), reports the exit of a worker
  /// of the replica's latest start, then spawns the queued replicas' workers (once `endpoint` is
  /// known).
  void pump(const std::string& endpoint, std::vector<std::string>* exited = nullptr);
  std::vector<Child>* children() { return &children_; }

 private:
  bool local(const NodeSpec& n) const { return is_loopback_host(n.host) || n.host == topo_.head.host; }
  bool has_local_workers(int32_t replica) const;
  void report(int32_t replica, const std::string& why, bool permanent = false);
  void spawn(int32_t replica, int64_t gen, const std::string& endpoint);
  /// The file a new worker leaves its exit reason in ("" when the folder cannot be made).
  std::string reason_file();

  const Topology& topo_;
  std::string config_path_;
  int32_t threads_per_worker_ = 0;
  std::map<std::string, std::string> env_;
  caf::actor scheduler_;
  std::mutex mu_;
  std::vector<std::pair<int32_t, int64_t>> queued_;  // (replica, generation)
  std::map<int32_t, int64_t> generation_;            // replica -> start requests so far (under mu_)
  std::vector<Child> children_;                      // main thread only
  struct Owner {
    int32_t replica = 0;
    int64_t generation = 0;
    std::string reason_file;  // kExitReasonFileEnv of the child
  };
  std::map<pid_t, Owner> owner_;  // live child -> its start; main thread
  std::string reason_dir_;        // mkdtemp'd on the first spawn; main thread
  int64_t reason_files_ = 0;
};

/// Polls the head until `replicas` replicas are ready (or a stop signal / `timeout_s`).
/// `children` (may be null): processes that must stay alive until then. `launcher` (may be null):
/// pumped while waiting (the autoscaler starts the first replicas through it). Returns true once
/// they are; false on a stop signal or the timeout, and with *failed set when a child exited
/// (`children` without `launcher`) or a worker failed first.
bool wait_ready(Client& client, size_t replicas, double timeout_s, bool* failed, std::vector<Child>* children = nullptr,
                WorkerLauncher* launcher = nullptr, const std::string& endpoint = "");

/// Writes "`endpoint`\n" to `path` (through a rename, so a reader never sees half of it); "" does
/// nothing. Errors: kUnavailable "--ready-file PATH: cannot write[ PATH.tmp]: <why>" (the
/// temporary file is removed).
Status write_ready_file(const std::string& path, const std::string& endpoint);
/// Removes the ready file (when `path` is set and names one): before the cluster is ready (a
/// file left by an earlier run must not say "ready" for this one) and once it stops serving.
void remove_ready_file(const std::string& path);

/// One stderr line per worker the head knows: role, replica, rank, node, pid, state, load and warm-up times.
void print_status_line(Client& client);

/// Drains (the HTTP front end keeps streaming the in-flight requests; new ones are refused),
/// stops the front end, the head, then the children (`children`, `front_end` may be null).
void shut_down(Head& head, std::vector<Child>* children, double drain_timeout_s, std::shared_ptr<void>* front_end);

}  // namespace specserve
