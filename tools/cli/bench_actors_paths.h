// `specserve bench-actors`: the three paths one request takes — (a) the Engine called directly,
// (b) the actor path in this process, (c) `specserve up` in a child process with the Client over
// loopback — the closed-loop client sweeps over them, and the /proc probes that measure what a
// run cost the machine (CPU of this process tree and of everything else, context switches).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "actors/client.h"
#include "actors/head.h"
#include "actors/runtime.h"
#include "cluster/process.h"
#include "config/topology.h"
#include "core/status.h"
#include "model/backend.h"
#include "spec/engine.h"
#include "spec/proposer.h"
#include "tools/cli/bench_actors_lib.h"
#include "tools/cli/common.h"

namespace specserve::cli::bench_actors {

// ---------------------------------------------------------------- machine load

/// CPU seconds of the machine (/proc/stat) and of this process tree now.
CpuSample cpu_sample();

/// CPU seconds and context switches of this process tree (every thread of it) now.
TreeCounters tree_counters();

/// Waits until other processes use at most `max_cores` (measured over 1 s windows), for at most
/// `max_wait_s`; returns the seconds waited.
double wait_for_quiet(double max_cores, double max_wait_s);

/// The 1, 5 and 15 minute load averages (/proc/loadavg), space-separated.
std::string loadavg();

// ---------------------------------------------------------------- one request, three ways

/// The Engine called directly, as bench-spec and generate do.
class DirectPath {
 public:
  /// `lm` and `backend` (created with the target's thread count) must outlive the path.
  Status start(const Topology& t, LoadedModel* lm, Backend* backend);

  /// One greedy request of `max_tokens` (ignore_eos) through the Engine; `*first_token_steps`
  /// (when given) gets the number of steps up to its first token.
  Expected<Sample> run(const std::vector<int32_t>& prompt, int max_tokens, int64_t* first_token_steps = nullptr);

  Engine& engine() { return *engine_; }

 private:
  std::unique_ptr<Proposer> proposer_;
  std::unique_ptr<Engine> engine_;
};

/// Polls the head until its replica reported the load after the last step (no running or waiting
/// sequence), then returns that load.
Expected<ShardLoad> settled_load(Client& c);

/// One greedy request of `max_tokens` (ignore_eos) through `c`, as path `name`; steps and times
/// from the replica's ShardLoad before and after (settled_load).
Expected<Sample> run_client(Client& c, const std::string& name, const std::vector<int32_t>& prompt, int max_tokens);

/// Waits until replica 0 is ready; an error when a worker failed or after `timeout_s`.
Status wait_ready(Client& c, double timeout_s);

/// (b) Head + target shard actor + Client, all in this process.
class InProcessPath {
 public:
  /// Starts the head and a target shard actor (`threads` CPU threads) in a runtime of its own
  /// (`scheduler_threads` CAF workers; 0: CAF's default) and an in-process Client; waits until
  /// the replica is ready (up to 600 s).
  Status start(const Topology& t, int threads, int scheduler_threads);
  ~InProcessPath();
  Client& client() { return *client_; }

 private:
  std::unique_ptr<ActorRuntime> rt_;
  std::unique_ptr<Head> head_;
  std::unique_ptr<Client> client_;
};

/// Sends SIGTERM to the running `up` child (NetworkPath), says where the run's folder stays (see
/// set_run_dir_for_signals), then re-raises `sig` with its default action: a benchmark stopped
/// by SIGINT/SIGTERM takes its cluster with it instead of leaving it orphaned. For signal().
extern "C" void stop_up_and_exit(int sig);

/// The run's folder (topology, up.log) that stop_up_and_exit names on stderr when a signal ends
/// the run; "" when none (paths longer than 1023 bytes are not named).
/// NOTE: an interrupted run left /tmp/specserve-bench-actors-XXXXXX without a word.
void set_run_dir_for_signals(const std::string& dir);

/// (c) `specserve up` in a child process (its node starts the target shard as a worker process);
/// the Client connects over loopback.
class NetworkPath {
 public:
  /// Runs `specserve up YAML` as a child (its log in DIR/up.log), waits for DIR/ready (up to
  /// 600 s; an error with the log's tail when the child exits first), connects a Client to the
  /// head over loopback with the cluster token and waits until the replica is ready (up to 60 s).
  Status start(const std::string& dir, const std::string& yaml, const Topology& t, int threads, int scheduler_threads);
  /// Stops the child (SIGTERM: up drains, stops its node, which stops the worker).
  ~NetworkPath();
  Client& client() { return *client_; }

 private:
  std::string tail_log();  ///< the last 2000 bytes of DIR/up.log
  Child up_;
  std::string log_;
  std::unique_ptr<Client> client_;
};

// ---------------------------------------------------------------- concurrency

/// `n` clients (threads) in a closed loop over `c`: request j goes to client j % n and asks
/// question j (first turn, chat template), greedy, `max_tokens` each (ignore_eos).
LevelResult sweep_clients(Client& c, const std::vector<Question>& qs, int n, int requests, int max_tokens);

/// The same closed loop on the Engine directly: a finished request's client adds its next one
/// before the next step.
Expected<LevelResult> sweep_direct(Engine& e, const std::vector<Question>& qs, int n, int requests, int max_tokens);

}  // namespace specserve::cli::bench_actors
