// actors/gpu_memory_plan.h: the KV sizing arithmetic of a cuda:N worker (vLLM's
// gpu_memory_utilization semantics), on made-up device sizes: fits, does not fit (the error's
// text), the draft's weights and KV counted, the fraction respected; and that nothing is planned
// on the CPU. Expected block counts are worked out by hand in each test's comments.
#include "actors/gpu_memory_plan.h"

#include <gtest/gtest.h>

#include <string>

#include "actors/backend_factory.h"

namespace specserve {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;
constexpr int64_t kGiB = int64_t{1} << 30;

// A 16 GiB device, nothing else on it, 4 GiB of target weights loaded; 1 MiB target blocks of
// 16 tokens; no activations and no reserve unless a test sets them.
GpuMemoryInputs base() {
  GpuMemoryInputs in;
  in.device = "cuda:0";
  in.total_bytes = 16 * kGiB;
  in.weight_bytes = 4 * kGiB;
  in.free_bytes = in.total_bytes - in.weight_bytes;
  in.gpu_memory_utilization = 0.5;
  in.reserved_bytes = 0;
  in.target_block_bytes = kMiB;
  in.block_size = 16;
  in.max_model_len = 1024;  // 64 blocks per sequence
  in.max_num_seqs = 1000;   // cap 64000 blocks: not binding unless a test lowers it
  return in;
}

TEST(GpuMemoryPlan, FitsTheFractionLessTheWeights) {
  // 0.5 * 16 GiB = 8 GiB, less 4 GiB of weights = 4 GiB = 4096 blocks of 1 MiB.
  auto p = plan_gpu_memory(base());
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  EXPECT_EQ(p->num_kv_blocks, 4096);
  EXPECT_EQ(p->budget_bytes, 4 * kGiB);
  EXPECT_EQ(p->kv_bytes, 4 * kGiB);
  EXPECT_FALSE(p->limited_by_free);
  EXPECT_NE(p->summary.find("cuda:0: 4096 KV blocks of 16 tokens"), std::string::npos) << p->summary;
}

TEST(GpuMemoryPlan, UtilizationIsAFractionOfTotalNotOfFree) {
  GpuMemoryInputs in = base();
  in.gpu_memory_utilization = 0.75;  // 12 GiB - 4 GiB = 8 GiB = 8192 blocks (free is 12 GiB: not binding)
  auto p = plan_gpu_memory(in);
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  EXPECT_EQ(p->num_kv_blocks, 8192);
  in.gpu_memory_utilization = 0.25;  // 4 GiB - 4 GiB of weights: nothing left
  auto q = plan_gpu_memory(in);
  ASSERT_FALSE(q.ok());
  EXPECT_EQ(q.status().code(), StatusCode::kResourceExhausted);
}

TEST(GpuMemoryPlan, ActivationsAndReserveComeOffTheBudget) {
  GpuMemoryInputs in = base();
  in.activation_bytes = 1 * kGiB;
  in.reserved_bytes = 512 * kMiB;  // 4 GiB - 1.5 GiB = 2560 MiB
  auto p = plan_gpu_memory(in);
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  EXPECT_EQ(p->num_kv_blocks, 2560);
}

TEST(GpuMemoryPlan, DraftWeightsAndDraftKvAreCounted) {
  GpuMemoryInputs in = base();
  in.draft_weight_bytes = 1 * kGiB;      // 8 - 4 - 1 = 3 GiB
  in.draft_block_bytes = 512 * 1024;     // 1.5 MiB per block pair: 3072 MiB / 1.5 MiB = 2048
  auto p = plan_gpu_memory(in);
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  EXPECT_EQ(p->num_kv_blocks, 2048) << "the same count for the target's pool and the draft's";
  EXPECT_EQ(p->kv_bytes, 3 * kGiB);
  EXPECT_NE(p->summary.find("each for the target and the draft"), std::string::npos) << p->summary;
  EXPECT_NE(p->summary.find("1024 MiB of draft weights"), std::string::npos) << p->summary;
  // Without the draft the target alone gets 4096: the draft is not free.
  ASSERT_EQ(plan_gpu_memory(base())->num_kv_blocks, 4096);
}

TEST(GpuMemoryPlan, ADraftWorkerPlansOnlyItsDraftKv) {
  GpuMemoryInputs in = base();
  in.target_block_bytes = 0;
  in.draft_block_bytes = 256 * 1024;  // 4 GiB / 256 KiB = 16384
  auto p = plan_gpu_memory(in);
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  EXPECT_EQ(p->num_kv_blocks, 16384);
}

TEST(GpuMemoryPlan, NeverMoreThanTheDeviceHasFree) {
  GpuMemoryInputs in = base();
  in.free_bytes = 2 * kGiB;  // another process holds 10 GiB: 2 GiB = 2048 blocks, not 4096
  auto p = plan_gpu_memory(in);
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  EXPECT_EQ(p->num_kv_blocks, 2048);
  EXPECT_TRUE(p->limited_by_free);
  EXPECT_NE(p->summary.find("less than the fraction allows"), std::string::npos) << p->summary;
}

TEST(GpuMemoryPlan, CappedAtMaxNumSeqsSequencesOfMaxModelLen) {
  GpuMemoryInputs in = base();
  in.max_num_seqs = 8;  // 8 * 64 = 512 blocks, though 4096 would fit
  in.max_model_len = 1000;  // ceil(1000 / 16) = 63 blocks per sequence: 504
  auto p = plan_gpu_memory(in);
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  EXPECT_EQ(p->num_kv_blocks, 504);
  EXPECT_EQ(p->kv_bytes, 504 * kMiB);
  EXPECT_EQ(p->budget_bytes, 4 * kGiB);
}

TEST(GpuMemoryPlan, OneSequenceThatDoesNotFitIsAnErrorNamingWhatToChange) {
  GpuMemoryInputs in = base();
  in.gpu_memory_utilization = 0.253;  // 0.253 * 16 GiB = 4145.152 MiB: 49 MiB after the weights, 64 needed
  in.utilization_field = "nodes[0].workers[0].gpu_memory_utilization";
  in.max_model_len_field = "models.target.max_model_len";
  auto p = plan_gpu_memory(in);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), StatusCode::kResourceExhausted);
  const std::string m = p.status().message();
  for (const char* want : {"cuda:0: no room for the KV cache of one sequence of models.target.max_model_len 1024 tokens",
                           "needs 64 MiB (64 blocks of 1024 KiB)", "but 49 MiB remain",
                           "nodes[0].workers[0].gpu_memory_utilization 0.253 of 16384 MiB = 4145 MiB",
                           "less 4096 MiB of weights", "12288 MiB free on the device",
                           "raise nodes[0].workers[0].gpu_memory_utilization, or lower models.target.max_model_len or "
                           "max_num_batched_tokens"}) {
    EXPECT_NE(m.find(want), std::string::npos) << "'" << want << "' not in: " << m;
  }
  // A shorter max_model_len fits: 48 tokens = 3 blocks.
  in.max_model_len = 48;
  auto q = plan_gpu_memory(in);
  ASSERT_TRUE(q.ok()) << q.status().to_string();
  EXPECT_EQ(q->num_kv_blocks, 49);
}

TEST(GpuMemoryPlan, NotFittingBecauseOthersHoldTheDeviceSaysSo) {
  GpuMemoryInputs in = base();
  in.free_bytes = 10 * kMiB;
  auto p = plan_gpu_memory(in);
  ASSERT_FALSE(p.ok());
  const std::string m = p.status().message();
  EXPECT_NE(m.find("other processes hold memory on cuda:0"), std::string::npos) << m;
  EXPECT_NE(m.find("but 10 MiB remain"), std::string::npos) << m;
}

TEST(GpuMemoryPlan, InputsOutOfRangeAreRefused) {
  for (double u : {0.0, -0.1, 1.5}) {
    GpuMemoryInputs in = base();
    in.gpu_memory_utilization = u;
    in.utilization_field = "--gpu-memory-utilization";
    auto p = plan_gpu_memory(in);
    ASSERT_FALSE(p.ok()) << u;
    EXPECT_EQ(p.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(p.status().message().find("--gpu-memory-utilization = "), std::string::npos) << p.status().message();
    EXPECT_NE(p.status().message().find("must be in (0, 1]"), std::string::npos) << p.status().message();
  }
  GpuMemoryInputs none = base();
  none.target_block_bytes = 0;
  EXPECT_EQ(plan_gpu_memory(none).status().code(), StatusCode::kInvalidArgument);
  GpuMemoryInputs zero_len = base();
  zero_len.max_model_len = 0;
  EXPECT_EQ(plan_gpu_memory(zero_len).status().code(), StatusCode::kInvalidArgument);
  // All of the device is allowed.
  GpuMemoryInputs all = base();
  all.gpu_memory_utilization = 1.0;
  ASSERT_TRUE(plan_gpu_memory(all).ok());
  EXPECT_EQ(plan_gpu_memory(all)->num_kv_blocks, 12288);
}

TEST(GpuMemoryPlan, EngineInputsFromTheModelAndTheEngineLimits) {
  ModelConfig c;
  c.num_layers = 4;
  c.hidden_size = 64;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 16;  // kv_dim 32
  c.ffn_size = 128;
  c.vocab_size = 100;
  c.context_length = 256;
  EngineOptions o;
  o.block_size = 8;
  o.max_num_seqs = 3;
  o.max_num_batched_tokens = 10;
  GpuMemoryInputs in = engine_memory_inputs(c, o);
  EXPECT_EQ(in.target_block_bytes, 2 * 4 * 32 * 8 * 4);  // K and V, 4 layers, 8 slots of 32 floats
  EXPECT_EQ(in.max_model_len, 256) << "0: the model's context length";
  EXPECT_EQ(in.max_num_seqs, 3);
  EXPECT_EQ(in.block_size, 8);
  // hidden 64, q 64, kv 32, ffn 128, vocab 100: 740 floats per row; 10 rows * 4 B * 740 * 1.25.
  EXPECT_EQ(in.activation_bytes, 10 * 4 * (3 * 64 + 2 * 64 + 2 * 32 + 2 * 128 + 100) * 5 / 4);
  EXPECT_EQ(engine_memory_inputs(c, o, 2).target_block_bytes, in.target_block_bytes / 2) << "a rank holds half the KV heads";
  o.max_model_len = 100;
  EXPECT_EQ(engine_memory_inputs(c, o).max_model_len, 100);
}

// On the CPU nothing is measured and nothing planned: the engine keeps its defaults.
TEST(GpuMemoryPlan, CpuBudgetIsInactiveAndChangesNothing) {
  DeviceMemoryBudget cpu("cpu", 0.5, "--gpu-memory-utilization");
  EXPECT_FALSE(cpu.active());
  auto backend = make_backend_for_device("--device", "cpu", 1);
  ASSERT_TRUE(backend.ok());
  EXPECT_EQ((*backend)->weight_bytes(), 0) << "the CPU's memory is not planned";
  cpu.target_loaded(**backend);
  EngineOptions o;
  o.num_kv_blocks = 7;
  EngineKvPlanner planner(cpu, base(), &o);
  EXPECT_FALSE(static_cast<bool>(planner.draft_planner())) << "no draft planner: the proposer keeps its default KV";
  ASSERT_TRUE(planner.finish().ok());
  EXPECT_EQ(o.num_kv_blocks, 7);
  EXPECT_EQ(planner.summary(), "");
}

}  // namespace
}  // namespace specserve
