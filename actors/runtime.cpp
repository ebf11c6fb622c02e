#include "actors/runtime.h"

#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "actors/messages.h"
#include "core/logging.h"
#include "config/topology.h"

namespace specserve {

void add_message_types(caf::actor_system_config& cfg) { cfg.add_message_types<caf::id_block::specserve>(); }

ActorRuntime::ActorRuntime(const RuntimeOptions& o) {
  config_.load<caf::io::middleman>();
  add_message_types(config_);
  config_.set("middleman.heartbeat-interval",
              caf::timespan{static_cast<int64_t>(o.heartbeat_s * 1e9)});
  config_.set("middleman.connection-timeout",
              caf::timespan{static_cast<int64_t>(o.connection_timeout_s * 1e9)});
  config_.set("logger.console", caf::atom("none"));
  if (o.scheduler_threads > 0) config_.set("scheduler.max-threads", static_cast<size_t>(o.scheduler_threads));
  std::string policy = o.scheduler_policy;
  if (policy.empty()) {
    const char* env = std::getenv("SPECSERVE_CAF_SCHEDULER");
    policy = env && *env ? env : "sharing";
  }
  if (policy != "sharing" && policy != "stealing") {
    get_logger("actors")->warn("SPECSERVE_CAF_SCHEDULER / scheduler policy '{}': not sharing or stealing; using sharing", policy);
    policy = "sharing";
  }
  config_.set("scheduler.policy", policy == "sharing" ? caf::atom("sharing") : caf::atom("stealing"));
  // NOTE: the system waits for every actor when it is destroyed (CAF's default; destroying
  // live actors crashes in 0.17). Every actor here therefore monitors whatever it waits for:
  // request actors and workers the scheduler, client sinks the scheduler (and the Client kills
  // its sinks when destroyed).
  system_ = std::make_unique<caf::actor_system>(config_);
}

ActorRuntime::~ActorRuntime() = default;

namespace {
std::string trim(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return s.substr(b, e - b);
}
}  // namespace

Expected<std::string> read_cluster_token(const std::string& path_in) {
  auto path = expand_user_path(path_in);
  if (!path.ok()) return path.status();
  struct stat st {};
  if (::stat(path->c_str(), &st) != 0) {
    return not_found("cluster token file " + *path + ": " + std::strerror(errno) +
                     " (`specserve up` creates it; copy it to every host that joins)");
  }
  // NOTE: checked before the mode: for a directory (/tmp, mode 777) the mode advice below would
  // be "run chmod 600 on it", and a directory of mode 700 used to read as an "empty" token.
  if (S_ISDIR(st.st_mode)) {
    return invalid_argument("cluster token file " + *path + ": is a directory; name the file that holds the token");
  }
  if (!S_ISREG(st.st_mode)) {
    return invalid_argument("cluster token file " + *path + ": not a regular file (a device, FIFO or socket)");
  }
  if (st.st_mode & (S_IRWXG | S_IRWXO)) {
    return invalid_argument("cluster token file " + *path + ": readable by group or others (mode " +
                            [&] { std::ostringstream o; o << std::oct << (st.st_mode & 0777); return o.str(); }() +
                            "); run chmod 600 on it");
  }
  std::ifstream in(*path);
  std::string line;
  std::getline(in, line);
  line = trim(line);
  if (line.empty()) return invalid_argument("cluster token file " + *path + ": empty (the token is its first line)");
  // NOTE: the token is the actor port's only credential: a short one can be guessed.
  if (line.size() < kMinClusterTokenChars) {
    return invalid_argument("cluster token file " + *path + ": the token is " + std::to_string(line.size()) +
                            " bytes long; at least " + std::to_string(kMinClusterTokenChars) +
                            " are needed (on the head, delete the file and `specserve up` writes a random 64-character "
                            "one; copy that file to every host that joins)");
  }
  return line;
}

Status check_cluster_token_creatable(const std::string& path_in) {
  auto path = expand_user_path(path_in);
  if (!path.ok()) return path.status();
  std::error_code ec;
  std::filesystem::path dir = std::filesystem::absolute(*path, ec).parent_path();
  if (ec || dir.empty()) dir = std::filesystem::path(*path).parent_path();
  if (dir.empty()) dir = ".";
  while (!std::filesystem::exists(dir, ec) && dir.has_parent_path() && dir.parent_path() != dir) dir = dir.parent_path();
  if (!std::filesystem::is_directory(dir, ec)) return invalid_argument(*path + ": cannot be created: " + dir.string() + " is not a folder");
  // /proc and /sys first: they refuse new folders whatever access() says (root passes it there).
  struct statfs fs {};
  constexpr long kProcMagic = 0x9fa0, kSysfsMagic = 0x62656572;  // linux/magic.h
  if (::statfs(dir.c_str(), &fs) == 0 && (fs.f_type == kProcMagic || fs.f_type == kSysfsMagic)) {
    return invalid_argument(*path + ": cannot be created: " + dir.string() + " is in /proc or /sys");
  }
  // access() also answers EROFS for a read-only mount, to root as well.
  if (::access(dir.c_str(), W_OK | X_OK) != 0) {
    return invalid_argument(*path + ": cannot be created: " + dir.string() + " is not writable (" + std::strerror(errno) + ")");
  }
  return Status();
}

Expected<std::string> ensure_cluster_token(const std::string& path_in) {
  auto path = expand_user_path(path_in);
  if (!path.ok()) return path.status();
  if (std::filesystem::exists(*path)) return read_cluster_token(*path);
  std::error_code ec;
  const auto dir = std::filesystem::path(*path).parent_path();
  if (!dir.empty() && !std::filesystem::exists(dir)) {
    std::filesystem::create_directories(dir, ec);
    if (ec) return unavailable("cluster token file " + *path + ": cannot create " + dir.string() + ": " + ec.message());
    ::chmod(dir.c_str(), 0700);
  }
  std::random_device rd;
  static const char* hex = "0123456789abcdef";
  std::string tok;
  for (int i = 0; i < 32; ++i) {
    const unsigned v = rd() & 0xffu;
    tok += hex[v >> 4];
    tok += hex[v & 15];
  }
  const mode_t old = ::umask(077);
  {
    std::ofstream out(*path);
    out << tok << "\n";
    if (!out) {
      ::umask(old);
      return unavailable("cluster token file " + *path + ": cannot write: " + std::strerror(errno));
    }
  }
  ::umask(old);
  ::chmod(path->c_str(), 0600);
  return tok;
}

bool token_matches(const std::string& presented, const std::string& expected) {
  unsigned diff = static_cast<unsigned>(presented.size() ^ expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    diff |= static_cast<unsigned char>(expected[i]) ^ static_cast<unsigned char>(i < presented.size() ? presented[i] : 0);
  }
  return diff == 0 && !expected.empty();
}

Expected<std::pair<std::string, uint16_t>> parse_host_port(const std::string& text, const std::string& field) {
  const size_t colon = text.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == text.size()) {
    return invalid_argument(field + ": '" + text + "' is not HOST:PORT");
  }
  std::string host = text.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  const std::string port_s = text.substr(colon + 1);
  long port = 0;
  for (char c : port_s) {
    if (c < '0' || c > '9') return invalid_argument(field + ": port '" + port_s + "' in '" + text + "' is not a number");
    port = port * 10 + (c - '0');
    if (port > 65535) break;
  }
  if (port < 1 || port > 65535) return invalid_argument(field + ": port '" + port_s + "' in '" + text + "' is not in 1..65535");
  return std::make_pair(host, static_cast<uint16_t>(port));
}

std::string caf_error_text(caf::actor_system& sys, const caf::error& e) { return sys.render(e); }

}  // namespace specserve
