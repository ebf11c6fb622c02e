// specserve cluster: the topology `up` validated, handed to the processes it starts (its node
// processes, their workers, the autoscaler's workers) so that every later start — a node restarting
// a killed worker, a cold start an hour later — reads the bytes up checked, not the file again.
// Editing or removing the YAML while up runs then changes nothing until up is restarted (it broke
// every later start before: "scheduler.bogus_key: unknown key"). A node joining from another host
// reads its own copy of the file (`specserve node --join ... --config FILE`).
#pragma once

#include <cstddef>
#include <string>

#include "config/topology.h"
#include "core/status.h"

namespace specserve {

/// Environment variables (inherited by every child spawn_child starts): the YAML text, and the
/// absolute path of the file it was read from.
inline constexpr const char* kTopologySnapshotEnv = "SPECSERVE_TOPOLOGY_SNAPSHOT";
inline constexpr const char* kTopologySnapshotOfEnv = "SPECSERVE_TOPOLOGY_SNAPSHOT_OF";
/// Linux limits one environment string to 128 KiB (MAX_ARG_STRLEN); a larger topology is not
/// handed down (children then read the file).
inline constexpr size_t kMaxTopologySnapshotBytes = 120 * 1024;

/// Sets this process's snapshot variables to `src` (call before any thread starts: setenv).
/// Errors: kInvalidArgument, naming the file and its size, when the text is over
/// kMaxTopologySnapshotBytes or holds a NUL byte; nothing is set then.
Status publish_topology_snapshot(const TopologySource& src);

/// The topology a node or worker process uses: parse_topology of the snapshot when this process's
/// environment holds one of `path` (the same absolute path; messages and relative paths as
/// load_topology_file's), otherwise load_topology_file(path).
Expected<Topology> load_launched_topology(const std::string& path);

}  // namespace specserve
