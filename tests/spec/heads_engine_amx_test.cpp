// The real default model under SPECSERVE_CPU_MATMUL=amx (cpu/matmul.h: bf16 tiles): Medusa and
// EAGLE trees and plain decoding in a batch of 4 give each prompt the tokens plain decoding gives
// it alone, one at a time. This is what the AMX kernel's batch invariance is for: verification
// rows, decode rows and a prompt alone are multiplied in different x groups. Skips, saying so,
// where the CPU or kernel has no amx-bf16.
#include <cstdio>

#include "cpu/matmul.h"
#include "tests/spec/heads_engine_fixture.h"

namespace specserve::heads_testing {
namespace {

TEST_F(HeadsEngineTest, AmxKernelKeepsGreedyIdentityForTreesAndBatches) {
  const MatmulIsa saved = matmul_isa();
  if (!set_matmul_isa(MatmulIsa::kAmx)) GTEST_SKIP() << "the AMX kernel cannot run here: this CPU lacks amx-tile, amx-bf16 or avx512bf16, or the kernel refused the tile state";
  struct Restore {
    MatmulIsa isa;
    ~Restore() { set_matmul_isa(isa); }
  } restore{saved};
  const int32_t kTokens = 12;
  const EngineRun alone = run(nullptr, 0, 1, kTokens, 4);  // four prompts, one at a time
  const EngineRun plain = run(nullptr, 0, 4, kTokens, 4);  // the same four in one batch
  const HeadsBatch4 heads = run_heads_batch4(kTokens);
  ASSERT_TRUE(heads.ok);
  const EngineRun& med = heads.medusa;
  const EngineRun& eag = heads.eagle;
  for (size_t i = 0; i < 4; ++i) {
    ASSERT_EQ(alone.tokens[i].size(), static_cast<size_t>(kTokens));
    EXPECT_EQ(plain.tokens[i], alone.tokens[i]) << "plain batch of 4, prompt " << i;
    EXPECT_EQ(med.tokens[i], alone.tokens[i]) << "medusa, prompt " << i;
    EXPECT_EQ(eag.tokens[i], alone.tokens[i]) << "eagle, prompt " << i;
  }
  EXPECT_GT(med.spec.num_accepted_tokens, 0) << "medusa heads accepted nothing under amx";
  EXPECT_GT(eag.spec.num_accepted_tokens, 0) << "eagle head accepted nothing under amx";
  std::printf("[heads amx] batch 4: mean accepted length medusa %.2f, eagle %.2f\n", med.spec.mean_acceptance_length(),
              eag.spec.mean_acceptance_length());
}

}  // namespace
}  // namespace specserve::heads_testing
