// Tensor parallelism on the CPU (issue 9: "tensor parallelism 1 vs 2 identical on CPU (Gloo)"),
// the parts the model split is built from:
//  - the Gloo communicator: all-reduce in rank order, bit-identical on every rank; broadcast;
//    barrier; rendezvous through the in-process and the file store; argument errors;
//  - the shard split (uneven: SmolLM2-135M's 3 kv heads over 2 ranks) and its errors.
// Tensor slices and the model split over ranks-as-threads are in tensor_parallel_model_test.cpp.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "cpu/cpu_backend.h"
#include "cpu/gloo_communicator.h"
#include "cpu/tensor_parallel.h"
#include "model/communicator.h"
#include "model/model_config.h"
#include "model/transformer.h"
#include "tests/test_util.h"

namespace specserve {
namespace {


// ---------------------------------------------------------------- communicator

// Runs fn(rank) on `size` threads at once.
template <typename F>
void on_ranks(int size, F fn) {
  std::vector<std::thread> ts;
  for (int r = 0; r < size; ++r) ts.emplace_back([&fn, r] { fn(r); });
  for (auto& t : ts) t.join();
}

std::vector<std::unique_ptr<Communicator>> connect(int size, std::shared_ptr<RendezvousStore> store,
                                                   const std::string& prefix) {
  std::vector<std::unique_ptr<Communicator>> comms(static_cast<size_t>(size));
  std::vector<Status> errs(static_cast<size_t>(size));
  on_ranks(size, [&](int r) {
    GlooOptions o;
    o.prefix = prefix;
    auto c = make_gloo_communicator(r, size, store, o);
    if (c.ok()) comms[static_cast<size_t>(r)] = std::move(*c);
    else errs[static_cast<size_t>(r)] = c.status();
  });
  for (int r = 0; r < size; ++r) EXPECT_TRUE(errs[static_cast<size_t>(r)].ok()) << "rank " << r << ": " << errs[r].to_string();
  return comms;
}

TEST(GlooCommunicator, AllReduceSumsInRankOrderIdenticallyOnEveryRank) {
  const int size = 3;
  auto comms = connect(size, std::make_shared<InProcessStore>(), "allreduce");
  ASSERT_TRUE(comms[0] && comms[1] && comms[2]);
  const int64_t n = 1000;
  // Values whose fp32 sum depends on the order: large and small magnitudes mixed.
  std::vector<std::vector<float>> in(size, std::vector<float>(n));
  for (int r = 0; r < size; ++r) {
    for (int64_t i = 0; i < n; ++i) in[r][i] = static_cast<float>(std::sin(0.37 * i + r) * std::pow(10.0, (i + 3 * r) % 9 - 4));
  }
  std::vector<float> want(n);
  for (int64_t i = 0; i < n; ++i) want[i] = (in[0][i] + in[1][i]) + in[2][i];
  std::vector<std::vector<float>> got = in;
  std::vector<Status> st(size);
  on_ranks(size, [&](int r) {
    for (int rep = 0; rep < 3 && st[r].ok(); ++rep) {  // several in a row: tags and scratch reuse
      got[r] = in[r];
      st[r] = comms[r]->all_reduce_sum(got[r].data(), n);
    }
  });
  for (int r = 0; r < size; ++r) {
    ASSERT_TRUE(st[r].ok()) << st[r].to_string();
    EXPECT_EQ(comms[r]->rank(), r);
    EXPECT_EQ(comms[r]->size(), size);
    EXPECT_EQ(0, std::memcmp(got[r].data(), want.data(), n * sizeof(float))) << "rank " << r;
  }
}

TEST(GlooCommunicator, BroadcastAndBarrierOverAFileStore) {
  const std::string dir = ::testing::TempDir() + "/specserve_tp_store_" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  auto comms = connect(2, std::make_shared<FileStore>(dir), "bcast");
  ASSERT_TRUE(comms[0] && comms[1]);
  std::vector<std::vector<int32_t>> data = {{0, 0, 0, 0}, {7, 8, 9, 10}};
  std::vector<Status> st(2);
  on_ranks(2, [&](int r) {
    st[r] = comms[r]->broadcast(data[r].data(), 16, /*root=*/1);
    if (st[r].ok()) st[r] = comms[r]->barrier();
  });
  ASSERT_TRUE(st[0].ok()) << st[0].to_string();
  ASSERT_TRUE(st[1].ok()) << st[1].to_string();
  EXPECT_EQ(data[0], (std::vector<int32_t>{7, 8, 9, 10}));
  EXPECT_EQ(data[1], (std::vector<int32_t>{7, 8, 9, 10}));
  std::filesystem::remove_all(dir);
}

TEST(GlooCommunicator, ArgumentErrorsAndRendezvousTimeout) {
  auto store = std::make_shared<InProcessStore>();
  auto bad_rank = make_gloo_communicator(2, 2, store);
  ASSERT_FALSE(bad_rank.ok());
  EXPECT_EQ(bad_rank.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad_rank.status().message().find("rank = 2"), std::string::npos) << bad_rank.status().to_string();
  auto bad_size = make_gloo_communicator(0, 0, store);
  ASSERT_FALSE(bad_size.ok());
  EXPECT_NE(bad_size.status().message().find("size = 0"), std::string::npos) << bad_size.status().to_string();
  // Rank 1 never shows up.
  GlooOptions o;
  o.prefix = "lonely";
  o.timeout = std::chrono::milliseconds(300);
  auto alone = make_gloo_communicator(0, 2, store, o);
  ASSERT_FALSE(alone.ok());
  EXPECT_EQ(alone.status().code(), StatusCode::kDeadlineExceeded) << alone.status().to_string();
  SoloCommunicator solo;
  float x = 1.5f;
  EXPECT_TRUE(solo.all_reduce_sum(&x, 1).ok());
  EXPECT_EQ(x, 1.5f);
}

// ---------------------------------------------------------------- shard split

TEST(TensorParallelShard, SplitsKvHeadGroupsUnevenlyAndNamesBadSizes) {
  auto cfg = ModelConfig::from_gguf(testing::default_gguf());
  ASSERT_TRUE(cfg.ok()) << cfg.status().to_string();
  ASSERT_EQ(cfg->num_heads, 9);
  ASSERT_EQ(cfg->num_kv_heads, 3);
  ASSERT_EQ(cfg->ffn_size, 1536);
  auto s0 = tensor_parallel_shard(*cfg, 0, 2, 32), s1 = tensor_parallel_shard(*cfg, 1, 2, 32);
  ASSERT_TRUE(s0.ok() && s1.ok());
  EXPECT_EQ(s0->kv_head_begin, 0);
  EXPECT_EQ(s0->kv_head_end, 1);
  EXPECT_EQ(s1->kv_head_begin, 1);
  EXPECT_EQ(s1->kv_head_end, 3);
  EXPECT_EQ(s0->head_end, 3);
  EXPECT_EQ(s1->head_begin, 3);
  EXPECT_EQ(s1->head_end, 9);
  EXPECT_EQ(s0->ffn_end, 768);
  EXPECT_EQ(s1->ffn_begin, 768);
  EXPECT_EQ(s1->ffn_end, 1536);
  // Every head, kv head and MLP unit belongs to exactly one rank, for every legal size.
  for (int tp = 1; tp <= 3; ++tp) {
    int64_t h = 0, kv = 0, ff = 0;
    for (int r = 0; r < tp; ++r) {
      auto s = tensor_parallel_shard(*cfg, r, tp, 256);
      ASSERT_TRUE(s.ok());
      EXPECT_EQ(s->head_begin, h);
      EXPECT_EQ(s->kv_head_begin, kv);
      EXPECT_EQ(s->ffn_begin, ff);
      EXPECT_GT(s->num_kv_heads(), 0);
      EXPECT_GT(s->ffn_size(), 0);
      EXPECT_EQ(s->ffn_begin % 256, 0);
      h = s->head_end, kv = s->kv_head_end, ff = s->ffn_end;
    }
    EXPECT_EQ(h, 9);
    EXPECT_EQ(kv, 3);
    EXPECT_EQ(ff, 1536);
  }
  for (int tp : {0, 4, -1}) {
    auto bad = tensor_parallel_shard(*cfg, 0, tp);
    ASSERT_FALSE(bad.ok()) << tp;
    EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(bad.status().message().find("tensor_parallel_size = " + std::to_string(tp)), std::string::npos)
        << bad.status().to_string();
  }
  auto over = tensor_parallel_shard(*cfg, 0, 4);
  EXPECT_NE(over.status().message().find("3 kv heads"), std::string::npos) << over.status().to_string();
  // The group refuses before starting a thread; a bare load without a communicator too.
  ThreadedTensorParallelOptions o;
  o.tp_size = 4;
  auto g = ThreadedTensorParallel::create(testing::default_gguf(), o);
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.status().message().find("tensor_parallel_size = 4"), std::string::npos) << g.status().to_string();
  o.tp_size = 0;
  g = ThreadedTensorParallel::create(testing::default_gguf(), o);
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.status().message().find("tensor_parallel_size = 0"), std::string::npos) << g.status().to_string();
  auto backend = make_cpu_backend(1);
  LoadOptions lo;
  lo.tp_size = 2;
  lo.max_layers = 1;
  auto m = Transformer::load(testing::default_gguf(), *backend, lo);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("communicator"), std::string::npos) << m.status().to_string();
}

}  // namespace
}  // namespace specserve
