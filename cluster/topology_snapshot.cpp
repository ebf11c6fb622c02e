// specserve cluster: the validated topology handed from `up` to its children (topology_snapshot.h).
#include "cluster/topology_snapshot.h"

#include <cstdlib>
#include <filesystem>

namespace specserve {

Expected<std::map<std::string, std::string>> topology_snapshot_env(const TopologySource& src) {
  if (src.text.size() > kMaxTopologySnapshotBytes) {
    return invalid_argument(src.path + ": " + std::to_string(src.text.size()) + " bytes, over the " +
                            std::to_string(kMaxTopologySnapshotBytes) +
                            " an environment variable may hold: the processes up starts read the file again");
  }
  if (src.text.find('\0') != std::string::npos) {
    return invalid_argument(src.path + ": holds a NUL byte: the processes up starts read the file again");
  }
  return std::map<std::string, std::string>{{kTopologySnapshotOfEnv, src.absolute_path}, {kTopologySnapshotEnv, src.text}};
}

void clear_inherited_topology_snapshot() {
  ::unsetenv(kTopologySnapshotOfEnv);
  ::unsetenv(kTopologySnapshotEnv);
}

Expected<Topology> load_launched_topology(const std::string& path) {
  const char* of = std::getenv(kTopologySnapshotOfEnv);
  const char* text = std::getenv(kTopologySnapshotEnv);
  if (of == nullptr || text == nullptr) return load_topology_file(path);
  std::error_code ec;
  const std::filesystem::path abs = std::filesystem::absolute(std::filesystem::path(path), ec);
  if (ec || abs.lexically_normal().string() != of) return load_topology_file(path);
  return parse_topology(text, path, abs.parent_path().string());
}

}  // namespace specserve
