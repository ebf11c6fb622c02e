// The in-process cluster the actor tests drive (tests/actors/actors_test.cpp,
// actors_draft_worker_test.cpp): a head, a target shard and optionally a draft worker actor on
// the real default model, reached through the Client API, with the helpers they share.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "actors/client.h"
#include "actors/draft_worker.h"
#include "actors/head.h"
#include "actors/target_shard.h"
#include "tests/test_util.h"

namespace specserve::actors_testing {

inline constexpr const char* kToken = "test-token-0123456789";

inline Topology make_topology(std::optional<SpeculativeSpec> spec, bool draft_worker, int64_t kv_bytes = int64_t{64} << 20) {
  Topology t;
  t.source = "(test)";
  t.cluster.name = "test";
  t.models.target.path = testing::default_model_path();
  t.models.target.max_model_len = 512;
  t.models.speculative = spec;
  t.scheduler.max_num_seqs = 8;
  t.scheduler.kv_cache_bytes = kv_bytes;
  NodeSpec n;
  n.name = "local";
  WorkerSpec w;
  n.workers.push_back(w);
  if (draft_worker) {
    WorkerSpec d;
    d.role = WorkerRole::kDraftWorker;
    n.workers.push_back(d);
  }
  t.nodes.push_back(n);
  return t;
}

// Polls the status until `pred` holds for replica 0's load (the last ShardLoad may still be on
// its way when the client has its result), at most 10 s.
template <class Pred>
ClusterStatus status_when(Client& c, Pred pred) {
  ClusterStatus last;
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (std::chrono::steady_clock::now() < end) {
    auto st = c.status();
    if (st.ok()) {
      last = *st;
      if (!last.replicas.empty() && pred(last.replicas[0].load)) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return last;
}

inline int64_t sum(const std::vector<int64_t>& v) {
  int64_t s = 0;
  for (int64_t x : v) s += x;
  return s;
}

class Cluster {
 public:
  Cluster(std::optional<SpeculativeSpec> spec, bool draft_worker, int64_t kv_bytes = int64_t{64} << 20) {
    topo_ = make_topology(spec, draft_worker, kv_bytes);
    auto h = Head::start(rt_, topo_, kToken, /*publish=*/false);
    EXPECT_TRUE(h.ok()) << h.status().to_string();
    head_ = std::move(*h);
    WorkerConfig wc = shard_config();
    wc.remote_draft = draft_worker;
    shard_ = spawn_target_shard(rt_.system(), wc);
    if (draft_worker) {
      wc.role = WorkerRole::kDraftWorker;
      spawn_draft_worker(rt_.system(), wc);
    }
    client_ = Client::in_process(rt_.system(), head_->scheduler(), kToken);
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    while (std::chrono::steady_clock::now() < end) {
      auto st = client_->status();
      if (st.ok() && !st->replicas.empty() && st->replicas[0].ready) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  ~Cluster() {
    client_.reset();
    head_->stop();
  }
  Client& client() { return *client_; }
  Head& head() { return *head_; }
  ActorRuntime& runtime() { return rt_; }
  caf::actor shard() const { return shard_; }  ///< the target shard spawned at start
  /// The target shard's configuration (another worker for the same slot: change its node).
  WorkerConfig shard_config() const {
    WorkerConfig wc;
    wc.node = "local";
    wc.topology = topo_;
    wc.threads = 1;
    wc.token = kToken;
    wc.scheduler = head_->scheduler();
    return wc;
  }

 private:
  ActorRuntime rt_;
  Topology topo_;
  std::unique_ptr<Head> head_;
  std::unique_ptr<Client> client_;
  caf::actor shard_;
};

inline GenerateRequest greedy(const std::vector<int32_t>& ids, int32_t n) { return testing::greedy_request(ids, n); }

inline std::vector<std::vector<int32_t>> prompts(Head& head) {
  const char* texts[] = {
      "The capital of France is Paris. The capital of France is Paris. The capital of",
      "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n\ndef fib2(n):",
      "Once upon a time, there was a little robot who",
  };
  std::vector<std::vector<int32_t>> out;
  for (const char* t : texts) out.push_back(head.tokenizer().encode(t, true, false));
  return out;
}

}  // namespace specserve::actors_testing
