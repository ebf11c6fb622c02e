// specserve actors: what a worker actor (target shard or draft worker) is told at spawn.
#pragma once

#include <caf/all.hpp>
#include <spdlog/spdlog.h>

#include <string>
#include <vector>

#include "actors/messages.h"
#include "config/topology.h"
#include "spec/engine.h"

namespace specserve {

struct WorkerConfig {
  std::string node;                ///< the node it runs on (for status and logs)
  WorkerRole role = WorkerRole::kTargetShard;
  int32_t replica = 0;
  int32_t rank = 0;
  Topology topology;               ///< models, scheduler limits
  /// Target shard: the replica has a draft_worker, so drafts come from it (attached by the
  /// scheduler once it is ready); false: the proposer runs inside the shard.
  bool remote_draft = false;
  int32_t threads = 0;             ///< CPU backend threads; 0: OpenMP's default
  DeviceSpec device;               ///< where its model runs: the topology worker's `device` (cpu, cuda:N)
  /// cuda:N: the fraction of the device's total memory it may use (actors/gpu_memory_plan.h), and
  /// the flag or YAML field it came from, for messages.
  double gpu_memory_utilization = 0.9;
  std::string gpu_memory_utilization_field = "gpu_memory_utilization";
  double draft_timeout_s = 3.0;    ///< one propose round trip, then the step decodes plainly
  /// Deadline of one KV fetch from another worker (migration), then the sequence recomputes.
  double kv_transfer_timeout_s = 5.0;
  std::string token;               ///< the cluster token
  caf::actor scheduler;            ///< where to register
  /// Draft worker in its own process: the host its port listens on (port chosen by the OS).
  /// Empty: in the scheduler's process (no port).
  std::string listen_host;
  /// The node's host. Tensor-parallel ranks (models.target.tensor_parallel_size > 1): the address
  /// their Gloo device binds and publishes to the other ranks; every target shard of a topology
  /// whose nodes are all on loopback: the address whose interface (lo) its KV data plane's UCX
  /// network transports use (actors/target_shard_load.cpp). Empty: loopback.
  std::string tp_host;
};

/// The part of a worker's registration every worker kind fills the same way: the cluster token,
/// node, role (cfg.role), replica, rank, this process's pid, `state` ("loading", "warming",
/// "ready", "failed"), `error` and `self`. The caller adds its kind's fields.
WorkerHello worker_hello(const WorkerConfig& cfg, const caf::actor& self, const std::string& state, const std::string& error);

/// The exit reason a worker actor quits with when its scheduler went down abnormally (see
/// scheduler_down_level); run_worker exits then with cluster/node_supervisor.h's kExitLostHead,
/// so that the node restarts it. NOTE: it quit normally and the worker exited 0, which a node
/// takes for a stop it asked for: a worker stalled ~7 s was gone for good while the head waited
/// for its restart.
inline constexpr caf::exit_reason kLostHeadReason = caf::exit_reason::remote_link_unreachable;

/// How loudly a worker logs that its scheduler is gone: info when the head shut it down
/// (a normal stop: exit_reason normal or user_shutdown), warning for anything else (a crash,
/// a lost connection).
inline spdlog::level::level_enum scheduler_down_level(const caf::down_msg& m) {
  return !m.reason || m.reason == caf::exit_reason::normal || m.reason == caf::exit_reason::user_shutdown ? spdlog::level::info
                                                                                                            : spdlog::level::warn;
}

/// Quits `self` after its scheduler's down message `m`: normally when the head shut it down,
/// with kLostHeadReason otherwise (the worker process then exits kExitLostHead).
template <class Actor>
void quit_after_scheduler_down(Actor* self, const caf::down_msg& m) {
  if (scheduler_down_level(m) == spdlog::level::info) {
    self->quit();
  } else {
    self->quit(kLostHeadReason);
  }
}

/// The engine limits a topology asks for, with the KV cache sized from
/// scheduler.kv_cache_bytes for `model` (K and V, fp32, every layer). Errors name the field:
/// a cache too small for one block.
Expected<EngineOptions> engine_options_for(const Topology& topology, const ModelConfig& model);

/// The CPU KV pool of `options` (num_kv_blocks of block_size tokens, from engine_options_for)
/// holds one sequence of the full context: options.max_model_len, or the model's
/// context_length when that is 0. As vLLM refuses to start when the KV cache cannot hold one
/// sequence of max_model_len, `serve`, `up` and `up --dry-run` refuse such a topology before
/// anything starts (the alternative: a request that fails halfway through its generation). The
/// worker itself does not check it, so a program that builds a topology itself may run a small
/// pool on purpose: a sequence that outgrows it then fails alone (spec/step_policy.cpp). Not
/// for cuda:N, whose pool comes from gpu_memory_utilization (EngineKvPlanner checks it there).
/// Errors: kInvalidArgument naming scheduler.kv_cache_bytes (its source: the YAML position or
/// --kv-cache-bytes) and max_model_len with their values, the blocks one sequence needs, the
/// smallest kv_cache_bytes that holds them and the largest max_model_len this pool holds.
Status check_kv_holds_one_sequence(const Topology& topology, const EngineOptions& options, const ModelConfig& model);

/// scheduler.kv_cache_bytes is at most this machine's physical memory (a CPU pool larger than
/// that can never be allocated). Checked by `serve`, `up` (for the nodes on its host) and every
/// CPU target shard when it starts. Errors: kInvalidArgument naming the field, its value and the
/// machine's memory.
Status check_kv_fits_memory(const Topology& topology);

/// The checks `serve` and `up` make before start that need the target's config `model` (read
/// from `model_path`, named in the message): models.target.max_model_len within the model's
/// context_length; then, when `cpu_pool` (tensor-parallel size 1 and a CPU target shard),
/// engine_options_for and check_kv_holds_one_sequence; then, when `check_memory` too,
/// check_kv_fits_memory. Returns the first problem (kInvalidArgument, naming the field by its
/// source: "--max-model-len" for serve, the YAML position and path for up), or OK.
Status check_target_fits(const Topology& topology, const ModelConfig& model, const std::string& model_path, bool cpu_pool,
                         bool check_memory);

/// One problem check_model_files() found: `field` is the topology key ("models.target.path",
/// "models.speculative.model", "models.speculative.speculative_token_tree"), `value` what it
/// was given (a path, or a quoted tree); empty `field`: `status`' message is whole and names
/// its own fields (check_target_fits').
struct ModelFileProblem {
  std::string field;
  std::string value;
  Status status;
};

/// The model files of `topology` checked without loading a weight (`up --dry-run`), every
/// problem found: models.target.path opens as GGUF and is a model load_model() accepts
/// (model/model_loader.h check_model_file); then check_target_fits(topology, its config, path,
/// cpu_pool, check_memory); then, with models.speculative, check_speculative_files (against the
/// target's fingerprint when the target opened). Errors come as the GGUF reader's and the
/// checks' own statuses (kNotFound, kCorruptData, kInvalidArgument, kUnsupported).
std::vector<ModelFileProblem> check_model_files(const Topology& topology, bool cpu_pool, bool check_memory);

}  // namespace specserve
