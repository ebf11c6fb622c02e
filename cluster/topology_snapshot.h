// specserve cluster: the topology `up` validated, handed to the processes it starts (its node
// processes, their workers, the autoscaler's workers) so that every later start — a node restarting
// a killed worker, a cold start an hour later — reads the bytes up checked, not the file again.
// Editing or removing the YAML while up runs then changes nothing until up is restarted (it broke
// every later start before: "scheduler.bogus_key: unknown key"). A node joining from another host
// reads its own copy of the file (`specserve node --join ... --config FILE`), and `specserve
// status` / `client --config` read the file as it is now.
//
// NOTE: passed in the children's environment (spawn_child's `env`), not set in up's own: up has
// threads by then (CAF; a CUDA context from the plan's device check), and setenv is not
// thread-safe against their getenv.
#pragma once

#include <cstddef>
#include <map>
#include <string>

#include "config/topology.h"
#include "core/status.h"

namespace specserve {

/// Environment variables of the children: the YAML text, and the absolute path of the file it
/// was read from.
inline constexpr const char* kTopologySnapshotEnv = "SPECSERVE_TOPOLOGY_SNAPSHOT";
inline constexpr const char* kTopologySnapshotOfEnv = "SPECSERVE_TOPOLOGY_SNAPSHOT_OF";
/// Linux limits one environment string to 128 KiB (MAX_ARG_STRLEN); a larger topology is not
/// handed down (children then read the file).
inline constexpr size_t kMaxTopologySnapshotBytes = 120 * 1024;

/// The two variables that hand `src` to a child (add them to spawn_child's `env`).
/// Errors: kInvalidArgument, naming the file and its size, when the text is over
/// kMaxTopologySnapshotBytes or holds a NUL byte (the children then read the file again).
Expected<std::map<std::string, std::string>> topology_snapshot_env(const TopologySource& src);

/// Removes snapshot variables this process inherited (up started from inside a worker's
/// environment must not hand down a text it did not validate). Call before any thread starts.
void clear_inherited_topology_snapshot();

/// The topology a node or worker process uses: parse_topology of the snapshot when this process's
/// environment holds one of `path` (the same absolute path; messages and relative paths as
/// load_topology_file's), otherwise load_topology_file(path).
Expected<Topology> load_launched_topology(const std::string& path);

}  // namespace specserve
