// specserve cluster: what `specserve up` would start, checked without starting it (`up` runs the
// checks before it starts anything; `up --dry-run` runs them and prints the plan).
#pragma once

#include <string>
#include <vector>

#include "config/topology.h"
#include "core/status.h"

namespace specserve {

/// The checks `up` can make before it starts anything, beyond parsing (which
/// load_topology_file already did), without loading any weight; EVERY problem found, in this
/// order (empty: the plan is sound):
///  - every worker on a node this host runs (loopback, or the head's host) names a device this
///    machine has (actors/backend_factory.h check_device_available);
///  - models.target.path opens as GGUF and is a model load_model() accepts: not a Medusa / EAGLE
///    head file, a supported architecture (model/model_loader.h check_model_file); its
///    models.target.max_model_len within the model's context length; with tensor_parallel_size
///    1 and a target shard on a CPU, scheduler.kv_cache_bytes holds one sequence of
///    max_model_len (actors/worker_config.h check_kv_holds_one_sequence) and, for a shard on
///    this host, fits this machine's memory (check_kv_fits_memory), and so do the pools of all
///    CPU target shards and prefill workers on this host together;
///  - models.speculative (actors/proposer_factory.h check_speculative_files): its
///    speculative_token_tree parses; its model opens as GGUF and, for medusa / eagle, is a head
///    of that method (general.architecture) trained on this target (`<arch>.target_fingerprint`
///    equal to the target's model fingerprint); a draft_model is a model load_model() accepts.
///  - cluster.token_file, when it exists, reads as a token (actors/runtime.h read_cluster_token:
///    not a directory or device, not readable by group or others, not empty).
/// Each error names the file position, the field path and its value ("cluster.yaml:12:40:
/// nodes[0].workers[1].device = cuda:3: ..."): kInvalidArgument / kUnavailable from the device
/// check, the GGUF reader's kNotFound / kCorruptData, kUnsupported for an architecture,
/// kInvalidArgument for a head or tree. Nothing is created (no token file, no port bound).
std::vector<Status> check_up_plan(const Topology& topology);

/// A human-readable plan of `topology`: cluster, head endpoints, models (path, tensor-parallel
/// size, the speculative settings: describe_speculative), each node (local or remote, its devices) and worker
/// (role, replica, device; the tensor-parallel rank for target shards only), the scheduler
/// budgets and the autoscaler's bounds. Lines end in '\n'.
std::string describe_up_plan(const Topology& topology);

}  // namespace specserve
