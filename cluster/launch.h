// specserve cluster: the launcher commands — `serve` (one process), `up` (head + local nodes
// from a topology), `node --join` (a node's workers), `worker` (one worker process).
//
// Process tree of `specserve up cluster.yaml`:
//   up (head: scheduler actor, actor port)  ->  node <name> (one per node on this host)
//                                               ->  worker <name>/<j> (one per worker: target shard, draft worker)
// Workers connect to the head's actor port, present the cluster token, load, warm up and
// report ready. Ctrl-C / SIGTERM on `up` drains in-flight requests, then stops every process it
// started. A node on another host joins with `specserve node --join HEAD:PORT --name NODE
// --config cluster.yaml` (the same file and token file on that host).
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "actors/head.h"
#include "actors/runtime.h"
#include "config/topology.h"

namespace specserve {

/// Starts the head's HTTP front end (server/; tools/cli wires it in, since cluster/ does not
/// include server/). Called right after the head starts, before the workers are ready (its
/// /health answers 503 until then). The returned object stops the front end when destroyed,
/// which happens after the head drained in-flight requests. Errors stop the launch.
using FrontEndStarter =
    std::function<Expected<std::shared_ptr<void>>(const Topology& topology, Head& head, ActorRuntime& runtime,
                                                  const std::string& token)>;

struct UpOptions {
  std::string config_path;
  int32_t threads_per_worker = 0;  ///< 0: this host's cores / workers on its node (at least 1)
  double drain_timeout_s = 60;
  /// Called once every replica is ready (tests and scripts wait for it); also printed.
  std::string ready_file;          ///< non-empty: written with "HOST:PORT\n" when ready
  FrontEndStarter front_end;       ///< null: no HTTP front end (head.http_port unused)
  /// Check the topology (parse, ports free, tensor-parallel sizes, this host's devices, model
  /// files: cluster/up_plan.h), print the plan to stdout and exit 0, starting nothing; with
  /// problems, print every one to stderr (each naming its field and value) and exit 2.
  bool dry_run = false;
};
/// `specserve up`: returns the process exit code. With or without dry_run the same checks run
/// first; a topology that fails to parse or any problem they find exits 2 before anything starts
/// (no token file, no port bound, no process); 1 is a failure after the launch began.
int run_up(const UpOptions& options);

struct NodeOptions {
  std::string join;         ///< HEAD_HOST:PORT
  std::string name;         ///< node name in the topology
  std::string config_path;
  int32_t threads_per_worker = 0;
  bool exit_with_parent = false;  ///< set by `up`: stop when the launcher dies
};
int run_node(const NodeOptions& options);

struct WorkerOptions {
  std::string join;
  std::string node;
  std::string config_path;
  int32_t index = 0;        ///< position in the node's `workers` list
  int32_t threads = 0;
  double connect_timeout_s = 30;
};
int run_worker(const WorkerOptions& options);

struct ServeOptions {
  Topology topology;        ///< built from the flags: one node, one target shard with its proposer
  int32_t threads = 0;
  double drain_timeout_s = 60;
  std::string ready_file;
  FrontEndStarter front_end;  ///< null: no HTTP front end
};
int run_serve(const ServeOptions& options);

}  // namespace specserve
