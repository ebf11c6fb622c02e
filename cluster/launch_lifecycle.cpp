// specserve cluster: the head-side launch lifecycle of `up` and `serve` (see launch_lifecycle.h):
// WorkerLauncher, waiting for ready replicas, the ready file and status lines, and shut-down.
#include "cluster/launch_lifecycle.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "actors/messages.h"
#include "core/logging.h"

namespace specserve {

int32_t default_threads(int32_t workers_here) {
  const int32_t cores = static_cast<int32_t>(std::max(1u, std::thread::hardware_concurrency()));
  return std::max(1, cores / std::max(1, workers_here));
}

Status WorkerLauncher::request(int32_t replica) {
  if (!has_local_workers(replica)) {
    return unavailable("replica " + std::to_string(replica) +
                       " has no worker on a node of this host: start its node there (specserve node --join)");
  }
  std::lock_guard<std::mutex> lock(mu_);
  queued_.emplace_back(replica, ++generation_[replica]);
  return Status();
}

WorkerLauncher::~WorkerLauncher() {
  if (reason_dir_.empty()) return;
  std::error_code ec;
  std::filesystem::remove_all(reason_dir_, ec);
}

std::string WorkerLauncher::reason_file() {
  if (reason_dir_.empty()) {
    const char* tmp = std::getenv("TMPDIR");
    std::string tmpl = std::string(tmp && *tmp ? tmp : "/tmp") + "/specserve-up-XXXXXX";
    if (::mkdtemp(tmpl.data()) == nullptr) return {};
    reason_dir_ = tmpl;
  }
  return reason_dir_ + "/worker-" + std::to_string(++reason_files_) + ".reason";
}

void WorkerLauncher::pump(const std::string& endpoint, std::vector<std::string>* exited) {
  for (const ChildExit& e : reap_child_exits(&children_)) {
    auto it = owner_.find(e.child.pid);
    const std::string reason = it == owner_.end() ? std::string() : take_exit_reason(it->second.reason_file);
    const std::string line = e.line + (reason.empty() ? "" : ": " + reason);
    if (exited) exited->push_back(line);
    if (it == owner_.end()) continue;
    const Owner o = it->second;
    owner_.erase(it);
    bool latest = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      latest = generation_[o.replica] == o.generation;  // not started again since: the exit is news
    }
    if (latest) report(o.replica, line, /*permanent=*/!e.signaled && e.code == kExitConfig);
  }
  std::vector<std::pair<int32_t, int64_t>> q;
  {
    std::lock_guard<std::mutex> lock(mu_);
    q.swap(queued_);
  }
  for (const auto& [replica, gen] : q) spawn(replica, gen, endpoint);
}

bool WorkerLauncher::has_local_workers(int32_t replica) const {
  for (const NodeSpec& n : topo_.nodes) {
    if (!local(n)) continue;
    for (const WorkerSpec& w : n.workers) {
      if (w.replica == replica) return true;
    }
  }
  return false;
}

void WorkerLauncher::report(int32_t replica, const std::string& why, bool permanent) {
  // Info: the head decides whether it matters (a retired worker's exit does not).
  get_logger("cluster")->info("replica {}: {}", replica, why);
  if (scheduler_) caf::anon_send(scheduler_, launch_err_atom::value, replica, why, permanent);
}

void WorkerLauncher::spawn(int32_t replica, int64_t gen, const std::string& endpoint) {
  // NOTE: never two processes of one replica (they would share its device and KV budget):
  // the head waits for a retired worker's down message, which can come before its process
  // has exited; the start is refused and the head retries after a backoff.
  for (const auto& [pid, owner] : owner_) {
    if (owner.replica == replica) {
      report(replica, "cannot start it: its worker pid " + std::to_string(pid) + " has not exited yet");
      return;
    }
  }
  for (const NodeSpec& n : topo_.nodes) {
    if (!local(n)) continue;
    const int32_t threads = threads_per_worker_ > 0 ? threads_per_worker_
                                                    : default_threads(static_cast<int32_t>(n.workers.size()));
    for (size_t j = 0; j < n.workers.size(); ++j) {
      const WorkerSpec& w = n.workers[j];
      if (w.replica != replica) continue;
      std::vector<std::string> argv = {self_executable(), "worker", "--join", endpoint, "--node", n.name, "--config",
                                       config_path_, "--index", std::to_string(j), "--threads", std::to_string(threads)};
      const std::string name = "worker " + n.name + "/" + std::to_string(j) + " " + worker_role_name(w.role) +
                               " (replica " + std::to_string(replica) + ")";
      const std::string reason = reason_file();
      std::map<std::string, std::string> env = env_;
      env["OMP_WAIT_POLICY"] = "PASSIVE";
      if (!reason.empty()) env[kExitReasonFileEnv] = reason;
      auto c = spawn_child(argv, env, name);
      if (!c.ok()) {
        report(replica, "cannot start " + name + ": " + c.status().message());
        continue;
      }
      get_logger("cluster")->info("started {} (pid {})", name, c->pid);
      children_.push_back(*c);
      owner_[c->pid] = Owner{replica, gen, reason};
    }
  }
}

bool wait_ready(Client& client, size_t replicas, double timeout_s, bool* failed, std::vector<Child>* children,
                WorkerLauncher* launcher, const std::string& endpoint) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  std::string last;
  while (std::chrono::steady_clock::now() < end && !stop_requested()) {
    if (launcher) {
      // A worker of an autoscaled replica that exits is reported to the head, which starts the
      // replica again (with a backoff): not a reason to give up the launch.
      std::vector<std::string> exited;
      launcher->pump(endpoint, &exited);
      for (const auto& line : exited) get_logger("cluster")->warn("{}", line);
    }
    if (children && !launcher) {
      auto exited = reap_children(children);
      if (!exited.empty()) {
        for (const auto& line : exited) std::fprintf(stderr, "specserve: %s before the cluster was ready\n", line.c_str());
        *failed = true;
        return false;
      }
    }
    auto st = client.status(std::chrono::seconds(5));
    if (st.ok()) {
      size_t ready = 0;
      for (const auto& r : st->replicas) ready += r.ready;
      for (const auto& w : st->workers) {
        if (w.state == "failed") {
          std::fprintf(stderr, "specserve: worker %s of replica %d on node %s failed: %s\n", w.role.c_str(), w.replica,
                       w.node.c_str(), w.error.c_str());
          *failed = true;
          return false;
        }
      }
      std::string line = "waiting for replicas: " + std::to_string(ready) + "/" + std::to_string(replicas) + " ready, " +
                         std::to_string(st->workers.size()) + " worker(s) registered";
      if (line != last) std::fprintf(stderr, "specserve: %s\n", line.c_str());
      last = line;
      if (ready >= replicas) return true;
    }
    if (!launcher) {
      wait_for_stop(0.25);
      continue;
    }
    for (int i = 0; i < 5 && !stop_requested(); ++i) {
      std::vector<std::string> exited;
      launcher->pump(endpoint, &exited);
      for (const auto& line : exited) get_logger("cluster")->warn("{}", line);
      wait_for_stop(0.05);
    }
  }
  return false;
}

void remove_ready_file(const std::string& path) {
  if (!path.empty()) std::remove(path.c_str());
}

Status write_ready_file(const std::string& path, const std::string& endpoint) {
  if (path.empty()) return Status();
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp);
    out << endpoint << "\n";
    out.close();
    if (!out) {
      const std::string why = std::strerror(errno);
      std::remove(tmp.c_str());
      return unavailable("--ready-file " + path + ": cannot write " + tmp + ": " + why);
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    std::remove(tmp.c_str());
    return unavailable("--ready-file " + path + ": cannot write: " + why);
  }
  return Status();
}

void print_status_line(Client& client) {
  auto st = client.status(std::chrono::seconds(5));
  if (!st.ok()) return;
  for (const auto& w : st->workers) {
    std::fprintf(stderr, "  %-13s replica %d rank %d on %-8s pid %-7d %-8s load %.2f s  warm-up %.2f s  %s\n", w.role.c_str(),
                 w.replica, w.rank, w.node.c_str(), w.pid, w.state.c_str(), w.load_seconds, w.warmup_seconds,
                 w.compute.c_str());
  }
}

void shut_down(Head& head, std::vector<Child>* children, double drain_timeout_s, std::shared_ptr<void>* front_end) {
  std::fprintf(stderr, "specserve: stopping: draining in-flight requests (up to %.0f s; Ctrl-C again to stop now)...\n",
               drain_timeout_s);
  // A second SIGINT/SIGTERM ends the wait (as vLLM's, uvicorn's and Ray's second Ctrl-C does):
  // the requests still running are cut off as at the drain timeout. NOTE: it was ignored, and
  // `up` waited for the longest request.
  const int signals = stop_signal_count();
  Status st = head.drain(std::chrono::milliseconds(static_cast<int64_t>(drain_timeout_s * 1000)),
                         [signals] { return stop_signal_count() > signals; });
  if (st.code() == StatusCode::kCancelled) {
    std::fprintf(stderr, "specserve: a second stop signal: stopping now\n");
  } else if (!st.ok()) {
    std::fprintf(stderr, "specserve: %s; stopping anyway\n", st.message().c_str());
  }
  if (front_end) front_end->reset();
  head.stop();
  // NOTE: longer than a node gives its workers (10 s), so a node is never killed before it has
  // stopped its workers (which would orphan a worker still finishing a step).
  if (children) stop_children(children, 15.0);
  std::fprintf(stderr, "specserve: stopped\n");
}

}  // namespace specserve
