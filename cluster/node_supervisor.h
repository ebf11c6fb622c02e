// specserve cluster: a node process's workers, and their restart when a signal kills one.
//
// `specserve node` starts one worker process per worker of its node (cluster/launch.h). With
// the topology's scheduler.worker_restarts > 0 (config/topology.h), a worker killed by a signal
// other than SIGTERM or SIGINT (SIGKILL from the OOM killer or a person, SIGSEGV, SIGABRT from a
// failed check) is started again with the same arguments after a backoff of 1, 2, 4 ... s (at
// most 30 s), up to that many times per worker; it loads its model and registers with the head
// again, which hands it the requests its death re-queued (actors/scheduler.h). So is a worker
// that exits kExitLostHead (its connection to a live head was lost). A worker that exits
// otherwise on its own (code 0: the head shut it down or retired it; another code: it could not
// load or reach the head) is not restarted: doing the same again would fail the same way. Neither is a
// tensor-parallel rank: a group lives whole (actors/tp_group.h), and the head stops the rest of
// it when one rank dies.
// Thread-safety: one thread (the node's main loop).
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "cluster/process.h"
#include "core/status.h"

namespace specserve {

/// The exit status of a worker process whose head went away abnormally (a lost connection: the
/// process was stopped longer than the head waits for it, or the network dropped): its node
/// restarts it like a crashed worker (within scheduler.worker_restarts) and it joins the head
/// again. EX_TEMPFAIL of sysexits.h.
inline constexpr int kExitLostHead = 75;

/// Whether a worker that ended as `e` is restarted, after `restarts_done` restarts of it, with
/// at most `max_restarts` (see the file comment).
bool should_restart_worker(const ChildExit& e, int32_t restarts_done, int32_t max_restarts);

/// Seconds to wait before restart number `restarts_done + 1`: 1, 2, 4, ... capped at 30.
double worker_restart_backoff_s(int32_t restarts_done);

/// One worker process as the node starts it.
struct SupervisedWorker {
  std::vector<std::string> argv;
  std::map<std::string, std::string> env;
  std::string name;          ///< for logs: "worker node0/1 target_shard"
  bool restartable = true;   ///< false for tensor-parallel ranks
};

class NodeSupervisor {
 public:
  /// `max_restarts`: scheduler.worker_restarts.
  NodeSupervisor(std::string node, int32_t max_restarts) : node_(std::move(node)), max_restarts_(max_restarts) {}

  /// Starts every worker. Errors: those of spawn_child (the workers started so far keep running:
  /// stop() them).
  Status start(std::vector<SupervisedWorker> workers);
  /// Reaps the workers that ended, logs each, schedules the restarts the policy allows and
  /// starts those that are due. Sets *failed when a worker ended other than with code 0 and is
  /// not going to be restarted.
  void pump(bool* failed);
  /// True when no worker runs and none waits for a restart.
  bool done() const { return running_.empty() && pending_.empty(); }
  /// SIGTERM, `grace_s`, then SIGKILL; forgets pending restarts.
  void stop(double grace_s);

  const std::vector<Child>& running() const { return running_; }
  /// Restarts done so far, over all workers.
  int32_t restarts() const { return total_restarts_; }

 private:
  struct Pending {
    size_t index;
    std::chrono::steady_clock::time_point due;
  };
  std::string node_;
  int32_t max_restarts_;
  std::vector<SupervisedWorker> workers_;
  std::vector<Child> running_;
  std::map<int, size_t> index_of_pid_;
  std::vector<int32_t> restarts_done_;
  std::vector<Pending> pending_;
  int32_t total_restarts_ = 0;
};

}  // namespace specserve
