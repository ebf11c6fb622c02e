// Elastic serving with real processes on loopback: `specserve up` with min_replicas 1,
// max_replicas 3, warm_pool 1 and short delays on the default model (plain decoding). A bounded
// burst through the client API scales the cluster up by promoting the standby replica (and the
// pool is refilled by a cold start); after the burst it returns to one ready replica; no request
// fails, each finishes with all its tokens, greedy output equal to the target alone.
// No timing assertions: the waits are bounds, the measured times are only checked to exist.
#include <gtest/gtest.h>

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <filesystem>
#include <fstream>
#include <map>
#include <thread>

#include "actors/client.h"
#include "cluster/process.h"
#include "model/gguf.h"
#include "model/tokenizer.h"
#include "tests/test_util.h"

namespace specserve {
namespace {

int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

std::map<std::string, int> count_states(const ClusterStatus& st) {
  std::map<std::string, int> n;
  for (const auto& r : st.replicas) ++n[r.state];
  return n;
}

TEST(Autoscale, BurstScalesUpByPromotionAndBackToMinWithNoFailedRequest) {
  const std::string dir = ::testing::TempDir() + "specserve_autoscale_" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  const int port = free_port();
  const std::string config = dir + "/cluster.yaml";
  std::ofstream(config)
      << "cluster: { name: autoscale-test, token_file: " << dir << "/token }\n"
      << "head: { host: 127.0.0.1, actor_port: " << port << ", http_port: " << free_port() << " }\n"
      << "models:\n  target: { path: " << testing::default_model_path() << ", max_model_len: 256 }\n"
      << "nodes:\n  - name: n0\n    host: 127.0.0.1\n    devices: [cpu]\n    workers:\n"
      << "      - { role: target_shard, replica: 0, device: cpu }\n"
      << "      - { role: target_shard, replica: 1, device: cpu }\n"
      << "      - { role: target_shard, replica: 2, device: cpu }\n"
      << "scheduler: { max_num_seqs: 2, kv_cache_bytes: 8MiB }\n"
      << "autoscale: { min_replicas: 1, max_replicas: 3, warm_pool: 1, upscale_delay_s: 1, downscale_delay_s: 3,\n"
      << "             target_ongoing_requests: 2 }\n";
  const std::string ready = dir + "/ready";
  auto up = spawn_child({SPECSERVE_BIN, "up", config, "--ready-file", ready, "--threads-per-worker", "1", "--drain-timeout",
                         "30"},
                        {{"OMP_WAIT_POLICY", "PASSIVE"}}, "up");
  ASSERT_TRUE(up.ok()) << up.status().to_string();
  struct Cleanup {
    pid_t pid;
    std::string dir;
    ~Cleanup() {
      if (pid > 0 && ::kill(pid, 0) == 0) {
        ::kill(pid, SIGKILL);
        ::waitpid(pid, nullptr, 0);
      }
      std::filesystem::remove_all(dir);
    }
  } cleanup{up->pid, dir};

  auto until = [](double seconds, const std::function<bool()>& cond) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    while (std::chrono::steady_clock::now() < end) {
      if (cond()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return cond();
  };
  ASSERT_TRUE(until(120, [&] { return std::filesystem::exists(ready); })) << "specserve up was not ready within 120 s";
  std::string token;
  std::getline(std::ifstream(dir + "/token"), token);
  auto client = Client::connect("127.0.0.1", static_cast<uint16_t>(port), token);
  ASSERT_TRUE(client.ok()) << client.status().to_string();
  Client& c = **client;

  // Start-up: min_replicas ready and the warm pool's standby replica loaded; the third declared
  // replica is not started.
  ClusterStatus st;
  ASSERT_TRUE(until(60, [&] {
    auto s = c.status();
    if (s.ok()) st = *s;
    auto n = count_states(st);
    return s.ok() && n["ready"] == 1 && n["standby"] == 1;
  })) << "no standby replica after start-up";
  EXPECT_TRUE(st.autoscale.enabled);
  EXPECT_EQ(count_states(st)["stopped"], 1);
  EXPECT_EQ(st.autoscale.num_cold_starts, 2);
  ASSERT_EQ(st.autoscale.cold_start_seconds.size(), 2u);
  for (double s : st.autoscale.cold_start_seconds) EXPECT_GT(s, 0.0);
  const int64_t promotions_before = st.autoscale.num_promotions;

  // The burst: 24 requests at 2 per replica want 12 replicas; 3 at most.
  auto tok = Tokenizer::from_gguf(*GgufFile::open(testing::default_model_path()));
  ASSERT_TRUE(tok.ok());
  const char* texts[] = {"The history of the Roman Empire begins with", "A recipe for pancakes: first, take",
                         "The three laws of motion state that", "In a small village by the sea there lived"};
  constexpr int32_t kTokens = 24;
  std::vector<std::shared_ptr<RequestHandle>> hs;
  for (int i = 0; i < 24; ++i) {
    GenerateRequest r;
    r.prompt_token_ids = tok->encode(texts[i % 4], true, false);
    r.max_tokens = kTokens;
    r.sampling.temperature = 0;
    r.sampling.ignore_eos = true;
    auto h = c.submit(r);
    ASSERT_TRUE(h.ok()) << h.status().to_string();
    hs.push_back(*h);
  }
  // Watch the replicas while the burst runs.
  int max_ready = 0;
  std::atomic<bool> burst_done{false};
  std::thread watcher([&] {
    while (!burst_done) {
      auto s = c.status(std::chrono::seconds(5));
      if (s.ok()) max_ready = std::max(max_ready, count_states(*s)["ready"]);
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  });
  std::vector<std::vector<int32_t>> outputs(4);
  for (size_t i = 0; i < hs.size(); ++i) {
    auto r = hs[i]->wait();
    ASSERT_TRUE(r.ok()) << "request " << i << " failed: " << r.status().to_string();
    EXPECT_EQ(r->finish_reason, "length") << "request " << i;
    EXPECT_EQ(r->tokens.size(), static_cast<size_t>(kTokens)) << "request " << i;
    // Greedy: the same prompt gives the same tokens on every replica.
    if (outputs[i % 4].empty()) outputs[i % 4] = r->tokens;
    EXPECT_EQ(r->tokens, outputs[i % 4]) << "request " << i;
  }
  burst_done = true;
  watcher.join();
  auto after_burst = c.status();
  ASSERT_TRUE(after_burst.ok());
  EXPECT_GE(max_ready, 2) << "the burst did not scale up";
  EXPECT_GT(after_burst->autoscale.num_promotions, promotions_before) << "scaled up without a promotion";
  EXPECT_FALSE(after_burst->autoscale.promotion_seconds.empty()) << "decision -> first token was not measured";

  // After the burst: back to min_replicas ready, drained replicas parked or stopped.
  ASSERT_TRUE(until(60, [&] {
    auto s = c.status();
    if (s.ok()) st = *s;
    auto n = count_states(st);
    return s.ok() && n["ready"] == 1 && n["draining"] == 0 && n["standby"] >= 1;
  })) << "the cluster did not return to 1 ready replica; last target " << st.autoscale.target_ready << ": "
      << st.autoscale.last_reason;
  EXPECT_EQ(st.autoscale.target_ready, 1);
  EXPECT_GE(st.autoscale.num_drains, 1);
  EXPECT_EQ(st.finished, 24);
  EXPECT_EQ(st.requeued, 0) << "a drain re-queued a request instead of letting it finish";
  for (const auto& r : st.replicas) {
    ASSERT_EQ(r.state_seconds_total.size(), 7u);
    if (r.state == "ready") EXPECT_GT(r.state_seconds_total[3], 0.0);
  }

  // Still serving after scaling down.
  GenerateRequest again;
  again.prompt_token_ids = tok->encode(texts[0], true, false);
  again.max_tokens = 4;
  again.sampling.temperature = 0;
  again.sampling.ignore_eos = true;
  auto r = c.generate(again);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->tokens, std::vector<int32_t>(outputs[0].begin(), outputs[0].begin() + 4));

  client->reset();
  ::kill(up->pid, SIGTERM);
  int status = 0;
  EXPECT_TRUE(until(60, [&] { return ::waitpid(up->pid, &status, WNOHANG) == up->pid; })) << "up did not stop";
  cleanup.pid = -1;
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
}

}  // namespace
}  // namespace specserve
