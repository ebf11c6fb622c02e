// actors/gpu_memory_plan.h on a real GPU: a target with an in-process layer_skip draft (its own
// KV) sized together from gpu_memory_utilization, both pools really allocated, the process's use
// of the device within its fraction, the engine then generating; and the error when the
// fraction leaves no room. Skips with the reason where no CUDA device is present.
#include "actors/gpu_memory_plan.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "actors/backend_factory.h"
#include "actors/proposer_factory.h"
#include "model/model_loader.h"
#include "spec/engine.h"
#include "tests/test_util.h"

namespace specserve {
namespace {

#define SKIP_WITHOUT_CUDA()                                                                  \
  do {                                                                                       \
    auto m_ = device_memory("cuda:0");                                                       \
    if (!m_.ok()) GTEST_SKIP() << "no CUDA device: " << m_.status().to_string();             \
  } while (0)

TEST(GpuMemoryPlanOnDevice, TargetAndLayerSkipDraftStayWithinTheFraction) {
  SKIP_WITHOUT_CUDA();
  constexpr double kFraction = 0.3;
  auto before = device_memory("cuda:0");
  ASSERT_TRUE(before.ok());
  DeviceMemoryBudget memory("cuda:0", kFraction, "gpu_memory_utilization");
  ASSERT_TRUE(memory.active());
  auto backend = make_backend_for_device("--device", "cuda:0", 0);
  ASSERT_TRUE(backend.ok()) << backend.status().to_string();
  auto lm = load_model(testing::default_model_path(), **backend, /*quiet=*/true);
  ASSERT_TRUE(lm.ok()) << lm.status().to_string();
  memory.target_loaded(**backend);

  EngineOptions eo;
  eo.max_model_len = 2048;
  eo.max_num_seqs = 1 << 20;  // so many sequences that the fraction, not max_num_seqs, bounds the pools
  eo.num_speculative_tokens = 3;
  EngineKvPlanner plan(memory, engine_memory_inputs(lm->model->config(), eo), &eo);
  SpeculativeSpec spec;
  spec.method = SpeculativeMethod::kLayerSkip;
  spec.num_speculative_tokens = 3;
  ProposerBuildOptions bo;
  bo.max_model_len = eo.max_model_len;
  bo.plan_kv = plan.draft_planner();
  ASSERT_TRUE(static_cast<bool>(bo.plan_kv));
  bo.block_size = eo.block_size;
  bo.max_num_batched_tokens = eo.max_num_batched_tokens;
  auto proposer = build_proposer(spec, *lm, **backend, bo);
  ASSERT_TRUE(proposer.ok()) << proposer.status().to_string();
  ASSERT_TRUE(plan.finish().ok());
  std::printf("[ info ] %s\n", plan.summary().c_str());
  ASSERT_NE(plan.summary().find("each for the target and the draft"), std::string::npos)
      << "the layer_skip draft's KV was planned with the target's: " << plan.summary();
  EXPECT_GT(eo.num_kv_blocks, 128) << "a 135M model leaves room for more than one 2048-token sequence";
  EXPECT_LT(eo.num_kv_blocks, int64_t{1 << 20} * 128) << "the fraction bounds the pools";

  auto engine = Engine::create(*lm->model, lm->tokenizer.get(), proposer->get(), eo);
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  auto after = device_memory("cuda:0");
  ASSERT_TRUE(after.ok());
  const int64_t used = before->free_bytes - after->free_bytes;
  const int64_t allowed = static_cast<int64_t>(kFraction * static_cast<double>(before->total_bytes));
  std::printf("[ info ] this process holds %lld MiB of cuda:0 after both pools; its fraction is %lld MiB\n",
              static_cast<long long>(used >> 20), static_cast<long long>(allowed >> 20));
  EXPECT_LE(used, allowed) << "weights + both KV pools exceed gpu_memory_utilization " << kFraction;
  EXPECT_GT(used, allowed / 2) << "the pools should fill most of the fraction when max_num_seqs does not bind";

  GenerateParams p;
  p.prompt = lm->tokenizer->encode("The capital of France is", true, false);
  p.max_tokens = 8;
  p.sampling.temperature = 0;
  p.sampling.ignore_eos = true;
  ASSERT_TRUE((*engine)->add_request(p).ok());
  std::vector<SeqEvent> events;
  int64_t tokens = 0;
  while ((*engine)->has_work()) {
    events.clear();
    ASSERT_TRUE((*engine)->step(&events).ok());
    for (const auto& e : events) tokens += static_cast<int64_t>(e.tokens.size());
  }
  EXPECT_EQ(tokens, 8);
}

TEST(GpuMemoryPlanOnDevice, AFractionSmallerThanTheWeightsIsAClearError) {
  SKIP_WITHOUT_CUDA();
  DeviceMemoryBudget memory("cuda:0", 0.0001, "nodes[0].workers[0].gpu_memory_utilization");
  auto backend = make_backend_for_device("--device", "cuda:0", 0);
  ASSERT_TRUE(backend.ok()) << backend.status().to_string();
  auto lm = load_model(testing::default_model_path(), **backend, /*quiet=*/true);
  ASSERT_TRUE(lm.ok()) << lm.status().to_string();
  memory.target_loaded(**backend);
  EngineOptions eo;
  eo.max_model_len = 2048;
  EngineKvPlanner plan(memory, engine_memory_inputs(lm->model->config(), eo), &eo);
  const Status st = plan.finish();
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(st.message().find("cuda:0: no room for the KV cache"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("raise nodes[0].workers[0].gpu_memory_utilization"), std::string::npos) << st.message();
  EXPECT_EQ(eo.num_kv_blocks, 0);
}

}  // namespace
}  // namespace specserve
