#include "cluster/process.h"

#include <signal.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <thread>

extern char** environ;

namespace specserve {
namespace {
std::atomic<bool> g_stop{false};
std::atomic<int> g_signals{0};
void on_signal(int) {
  g_stop.store(true);
  g_signals.fetch_add(1);
}
}  // namespace

void install_stop_signals() {
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);
  ::signal(SIGPIPE, SIG_IGN);
}

bool stop_requested() { return g_stop.load(); }

int stop_signal_count() { return g_signals.load(); }

bool wait_for_stop(double seconds) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < end) {
    if (g_stop.load()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return g_stop.load();
}

bool exit_with_parent() {
  const pid_t parent = ::getppid();
  ::prctl(PR_SET_PDEATHSIG, SIGTERM);
  return ::getppid() == parent && parent != 1;
}

std::string self_executable() {
  char buf[PATH_MAX];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return "specserve";
  buf[n] = 0;
  return buf;
}

Expected<Child> spawn_child(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env,
                            const std::string& name) {
  std::vector<std::string> env_strings;
  for (char** e = environ; *e; ++e) {
    std::string kv = *e;
    const std::string key = kv.substr(0, kv.find('='));
    if (!env.count(key)) env_strings.push_back(kv);
  }
  for (const auto& [k, v] : env) env_strings.push_back(k + "=" + v);
  std::vector<char*> cargv, cenv;
  for (const auto& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  for (const auto& e : env_strings) cenv.push_back(const_cast<char*>(e.c_str()));
  cenv.push_back(nullptr);
  // The child must not inherit our SIGINT/SIGTERM handlers' ignored state; defaults are fine.
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t def;
  sigemptyset(&def);
  sigaddset(&def, SIGPIPE);
  posix_spawnattr_setsigdefault(&attr, &def);
  // Own process group: a terminal's Ctrl-C reaches only the launcher, which drains first and
  // then stops its children itself.
  posix_spawnattr_setpgroup(&attr, 0);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETPGROUP);
  pid_t pid = -1;
  const int rc = ::posix_spawn(&pid, cargv[0], nullptr, &attr, cargv.data(), cenv.data());
  posix_spawnattr_destroy(&attr);
  if (rc != 0) return unavailable("cannot start " + name + " (" + argv[0] + "): " + std::strerror(rc));
  return Child{pid, name};
}

void signal_children(const std::vector<Child>& children, int sig) {
  for (const Child& c : children) {
    if (c.pid > 0) ::kill(c.pid, sig);
  }
}

std::vector<ChildExit> reap_child_exits(std::vector<Child>* children) {
  std::vector<ChildExit> out;
  for (auto it = children->begin(); it != children->end();) {
    int status = 0;
    const pid_t r = ::waitpid(it->pid, &status, WNOHANG);
    if (r == it->pid) {
      ChildExit e;
      e.child = *it;
      e.signaled = WIFSIGNALED(status);
      e.code = WIFEXITED(status) ? WEXITSTATUS(status) : e.signaled ? WTERMSIG(status) : -1;
      const std::string how = WIFEXITED(status) ? "exited with code " + std::to_string(e.code)
                              : e.signaled      ? std::string("was killed by signal ") + std::to_string(e.code)
                                                : "stopped";
      e.line = it->name + " (pid " + std::to_string(it->pid) + ") " + how;
      out.push_back(std::move(e));
      it = children->erase(it);
    } else {
      ++it;
    }
  }
  return out;
}

std::vector<std::string> reap_children(std::vector<Child>* children) {
  std::vector<std::string> lines;
  for (auto& e : reap_child_exits(children)) lines.push_back(std::move(e.line));
  return lines;
}

void stop_children(std::vector<Child>* children, double grace_s) {
  signal_children(*children, SIGTERM);
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(grace_s);
  while (!children->empty() && std::chrono::steady_clock::now() < end) {
    reap_children(children);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  signal_children(*children, SIGKILL);
  for (const Child& c : *children) {
    int status = 0;
    ::waitpid(c.pid, &status, 0);
  }
  children->clear();
}

void record_exit_reason(const std::string& why) {
  const char* path = std::getenv(kExitReasonFileEnv);
  if (path == nullptr || *path == '\0') return;
  std::ofstream out(path, std::ios::trunc);
  out << why << "\n";
}

std::string take_exit_reason(const std::string& path) {
  if (path.empty()) return {};
  std::string text;
  {
    std::ifstream in(path, std::ios::binary);
    if (!in) return {};
    text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  std::remove(path.c_str());
  if (text.size() > 2000) text.resize(2000);
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
  for (size_t at = text.find('\n'); at != std::string::npos; at = text.find('\n', at)) text.replace(at, 1, "; ");
  return text;
}

}  // namespace specserve
