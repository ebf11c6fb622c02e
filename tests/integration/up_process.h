// Shared by the multi-process cluster tests (tests/integration/cluster_*_test.cpp): `specserve
// up` on a topology in a temp folder (UpProcess), free ports, the prompts and greedy requests the
// tests use, and the wait for a replica that is generating.
#pragma once

#include <gtest/gtest.h>

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <thread>

#include "actors/client.h"
#include "cluster/process.h"
#include "cpu/cpu_backend.h"
#include "cpu/matmul.h"
#include "cpu/matmul_amx.h"
#include "model/model_loader.h"
#include "spec/engine.h"
#include "spec/ngram_proposer.h"
#include "tests/test_util.h"


namespace specserve::cluster_testing {

inline int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

inline std::map<std::string, std::string> with_omp_passive(std::map<std::string, std::string> env) {
  env["OMP_WAIT_POLICY"] = "PASSIVE";
  return env;
}

// A topology in a fresh temp folder, `up` started on it, the client connected.
class UpProcess {
 public:
  explicit UpProcess(const std::string& nodes_yaml, const std::string& speculative_yaml,
                     const std::string& kv_cache = "64MiB", std::map<std::string, std::string> env = {},
                     const std::string& target_extra = "", const std::string& scheduler_extra = "")
      : UpProcess(
            [&](const std::string& dir, int port, int http) {
              std::ostringstream y;
              y << "cluster: { name: test, token_file: " << dir << "/token }\n"
                << "head: { host: 127.0.0.1, actor_port: " << port << ", http_port: " << http << " }\n"
                << "models:\n  target: { path: " << testing::default_model_path() << ", max_model_len: 512" << target_extra
                << " }\n"
                << speculative_yaml << "nodes:\n" << nodes_yaml
                << "scheduler: { max_num_seqs: 8, kv_cache_bytes: " << kv_cache << scheduler_extra << " }\n";
              return y.str();
            },
            std::move(env)) {}
  // The caller's topology: `yaml(dir, actor_port, http_port)` is the file's text. The folder is
  // fresh (the caller may put files there first, e.g. the model); the token file must be
  // dir/token (connect() reads it there).
  using YamlMaker = std::function<std::string(const std::string& dir, int actor_port, int http_port)>;
  explicit UpProcess(const YamlMaker& yaml, std::map<std::string, std::string> env = {}) {
    dir_ = ::testing::TempDir() + "specserve_cluster_" + std::to_string(::getpid()) + "_" + std::to_string(counter_++);
    std::filesystem::create_directories(dir_);
    port_ = free_port();
    int http = free_port();
    while (http == port_) http = free_port();  // the kernel may hand the same free port out twice
    config_ = dir_ + "/cluster.yaml";
    std::ofstream(config_) << yaml(dir_, port_, http);
    ready_ = dir_ + "/ready";
    auto c = spawn_child({SPECSERVE_BIN, "up", config_, "--ready-file", ready_, "--threads-per-worker", "1",
                          "--drain-timeout", "30"},
                         with_omp_passive(std::move(env)), "up");
    EXPECT_TRUE(c.ok()) << c.status().to_string();
    up_ = *c;
  }
  ~UpProcess() {
    if (up_.pid > 0) {
      ::kill(up_.pid, SIGKILL);
      ::waitpid(up_.pid, nullptr, 0);
    }
    for (int pid : worker_pids_) ::kill(pid, SIGKILL);
    std::filesystem::remove_all(dir_);
  }
  // Waits for the ready file, then connects.
  Client* connect() {
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(180);
    while (!std::filesystem::exists(ready_) && std::chrono::steady_clock::now() < end) {
      int status = 0;
      if (::waitpid(up_.pid, &status, WNOHANG) == up_.pid) {
        ADD_FAILURE() << "specserve up exited before it was ready (status " << status << ")";
        up_.pid = -1;
        return nullptr;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    if (!std::filesystem::exists(ready_)) {
      ADD_FAILURE() << "specserve up was not ready within 180 s";
      return nullptr;
    }
    std::ifstream in(dir_ + "/token");
    std::getline(in, token_);
    auto c = Client::connect("127.0.0.1", static_cast<uint16_t>(port_), token_);
    EXPECT_TRUE(c.ok()) << c.status().to_string();
    if (!c.ok()) return nullptr;
    client_ = std::move(*c);
    auto st = client_->status();
    if (st.ok()) {
      for (const auto& w : st->workers) worker_pids_.push_back(w.pid);
    }
    return client_.get();
  }
  bool ready_file_exists() const { return std::filesystem::exists(ready_); }
  // SIGTERM, then the exit code (-1 when it did not exit within `seconds`).
  int terminate(double seconds) {
    client_.reset();
    ::kill(up_.pid, SIGTERM);
    return wait_exit(seconds);
  }
  // The exit code once `up` exits by itself (-1 when it did not within `seconds`).
  int wait_exit(double seconds) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    while (std::chrono::steady_clock::now() < end) {
      int status = 0;
      if (::waitpid(up_.pid, &status, WNOHANG) == up_.pid) {
        up_.pid = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return -1;
  }
  const std::vector<int>& worker_pids() const { return worker_pids_; }
  const std::string& token() const { return token_; }
  int port() const { return port_; }
  const std::string& config() const { return config_; }
  const std::string& dir() const { return dir_; }

 private:
  static inline int counter_ = 0;
  std::string dir_, config_, ready_, token_;
  int port_ = 0;
  Child up_;
  std::unique_ptr<Client> client_;
  std::vector<int> worker_pids_;
};

inline bool alive(int pid) { return ::kill(pid, 0) == 0; }

// Polls `cond` every 100 ms for up to `seconds`; its last value.
inline bool until(double seconds, const std::function<bool()>& cond) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < end) {
    if (cond()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return cond();
}
inline std::string read_token(const UpProcess& up) { return up.token(); }

inline std::vector<std::vector<int32_t>> prompt_ids() {
  static std::unique_ptr<Backend> backend = make_cpu_backend(1);
  auto f = GgufFile::open(testing::default_model_path());
  auto tok = Tokenizer::from_gguf(*f);
  const char* texts[] = {
      "The history of the Roman Empire begins with",
      "A recipe for pancakes: first, take",
      "The three laws of motion state that",
      "In a small village by the sea there lived",
  };
  std::vector<std::vector<int32_t>> out;
  for (const char* t : texts) out.push_back(tok->encode(t, true, false));
  return out;
}

inline GenerateRequest greedy(const std::vector<int32_t>& ids, int32_t n) { return testing::greedy_request(ids, n); }

// Polls status() until every replica has requests and has generated a few tokens (up to 120 s),
// then returns the pid of `replica`'s ready target shard; -1 if that never happens.
inline int target_shard_pid_once_generating(Client* c, int32_t replica) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (std::chrono::steady_clock::now() < end) {
    auto st = c->status();
    if (!st.ok()) return -1;
    bool all = !st->replicas.empty();
    for (const auto& r : st->replicas) all = all && r.assigned > 0 && r.load.generated_tokens >= 4;
    if (all) {
      for (const auto& w : st->workers) {
        if (w.role == "target_shard" && w.replica == replica && w.state == "ready") return w.pid;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return -1;
}

}  // namespace specserve::cluster_testing
