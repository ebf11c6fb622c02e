#include "cluster/node_supervisor.h"

#include <csignal>

#include <algorithm>

#include "core/logging.h"

namespace specserve {

bool should_restart_worker(const ChildExit& e, int32_t restarts_done, int32_t max_restarts) {
  if (!e.signaled && e.code == kExitLostHead) return restarts_done < max_restarts;  // lost the head: join again
  if (!e.signaled) return false;                          // it exited on its own
  if (e.code == SIGTERM || e.code == SIGINT) return false;  // someone asked it to stop
  return restarts_done < max_restarts;
}

double worker_restart_backoff_s(int32_t restarts_done) {
  double s = 1.0;
  for (int32_t i = 0; i < restarts_done && s < 30.0; ++i) s *= 2.0;
  return std::min(s, 30.0);
}

Status NodeSupervisor::start(std::vector<SupervisedWorker> workers) {
  workers_ = std::move(workers);
  restarts_done_.assign(workers_.size(), 0);
  for (size_t i = 0; i < workers_.size(); ++i) {
    auto c = spawn_child(workers_[i].argv, workers_[i].env, workers_[i].name);
    if (!c.ok()) return c.status();
    index_of_pid_[c->pid] = i;
    running_.push_back(*c);
  }
  return Status();
}

void NodeSupervisor::pump(bool* failed) {
  auto log = get_logger("cluster");
  for (const ChildExit& e : reap_child_exits(&running_)) {
    const auto it = index_of_pid_.find(e.child.pid);
    if (it == index_of_pid_.end()) continue;
    const size_t i = it->second;
    index_of_pid_.erase(it);
    const SupervisedWorker& w = workers_[i];
    if (w.restartable && should_restart_worker(e, restarts_done_[i], max_restarts_)) {
      const double wait_s = worker_restart_backoff_s(restarts_done_[i]);
      log->warn("node {}: {}; restarting it in {:.0f} s (restart {} of at most {}, scheduler.worker_restarts)", node_,
                e.line, wait_s, restarts_done_[i] + 1, max_restarts_);
      pending_.push_back({i, std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                                                    std::chrono::duration<double>(wait_s))});
      continue;
    }
    if (e.signaled || e.code != 0) {
      *failed = true;
      std::string why;
      if (!w.restartable && e.signaled) {
        why = " (a tensor-parallel rank: not restarted)";
      } else if (e.signaled && e.code != SIGTERM && e.code != SIGINT && max_restarts_ > 0) {
        why = " (no restart left: scheduler.worker_restarts " + std::to_string(max_restarts_) + ")";
      }
      log->warn("node {}: {}{}", node_, e.line, why);
    } else {
      log->info("node {}: {}", node_, e.line);
    }
  }
  const auto now = std::chrono::steady_clock::now();
  for (auto p = pending_.begin(); p != pending_.end();) {
    if (p->due > now) {
      ++p;
      continue;
    }
    const size_t i = p->index;
    p = pending_.erase(p);
    auto c = spawn_child(workers_[i].argv, workers_[i].env, workers_[i].name);
    if (!c.ok()) {
      log->warn("node {}: cannot restart {}: {}", node_, workers_[i].name, c.status().message());
      *failed = true;
      continue;
    }
    ++restarts_done_[i];
    ++total_restarts_;
    index_of_pid_[c->pid] = i;
    running_.push_back(*c);
    log->info("node {}: restarted {} (pid {})", node_, workers_[i].name, c->pid);
  }
}

void NodeSupervisor::stop(double grace_s) {
  pending_.clear();
  stop_children(&running_, grace_s);
  index_of_pid_.clear();
}

}  // namespace specserve
