// Elastic serving with real processes on loopback: `specserve up` with min_replicas 1,
// max_replicas 3, warm_pool 1 and short delays on the default model (plain decoding). A bounded
// burst through the client API scales the cluster up: the standby replica is promoted first, the
// third slot is started cold and reaches ready too. After the burst, two long requests keep
// running while the cluster scales back to one ready replica: the drain moves the one on a
// drained replica with its KV (migrated), and the stopped replica's worker process is gone. No
// request fails; each finishes with all its tokens, greedy output equal to an Engine running the
// target alone. The topology file is moved away once up is ready: the cold start still works.
// No timing assertions: the waits are bounds, the measured times are only checked to exist.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <set>
#include <chrono>
#include <functional>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <thread>

#include "actors/client.h"
#include "cluster/process.h"
#include "cpu/cpu_backend.h"
#include "model/gguf.h"
#include "model/model_loader.h"
#include "model/tokenizer.h"
#include "spec/engine.h"
#include "tests/test_util.h"

namespace specserve {
namespace {

// stdout of a command (popen).
std::string run_output(const std::string& cmd) {
  std::string out;
  FILE* f = ::popen(cmd.c_str(), "r");
  if (!f) return out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, n);
  ::pclose(f);
  return out;
}

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
  int http = free_port();
  while (http == port) http = free_port();  // the kernel may hand the same free port out twice
  const std::string config = dir + "/cluster.yaml";
  std::ofstream(config)
      << "cluster: { name: autoscale-test, token_file: " << dir << "/token }\n"
      << "head: { host: 127.0.0.1, actor_port: " << port << ", http_port: " << http << " }\n"
      << "models:\n  target: { path: " << testing::default_model_path() << ", max_model_len: 512 }\n"
      << "nodes:\n  - name: n0\n    host: 127.0.0.1\n    devices: [cpu]\n    workers:\n"
      << "      - { role: target_shard, replica: 0, device: cpu }\n"
      << "      - { role: target_shard, replica: 1, device: cpu }\n"
      << "      - { role: target_shard, replica: 2, device: cpu }\n"
      << "scheduler: { max_num_seqs: 2, kv_cache_bytes: 48MiB }\n"
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
  // The topology file moved away: the cold start below reads what up validated
  // (cluster/topology_snapshot.h). `specserve status` reads it at the end.
  std::filesystem::rename(config, config + ".away");
  EXPECT_TRUE(st.autoscale.enabled);
  EXPECT_EQ(count_states(st)["stopped"], 1);
  EXPECT_EQ(st.autoscale.num_cold_starts, 2);
  ASSERT_EQ(st.autoscale.cold_start_seconds.size(), 2u);
  for (double s : st.autoscale.cold_start_seconds) EXPECT_GT(s, 0.0);
  const int64_t promotions_before = st.autoscale.num_promotions;
  int32_t first_ready = -1, standby_before = -1;
  for (const auto& r : st.replicas) {
    if (r.state == "ready") first_ready = r.replica;
    if (r.state == "standby") standby_before = r.replica;
  }

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
  // Watch the replicas while the burst runs: the most ready at once, the order in which the
  // other replicas became ready, and every worker pid of each replica.
  int max_ready = 0;
  std::vector<int32_t> became_ready;
  std::map<int32_t, std::set<int>> pids;
  std::atomic<bool> burst_done{false};
  std::thread watcher([&] {
    while (!burst_done) {
      auto s = c.status(std::chrono::seconds(5));
      if (s.ok()) {
        max_ready = std::max(max_ready, count_states(*s)["ready"]);
        for (const auto& r : s->replicas) {
          if (r.state == "ready" && r.replica != first_ready &&
              std::find(became_ready.begin(), became_ready.end(), r.replica) == became_ready.end()) {
            became_ready.push_back(r.replica);
          }
        }
        for (const auto& w : s->workers) {
          if (w.pid > 0) pids[w.replica].insert(w.pid);
        }
      }
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
  auto after_burst = c.status();
  ASSERT_TRUE(after_burst.ok());
  EXPECT_EQ(max_ready, 3) << "the burst wants every slot: 3 ready replicas";
  ASSERT_FALSE(became_ready.empty()) << "the burst did not scale up";
  EXPECT_EQ(became_ready[0], standby_before) << "the first replica added was not the standby one (no promotion)";
  EXPECT_GT(after_burst->autoscale.num_promotions, promotions_before);
  EXPECT_GE(after_burst->autoscale.num_cold_starts, 3) << "the third slot was not started cold";
  std::filesystem::rename(config + ".away", config);
  EXPECT_FALSE(after_burst->autoscale.promotion_seconds.empty()) << "decision -> first token was not measured";
  // Each warm promotion is measured three ways from the decision: routed <= first request sent
  // <= its first token (a promotion during a burst has work at once: queued, or handed back).
  const AutoscaleStatus& as = after_burst->autoscale;
  EXPECT_EQ(as.promotion_routable_seconds.size(), static_cast<size_t>(as.num_promotions));
  EXPECT_GE(as.promotion_dispatch_seconds.size(), as.promotion_seconds.size());
  int measured = 0;
  for (const auto& r : after_burst->replicas) {
    if (r.num_promotions == 0 || r.promotion_seconds <= 0) continue;
    ++measured;
    EXPECT_LE(r.promotion_routable_seconds, r.promotion_dispatch_seconds) << "replica " << r.replica;
    EXPECT_LE(r.promotion_dispatch_seconds, r.promotion_seconds) << "replica " << r.replica;
  }
  EXPECT_GE(measured, 1) << "no replica reports its promotion's three times";

  // Long requests keep running while the load falls: the drain of a replica that holds one
  // moves it, with its KV, to a replica that stays. One lane per ready replica, each submitting
  // its long request again as soon as it finishes, until one moved (or 120 s): on a fast CPU one
  // request of kLong tokens can end before a 3 s downscale delay passes (it did at ~60 tokens/s
  // with AVX-512). The lanes start once every replica reported itself empty, so the dispatcher
  // (the most free KV blocks wins) puts one on each ready replica, and R lanes at 2 per replica
  // want fewer than R replicas: the next drain, which takes the emptiest replica, takes one that
  // holds a long request.
  // NOTE: three lanes whatever the ready count flaked: with 2 ready (the burst's first drain
  // already done) 3 lanes want 2 replicas, so no drain came while they ran; and lanes started
  // while the replicas' last loads still counted burst requests landed 2 + 1 + 0, and the drain
  // took the empty replica.
  int32_t lanes = 0;
  ASSERT_TRUE(until(10, [&] {
    auto s = c.status();
    if (!s.ok()) return false;
    int32_t ready = 0;
    for (const auto& r : s->replicas) {
      if (r.state != "ready") continue;
      ++ready;
      if (r.assigned > 0 || r.load.num_running + r.load.num_waiting > 0 || r.load.free_kv_blocks < r.load.total_kv_blocks) return false;
    }
    lanes = ready;
    return ready > 0 && s->queued == 0 && s->running == 0;
  })) << "the replicas did not report themselves empty after the burst";
  ASSERT_GE(lanes, 2) << "the cluster scaled down to one replica before the long requests: no drain is left to test";
  const char* long_texts[] = {"Once upon a time, in a land far away,", "The ocean covers most of the planet and",
                              "The history of mathematics begins with counting, and"};
  constexpr int32_t kLong = 300;
  std::atomic<int32_t> long_migrations{0};
  std::atomic<int32_t> long_finished{0};
  std::mutex long_mu;
  std::vector<std::pair<size_t, std::vector<int32_t>>> long_outputs;  // (prompt, tokens)
  std::vector<std::string> long_errors;
  const auto long_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  auto lane = [&](size_t i) {
    do {
      GenerateRequest r;
      r.prompt_token_ids = tok->encode(long_texts[i], true, false);
      r.max_tokens = kLong;
      r.sampling.temperature = 0;
      r.sampling.ignore_eos = true;
      auto h = c.submit(r);
      auto res = h.ok() ? (*h)->wait() : Expected<GenerateResult>(h.status());
      std::lock_guard<std::mutex> lock(long_mu);
      if (!res.ok()) {
        long_errors.push_back("long request " + std::to_string(i) + " failed: " + res.status().to_string());
        return;
      }
      if (res->finish_reason != "length" || res->tokens.size() != static_cast<size_t>(kLong)) {
        long_errors.push_back("long request " + std::to_string(i) + ": finish " + res->finish_reason + " after " +
                              std::to_string(res->tokens.size()) + " tokens");
      }
      long_outputs.emplace_back(i, res->tokens);
      long_migrations += res->num_migrations;
      ++long_finished;
    } while (long_migrations == 0 && std::chrono::steady_clock::now() < long_deadline);
  };
  std::vector<std::thread> lane_threads;
  for (int32_t i = 0; i < std::min(lanes, 3); ++i) lane_threads.emplace_back(lane, static_cast<size_t>(i));
  for (auto& th : lane_threads) th.join();
  for (const auto& e : long_errors) ADD_FAILURE() << e;
  burst_done = true;
  watcher.join();
  // NOTE: the oracle runs after the long requests were submitted: loading it right after the
  // burst would delay them past the scale-down they must overlap.
  for (int k = 0; k < 4; ++k) {
    EXPECT_EQ(outputs[k], testing::greedy_reference(tok->encode(texts[k], true, false), kTokens)) << "prompt " << k;
  }
  for (size_t i = 0; i < 3; ++i) {
    const auto want = testing::greedy_reference(tok->encode(long_texts[i], true, false), kLong);
    for (const auto& [prompt, tokens] : long_outputs) {
      if (prompt == i) EXPECT_EQ(tokens, want) << "long request " << i;
    }
  }

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
  EXPECT_EQ(st.finished, 24 + long_finished.load());
  EXPECT_EQ(st.requeued, 0) << "a drain re-queued a request instead of moving it";
  EXPECT_GT(st.migrated, 0) << "no drain overlapped a running request";
  EXPECT_GT(long_migrations.load(), 0) << "neither long request moved in the drain";
  EXPECT_GT(st.kv_migrated_tokens, 0) << "the drained sequences' KV must move, not be recomputed";
  // The stopped replica's worker processes are gone (`up` reaps them).
  int stopped = 0;
  for (const auto& r : st.replicas) {
    if (r.state != "stopped") continue;
    ++stopped;
    ASSERT_FALSE(pids[r.replica].empty()) << "replica " << r.replica << " never had a worker";
    for (int pid : pids[r.replica]) {
      EXPECT_TRUE(until(15, [&] { return ::kill(pid, 0) != 0; })) << "replica " << r.replica << ": pid " << pid << " lives on";
    }
  }
  EXPECT_EQ(stopped, 1) << "scale-down keeps the pool and stops the rest";
  for (const auto& r : st.replicas) {
    ASSERT_EQ(r.state_seconds_total.size(), 7u);
    if (r.state == "ready") EXPECT_GT(r.state_seconds_total[3], 0.0);
  }

  // `specserve status` shows every replica's lifecycle state and the time spent in each state,
  // and the autoscaler's cold-start and promotion times (JSON and the table).
  const std::string js = run_output(std::string(SPECSERVE_BIN) + " status --config " + config + " --json");
  const auto j = nlohmann::json::parse(js, nullptr, /*allow_exceptions=*/false);
  ASSERT_FALSE(j.is_discarded()) << "specserve status --json printed no JSON: " << js;
  EXPECT_TRUE(j["ended"]["generated_tokens"].is_number_integer() && j["ended"]["accepted_per_pos"].is_array()) << js;
  std::map<std::string, int> json_states;
  for (const auto& r : j["replicas"]) {
    ++json_states[r["state"].get<std::string>()];
    EXPECT_EQ(r["state_seconds_total"].size(), 7u) << r.dump();
    EXPECT_TRUE(r["goodput_drafting"].is_number_integer() && r["goodput_skipped"].is_number_integer()) << r.dump();
    for (const char* k : {"starting", "loading", "warming", "ready", "draining", "standby", "stopped"}) {
      EXPECT_TRUE(r["state_seconds_total"].contains(k)) << k << " in " << r.dump();
    }
  }
  EXPECT_EQ(json_states["ready"], 1) << js;
  for (const char* k : {"cold_start_seconds", "promotion_routable_seconds", "promotion_dispatch_seconds", "promotion_seconds",
                        "cold_scale_up_seconds"}) {
    EXPECT_TRUE(j["autoscale"].contains(k)) << k << " in " << j["autoscale"].dump();
  }
  EXPECT_FALSE(j["autoscale"]["promotion_routable_seconds"].empty());
  EXPECT_EQ(j["autoscale"]["num_failed_starts"], 0) << j["autoscale"].dump();
  const std::string table = run_output(std::string(SPECSERVE_BIN) + " status --config " + config);
  EXPECT_NE(table.find("seconds in each state: starting"), std::string::npos) << table;
  EXPECT_NE(table.find("warm promotion, from the decision: routed"), std::string::npos) << table;
  EXPECT_NE(table.find("cold start (process start -> ready)"), std::string::npos) << table;

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
