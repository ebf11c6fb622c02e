// Tensor-parallel replicas whose ranks are actors (actors/tp_group.h, actors/tp_rank.h), in one
// process on the real default model (SmolLM2-135M: 3 kv heads split 1 + 2 over two ranks):
//  - the scheduler's rendezvous store: a get waits for a later set; a key never set fails by
//    the deadline naming the key; a join that does not fit the topology is refused;
//  - a replica of two ranks (rank 0 a target shard with the engine, rank 1 a follower) serves
//    greedy requests token for token identical to the target alone (plain decoding, and Medusa
//    trees, whose hidden states and KV compaction go through both ranks; layer-skip drafts, whose
//    shallower KV store and forward passes go through both ranks);
//  - a follower that dies mid-generation stops its replica; the request is re-queued and
//    finishes on the other replica with the same tokens.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <thread>

#include "actors/client.h"
#include "actors/head.h"
#include "actors/messages.h"
#include "actors/target_shard.h"
#include "actors/tp_group.h"
#include "actors/tp_rank.h"
#include "tests/cpu/fp32_kernel_scope.h"
#include "tests/test_util.h"

namespace specserve {
namespace {

const char* kToken = "test-token-tp-0123456789";

Topology tp_topology(int32_t replicas, int32_t tp, std::optional<SpeculativeSpec> spec = std::nullopt) {
  Topology t;
  t.source = "(test)";
  t.cluster.name = "test";
  t.models.target.path = testing::default_model_path();
  t.models.target.max_model_len = 512;
  t.models.target.tensor_parallel_size = tp;
  t.models.speculative = spec;
  t.scheduler.max_num_seqs = 8;
  t.scheduler.kv_cache_bytes = int64_t{32} << 20;
  t.autoscale.start_timeout_s = 60;
  NodeSpec n;
  n.name = "local";
  for (int32_t r = 0; r < replicas; ++r) {
    for (int32_t k = 0; k < tp; ++k) {
      WorkerSpec w;
      w.replica = r;
      w.rank = k;
      n.workers.push_back(w);
    }
  }
  t.nodes.push_back(n);
  return t;
}

GenerateRequest greedy(const std::vector<int32_t>& ids, int32_t n) { return testing::greedy_request(ids, n); }

// A head and every rank of every replica as actors of this process, one CPU thread each.
class TpCluster {
 public:
  explicit TpCluster(Topology topo) : topo_(std::move(topo)) {
    auto h = Head::start(rt_, topo_, kToken, /*publish=*/false);
    EXPECT_TRUE(h.ok()) << h.status().to_string();
    head_ = std::move(*h);
    for (const WorkerSpec& w : topo_.nodes[0].workers) {
      WorkerConfig wc;
      wc.node = "local";
      wc.replica = w.replica;
      wc.rank = w.rank;
      wc.topology = topo_;
      wc.threads = 1;
      wc.token = kToken;
      wc.scheduler = head_->scheduler();
      if (w.rank == 0) {
        ranks_[{w.replica, 0}] = spawn_target_shard(rt_.system(), wc);
      } else {
        ranks_[{w.replica, w.rank}] = spawn_tp_rank(rt_.system(), wc);
      }
    }
    client_ = Client::in_process(rt_.system(), head_->scheduler(), kToken);
  }
  ~TpCluster() {
    client_.reset();
    head_->stop();
  }
  // Waits until `n` replicas are ready (at most 120 s).
  bool wait_ready(size_t n) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    while (std::chrono::steady_clock::now() < end) {
      auto st = client_->status();
      if (st.ok()) {
        size_t ready = 0;
        for (const auto& r : st->replicas) ready += r.ready ? 1 : 0;
        if (ready >= n) return true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return false;
  }
  Client& client() { return *client_; }
  Head& head() { return *head_; }
  caf::actor rank(int32_t replica, int32_t r) { return ranks_.at({replica, r}); }
  caf::actor_system& system() { return rt_.system(); }

 private:
  ActorRuntime rt_;
  Topology topo_;
  std::unique_ptr<Head> head_;
  std::unique_ptr<Client> client_;
  std::map<std::pair<int32_t, int32_t>, caf::actor> ranks_;
};

std::vector<std::vector<int32_t>> prompts(Head& head) {
  const char* texts[] = {
      "The capital of France is Paris. The capital of France is Paris. The capital of",
      "Once upon a time, there was a little robot who",
  };
  std::vector<std::vector<int32_t>> out;
  for (const char* t : texts) out.push_back(head.tokenizer().encode(t, true, false));
  return out;
}

// Rank 0's wait for a follower that will never answer (its process died after its last
// collective; its down message routes through the head and may never arrive) ends as soon as the
// head's (tp_abort_atom, why) reaches the waiter, not at the command timeout; the group is then
// broken for every later call.
TEST(TpPeers, AnAbortFromTheHeadEndsAWaitForAFollowerThatNeverAnswers) {
  ActorRuntime rt;
  // A follower that takes every command and never answers (a process gone silent).
  caf::actor silent = rt.system().spawn([]() -> caf::behavior { return {[](const TpCommand&) {}}; });
  ActorTensorParallelPeers peers(rt.system(), {silent}, std::chrono::seconds(20), std::chrono::seconds(20));
  ForwardBatch batch;
  peers.start_forward(0, batch);
  std::thread head([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    caf::scoped_actor sender(rt.system());
    sender->send(peers.waiter(), tp_abort_atom::value, std::string("tensor parallel rank 1 went down (test)"));
  });
  const auto start = std::chrono::steady_clock::now();
  const Status st = peers.finish_forward();
  const auto waited = std::chrono::steady_clock::now() - start;
  head.join();
  EXPECT_EQ(st.code(), StatusCode::kUnavailable) << st.to_string();
  EXPECT_NE(st.message().find("rank 1 went down (test)"), std::string::npos) << st.message();
  EXPECT_LT(waited, std::chrono::seconds(5)) << "waited for the command timeout";
  EXPECT_TRUE(peers.broken());
  EXPECT_EQ(peers.create_kv(0, 4, 16, 1).code(), StatusCode::kUnavailable);
  caf::anon_send_exit(silent, caf::exit_reason::user_shutdown);
}

TEST(TpRendezvous, GetWaitsForSetAndMissingKeysAndBadJoinsFail) {
  // A head alone (its workers never start): the store and the join live on the scheduler.
  ActorRuntime rt;
  Topology t = tp_topology(1, 2);
  auto head = Head::start(rt, t, kToken, /*publish=*/false);
  ASSERT_TRUE(head.ok()) << head.status().to_string();
  ActorRendezvousStore store(rt.system(), (*head)->scheduler());
  std::thread later([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    EXPECT_TRUE(store.set("g/addr", {'a', '\0', 'b'}).ok());
  });
  const auto t0 = std::chrono::steady_clock::now();
  auto v = store.get("g/addr", std::chrono::seconds(10));
  later.join();
  ASSERT_TRUE(v.ok()) << v.status().to_string();
  EXPECT_EQ(*v, (std::vector<char>{'a', '\0', 'b'}));
  EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(150));  // it waited for the set
  auto again = store.get("g/addr", std::chrono::milliseconds(100));  // set already: at once
  ASSERT_TRUE(again.ok());

  auto missing = store.get("g/never", std::chrono::milliseconds(300));
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(missing.status().message().find("g/never"), std::string::npos) << missing.status().message();

  caf::scoped_actor self{rt.system()};
  TpJoinMsg bad;
  bad.token = kToken;
  bad.replica = 0;
  bad.rank = 0;
  bad.tp_size = 3;  // the topology says 2
  bad.self = caf::actor_cast<caf::actor>(self);
  auto refused = join_tp_group(rt.system(), (*head)->scheduler(), bad, std::chrono::seconds(5));
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("tensor_parallel_size = 2"), std::string::npos) << refused.status().message();

  TpJoinMsg alone = bad;
  alone.tp_size = 2;  // fits, but rank 1 never joins
  auto timed_out = join_tp_group(rt.system(), (*head)->scheduler(), alone, std::chrono::milliseconds(300));
  ASSERT_FALSE(timed_out.ok());
  EXPECT_EQ(timed_out.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(timed_out.status().message().find("tensor_parallel_size = 2"), std::string::npos);

  TpJoinMsg wrong_token = alone;
  wrong_token.token = "not-the-token";
  auto no = join_tp_group(rt.system(), (*head)->scheduler(), wrong_token, std::chrono::seconds(5));
  EXPECT_FALSE(no.ok());
  (*head)->stop();
}

TEST(TpActors, TwoRanksServeGreedyIdenticalToTheTargetAlone) {
  // Greedy identity across ranks is an fp32 property (under the int8 kernel TP drifts:
  // tests/model/tensor_parallel_model_test.cpp); also where the run set SPECSERVE_CPU_MATMUL.
  testing::Fp32MatmulScope fp32;
  TpCluster c(tp_topology(1, 2));
  ASSERT_TRUE(c.wait_ready(1));
  auto st = c.client().status();
  ASSERT_TRUE(st.ok());
  int ranks_ready = 0;
  for (const auto& w : st->workers) ranks_ready += (w.role == "target_shard" && w.state == "ready") ? 1 : 0;
  EXPECT_EQ(ranks_ready, 2);  // rank 1 registers too (shown in `specserve status`)
  EXPECT_EQ(st->tensor_parallel_size, 2);
  ASSERT_EQ(st->replicas.size(), 1u);
  auto ps = prompts(c.head());
  std::vector<std::shared_ptr<RequestHandle>> hs;
  for (const auto& p : ps) {
    auto h = c.client().submit(greedy(p, 24));
    ASSERT_TRUE(h.ok()) << h.status().to_string();
    hs.push_back(*h);
  }
  for (size_t i = 0; i < hs.size(); ++i) {
    auto r = hs[i]->wait();
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_EQ(r->finish_reason, "length");
    EXPECT_EQ(r->tokens, testing::greedy_reference(ps[i], 24)) << "prompt " << i;
  }
}

TEST(TpActors, MedusaTreesOverTwoRanksStayGreedyIdentical) {
  // Greedy identity across ranks is an fp32 property (under the int8 kernel TP drifts:
  // tests/model/tensor_parallel_model_test.cpp); also where the run set SPECSERVE_CPU_MATMUL.
  testing::Fp32MatmulScope fp32;
  SpeculativeSpec spec;
  spec.method = SpeculativeMethod::kMedusa;
  spec.model = (std::filesystem::path(SPECSERVE_SOURCE_DIR) / "models/heads/medusa-smollm2-135m.gguf").string();
  spec.num_speculative_tokens = 8;
  TpCluster c(tp_topology(1, 2, spec));
  ASSERT_TRUE(c.wait_ready(1));
  auto ps = prompts(c.head());
  int64_t drafts = 0;
  for (const auto& p : ps) {
    auto r = c.client().generate(greedy(p, 24));
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_EQ(r->tokens, testing::greedy_reference(p, 24));
    drafts += r->num_drafts;
  }
  EXPECT_GT(drafts, 0);  // trees were verified (not plain decoding)
}

TEST(TpActors, LayerSkipDraftsOverTwoRanksStayGreedyIdentical) {
  // Greedy identity across ranks is an fp32 property (under the int8 kernel TP drifts:
  // tests/model/tensor_parallel_model_test.cpp); also where the run set SPECSERVE_CPU_MATMUL.
  testing::Fp32MatmulScope fp32;
  // The self-speculative draft runs the first layers of the same split model: its own KV store
  // (create_kv with fewer layers) and ForwardBatch::num_layers travel to rank 1 too.
  SpeculativeSpec spec;
  spec.method = SpeculativeMethod::kLayerSkip;
  spec.num_speculative_tokens = 3;
  spec.num_layers = 20;
  TpCluster c(tp_topology(1, 2, spec));
  ASSERT_TRUE(c.wait_ready(1));
  auto ps = prompts(c.head());
  auto r = c.client().generate(greedy(ps[0], 24));
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->tokens, testing::greedy_reference(ps[0], 24));
  EXPECT_GT(r->num_accepted_tokens, 0);  // drafts were made and some accepted
}

TEST(TpActors, AFollowerDyingStopsItsReplicaAndTheRequestFinishesOnAnother) {
  // Greedy identity across ranks is an fp32 property (under the int8 kernel TP drifts:
  // tests/model/tensor_parallel_model_test.cpp); also where the run set SPECSERVE_CPU_MATMUL.
  testing::Fp32MatmulScope fp32;
  TpCluster c(tp_topology(2, 2));
  ASSERT_TRUE(c.wait_ready(2));
  auto ps = prompts(c.head());
  auto h = c.client().submit(greedy(ps[1], 96));
  ASSERT_TRUE(h.ok()) << h.status().to_string();
  // Find the replica running it, then kill that replica's rank 1 while it generates.
  int32_t victim = -1;
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (victim < 0 && std::chrono::steady_clock::now() < end) {
    auto st = c.client().status();
    if (st.ok()) {
      for (const auto& r : st->replicas) {
        if (r.assigned > 0 && r.load.generated_tokens > 4) victim = r.replica;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_GE(victim, 0) << "no replica started generating";
  caf::anon_send_exit(c.rank(victim, 1), caf::exit_reason::kill);
  auto r = (*h)->wait();
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->finish_reason, "length");
  EXPECT_GE(r->num_requeues, 1);
  EXPECT_EQ(r->tokens, testing::greedy_reference(ps[1], 96));
  auto st = c.client().status();
  ASSERT_TRUE(st.ok());
  for (const auto& rep : st->replicas) {
    if (rep.replica == victim) EXPECT_FALSE(rep.ready) << "the broken replica still routed";
  }
  bool shown = false;  // `specserve status` says which rank went down and why
  for (const auto& w : st->workers) {
    if (w.replica == victim && w.rank == 1) {
      EXPECT_EQ(w.state, "down");
      EXPECT_NE(w.error.find("kill"), std::string::npos) << w.error;
      shown = true;
    }
  }
  EXPECT_TRUE(shown);
}

}  // namespace
}  // namespace specserve
