// Token trees on the real default model, the quick default-set check: greedy output with a
// Medusa-shaped tree (the right token hidden among wrong siblings at random ranks) is, token
// for token and logprob for logprob, that of plain decoding, alone and in a batch of 3.
// The wider sweep (more prompts, shapes, batch 8, typical acceptance) is in
// real_model_tree_slow_test.cpp.
#include <chrono>
#include <cstdio>

#include "tests/spec/real_model_tree_util.h"

namespace specserve {
namespace {

using namespace real_tree_testing;

TEST(RealModelTree, GreedyTreeEqualsPlainDecodingAloneAndBatched) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<Tokens> prompts = reference_prompts(3, 48);
  ASSERT_EQ(prompts.size(), 3u);
  const TreeRun base = run_greedy(nullptr, 0, 1, 14, prompts);
  const TokenTree shape = default_medusa_tree(10);
  auto p1 = oracle(shape, prompts, base, 0.25, 1);
  const TreeRun alone = run_greedy(p1.get(), 10, 1, 14, prompts);
  expect_same(base, alone, "medusa-10 batch 1");
  auto p3 = oracle(shape, prompts, base, 0.25, 2);
  const TreeRun batched = run_greedy(p3.get(), 10, 3, 14, prompts);
  expect_same(base, batched, "medusa-10 batch 3");
  EXPECT_GT(p1->num_right_off_first() + p3->num_right_off_first(), 3) << "no path off the first branch";
  std::printf("[ tree     ] mean acceptance length %.2f (batch 1), %.2f (batch 3); %.1f s\n", alone.spec.mean_acceptance_length(),
              batched.spec.mean_acceptance_length(),
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
}

}  // namespace
}  // namespace specserve
