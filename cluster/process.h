// specserve cluster: child processes and stop signals for the launcher commands.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <map>
#include <string>
#include <vector>

#include "core/status.h"

namespace specserve {

/// Installs SIGINT/SIGTERM handlers that set the flag returned by stop_requested() (and SIGPIPE
/// ignored). Idempotent.
void install_stop_signals();
/// True once SIGINT or SIGTERM arrived.
bool stop_requested();
/// How many SIGINT/SIGTERM the handlers of install_stop_signals have seen (a second one during a drain
/// stops at once: shut_down).
int stop_signal_count();
/// Sleeps up to `seconds`, returning early (true) when a stop signal arrives.
bool wait_for_stop(double seconds);

/// Asks the kernel to send SIGTERM to this process when its parent dies (Linux
/// PR_SET_PDEATHSIG), so children of a killed launcher do not linger. Returns false when the
/// parent is already gone.
bool exit_with_parent();

/// This executable's path (/proc/self/exe).
std::string self_executable();

/// A child process started by `spawn_child`.
struct Child {
  pid_t pid = -1;
  std::string name;  ///< for logs: "node node0", "worker node0/1 target_shard"
};

/// Starts `argv` (argv[0] is the program path) with `env` added to this process's environment.
/// Errors: kUnavailable with errno's text.
Expected<Child> spawn_child(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env,
                            const std::string& name);
/// Sends `sig` to every child still running.
void signal_children(const std::vector<Child>& children, int sig);
/// How a reaped child ended.
struct ChildExit {
  Child child;
  bool signaled = false;  ///< killed by a signal (then `code` is the signal number)
  int code = 0;           ///< exit code, or the signal number
  std::string line;       ///< "<name> (pid N) exited with code C" / "... was killed by signal S"
};
/// Reaps children that exited (non-blocking), removing them from *children.
std::vector<ChildExit> reap_child_exits(std::vector<Child>* children);
/// The same, one line per exit ("<name> (pid N) exited with code C").
std::vector<std::string> reap_children(std::vector<Child>* children);
/// SIGTERM, wait up to `grace_s`, then SIGKILL what is left; reaps all.
void stop_children(std::vector<Child>* children, double grace_s);

/// The exit status of a worker that failed before it registered for a reason a retry cannot
/// mend: bad input (its topology entry, a model or token file missing or malformed, a dtype its
/// device cannot run; EX_CONFIG of sysexits.h). The autoscaler parks such a replica at once
/// (actors/scheduler_lifecycle.cpp: the queue does not wait for it); a worker that failed for
/// what may pass (the head not reachable yet, a device that did not answer) exits 1 and is retried.
inline constexpr int kExitConfig = 78;

/// Names the file where a child process leaves the one-line reason it failed (the launcher
/// sets it for each worker it starts, and shows the reason in `status` and in the errors of the
/// requests that waited for it).
inline constexpr const char* kExitReasonFileEnv = "SPECSERVE_EXIT_REASON_FILE";
/// Writes `why` to the file named by kExitReasonFileEnv, if set (best effort: a launcher that
/// finds nothing reports the exit code alone).
void record_exit_reason(const std::string& why);
/// The reason left in `path` (its first 2,000 bytes, newlines as "; "), "" when there is none;
/// removes the file.
std::string take_exit_reason(const std::string& path);

}  // namespace specserve
