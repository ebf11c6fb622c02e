// specserve cluster: `specserve up --dry-run` — what `up` would start, checked without starting it.
#pragma once

#include <string>

#include "config/topology.h"
#include "core/status.h"

namespace specserve {

/// The checks `up` can make before it starts anything, beyond parsing (which
/// load_topology_file already did): every worker on a node this host runs (loopback, or the
/// head's host) names a device this machine has (actors/backend_factory.h
/// check_device_available), and the target and speculative model files open as GGUF.
/// Errors name the file position and field path ("cluster.yaml:12:40: nodes[0].workers[1].device")
/// and the value: kInvalidArgument / kUnavailable from the device check, the GGUF reader's
/// kNotFound / kCorruptData for a model file. Nothing is created (no token file, no port bound).
Status check_up_plan(const Topology& topology);

/// A human-readable plan of `topology`: cluster, head endpoints, models (path, tensor-parallel
/// size, the speculative method and k), each node (local or remote, its devices) and worker
/// (role, replica, rank, device), the scheduler budgets and the autoscaler's bounds. Lines end
/// in '\n'.
std::string describe_up_plan(const Topology& topology);

}  // namespace specserve
