// The real default model under the opt-in matmul kernels that do not compute in fp32 (cpu/matmul.h):
// SPECSERVE_CPU_MATMUL=amx (bf16 tiles) and vnni (int8 x against Q4_1 / Q8_0 weights). Medusa and
// EAGLE trees and plain decoding in a batch of 4 give each prompt the tokens plain decoding gives
// it alone, one at a time. This is what the kernels' batch invariance is for: verification rows,
// decode rows and a prompt alone are multiplied in different x groups. Each skips, saying so,
// where the CPU cannot run its kernel.
#include <cstdio>

#include "cpu/matmul.h"
#include "tests/spec/heads_engine_fixture.h"

namespace specserve::heads_testing {
namespace {

class HeadsEngineKernelTest : public HeadsEngineTest {
 protected:
  static void check_greedy_identity(const char* kernel, bool q8 = false);
};

// `q8`: the Q8_0 head files (models/heads/*.q8_0.gguf), whose matrices the vnni kernel also
// multiplies with int8 x.
void HeadsEngineKernelTest::check_greedy_identity(const char* kernel, bool q8) {
  const int32_t kTokens = 12;
  const EngineRun alone = run(nullptr, 0, 1, kTokens, 4);  // four prompts, one at a time
  const EngineRun plain = run(nullptr, 0, 4, kTokens, 4);  // the same four in one batch
  const HeadsBatch4 heads = run_heads_batch4(kTokens, q8);
  ASSERT_TRUE(heads.ok);
  const EngineRun& med = heads.medusa;
  const EngineRun& eag = heads.eagle;
  for (size_t i = 0; i < 4; ++i) {
    ASSERT_EQ(alone.tokens[i].size(), static_cast<size_t>(kTokens));
    EXPECT_EQ(plain.tokens[i], alone.tokens[i]) << kernel << ": plain batch of 4, prompt " << i;
    EXPECT_EQ(med.tokens[i], alone.tokens[i]) << kernel << ": medusa, prompt " << i;
    EXPECT_EQ(eag.tokens[i], alone.tokens[i]) << kernel << ": eagle, prompt " << i;
  }
  EXPECT_GT(med.spec.num_accepted_tokens, 0) << "medusa heads accepted nothing under " << kernel;
  EXPECT_GT(eag.spec.num_accepted_tokens, 0) << "eagle head accepted nothing under " << kernel;
  std::printf("[heads %s%s] batch 4: mean accepted length medusa %.2f, eagle %.2f\n", kernel, q8 ? ", Q8_0 heads" : "",
              med.spec.mean_acceptance_length(),
              eag.spec.mean_acceptance_length());
}

struct RestoreIsa {
  MatmulIsa isa = matmul_isa();
  ~RestoreIsa() { set_matmul_isa(isa); }
};

TEST_F(HeadsEngineKernelTest, AmxKernelKeepsGreedyIdentityForTreesAndBatches) {
  RestoreIsa restore;
  if (!set_matmul_isa(MatmulIsa::kAmx)) GTEST_SKIP() << "the AMX kernel cannot run here: this CPU lacks amx-tile, amx-bf16 or avx512bf16, or the kernel refused the tile state";
  check_greedy_identity("amx");
}

TEST_F(HeadsEngineKernelTest, VnniKernelKeepsGreedyIdentityForTreesAndBatches) {
  RestoreIsa restore;
  if (!set_matmul_isa(MatmulIsa::kVnni)) GTEST_SKIP() << "the vnni kernel cannot run here: this CPU lacks avx512vnni (or avx512bw/vl)";
  check_greedy_identity("vnni");
  check_greedy_identity("vnni", /*q8=*/true);
}

}  // namespace
}  // namespace specserve::heads_testing
