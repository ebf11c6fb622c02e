// Topology parsing: a section's keys (Fields: unknown and duplicate keys refused, with the
// nearest allowed name) and TopologyParser's typed readers of one field (string, integer, double,
// bool, byte size, name, host, model path), each recording a problem with its mark and the
// field's path instead of throwing. See topology_parse.cpp.
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <vector>

#include "config/topology.h"
#include "config/topology_internal.h"

namespace specserve {
namespace topology_internal {

namespace fs = std::filesystem;

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

namespace {

// A quoted scalar ("0.5", 'true') is a string in YAML (1.2, section 7.3): yaml-cpp tags it "!",
// a plain one "?"; `!!str 0.5` says so explicitly. Numeric and boolean fields refuse it rather than guess (a value written as
// "0.5" was taken as 0.5 before; a YAML loader in Python reads it as the string '0.5').
bool quoted(const YAML::Node& v) { return v.Tag() == "!" || v.Tag() == "tag:yaml.org,2002:str"; }

std::string quoted_message(const char* expected, const YAML::Node& v) {
  if (v.Tag() == "!") {
    return std::string("expected ") + expected + ", got the quoted string \"" + v.Scalar() +
           "\" (quotes make a string in YAML: write the value without them)";
  }
  return std::string("expected ") + expected + ", got the string \"" + v.Scalar() + "\" (tagged !!str: drop the tag)";
}

// Digits with an optional sign: an integer, whatever its size.
bool integer_text(const std::string& s) {
  size_t i = !s.empty() && (s[0] == '-' || s[0] == '+') ? 1 : 0;
  if (i == s.size()) return false;
  for (; i < s.size(); ++i) {
    if (s[i] < '0' || s[i] > '9') return false;
  }
  return true;
}

}  // namespace

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
  if (quoted(*v)) {
    error(*v, f.path(key), quoted_message("an integer", *v));
    return std::nullopt;
  }
  int64_t x = 0;
  if (!parse_int64(v->Scalar(), &x)) {
    if (integer_text(v->Scalar())) {  // past 64 bits
      error(*v, f.path(key), quote(v->Scalar()) + " is out of range " + std::to_string(min) + ".." + std::to_string(max));
      return std::nullopt;
    }
    error(*v, f.path(key), "expected an integer, got " + describe(*v));
    return std::nullopt;
  }
  if (x < min || x > max) {
    // NOTE: only a value below `min` gets the short form: 2147483648 for an int32 field used to
    // read "'2147483648' must be >= 0".
    if (x < min && (max == INT64_MAX || max == INT32_MAX)) {
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
  if (quoted(*v)) {
    error(*v, f.path(key), quoted_message("a number", *v));
    return std::nullopt;
  }
  const std::string& s = v->Scalar();
  char* end = nullptr;
  errno = 0;
  const double x = s.empty() ? 0.0 : std::strtod(s.c_str(), &end);
  if (!s.empty() && end == s.c_str() + s.size() && errno == ERANGE && !std::isfinite(x)) {
    error(*v, f.path(key), quote(s) + " is beyond the range of a double");
    return std::nullopt;
  }
  // (ERANGE with a finite result: an underflow, 1e-400 is 0 and 1e-310 a denormal: taken as read.)
  if (s.empty() || end != s.c_str() + s.size() || !std::isfinite(x)) {
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
  if (quoted(*v)) {
    error(*v, f.path(key), quoted_message("true or false", *v));
    return std::nullopt;
  }
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

}  // namespace topology_internal
}  // namespace specserve
