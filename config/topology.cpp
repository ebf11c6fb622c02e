// Topology: names of the enums, Topology's queries, the public helpers (byte sizes, devices,
// ~ paths, loopback hosts) and the entry points parse_topology / load_topology_file.
// The YAML walk is in topology_parse.cpp, the cross-field checks and the port probe in
// topology_validate.cpp.
//
// NOTE: yaml-cpp throws (parse errors, bad conversions). Exceptions stay inside these files:
// parse errors are caught at Load, and the walk itself never calls a throwing accessor on a
// node whose type it has not checked; a catch-all (parse_topology, here) still turns a
// surprise into a Status.
#include "config/topology.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pwd.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "config/topology_internal.h"

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

namespace topology_internal {

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

std::string fraction_text(double x) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.6g", x);
  return buf;
}

}  // namespace topology_internal

using topology_internal::lower;
using topology_internal::parse_int64;
using topology_internal::quote;
using topology_internal::TopologyParser;

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

// ---------------------------------------------------------------- entry points

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

Expected<TopologySource> read_topology_source(const std::string& path) {
  std::error_code dir_ec;
  if (fs::is_directory(path, dir_ec)) return invalid_argument(path + ": is a directory, not a topology file (a YAML file such as examples/cluster-local.yaml)");
  std::ifstream in(path, std::ios::binary);
  if (!in) return not_found(path + ": cannot read the topology file: " + std::strerror(errno));
  std::ostringstream ss;
  ss << in.rdbuf();
  std::error_code ec;
  fs::path abs = fs::absolute(fs::path(path), ec);
  TopologySource src;
  src.path = path;
  src.absolute_path = (ec ? fs::path(path) : abs).lexically_normal().string();
  src.base_dir = (ec ? fs::path(path) : abs).parent_path().string();
  src.text = ss.str();
  return src;
}

namespace {

Expected<Topology> load_topology(const std::string& path, bool endpoint_only) {
  auto src = read_topology_source(path);
  if (!src.ok()) return src.status();
  if (!endpoint_only) return parse_topology(src->text, path, src->base_dir);
  try {
    TopologyParser parser(path, src->base_dir);
    return parser.run(src->text, /*endpoint_only=*/true);
  } catch (const std::exception& e) {
    return internal_error(path + ": unexpected error while reading the topology: " + e.what());
  }
}

}  // namespace

Expected<Topology> load_topology_file(const std::string& path) { return load_topology(path, false); }

Expected<Topology> load_topology_endpoint(const std::string& path) { return load_topology(path, true); }

std::string describe_speculative(const Topology& t) {
  if (!t.models.speculative) return "none (plain decoding)";
  const SpeculativeSpec& sp = *t.models.speculative;
  std::string s = std::string(speculative_method_name(sp.method)) + ", num_speculative_tokens " + std::to_string(sp.num_speculative_tokens);
  if (!sp.model.empty()) s += ", model " + sp.model;
  if (sp.max_model_len) s += ", draft max_model_len " + std::to_string(*sp.max_model_len);
  if (sp.draft_p_min) {
    char v[32];
    std::snprintf(v, sizeof v, "%g", static_cast<double>(*sp.draft_p_min));
    s += std::string(", draft_p_min ") + v;
  }
  if (sp.disable_by_goodput) s += ", disable_by_goodput";
  if (sp.method == SpeculativeMethod::kNgram) {
    s += ", prompt_lookup " + std::to_string(sp.prompt_lookup_min) + ".." + std::to_string(sp.prompt_lookup_max);
  } else if (sp.lookup_first) {
    s += ", prompt lookup first " + std::to_string(sp.prompt_lookup_min) + ".." + std::to_string(sp.prompt_lookup_max);
  }
  if (sp.lookup_cached_requests > 0) s += ", lookup_cached_requests " + std::to_string(sp.lookup_cached_requests);
  return s;
}

}  // namespace specserve
