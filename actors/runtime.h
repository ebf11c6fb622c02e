// specserve actors: the actor system every specserve process runs, and the cluster token.
//
// One `ActorRuntime` per process: CAF 0.17's actor system with the I/O middleman loaded, the
// message types of actors/messages.h registered, and heartbeats on (CAF leaves them off, so a
// silent peer would go unnoticed): every `heartbeat_s` each connection carries a heartbeat,
// and a connection silent for `connection_timeout_s` is closed, which kills the proxies of its
// actors and delivers down messages to whoever monitors them.
#pragma once

#include <caf/all.hpp>
#include <caf/io/all.hpp>

#include <memory>
#include <string>

#include "core/status.h"

namespace specserve {

struct RuntimeOptions {
  double heartbeat_s = 1.0;           ///< > 0
  double connection_timeout_s = 5.0;  ///< > heartbeat_s
  int32_t scheduler_threads = 0;      ///< CAF worker threads; 0: CAF's default (cores)
  /// CAF's scheduler policy: "sharing" (workers block on one queue's condition variable) or
  /// "stealing" (CAF's default: idle workers poll, then sleep 50 us between polls for ~25 ms,
  /// then 10 ms). "" : $SPECSERVE_CAF_SCHEDULER when set, else "sharing".
  /// NOTE: sharing is the default because a polling worker competes for the cores with the
  /// engine's OpenMP threads after every message (bench/results/actors_*.md measures both).
  std::string scheduler_policy;
};

class ActorRuntime {
 public:
  explicit ActorRuntime(const RuntimeOptions& options = {});
  ~ActorRuntime();
  caf::actor_system& system() { return *system_; }
  caf::io::middleman& middleman() { return system_->middleman(); }

 private:
  caf::actor_system_config config_;
  std::unique_ptr<caf::actor_system> system_;
};

/// The shortest cluster token read_cluster_token accepts, in bytes.
inline constexpr size_t kMinClusterTokenChars = 16;

/// Reads the cluster token (first line, whitespace trimmed) from `path` (~ expanded).
/// Errors: kNotFound (missing, naming the path and how to create it), kInvalidArgument (empty,
/// shorter than kMinClusterTokenChars, a directory or another non-regular file, or readable by
/// group/others).
Expected<std::string> read_cluster_token(const std::string& path);

/// Reads the token at `path`, or creates it (32 random bytes as hex, mode 0600, parent folders
/// 0700) when the file does not exist.
Expected<std::string> ensure_cluster_token(const std::string& path);

/// Whether ensure_cluster_token could create a missing `path` (~ expanded), without creating
/// anything: the nearest existing folder above it must be a folder this process can write in,
/// on a writable file system other than /proc and /sys. Errors: kInvalidArgument "PATH: cannot
/// be created: FOLDER is not a folder / is in /proc or /sys / is not writable (why)".
Status check_cluster_token_creatable(const std::string& path);

/// Constant-time comparison of a presented token with the cluster's.
bool token_matches(const std::string& presented, const std::string& expected);

/// "host:port" -> (host, port). kInvalidArgument naming `field` and the value otherwise.
Expected<std::pair<std::string, uint16_t>> parse_host_port(const std::string& text, const std::string& field);

/// CAF error -> text, using the system's renderers.
std::string caf_error_text(caf::actor_system& sys, const caf::error& e);

}  // namespace specserve
