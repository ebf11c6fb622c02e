// Medusa and EAGLE on the real default model with the committed heads (models/heads/): greedy
// output through the tree engine is token-for-token that of plain decoding, in a batch of 4, and
// drafts are accepted (the heads were trained on this target). The full matrix (two tree shapes
// per method, batch 1 and 4, longer outputs) is heads_engine_slow_test.cpp.
#include <cstdio>

#include "spec/lookup_first_proposer.h"
#include "tests/spec/heads_engine_fixture.h"

namespace specserve::heads_testing {
namespace {

TEST_F(HeadsEngineTest, GreedyIdentityAtBatch4) {
  const int32_t kTokens = 12;
  const EngineRun plain = run(nullptr, 0, 4, kTokens, 4);
  const HeadsBatch4 heads = run_heads_batch4(kTokens);
  ASSERT_TRUE(heads.ok);
  const EngineRun& med = heads.medusa;
  const EngineRun& eag = heads.eagle;
  for (size_t i = 0; i < 4; ++i) {
    ASSERT_EQ(plain.tokens[i].size(), static_cast<size_t>(kTokens));
    EXPECT_EQ(med.tokens[i], plain.tokens[i]) << "medusa, prompt " << i;
    EXPECT_EQ(eag.tokens[i], plain.tokens[i]) << "eagle, prompt " << i;
  }
  EXPECT_GT(med.spec.num_drafts, 0);
  EXPECT_GT(med.spec.num_accepted_tokens, 0) << "medusa heads accepted nothing";
  EXPECT_GT(eag.spec.num_drafts, 0);
  EXPECT_GT(eag.spec.num_accepted_tokens, 0) << "eagle head accepted nothing";
  std::printf("[heads] batch 4: mean accepted length medusa %.2f, eagle %.2f\n", med.spec.mean_acceptance_length(),
              eag.spec.mean_acceptance_length());
}

TEST_F(HeadsEngineTest, GreedyIdentityAtBatch1StaticEagleChainAndMedusaTree) {
  const int32_t kTokens = 16;
  const EngineRun plain = run(nullptr, 0, 1, kTokens, 1);
  EagleOptions o;
  o.mode = EagleOptions::Mode::kStatic;
  o.tree_paths = parse_token_tree("[(0,), (0, 0), (0, 0, 0)]")->paths;
  auto e = eagle(o);
  ASSERT_TRUE(e);
  const EngineRun chain = run(e.get(), 3, 1, kTokens, 1);
  auto m = medusa("[(0,), (1,), (2,), (0, 0), (1, 0), (0, 1)]");
  ASSERT_TRUE(m);
  const EngineRun tree = run(m.get(), 6, 1, kTokens, 1);
  EXPECT_EQ(chain.tokens[0], plain.tokens[0]);
  EXPECT_EQ(tree.tokens[0], plain.tokens[0]);
  EXPECT_GT(chain.spec.num_accepted_tokens + tree.spec.num_accepted_tokens, 0);
}

// The committed heads in Q8_0 (models/heads/*.q8_0.gguf, tools/train/quantize_head.py): they load
// (every matrix Q8_0), keep greedy output that of plain decoding for an EAGLE chain, an EAGLE tree
// and a Medusa tree at batch 2, and draft nearly what the F16 heads draft (a quantised head may
// rank a near tie the other way, but most accepted drafts must stay).
TEST_F(HeadsEngineTest, Q8HeadsKeepGreedyIdentityAndAcceptLikeTheF16Heads) {
  const int32_t kTokens = 16;
  const EngineRun plain = run(nullptr, 0, 2, kTokens, 2);
  for (const std::string* path : {&kEagleQ8File, &kMedusaQ8File}) {
    auto f = GgufFile::open(*path);
    ASSERT_TRUE(f.ok()) << f.status().to_string();
    int matrices = 0;
    for (const GgufTensorInfo& t : f->tensors()) {
      if (t.shape.size() != 2) continue;
      ++matrices;
      EXPECT_EQ(t.type(), GgmlType::Q8_0) << *path << ": " << t.name;
    }
    EXPECT_GE(matrices, 4) << *path;
  }
  auto eagle_from = [&](const std::string& path, bool chain) {
    EagleOptions o;
    o.draft_vocab_size = 8192;
    if (chain) {
      o.mode = EagleOptions::Mode::kStatic;
      o.tree_paths = parse_token_tree("[(0,), (0, 0)]")->paths;
    } else {
      o.topk = 3;
      o.depth = 3;
    }
    auto e = EagleProposer::load(path, *model_, *file_, o);
    EXPECT_TRUE(e.ok()) << e.status().to_string();
    return e.ok() ? std::unique_ptr<Proposer>(std::move(*e)) : nullptr;
  };
  auto medusa_from = [&](const std::string& path) {
    MedusaOptions o;
    o.draft_vocab_size = 8192;
    o.tree_paths = parse_token_tree("[(0,), (1,), (0, 0), (0, 1)]")->paths;
    auto m = MedusaProposer::load(path, *model_, *file_, o);
    EXPECT_TRUE(m.ok()) << m.status().to_string();
    return m.ok() ? std::unique_ptr<Proposer>(std::move(*m)) : nullptr;
  };
  struct Case { const char* name; int32_t k; std::unique_ptr<Proposer> q8, f16; };
  Case cases[] = {{"eagle chain", 2, eagle_from(kEagleQ8File, true), eagle_from(kEagleFile, true)},
                  {"eagle tree", 6, eagle_from(kEagleQ8File, false), eagle_from(kEagleFile, false)},
                  {"medusa tree", 4, medusa_from(kMedusaQ8File), medusa_from(kMedusaFile)}};
  for (Case& c : cases) {
    ASSERT_TRUE(c.q8 && c.f16) << c.name;
    const EngineRun q8 = run(c.q8.get(), c.k, 2, kTokens, 2);
    const EngineRun f16 = run(c.f16.get(), c.k, 2, kTokens, 2);
    for (size_t i = 0; i < 2; ++i) EXPECT_EQ(q8.tokens[i], plain.tokens[i]) << c.name << ", prompt " << i;
    EXPECT_GT(q8.spec.num_accepted_tokens, 0) << c.name;
    EXPECT_GE(q8.spec.num_accepted_tokens * 4, f16.spec.num_accepted_tokens * 3)
        << c.name << ": Q8_0 accepted " << q8.spec.num_accepted_tokens << ", F16 " << f16.spec.num_accepted_tokens;
    std::printf("[heads] %s: accepted tokens Q8_0 %lld, F16 %lld\n", c.name, static_cast<long long>(q8.spec.num_accepted_tokens),
                static_cast<long long>(f16.spec.num_accepted_tokens));
  }
}

// Prompt lookup first, the real EAGLE head where it finds nothing (spec/lookup_first_proposer.h):
// greedy output still plain decoding's at batch 1 and 4; both sources drafted and something was
// accepted.
TEST_F(HeadsEngineTest, LookupFirstWithEagleKeepsGreedyIdentity) {
  const int32_t kTokens = 24;
  for (int32_t batch : {1, 4}) {
    const EngineRun plain = run(nullptr, 0, batch, kTokens, batch);
    EagleOptions o;
    o.topk = 4;
    o.depth = 4;
    auto e = eagle(o);
    ASSERT_TRUE(e);
    LookupFirstProposer lookup(std::move(e), 1, 3);
    const EngineRun got = run(&lookup, 8, batch, kTokens, batch);
    const std::string where = "batch " + std::to_string(batch);
    for (size_t i = 0; i < static_cast<size_t>(batch); ++i) {
      ASSERT_EQ(plain.tokens[i].size(), static_cast<size_t>(kTokens)) << where;
      EXPECT_EQ(got.tokens[i], plain.tokens[i]) << where << ", prompt " << i;
    }
    EXPECT_GT(lookup.num_lookup_drafts(), 0) << where;
    EXPECT_GT(lookup.num_inner_drafts(), 0) << where;
    EXPECT_GT(got.spec.num_accepted_tokens, 0) << where;
    std::printf("[heads] %s eagle+ngram: %lld lookup drafts, %lld head drafts, mean accepted length %.2f\n", where.c_str(),
                static_cast<long long>(lookup.num_lookup_drafts()), static_cast<long long>(lookup.num_inner_drafts()),
                got.spec.mean_acceptance_length());
  }
}

// draft_p_min on the real head: greedy output still plain decoding's, at batch 1 and 4; fewer
// tokens drafted than without it (low-confidence nodes dropped, some steps not drafted at all),
// and a larger share of what is drafted accepted.
TEST_F(HeadsEngineTest, DraftPMinKeepsGreedyIdentityAndDraftsLess) {
  const int32_t kTokens = 16;
  for (int32_t batch : {1, 4}) {
    const EngineRun plain = run(nullptr, 0, batch, kTokens, batch);
    EagleOptions o;
    o.topk = 4;
    o.depth = 4;
    auto e0 = eagle(o);
    ASSERT_TRUE(e0);
    const EngineRun all = run(e0.get(), 8, batch, kTokens, batch);
    o.draft_p_min = 0.3f;
    auto e1 = eagle(o);
    ASSERT_TRUE(e1);
    const EngineRun pruned = run(e1.get(), 8, batch, kTokens, batch);
    const std::string where = "batch " + std::to_string(batch);
    for (size_t i = 0; i < static_cast<size_t>(batch); ++i) {
      ASSERT_EQ(plain.tokens[i].size(), static_cast<size_t>(kTokens)) << where;
      EXPECT_EQ(all.tokens[i], plain.tokens[i]) << where << ", prompt " << i;
      EXPECT_EQ(pruned.tokens[i], plain.tokens[i]) << where << ", draft_p_min 0.3, prompt " << i;
    }
    EXPECT_GT(pruned.spec.num_accepted_tokens, 0) << where;
    EXPECT_LT(pruned.spec.num_draft_tokens, all.spec.num_draft_tokens) << where;
    EXPECT_GT(pruned.spec.acceptance_rate(), all.spec.acceptance_rate()) << where;
    std::printf("[heads] %s eagle 4x4 k 8: drafted %lld accepted %lld; draft_p_min 0.3: drafted %lld accepted %lld\n",
                where.c_str(), static_cast<long long>(all.spec.num_draft_tokens), static_cast<long long>(all.spec.num_accepted_tokens),
                static_cast<long long>(pruned.spec.num_draft_tokens), static_cast<long long>(pruned.spec.num_accepted_tokens));
  }
}

// disable_by_goodput (spec/goodput.h) on the real head: greedy output is still plain decoding's
// at batch 1 and 4, while some decode steps draft and some do not (the calibration alone
// alternates the two; after it, which ones depends on measured times).
TEST_F(HeadsEngineTest, DisableByGoodputKeepsGreedyIdentityAndSkipsSomeDrafts) {
  const int32_t kTokens = 24;
  for (int32_t batch : {1, 4}) {
    const EngineRun plain = run(nullptr, 0, batch, kTokens, batch);
    EagleOptions o;
    o.topk = 4;
    o.depth = 4;
    auto e = eagle(o);
    ASSERT_TRUE(e);
    const EngineRun gp = run(e.get(), 8, batch, kTokens, batch, 0.0f, 0, /*disable_by_goodput=*/true);
    const std::string where = "batch " + std::to_string(batch);
    for (size_t i = 0; i < static_cast<size_t>(batch); ++i) {
      ASSERT_EQ(plain.tokens[i].size(), static_cast<size_t>(kTokens)) << where;
      EXPECT_EQ(gp.tokens[i], plain.tokens[i]) << where << ", prompt " << i;
    }
    EXPECT_GT(gp.stats.goodput_drafting, 0) << where;
    EXPECT_GT(gp.stats.goodput_skipped, 0) << where;
    EXPECT_EQ(gp.spec.num_drafts, gp.stats.goodput_drafting) << where << ": every sequence asked to draft drafted";
    std::printf("[heads] %s eagle 4x4 k 8, disable_by_goodput: %lld sequence-steps drafted, %lld left out, accepted %lld\n",
                where.c_str(), static_cast<long long>(gp.stats.goodput_drafting), static_cast<long long>(gp.stats.goodput_skipped),
                static_cast<long long>(gp.spec.num_accepted_tokens));
  }
}

// Sampled requests: the heads' tokens are deterministic top ranks sent without q, which the
// engine verifies without replacement (lossless; the distribution itself is checked by the tree
// chi-square test). Here: drafts are accepted, nothing is refused, and a seeded run repeats.
TEST_F(HeadsEngineTest, SeededSamplingWithHeadsRepeatsAndAccepts) {
  EagleOptions o;
  o.topk = 3;
  o.depth = 3;
  auto e = eagle(o);
  ASSERT_TRUE(e);
  const EngineRun a = run(e.get(), 6, 2, 12, 2, 0.7f, 11);
  const EngineRun b = run(e.get(), 6, 2, 12, 2, 0.7f, 11);
  auto m = medusa("", 8192);
  ASSERT_TRUE(m);
  const EngineRun c = run(m.get(), 6, 2, 12, 2, 0.7f, 11);
  for (size_t i = 0; i < 2; ++i) {
    ASSERT_EQ(a.tokens[i].size(), 12u);
    EXPECT_EQ(a.tokens[i], b.tokens[i]) << "prompt " << i;
    EXPECT_EQ(c.tokens[i].size(), 12u);
  }
  EXPECT_GT(a.spec.num_accepted_tokens, 0);
  EXPECT_GT(c.spec.num_drafts, 0);
}

}  // namespace
}  // namespace specserve::heads_testing
