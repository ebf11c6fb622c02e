// A tensor-parallel replica whose two ranks are actors on two GPUs (actors/tp_group.h with the
// NCCL communicator, gpu/nccl_communicator.h, its unique id exchanged through the scheduler's
// rendezvous store): greedy output token for token the CPU target's alone. Needs two CUDA
// devices (NCCL runs one rank per GPU) and skips with the reason otherwise.
// NOTE: has not run on a GPU yet (no multi-GPU machine was lent so far).
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "actors/client.h"
#include "actors/head.h"
#include "actors/target_shard.h"
#include "actors/tp_rank.h"
#include "gpu/cuda_backend.h"
#include "gpu/nccl_communicator.h"
#include "tests/test_util.h"

namespace specserve {
namespace {

TEST(TpActorsCuda, TwoRanksOnTwoGpusServeGreedyIdenticalToTheCpu) {
  if (nccl_version() == 0) GTEST_SKIP() << "this build has no NCCL (see gpu/CMakeLists.txt)";
  if (cuda_device_count() < 2) GTEST_SKIP() << "needs 2 CUDA devices, found " << cuda_device_count();
  const char* token = "test-token-tp-cuda-0123456789";
  Topology t;
  t.source = "(test)";
  t.cluster.name = "test";
  t.models.target.path = testing::default_model_path();
  t.models.target.max_model_len = 512;
  t.models.target.tensor_parallel_size = 2;
  t.scheduler.max_num_seqs = 8;
  t.scheduler.kv_cache_bytes = int64_t{64} << 20;
  t.autoscale.start_timeout_s = 120;
  NodeSpec n;
  n.name = "local";
  for (int32_t k = 0; k < 2; ++k) {
    WorkerSpec w;
    w.rank = k;
    w.device.kind = DeviceKind::kCuda;
    w.device.index = k;
    n.workers.push_back(w);
  }
  t.nodes.push_back(n);
  ActorRuntime rt;
  auto head = Head::start(rt, t, token, /*publish=*/false);
  ASSERT_TRUE(head.ok()) << head.status().to_string();
  for (const WorkerSpec& w : t.nodes[0].workers) {
    WorkerConfig wc;
    wc.node = "local";
    wc.rank = w.rank;
    wc.device = w.device;
    wc.topology = t;
    wc.token = token;
    wc.scheduler = (*head)->scheduler();
    if (w.rank == 0) {
      spawn_target_shard(rt.system(), wc);
    } else {
      spawn_tp_rank(rt.system(), wc);
    }
  }
  auto client = Client::in_process(rt.system(), (*head)->scheduler(), token);
  bool ready = false;
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(180);
  while (!ready && std::chrono::steady_clock::now() < end) {
    auto st = client->status();
    ready = st.ok() && !st->replicas.empty() && st->replicas[0].ready;
    if (!ready) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_TRUE(ready) << "the two-GPU replica did not become ready";
  const std::vector<int32_t> prompt =
      testing::default_tokenizer().encode("The capital of France is Paris. The capital of", true, false);
  auto r = client->generate(testing::greedy_request(prompt, 24));
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->tokens, testing::greedy_reference(prompt, 24));
  client.reset();
  (*head)->stop();
}

}  // namespace
}  // namespace specserve
