// Medusa and EAGLE on the real default model (slow: a few minutes on two cores): greedy identity
// with plain decoding for two tree shapes per method at batch 1 and 4, the full vocabulary and a
// draft vocabulary; acceptance is reported and must be non-zero.
#include "tests/spec/heads_engine_fixture.h"

namespace specserve::heads_testing {
namespace {

TEST_F(HeadsEngineTest, GreedyIdentityTwoShapesBatch1And4) {
  const int32_t kTokens = 32;
  struct Case {
    std::string name;
    std::function<std::unique_ptr<Proposer>()> make;
    int32_t k;
  };
  EagleOptions dyn;
  dyn.topk = 4;
  dyn.depth = 5;
  dyn.draft_vocab_size = 8192;
  EagleOptions stat;
  stat.mode = EagleOptions::Mode::kStatic;
  stat.tree_paths = parse_token_tree("[(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (0, 0, 0, 0)]")->paths;
  const Case cases[] = {
      {"medusa mc_sim_7b_63 k=10", [] { return medusa(); }, 10},
      {"medusa small tree k=6", [] { return medusa("[(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0)]", 16384); }, 6},
      {"eagle dynamic k=10", [&] { return eagle(dyn); }, 10},
      {"eagle static k=7", [&] { return eagle(stat); }, 7},
  };
  for (int32_t batch : {1, 4}) {
    const size_t n = batch == 1 ? 2 : 4;
    const EngineRun plain = run(nullptr, 0, batch, kTokens, n);
    for (const Case& c : cases) {
      auto p = c.make();
      ASSERT_TRUE(p) << c.name;
      const EngineRun r = run(p.get(), c.k, batch, kTokens, n);
      for (size_t i = 0; i < n; ++i) EXPECT_EQ(r.tokens[i], plain.tokens[i]) << c.name << ", batch " << batch << ", prompt " << i;
      EXPECT_GT(r.spec.num_accepted_tokens, 0) << c.name;
      std::printf("[heads] %s batch %d: mean accepted length %.2f, drafts %lld\n", c.name.c_str(), batch,
                  r.spec.mean_acceptance_length(), static_cast<long long>(r.spec.num_drafts));
    }
  }
}

}  // namespace
}  // namespace specserve::heads_testing
