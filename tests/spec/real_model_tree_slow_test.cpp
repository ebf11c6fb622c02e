// Token trees on the real default model, the wide sweep (label "slow"): 8 prompts, 32 tokens,
// four tree shapes (Medusa's mc_sim_7b_63 whole and trimmed, a wide and a deep one) at batch 1
// and 8 — greedy output and logprobs exactly those of plain decoding — plus typical acceptance
// (greedy requests unaffected) and seeded sampling with trees (reproducible, no KV leak).
#include <chrono>
#include <cstdio>

#include "tests/spec/real_model_tree_util.h"

namespace specserve {
namespace {

using namespace real_tree_testing;

const std::vector<Tokens>& prompts() {
  static const std::vector<Tokens> p = reference_prompts(8, 96);
  return p;
}

const TreeRun& base() {
  static const TreeRun b = run_greedy(nullptr, 0, 1, 32, prompts());
  return b;
}

TokenTree tree_of(const char* text) { return parse_token_tree(text).value(); }

TEST(RealModelTreeSlow, GreedyTreesEqualPlainDecoding) {
  struct Shape {
    const char* name;
    TokenTree tree;
  };
  const std::vector<Shape> shapes = {
      {"mc_sim_7b_63", default_medusa_tree(63)},
      {"medusa-24", default_medusa_tree(24)},
      {"wide-6x2", tree_of("[(0,),(1,),(2,),(3,),(4,),(5,),(0,0),(1,0),(2,0),(3,0),(4,0),(5,0)]")},
      {"deep-chain-8+siblings", tree_of("[(0,),(1,),(0,0),(0,1),(0,0,0),(0,0,1),(0,0,0,0),(0,0,0,0,0),(0,0,0,0,0,0)]")},
  };
  for (const Shape& sh : shapes) {
    for (int32_t batch : {1, 8}) {
      const auto t0 = std::chrono::steady_clock::now();
      auto p = oracle(sh.tree, prompts(), base(), 0.2, 10 + static_cast<uint64_t>(batch));
      const TreeRun got = run_greedy(p.get(), sh.tree.num_nodes(), batch, 32, prompts());
      const std::string where = std::string(sh.name) + " batch " + std::to_string(batch);
      expect_same(base(), got, where);
      std::printf("[ tree     ] %-28s mean acceptance length %.2f  %.1f s\n", where.c_str(), got.spec.mean_acceptance_length(),
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
  }
}

TEST(RealModelTreeSlow, TypicalAcceptanceLeavesGreedyAlone) {
  auto p = oracle(default_medusa_tree(16), prompts(), base(), 0.2, 3);
  expect_same(base(), run_greedy(p.get(), 16, 8, 32, prompts(), /*typical=*/true), "typical acceptance, greedy, batch 8");
}

TEST(RealModelTreeSlow, SeededSamplingWithTreesIsReproducible) {
  RealModel& m = real_model();
  auto run = [&](uint64_t seed) {
    auto p = oracle(default_medusa_tree(12), prompts(), base(), 0.2, 4);
    EngineOptions o;
    o.max_num_seqs = 8;
    o.max_model_len = 1024;
    o.num_speculative_tokens = 12;
    auto e = Engine::create(*m.model, m.tokenizer.get(), p.get(), o);
    EXPECT_TRUE(e.ok());
    std::map<int64_t, Tokens> out;
    for (size_t i = 0; i < prompts().size(); ++i) {
      GenerateParams g;
      g.prompt = prompts()[i];
      g.max_tokens = 24;
      g.sampling.temperature = 0.7f;
      g.sampling.top_p = 0.9f;
      g.sampling.seed = seed + i;
      g.sampling.has_seed = true;
      g.sampling.ignore_eos = true;
      EXPECT_TRUE((*e)->add_request(g).ok());
    }
    std::vector<SeqEvent> evs;
    while ((*e)->has_work()) {
      evs.clear();
      EXPECT_TRUE((*e)->step(&evs).ok());
      for (const auto& ev : evs) out[ev.seq_id].insert(out[ev.seq_id].end(), ev.tokens.begin(), ev.tokens.end());
    }
    EXPECT_EQ((*e)->block_pool().num_free(), (*e)->block_pool().num_blocks());
    EXPECT_GT((*e)->stats().spec.num_accepted_tokens, 0);
    return out;
  };
  const auto a = run(100), b = run(100), c = run(200);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  for (const auto& [id, t] : a) EXPECT_EQ(t.size(), 24u);
}

}  // namespace
}  // namespace specserve
