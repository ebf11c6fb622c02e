// Topology parsing: yaml-cpp builds the node tree; TopologyParser walks it section by section,
// records every problem with its mark, then runs the cross-field checks.
//
// NOTE: yaml-cpp throws (parse errors, bad conversions). Exceptions stay inside this file:
// parse errors are caught at Load, and the walk itself never calls a throwing accessor on a
// node whose type it has not checked; a catch-all still turns a surprise into a Status.
#include "config/topology.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pwd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

namespace specserve {

namespace fs = std::filesystem;

std::string DeviceSpec::to_string() const {
  return kind == DeviceKind::kCpu ? std::string("cpu") : "cuda:" + std::to_string(index);
}

const char* worker_role_name(WorkerRole role) {
  switch (role) {
    case WorkerRole::kTargetShard: return "target_shard";
    case WorkerRole::kDraftWorker: return "draft_worker";
    case WorkerRole::kPrefillWorker: return "prefill_worker";
  }
  return "?";
}

const char* speculative_method_name(SpeculativeMethod method) {
  switch (method) {
    case SpeculativeMethod::kNgram: return "ngram";
    case SpeculativeMethod::kDraftModel: return "draft_model";
    case SpeculativeMethod::kLayerSkip: return "layer_skip";
    case SpeculativeMethod::kMedusa: return "medusa";
    case SpeculativeMethod::kEagle: return "eagle";
  }
  return "?";
}

std::string Topology::where(const std::string& path) const {
  auto it = locations.find(path);
  return it == locations.end() ? source : it->second;
}

std::vector<int32_t> Topology::replica_ids() const {
  std::set<int32_t> ids;
  for (const NodeSpec& n : nodes) {
    for (const WorkerSpec& w : n.workers) {
      if (w.role == WorkerRole::kTargetShard) ids.insert(w.replica);
    }
  }
  return {ids.begin(), ids.end()};
}

// ---------------------------------------------------------------- helpers

namespace {

std::string quote(std::string_view s) { return "'" + std::string(s) + "'"; }

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

bool parse_int64(std::string_view s, int64_t* out) {
  if (!s.empty() && s.front() == '+') s.remove_prefix(1);
  if (s.empty()) return false;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), *out);
  return ec == std::errc() && p == s.data() + s.size();
}

// Levenshtein distance, for "did you mean" on unknown keys.
size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

bool valid_name(std::string_view s) {
  if (s.empty() || !std::isalnum(static_cast<unsigned char>(s.front()))) return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.';
  });
}

// One key for "the same machine": every loopback spelling is this machine.
std::string host_key(const std::string& host) {
  return is_loopback_host(host) ? std::string("localhost") : lower(host);
}

}  // namespace

Expected<int64_t> parse_byte_size(std::string_view text) {
  std::string_view s = text;
  auto trim = [](std::string_view v) {
    while (!v.empty() && std::isspace(static_cast<unsigned char>(v.front()))) v.remove_prefix(1);
    while (!v.empty() && std::isspace(static_cast<unsigned char>(v.back()))) v.remove_suffix(1);
    return v;
  };
  s = trim(s);
  const std::string bad = "byte size " + quote(text) +
                          ": expected an integer or a number with a unit (B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)";
  if (!s.empty() && s.front() == '-') return invalid_argument("byte size " + quote(text) + ": must not be negative");
  size_t i = 0;
  while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) ++i;
  const std::string_view whole = s.substr(0, i);
  std::string_view frac;
  if (i < s.size() && s[i] == '.') {
    size_t j = i + 1;
    while (j < s.size() && std::isdigit(static_cast<unsigned char>(s[j]))) ++j;
    frac = s.substr(i + 1, j - i - 1);
    i = j;
  }
  if (whole.empty() && frac.empty()) return invalid_argument(bad);
  const std::string unit = lower(trim(s.substr(i)));
  static const std::map<std::string, int64_t> kUnits = {
      {"", 1},          {"b", 1},
      {"k", 1000},      {"kb", 1000},    {"ki", 1LL << 10}, {"kib", 1LL << 10},
      {"m", 1000000},   {"mb", 1000000}, {"mi", 1LL << 20}, {"mib", 1LL << 20},
      {"g", 1000000000LL}, {"gb", 1000000000LL}, {"gi", 1LL << 30}, {"gib", 1LL << 30},
      {"t", 1000000000000LL}, {"tb", 1000000000000LL}, {"ti", 1LL << 40}, {"tib", 1LL << 40},
  };
  auto u = kUnits.find(unit);
  if (u == kUnits.end()) return invalid_argument(bad);
  // Exact integer arithmetic: whole * unit + frac * unit / 10^len(frac), rounded down.
  __int128 value = 0;
  for (char c : whole) {
    value = value * 10 + (c - '0');
    if (value > INT64_MAX) return invalid_argument("byte size " + quote(text) + ": too large");
  }
  value *= u->second;
  __int128 num = 0, den = 1;
  for (char c : frac.substr(0, 18)) {
    num = num * 10 + (c - '0');
    den *= 10;
  }
  value += num * u->second / den;
  if (value > INT64_MAX) return invalid_argument("byte size " + quote(text) + ": too large");
  return static_cast<int64_t>(value);
}

Expected<DeviceSpec> parse_device(std::string_view text) {
  if (text == "cpu") return DeviceSpec{DeviceKind::kCpu, 0};
  if (text.substr(0, 5) == "cuda:") {
    int64_t n = 0;
    if (parse_int64(text.substr(5), &n) && n >= 0 && n <= INT32_MAX && text[5] != '+') {
      return DeviceSpec{DeviceKind::kCuda, static_cast<int32_t>(n)};
    }
  }
  return invalid_argument("device " + quote(text) + ": expected cpu or cuda:N (N >= 0)");
}

Expected<std::string> expand_user_path(const std::string& path) {
  if (path.empty() || path[0] != '~') return path;
  const size_t slash = path.find('/');
  const std::string user = path.substr(1, slash == std::string::npos ? std::string::npos : slash - 1);
  const std::string rest = slash == std::string::npos ? std::string() : path.substr(slash);
  std::string home;
  if (user.empty()) {
    if (const char* h = std::getenv("HOME"); h && *h) {
      home = h;
    } else if (const passwd* pw = getpwuid(getuid()); pw && pw->pw_dir) {
      home = pw->pw_dir;
    }
  } else if (const passwd* pw = getpwnam(user.c_str()); pw && pw->pw_dir) {
    home = pw->pw_dir;
  }
  if (home.empty()) {
    return not_found("cannot expand " + quote(path) + ": no home folder for " +
                     (user.empty() ? "the current user" : "user " + quote(user)));
  }
  return home + rest;
}

bool is_loopback_host(const std::string& host) {
  const std::string h = lower(host);
  if (h == "localhost" || h == "ip6-localhost" || h == "ip6-loopback" || h == "::1") return true;
  in_addr a4{};
  if (inet_pton(AF_INET, h.c_str(), &a4) == 1) return (ntohl(a4.s_addr) >> 24) == 127;
  return false;
}

// ---------------------------------------------------------------- the parser

namespace {

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

  Expected<Topology> run(const std::string& yaml_text);

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

  std::string file_;
  std::string base_dir_;
  Topology topo_;
  std::vector<Finding> findings_;
  std::set<std::string> explicit_;  // field paths set in the file (not defaults)

  friend class Fields;
};

Fields::Fields(TopologyParser& parser, const YAML::Node& node, std::string field_path, std::vector<std::string> keys)
    : node_(node), path_(std::move(field_path)) {
  const std::string shown = path_.empty() ? std::string("(top level)") : path_;
  if (!node.IsMap()) {
    std::string allowed;
    for (const auto& k : keys) allowed += (allowed.empty() ? "" : ", ") + k;
    parser.error(node, shown, "expected a mapping with keys {" + allowed + "}, got " + TopologyParser::describe(node));
    return;
  }
  is_map_ = true;
  parser.record(path_.empty() ? std::string("(top level)") : path_, node);
  std::map<std::string, YAML::Mark> seen;
  for (auto it = node.begin(); it != node.end(); ++it) {
    // Copies: the iterator's -> returns a proxy, so a reference into it would dangle.
    const YAML::Node k = it->first;
    const YAML::Node v = it->second;
    if (!k.IsScalar()) {
      parser.error(k, shown, "keys must be plain names, got " + TopologyParser::describe(k));
      continue;
    }
    const std::string key = k.Scalar();
    if (std::find(keys.begin(), keys.end(), key) == keys.end()) {
      std::string hint;
      size_t best = 3;
      for (const auto& cand : keys) {
        const size_t d = edit_distance(key, cand);
        if (d < best) best = d, hint = cand;
      }
      std::string allowed;
      for (const auto& kk : keys) allowed += (allowed.empty() ? "" : ", ") + kk;
      parser.error(k, path(key), "unknown key " + quote(key) +
                                     (hint.empty() ? "" : " (did you mean " + quote(hint) + "?)") +
                                     "; allowed here: " + allowed);
      continue;
    }
    if (auto [first, inserted] = seen.emplace(key, k.Mark()); !inserted) {
      parser.error(k, path(key), "duplicate key " + quote(key) + " (first at " + parser.loc(first->second) + ")");
      continue;
    }
    if (v.IsNull()) continue;  // `key:` / `key: ~` mean unset
    entries_.emplace(key, v);
    parser.explicit_.insert(path(key));
  }
}

void TopologyParser::missing(const Fields& f, const std::string& key, const std::string& hint) {
  error(f.node(), f.path(key), "missing required field" + (hint.empty() ? "" : " (" + hint + ")"));
}

const YAML::Node* TopologyParser::scalar(const Fields& f, const std::string& key, const char* expected, bool required) {
  const YAML::Node* v = f.get(key);
  if (!v) {
    if (required && f.is_map()) missing(f, key);
    return nullptr;
  }
  record(f.path(key), *v);
  if (!v->IsScalar()) {
    error(*v, f.path(key), std::string("expected ") + expected + ", got " + describe(*v));
    return nullptr;
  }
  return v;
}

std::optional<std::string> TopologyParser::read_string(const Fields& f, const std::string& key, bool required) {
  const YAML::Node* v = scalar(f, key, "a string", required);
  if (!v) return std::nullopt;
  if (v->Scalar().empty()) {
    error(*v, f.path(key), "must not be empty, got ''");
    return std::nullopt;
  }
  return v->Scalar();
}

std::optional<int64_t> TopologyParser::read_int(const Fields& f, const std::string& key, int64_t min, int64_t max,
                                                bool required) {
  const YAML::Node* v = scalar(f, key, "an integer", required);
  if (!v) return std::nullopt;
  int64_t x = 0;
  if (!parse_int64(v->Scalar(), &x)) {
    error(*v, f.path(key), "expected an integer, got " + describe(*v));
    return std::nullopt;
  }
  if (x < min || x > max) {
    if (max == INT64_MAX || max == INT32_MAX) {
      error(*v, f.path(key), quote(v->Scalar()) + " must be >= " + std::to_string(min));
    } else {
      error(*v, f.path(key),
            quote(v->Scalar()) + " is out of range " + std::to_string(min) + ".." + std::to_string(max));
    }
    return std::nullopt;
  }
  return x;
}

std::optional<double> TopologyParser::read_double(const Fields& f, const std::string& key, double min, bool required) {
  const YAML::Node* v = scalar(f, key, "a number", required);
  if (!v) return std::nullopt;
  const std::string& s = v->Scalar();
  char* end = nullptr;
  errno = 0;
  const double x = s.empty() ? 0.0 : std::strtod(s.c_str(), &end);
  if (s.empty() || end != s.c_str() + s.size() || errno != 0 || !std::isfinite(x)) {
    error(*v, f.path(key), "expected a number, got " + describe(*v));
    return std::nullopt;
  }
  if (x < min) {
    error(*v, f.path(key), quote(s) + " must be >= " + std::to_string(static_cast<int64_t>(min)));
    return std::nullopt;
  }
  return x;
}

std::optional<bool> TopologyParser::read_bool(const Fields& f, const std::string& key) {
  const YAML::Node* v = scalar(f, key, "true or false", false);
  if (!v) return std::nullopt;
  const std::string s = lower(v->Scalar());
  if (s == "true") return true;
  if (s == "false") return false;
  error(*v, f.path(key), "expected true or false, got " + describe(*v));
  return std::nullopt;
}

std::optional<int64_t> TopologyParser::read_byte_size(const Fields& f, const std::string& key) {
  const YAML::Node* v = scalar(f, key, "a byte size", false);
  if (!v) return std::nullopt;
  auto bytes = parse_byte_size(v->Scalar());
  if (!bytes.ok()) {
    error(*v, f.path(key), bytes.status().message());
    return std::nullopt;
  }
  if (*bytes <= 0) {
    error(*v, f.path(key), quote(v->Scalar()) + " must be > 0 bytes");
    return std::nullopt;
  }
  return *bytes;
}

std::optional<std::string> TopologyParser::read_name(const Fields& f, bool required) {
  auto name = read_string(f, "name", required);
  if (name && !valid_name(*name)) {
    error(*f.get("name"), f.path("name"),
          "expected letters, digits, '-', '_' or '.', starting with a letter or digit, got " + quote(*name));
    return std::nullopt;
  }
  return name;
}

std::optional<std::string> TopologyParser::read_host(const Fields& f, const std::string& key) {
  auto host = read_string(f, key, false);
  if (!host) return std::nullopt;
  const bool bad = std::any_of(host->begin(), host->end(), [](char c) {
    return std::isspace(static_cast<unsigned char>(c)) || c == '/' || c == '@';
  });
  if (bad || host->find("://") != std::string::npos) {
    error(*f.get(key), f.path(key), "expected a host name or IP address, got " + quote(*host));
    return std::nullopt;
  }
  if (!is_loopback_host(*host)) {
    topo_.notes.push_back(loc(f.get(key)->Mark()) + ": " + f.path(key) + ": " + quote(*host) +
                          " is not loopback: the head's actor port accepts peers from other machines, which "
                          "must present the token in cluster.token_file");
  }
  return host;
}

std::string TopologyParser::resolve_path(const std::string& raw, const YAML::Node& at, const std::string& path,
                                         bool* ok) {
  *ok = false;
  auto expanded = expand_user_path(raw);
  if (!expanded.ok()) {
    error(at, path, expanded.status().message(), StatusCode::kNotFound);
    return {};
  }
  fs::path p(*expanded);
  if (p.is_relative()) {
    std::error_code ec;
    fs::path base = base_dir_.empty() ? fs::current_path(ec) : fs::path(base_dir_);
    p = base / p;
  }
  std::error_code ec;
  fs::path abs = fs::absolute(p, ec);
  *ok = true;
  return (ec ? p : abs).lexically_normal().string();
}

std::optional<std::string> TopologyParser::read_model_path(const Fields& f, const std::string& key, bool required) {
  auto raw = read_string(f, key, required);
  if (!raw) return std::nullopt;
  const YAML::Node& at = *f.get(key);
  bool ok = false;
  std::string abs = resolve_path(*raw, at, f.path(key), &ok);
  if (!ok) return std::nullopt;
  const std::string shown = quote(*raw) + (abs == *raw ? "" : " (resolved to " + quote(abs) + ")");
  struct stat st {};
  if (::stat(abs.c_str(), &st) != 0) {
    error(at, f.path(key), shown + ": " + std::strerror(errno), StatusCode::kNotFound);
    return std::nullopt;
  }
  if (!S_ISREG(st.st_mode)) {
    error(at, f.path(key), shown + ": not a regular file (expected a GGUF model file)", StatusCode::kNotFound);
    return std::nullopt;
  }
  if (::access(abs.c_str(), R_OK) != 0) {
    error(at, f.path(key), shown + ": not readable: " + std::strerror(errno), StatusCode::kNotFound);
    return std::nullopt;
  }
  return abs;
}

// ---- sections

void TopologyParser::parse_cluster(const YAML::Node& n) {
  Fields f(*this, n, "cluster", {"name", "token_file"});
  if (auto name = read_name(f, false)) topo_.cluster.name = *name;
  std::string raw = "~/.config/specserve/token";
  if (auto t = read_string(f, "token_file", false)) raw = *t;
  bool ok = false;
  std::string abs = resolve_path(raw, f.get("token_file") ? *f.get("token_file") : n, f.path("token_file"), &ok);
  if (ok) topo_.cluster.token_file = abs;
}

void TopologyParser::parse_head(const YAML::Node& n) {
  Fields f(*this, n, "head", {"host", "actor_port", "http_port"});
  if (auto h = read_host(f, "host")) topo_.head.host = *h;
  if (auto p = read_int(f, "actor_port", 1, 65535, false)) topo_.head.actor_port = static_cast<int32_t>(*p);
  if (auto p = read_int(f, "http_port", 1, 65535, false)) topo_.head.http_port = static_cast<int32_t>(*p);
  if (topo_.head.actor_port == topo_.head.http_port) {
    const YAML::Node* at = f.get("http_port") ? f.get("http_port") : (f.get("actor_port") ? f.get("actor_port") : &n);
    error(*at, "head.http_port",
          quote(std::to_string(topo_.head.http_port)) + " is also head.actor_port: the two must differ");
  }
}

void TopologyParser::parse_models(const YAML::Node& n) {
  Fields f(*this, n, "models", {"target", "speculative"});
  if (!f.is_map()) return;
  if (const YAML::Node* t = f.get("target")) {
    parse_target(*t);
  } else {
    missing(f, "target", "the model every replica serves: {path, tensor_parallel_size}");
  }
  if (const YAML::Node* s = f.get("speculative")) parse_speculative(*s);
}

void TopologyParser::parse_target(const YAML::Node& n) {
  Fields f(*this, n, "models.target", {"path", "tensor_parallel_size", "max_model_len"});
  if (!f.is_map()) return;
  if (auto p = read_model_path(f, "path", true)) topo_.models.target.path = *p;
  if (auto tp = read_int(f, "tensor_parallel_size", 1, 1024, false)) {
    topo_.models.target.tensor_parallel_size = static_cast<int32_t>(*tp);
  }
  if (auto m = read_int(f, "max_model_len", 1, INT32_MAX, false)) {
    topo_.models.target.max_model_len = static_cast<int32_t>(*m);
  }
}

void TopologyParser::parse_speculative(const YAML::Node& n) {
  Fields f(*this, n, "models.speculative",
           {"method", "model", "num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max", "num_layers",
            "disable_by_batch_size", "draft_tensor_parallel_size", "adaptive_k"});
  if (!f.is_map()) return;
  SpeculativeSpec s;
  bool method_ok = false;
  static const char* kMethods = "ngram, draft_model, layer_skip, medusa, eagle";
  if (const YAML::Node* m = scalar(f, "method", "a string", false)) {
    static const std::map<std::string, SpeculativeMethod> kByName = {
        {"ngram", SpeculativeMethod::kNgram},         {"draft_model", SpeculativeMethod::kDraftModel},
        {"layer_skip", SpeculativeMethod::kLayerSkip}, {"medusa", SpeculativeMethod::kMedusa},
        {"eagle", SpeculativeMethod::kEagle}};
    auto it = kByName.find(m->Scalar());
    if (it == kByName.end()) {
      error(*m, f.path("method"), quote(m->Scalar()) + " is not one of " + kMethods);
    } else {
      s.method = it->second;
      method_ok = true;
    }
  } else if (!f.get("method")) {
    missing(f, "method", std::string("one of ") + kMethods);
  }
  if (auto k = read_int(f, "num_speculative_tokens", 1, 64, true)) s.num_speculative_tokens = static_cast<int32_t>(*k);
  const auto lmin = read_int(f, "prompt_lookup_min", 1, INT32_MAX, false);
  const auto lmax = read_int(f, "prompt_lookup_max", 1, INT32_MAX, false);
  const auto layers = read_int(f, "num_layers", 1, INT32_MAX, false);
  if (auto d = read_int(f, "disable_by_batch_size", 1, INT32_MAX, false)) {
    s.disable_by_batch_size = static_cast<int32_t>(*d);
  }
  if (auto d = read_int(f, "draft_tensor_parallel_size", 1, 1024, false)) {
    s.draft_tensor_parallel_size = static_cast<int32_t>(*d);
  }
  if (auto a = read_bool(f, "adaptive_k")) s.adaptive_k = *a;
  if (lmin) s.prompt_lookup_min = static_cast<int32_t>(*lmin);
  if (lmax) s.prompt_lookup_max = static_cast<int32_t>(*lmax);
  if (layers) s.num_layers = static_cast<int32_t>(*layers);
  if (!method_ok) return;  // the method-specific checks below would only echo that error

  const std::string method = quote(speculative_method_name(s.method));
  const bool needs_model = s.method == SpeculativeMethod::kDraftModel || s.method == SpeculativeMethod::kMedusa ||
                           s.method == SpeculativeMethod::kEagle;
  if (needs_model) {
    if (f.get("model")) {
      if (auto p = read_model_path(f, "model", true)) s.model = *p;
    } else {
      missing(f, "model", "method " + method + " needs the draft / head model's GGUF path");
    }
  } else if (const YAML::Node* m = f.get("model")) {
    error(*m, f.path("model"), "method " + method + " takes no model, got " + describe(*m));
  }
  if (s.method == SpeculativeMethod::kNgram) {
    if ((lmin || lmax) && s.prompt_lookup_min > s.prompt_lookup_max) {
      const std::string key = lmax ? "prompt_lookup_max" : "prompt_lookup_min";
      error(*f.get(key), f.path(key),
            "prompt_lookup_min " + quote(std::to_string(s.prompt_lookup_min)) + (lmin ? "" : " (default)") +
                " is greater than prompt_lookup_max " + quote(std::to_string(s.prompt_lookup_max)) +
                (lmax ? "" : " (default)") + ": need 1 <= min <= max");
    }
  } else {
    for (const char* key : {"prompt_lookup_min", "prompt_lookup_max"}) {
      if (const YAML::Node* v = f.get(key)) {
        error(*v, f.path(key), "applies only to method 'ngram', not " + method + "; got " + describe(*v));
      }
    }
  }
  if (s.method != SpeculativeMethod::kLayerSkip) {
    if (const YAML::Node* v = f.get("num_layers")) {
      error(*v, f.path("num_layers"), "applies only to method 'layer_skip', not " + method + "; got " + describe(*v));
    }
  }
  topo_.models.speculative = s;
}

void TopologyParser::parse_nodes(const YAML::Node& n) {
  record("nodes", n);
  if (!n.IsSequence() || n.size() == 0) {
    error(n, "nodes", "expected a non-empty sequence of nodes ({name, host, devices, workers}), got " + describe(n));
    return;
  }
  std::map<std::string, std::string> names;  // name -> path of its first use
  for (size_t i = 0; i < n.size(); ++i) {
    const std::string path = "nodes[" + std::to_string(i) + "]";
    record(path, n[i]);
    NodeSpec node;
    parse_node(n[i], path, &node);
    if (!node.name.empty()) {
      auto [it, inserted] = names.emplace(node.name, path);
      if (!inserted) {
        error_at(topo_.where(path + ".name"), path + ".name",
                 quote(node.name) + " is already the name of " + it->second);
      }
    }
    topo_.nodes.push_back(std::move(node));
  }
}

void TopologyParser::parse_node(const YAML::Node& n, const std::string& path, NodeSpec* node) {
  Fields f(*this, n, path, {"name", "host", "devices", "workers"});
  if (!f.is_map()) return;
  if (auto name = read_name(f, true)) node->name = *name;
  if (auto h = read_host(f, "host")) node->host = *h;
  if (const YAML::Node* d = f.get("devices")) {
    record(f.path("devices"), *d);
    if (!d->IsSequence() || d->size() == 0) {
      error(*d, f.path("devices"),
            "expected a non-empty sequence of devices ([cpu, cuda:0, ...]), got " + describe(*d));
    } else {
      for (size_t j = 0; j < d->size(); ++j) {
        const YAML::Node e = (*d)[j];
        const std::string dp = f.path("devices") + "[" + std::to_string(j) + "]";
        record(dp, e);
        if (!e.IsScalar()) {
          error(e, dp, "expected a device (cpu or cuda:N), got " + describe(e));
          continue;
        }
        auto dev = parse_device(e.Scalar());
        if (!dev.ok()) {
          error(e, dp, dev.status().message());
          continue;
        }
        if (std::find(node->devices.begin(), node->devices.end(), *dev) != node->devices.end()) {
          error(e, dp, quote(e.Scalar()) + " is listed twice");
          continue;
        }
        node->devices.push_back(*dev);
      }
    }
  } else {
    missing(f, "devices", "the devices this node offers, e.g. [cpu] or [cuda:0, cuda:1]");
  }
  if (const YAML::Node* w = f.get("workers")) {
    record(f.path("workers"), *w);
    if (!w->IsSequence()) {
      error(*w, f.path("workers"), "expected a sequence of workers ({role, device, ...}), got " + describe(*w));
      return;
    }
    for (size_t j = 0; j < w->size(); ++j) {
      const std::string wp = f.path("workers") + "[" + std::to_string(j) + "]";
      record(wp, (*w)[j]);
      WorkerSpec spec;
      parse_worker((*w)[j], wp, *node, &spec);
      node->workers.push_back(spec);
    }
  }
}

void TopologyParser::parse_worker(const YAML::Node& n, const std::string& path, const NodeSpec& node, WorkerSpec* w) {
  Fields f(*this, n, path, {"role", "model", "replica", "rank", "device"});
  if (!f.is_map()) return;
  bool role_ok = false;
  if (const YAML::Node* r = scalar(f, "role", "a string", true)) {
    static const std::map<std::string, WorkerRole> kByName = {{"target_shard", WorkerRole::kTargetShard},
                                                              {"draft_worker", WorkerRole::kDraftWorker},
                                                              {"prefill_worker", WorkerRole::kPrefillWorker}};
    auto it = kByName.find(r->Scalar());
    if (it == kByName.end()) {
      error(*r, f.path("role"), quote(r->Scalar()) + " is not one of target_shard, draft_worker, prefill_worker");
    } else {
      w->role = it->second;
      role_ok = true;
    }
  }
  if (const YAML::Node* d = scalar(f, "device", "a device (cpu or cuda:N)", true)) {
    auto dev = parse_device(d->Scalar());
    if (!dev.ok()) {
      error(*d, f.path("device"), dev.status().message());
    } else {
      w->device = *dev;
      // Checked here, against this node's own list, so the message can name both.
      if (!node.devices.empty() && std::find(node.devices.begin(), node.devices.end(), *dev) == node.devices.end()) {
        std::string listed;
        for (const auto& nd : node.devices) listed += (listed.empty() ? "" : ", ") + nd.to_string();
        const std::string node_path = path.substr(0, path.find(".workers"));
        error(*d, f.path("device"), quote(d->Scalar()) + " is not in " + node_path + ".devices [" + listed + "]");
      }
    }
  }
  if (auto r = read_int(f, "replica", 0, INT32_MAX, false)) w->replica = static_cast<int32_t>(*r);
  if (!role_ok) return;

  const int32_t tp = topo_.models.target.tensor_parallel_size;
  if (w->role == WorkerRole::kTargetShard) {
    if (auto r = read_int(f, "rank", 0, tp - 1, false)) {
      w->rank = static_cast<int32_t>(*r);
    } else if (!f.get("rank") && tp > 1) {
      missing(f, "rank", "models.target.tensor_parallel_size is " + std::to_string(tp) +
                             ": each target_shard needs a rank in 0.." + std::to_string(tp - 1));
    }
  } else if (const YAML::Node* r = f.get("rank")) {
    error(*r, f.path("rank"),
          "applies only to role target_shard, not " + quote(worker_role_name(w->role)) + "; got " + describe(*r));
  }
  const std::string want = w->role == WorkerRole::kDraftWorker ? "speculative" : "target";
  if (auto m = read_string(f, "model", false)) {
    if (*m != want) {
      error(*f.get("model"), f.path("model"), "a " + std::string(worker_role_name(w->role)) + " runs models." + want +
                                                  ", got " + quote(*m));
    }
  }
  w->model = want;
  if (w->role == WorkerRole::kDraftWorker && !topo_.models.speculative) {
    error(*f.get("role"), f.path("role"), "'draft_worker' needs models.speculative, which is not set");
  }
}

void TopologyParser::parse_scheduler(const YAML::Node& n) {
  Fields f(*this, n, "scheduler", {"max_num_seqs", "max_num_batched_tokens", "block_size", "kv_cache_bytes"});
  SchedulerSpec& s = topo_.scheduler;
  if (auto v = read_int(f, "max_num_seqs", 1, INT32_MAX, false)) s.max_num_seqs = static_cast<int32_t>(*v);
  const auto batched = read_int(f, "max_num_batched_tokens", 1, INT32_MAX, false);
  if (batched) s.max_num_batched_tokens = static_cast<int32_t>(*batched);
  if (auto v = read_int(f, "block_size", 1, 1024, false)) s.block_size = static_cast<int32_t>(*v);
  if (auto v = read_byte_size(f, "kv_cache_bytes")) s.kv_cache_bytes = *v;
  if (s.max_num_batched_tokens < s.max_num_seqs) {
    const YAML::Node* at =
        batched ? f.get("max_num_batched_tokens") : (f.get("max_num_seqs") ? f.get("max_num_seqs") : &n);
    error(*at, "scheduler.max_num_batched_tokens",
          quote(std::to_string(s.max_num_batched_tokens)) + " is less than max_num_seqs " +
              quote(std::to_string(s.max_num_seqs)) + ": every running sequence needs at least one token per step");
  }
}

void TopologyParser::parse_autoscale(const YAML::Node& n, std::optional<int32_t>* max_replicas) {
  Fields f(*this, n, "autoscale",
           {"min_replicas", "max_replicas", "warm_pool", "upscale_delay_s", "downscale_delay_s"});
  AutoscaleSpec& a = topo_.autoscale;
  if (auto v = read_int(f, "min_replicas", 0, INT32_MAX, false)) a.min_replicas = static_cast<int32_t>(*v);
  if (auto v = read_int(f, "max_replicas", 1, INT32_MAX, false)) *max_replicas = static_cast<int32_t>(*v);
  if (auto v = read_int(f, "warm_pool", 0, INT32_MAX, false)) a.warm_pool = static_cast<int32_t>(*v);
  if (auto v = read_double(f, "upscale_delay_s", 0, false)) a.upscale_delay_s = *v;
  if (auto v = read_double(f, "downscale_delay_s", 0, false)) a.downscale_delay_s = *v;
  if (*max_replicas && a.min_replicas > **max_replicas) {
    error(f.get("min_replicas") ? *f.get("min_replicas") : *f.get("max_replicas"), "autoscale.min_replicas",
          quote(std::to_string(a.min_replicas)) + " is greater than max_replicas " +
              quote(std::to_string(**max_replicas)));
  }
}

// ---- cross-field checks, run once every field parsed cleanly

void TopologyParser::check_topology(const std::optional<int32_t>& explicit_max_replicas) {
  const int32_t tp = topo_.models.target.tensor_parallel_size;
  const std::string tp_path = "models.target.tensor_parallel_size";
  const std::string tp_shown = quote(std::to_string(tp)) + (explicit_.count(tp_path) ? "" : " (default)");

  // A GPU belongs to one worker; workers on the same machine share its CPU.
  // NOTE: keyed by machine, not by node entry, so two node entries on one host (as in
  // examples/cluster-two-nodes.yaml) cannot both claim cuda:0.
  std::map<std::pair<std::string, std::string>, std::string> device_owner;
  // replica -> rank -> first worker path
  std::map<int32_t, std::map<int32_t, std::string>> shards;
  std::map<int32_t, std::string> other_workers;  // replica -> path of a draft/prefill worker
  for (size_t i = 0; i < topo_.nodes.size(); ++i) {
    const NodeSpec& node = topo_.nodes[i];
    for (size_t j = 0; j < node.workers.size(); ++j) {
      const WorkerSpec& w = node.workers[j];
      const std::string wp = "nodes[" + std::to_string(i) + "].workers[" + std::to_string(j) + "]";
      if (w.device.kind == DeviceKind::kCuda) {
        auto key = std::make_pair(host_key(node.host), w.device.to_string());
        auto [it, inserted] = device_owner.emplace(key, wp);
        if (!inserted) {
          error_at(topo_.where(wp + ".device"), wp + ".device",
                   quote(w.device.to_string()) + " on host " + quote(node.host) + " is already given to " + it->second +
                       ": a GPU runs one worker");
        }
      }
      if (w.role == WorkerRole::kTargetShard) {
        auto [it, inserted] = shards[w.replica].emplace(w.rank, wp);
        if (!inserted) {
          const std::string rp = explicit_.count(wp + ".rank") ? wp + ".rank" : wp;
          error_at(topo_.where(rp), rp, "rank " + quote(std::to_string(w.rank)) + " of replica " +
                                            std::to_string(w.replica) + " is already taken by " + it->second);
        }
      } else {
        other_workers.emplace(w.replica, wp);
      }
    }
  }
  if (shards.empty()) {
    error_at(topo_.where("nodes"), "nodes",
             "no target_shard worker: a replica needs models.target.tensor_parallel_size " + tp_shown +
                 " target_shard workers (ranks 0.." + std::to_string(tp - 1) + ")");
  }
  for (const auto& [replica, ranks] : shards) {
    if (static_cast<int32_t>(ranks.size()) == tp) continue;
    std::string have, lack;
    for (const auto& [r, p] : ranks) have += (have.empty() ? "" : ", ") + std::to_string(r);
    for (int32_t r = 0; r < tp; ++r) {
      if (!ranks.count(r)) lack += (lack.empty() ? "" : ", ") + std::to_string(r);
    }
    error_at(topo_.where(tp_path), tp_path,
             tp_shown + " but replica " + std::to_string(replica) + " has " + std::to_string(ranks.size()) +
                 " target_shard worker(s) (ranks " + have + "); missing rank(s) " + lack);
  }
  for (const auto& [replica, wp] : other_workers) {
    if (!shards.count(replica)) {
      const std::string rp = explicit_.count(wp + ".replica") ? wp + ".replica" : wp;
      error_at(topo_.where(rp), rp, "replica " + quote(std::to_string(replica)) + " has no target_shard worker");
    }
  }

  // Remote nodes must be able to reach the head.
  for (size_t i = 0; i < topo_.nodes.size(); ++i) {
    const NodeSpec& node = topo_.nodes[i];
    if (!is_loopback_host(node.host) && is_loopback_host(topo_.head.host)) {
      const std::string p = "nodes[" + std::to_string(i) + "].host";
      topo_.notes.push_back(topo_.where(p) + ": " + p + ": " + quote(node.host) + " is not loopback but head.host " +
                            quote(topo_.head.host) + " is: a node on another machine cannot join this head");
    }
  }

  AutoscaleSpec& a = topo_.autoscale;
  const int32_t declared = static_cast<int32_t>(shards.size());
  if (explicit_max_replicas) {
    a.max_replicas = *explicit_max_replicas;
    if (declared > a.max_replicas) {
      error_at(topo_.where("autoscale.max_replicas"), "autoscale.max_replicas",
               quote(std::to_string(a.max_replicas)) + " is less than the " + std::to_string(declared) +
                   " replicas the nodes declare");
    }
  } else {
    a.max_replicas = std::max(a.min_replicas, std::max(declared, 1));
  }
}

Expected<Topology> TopologyParser::run(const std::string& yaml_text) {
  YAML::Node root;
  try {
    root = YAML::Load(yaml_text);
  } catch (const YAML::Exception& e) {
    return invalid_argument(loc(e.mark) + ": malformed YAML: " + e.msg);
  }
  if (root.IsNull()) return invalid_argument(file_ + ":1:1: (top level): the topology is empty");
  Fields top(*this, root, "", {"cluster", "head", "models", "nodes", "scheduler", "autoscale"});
  std::optional<int32_t> max_replicas;
  if (top.is_map()) {
    // Order matters: workers are checked against models (tensor_parallel_size, speculative).
    parse_cluster(top.get("cluster") ? *top.get("cluster") : YAML::Node(YAML::NodeType::Map));
    if (const YAML::Node* h = top.get("head")) parse_head(*h);
    if (const YAML::Node* m = top.get("models")) {
      parse_models(*m);
    } else {
      missing(top, "models", "at least models.target");
    }
    if (const YAML::Node* nd = top.get("nodes")) {
      parse_nodes(*nd);
    } else {
      missing(top, "nodes", "at least one node with a target_shard worker");
    }
    if (const YAML::Node* s = top.get("scheduler")) parse_scheduler(*s);
    if (const YAML::Node* a = top.get("autoscale")) parse_autoscale(*a, &max_replicas);
  }
  // NOTE: cross-field checks run only on a topology whose fields all parsed: on a broken one
  // they would mostly repeat the first error in other words.
  if (findings_.empty()) check_topology(max_replicas);
  if (findings_.empty()) return std::move(topo_);
  std::string msg;
  for (const Finding& fd : findings_) msg += (msg.empty() ? "" : "\n") + fd.text;
  return Status(findings_.front().code, msg);
}

}  // namespace

Expected<Topology> parse_topology(const std::string& yaml_text, const std::string& name_for_errors,
                                  const std::string& base_dir) {
  try {
    TopologyParser parser(name_for_errors, base_dir);
    return parser.run(yaml_text);
  } catch (const std::exception& e) {
    // yaml-cpp should not throw past the checks above; if it does, the user still gets a value.
    return internal_error(name_for_errors + ": unexpected error while reading the topology: " + e.what());
  }
}

Expected<Topology> load_topology_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return not_found(path + ": cannot read the topology file: " + std::strerror(errno));
  std::ostringstream ss;
  ss << in.rdbuf();
  std::error_code ec;
  fs::path abs = fs::absolute(fs::path(path), ec);
  const std::string base = (ec ? fs::path(path) : abs).parent_path().string();
  return parse_topology(ss.str(), path, base);
}

// ---------------------------------------------------------------- ports

Status check_ports_free(const Topology& topology) {
  const HeadSpec& head = topology.head;
  std::string problems;
  StatusCode code = StatusCode::kOk;
  for (const auto& [field, port] : {std::pair<std::string, int32_t>{"head.actor_port", head.actor_port},
                                    std::pair<std::string, int32_t>{"head.http_port", head.http_port}}) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    addrinfo* res = nullptr;
    const std::string service = std::to_string(port);
    const int gai = getaddrinfo(head.host.c_str(), service.c_str(), &hints, &res);
    auto add = [&](StatusCode c, const std::string& where, const std::string& text) {
      if (code == StatusCode::kOk) code = c;
      problems += (problems.empty() ? "" : "\n") + where + ": " + text;
    };
    if (gai != 0) {
      add(StatusCode::kInvalidArgument, topology.where("head.host"),
          "head.host: " + quote(head.host) + " does not resolve: " + gai_strerror(gai));
      break;
    }
    int err = 0;
    const int fd = ::socket(res->ai_family, res->ai_socktype | SOCK_CLOEXEC, res->ai_protocol);
    if (fd < 0) {
      err = errno;
    } else {
      // SO_REUSEADDR as the servers will set it: a port left in TIME_WAIT is free, a listener is not.
      const int one = 1;
      ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
      if (::bind(fd, res->ai_addr, res->ai_addrlen) != 0) err = errno;
      ::close(fd);
    }
    freeaddrinfo(res);
    if (err == 0) continue;
    const char* name = strerrorname_np(err);
    std::string why = std::string(name ? name : "errno " + std::to_string(err)) + ", " + std::strerror(err);
    if (err == EADDRINUSE) {
      why = "already in use (" + why + "): another process listens there; stop it or pick another port";
    }
    if (err == EADDRNOTAVAIL) why = "cannot bind (" + why + "): head.host is not an address of this machine";
    if (err == EACCES) why = "cannot bind (" + why + "): ports below 1024 need privileges";
    add(StatusCode::kUnavailable, topology.where(field),
        field + ": " + quote(std::to_string(port)) + " on " + head.host + ": " + why);
  }
  if (code == StatusCode::kOk) return Status();
  return Status(code, problems);
}

}  // namespace specserve
