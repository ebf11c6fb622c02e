// specserve config: what the topology .cpp files share (not part of the public API).
//
// topology.cpp holds the public helpers and entry points, topology_parse.cpp the YAML walk
// (TopologyParser, Fields: YAML -> structs, field errors; the `nodes:` section in
// topology_parse_nodes.cpp), topology_validate.cpp the
// cross-field checks and the port probe. Include only from config/topology*.cpp.
#pragma once

#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "config/topology.h"
#include "core/status.h"

namespace specserve {
namespace topology_internal {

// ---------------------------------------------------------------- helpers (topology.cpp)

/// `s` in single quotes, for messages.
std::string quote(std::string_view s);
/// ASCII lower case.
std::string lower(std::string_view s);
/// A whole decimal int64 with an optional leading '+'; false for anything else.
bool parse_int64(std::string_view s, int64_t* out);
/// Levenshtein distance, for "did you mean" on unknown keys.
size_t edit_distance(std::string_view a, std::string_view b);
/// A cluster or node name: letters, digits, '-', '_', '.', starting with a letter or digit.
bool valid_name(std::string_view s);
/// One key for "the same machine": every loopback spelling is this machine.
std::string host_key(const std::string& host);
/// A fraction for messages: shortest round-trip-ish form ("0.9", "1.2", "0.35").
std::string fraction_text(double x);

// ---------------------------------------------------------------- the parser (topology_parse.cpp)

struct Finding {
  StatusCode code;
  std::string text;
};

class TopologyParser;

// A mapping whose keys were checked against the allowed set. Absent keys and explicit nulls
// (`key:` or `key: ~`) read as unset.
class Fields {
 public:
  Fields(TopologyParser& parser, const YAML::Node& node, std::string field_path, std::vector<std::string> keys);

  bool is_map() const { return is_map_; }
  const YAML::Node* get(const std::string& key) const {
    auto it = entries_.find(key);
    return it == entries_.end() ? nullptr : &it->second;
  }
  std::string path(const std::string& key) const { return path_.empty() ? key : path_ + "." + key; }
  const std::string& path() const { return path_; }
  const YAML::Node& node() const { return node_; }

 private:
  YAML::Node node_;
  std::string path_;
  bool is_map_ = false;
  std::map<std::string, YAML::Node> entries_;
};

class TopologyParser {
 public:
  TopologyParser(std::string file, std::string base_dir) : file_(std::move(file)), base_dir_(std::move(base_dir)) {
    topo_.source = file_;
  }

  /// endpoint_only: only `cluster` and `head` are read (load_topology_endpoint).
  Expected<Topology> run(const std::string& yaml_text, bool endpoint_only = false);

  std::string loc(const YAML::Mark& m) const {
    if (m.is_null()) return file_;
    return file_ + ":" + std::to_string(m.line + 1) + ":" + std::to_string(m.column + 1);
  }
  void error_at(const std::string& where, const std::string& path, const std::string& what,
                StatusCode code = StatusCode::kInvalidArgument) {
    findings_.push_back({code, where + ": " + path + ": " + what});
  }
  void error(const YAML::Node& at, const std::string& path, const std::string& what,
             StatusCode code = StatusCode::kInvalidArgument) {
    error_at(loc(at.Mark()), path, what, code);
  }
  void record(const std::string& path, const YAML::Node& node) { topo_.locations.emplace(path, loc(node.Mark())); }

  // A short rendering of any node for messages: 'text' for scalars, flow style otherwise.
  static std::string describe(const YAML::Node& n) {
    if (n.IsScalar()) return quote(n.Scalar());
    if (n.IsNull()) return "null";
    YAML::Emitter e;
    e << YAML::Flow << n;
    std::string s = e.c_str();
    if (s.size() > 60) s = s.substr(0, 57) + "...";
    return std::string(n.IsMap() ? "a mapping " : "a sequence ") + quote(s);
  }

 private:
  // Field readers: nullopt when unset or wrong (the error is recorded). `required` reports a
  // missing field at the enclosing mapping.
  std::optional<std::string> read_string(const Fields& f, const std::string& key, bool required);
  std::optional<int64_t> read_int(const Fields& f, const std::string& key, int64_t min, int64_t max, bool required);
  std::optional<double> read_double(const Fields& f, const std::string& key, double min, bool required);
  std::optional<bool> read_bool(const Fields& f, const std::string& key);
  std::optional<int64_t> read_byte_size(const Fields& f, const std::string& key);
  std::optional<std::string> read_host(const Fields& f, const std::string& key);
  // `name`: a cluster or node name, usable in log lines and metric labels.
  std::optional<std::string> read_name(const Fields& f, bool required);
  // A model file: ~ expanded, made absolute from base_dir_, checked readable.
  std::optional<std::string> read_model_path(const Fields& f, const std::string& key, bool required);
  const YAML::Node* scalar(const Fields& f, const std::string& key, const char* expected, bool required);
  void missing(const Fields& f, const std::string& key, const std::string& hint = "");
  std::string resolve_path(const std::string& raw, const YAML::Node& at, const std::string& path, bool* ok);

  void parse_cluster(const YAML::Node& n);
  void parse_head(const YAML::Node& n);
  void parse_models(const YAML::Node& n);
  void parse_target(const YAML::Node& n);
  void parse_speculative(const YAML::Node& n);
  void parse_nodes(const YAML::Node& n);
  void parse_node(const YAML::Node& n, const std::string& path, NodeSpec* node);
  void parse_worker(const YAML::Node& n, const std::string& path, const NodeSpec& node, WorkerSpec* w);
  void parse_scheduler(const YAML::Node& n);
  void parse_autoscale(const YAML::Node& n, std::optional<int32_t>* max_replicas);

  void check_topology(const std::optional<int32_t>& explicit_max_replicas);
  // One worker on a GPU, for check_device_share.
  struct DeviceUser {
    std::string path;   // nodes[i].workers[j]
    std::string node;   // its node's name
    std::string host;   // its node's host, as written
    double gpu_memory_utilization = 0;
  };
  // The workers on one GPU of one machine: their gpu_memory_utilization fractions must sum to
  // at most 1 (the error is reported at the last of them).
  void check_device_share(const std::string& device, const std::vector<DeviceUser>& users);

  std::string file_;
  std::string base_dir_;
  Topology topo_;
  std::vector<Finding> findings_;
  std::set<std::string> explicit_;  // field paths set in the file (not defaults)
  bool tp_invalid_ = false;          // models.target.tensor_parallel_size given but refused (its error is recorded)

  friend class Fields;
};

}  // namespace topology_internal
}  // namespace specserve
