// Automatic prefix caching in the Engine (spec/engine.h) and in a draft model's own cache
// (spec/model_drafter.h), on the real default model (SmolLM2-135M-Instruct Q4_1): the same long
// prompt sent twice hits the cached blocks the second time, computes fewer prefill tokens, and
// gives the same output as the first time and as an engine with caching off — greedy, seeded
// sampling, and with a layer-skip drafter whose own cache must hold the draft KV of the hit
// prefix. Edge cases: a prompt shorter than a block (no hit), a prompt of exactly N blocks
// (N - 1 hit: the last token is always computed), a small cache that evicts, and sequences
// sharing a prefix under preemption. Block size 16 (the default).
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>

#include "cpu/cpu_backend.h"
#include "model/gguf.h"
#include "model/tokenizer.h"
#include "model/transformer.h"
#include "spec/engine.h"
#include "spec/model_drafter.h"
#include "tests/test_util.h"

namespace specserve {
namespace {

using Tokens = std::vector<int32_t>;

/// What one request produced, and what the engine counted while it ran.
struct Result {
  Tokens tokens;
  std::vector<float> logprobs;
  int64_t prefill_tokens = 0;  // EngineStats::prefill_tokens added by this request
  int64_t queries = 0;         // EngineStats::prefix_cache_queries added
  int64_t hits = 0;            // EngineStats::prefix_cache_hits added
  SpecStats spec;
};

class PrefixCacheEngineTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    backend_ = make_cpu_backend(1).release();
    auto m = Transformer::load(testing::default_gguf(), *backend_);
    ASSERT_TRUE(m.ok()) << m.status().to_string();
    model_ = m->release();
    std::ifstream in(testing::data_path("llama_ref/smollm2_greedy.json"));
    ASSERT_TRUE(in.good());
    const nlohmann::json j = nlohmann::json::parse(in);
    // Two long recorded prompts (577 and 547 tokens): A is the head of one, B the tail of the
    // other, so they share no block.
    const Tokens a = j["cases"][7]["prompt_ids"].get<Tokens>();
    const Tokens b = j["cases"][8]["prompt_ids"].get<Tokens>();
    ASSERT_GE(a.size(), 200u);
    ASSERT_GE(b.size(), 200u);
    long_a_ = new Tokens(a.begin(), a.begin() + 90);  // 5 full blocks + 10 tokens
    long_b_ = new Tokens(b.end() - 90, b.end());
  }

  static EngineOptions options(bool caching, int64_t num_kv_blocks = 0, int32_t max_num_seqs = 4) {
    EngineOptions o;
    o.max_num_seqs = max_num_seqs;
    o.max_model_len = 512;
    o.num_kv_blocks = num_kv_blocks;
    o.enable_prefix_caching = caching;
    return o;
  }

  static GenerateParams request(const Tokens& prompt, int32_t max_tokens, double temperature = 0, uint64_t seed = 0) {
    GenerateParams p;
    p.prompt = prompt;
    p.max_tokens = max_tokens;
    p.sampling.temperature = static_cast<float>(temperature);
    if (temperature > 0) {
      p.sampling.seed = seed;
      p.sampling.has_seed = true;
    }
    p.sampling.ignore_eos = true;
    p.sampling.logprobs = 1;
    return p;
  }

  /// Runs `reqs` together on `e` until all finish; one Result each, in order.
  static std::vector<Result> run_together(Engine& e, const std::vector<GenerateParams>& reqs) {
    const EngineStats before = e.stats();
    std::map<int64_t, size_t> which;
    for (size_t i = 0; i < reqs.size(); ++i) {
      auto id = e.add_request(reqs[i]);
      EXPECT_TRUE(id.ok()) << id.status().to_string();
      if (id.ok()) which[*id] = i;
    }
    std::vector<Result> out(reqs.size());
    std::vector<SeqEvent> evs;
    while (e.has_work()) {
      evs.clear();
      Status st = e.step(&evs);
      EXPECT_TRUE(st.ok()) << st.to_string();
      if (!st.ok()) break;
      for (const SeqEvent& ev : evs) {
        Result& r = out[which.at(ev.seq_id)];
        r.tokens.insert(r.tokens.end(), ev.tokens.begin(), ev.tokens.end());
        for (const auto& lp : ev.logprobs) r.logprobs.push_back(lp.logprob);
        if (ev.finish != FinishReason::kNone) r.spec = *e.take_finished_stats(ev.seq_id);
      }
    }
    const EngineStats& after = e.stats();
    if (reqs.size() == 1) {
      out[0].prefill_tokens = after.prefill_tokens - before.prefill_tokens;
      out[0].queries = after.prefix_cache_queries - before.prefix_cache_queries;
      out[0].hits = after.prefix_cache_hits - before.prefix_cache_hits;
    }
    EXPECT_EQ(e.block_pool().num_free(), e.block_pool().num_blocks()) << "KV blocks leaked";
    return out;
  }

  static Result run_one(Engine& e, const GenerateParams& req) { return run_together(e, {req})[0]; }

  static std::unique_ptr<Engine> engine(const EngineOptions& o, Proposer* proposer = nullptr) {
    auto e = Engine::create(*model_, &testing::default_tokenizer(), proposer, o);
    EXPECT_TRUE(e.ok()) << e.status().to_string();
    return e.ok() ? std::move(*e) : nullptr;
  }

  static Backend* backend_;
  static Transformer* model_;
  static Tokens* long_a_;
  static Tokens* long_b_;
};

Backend* PrefixCacheEngineTest::backend_ = nullptr;
Transformer* PrefixCacheEngineTest::model_ = nullptr;
Tokens* PrefixCacheEngineTest::long_a_ = nullptr;
Tokens* PrefixCacheEngineTest::long_b_ = nullptr;

void expect_same_output(const Result& want, const Result& got, const std::string& what) {
  EXPECT_EQ(got.tokens, want.tokens) << what;
  EXPECT_EQ(got.logprobs, want.logprobs) << what;  // bit-identical: the KV is the same
}

TEST_F(PrefixCacheEngineTest, LongPromptSentTwiceHitsAndGivesTheSameGreedyOutput) {
  const GenerateParams req = request(*long_a_, 12);
  auto off = engine(options(false));
  ASSERT_TRUE(off);
  const Result plain = run_one(*off, req);
  EXPECT_EQ(off->stats().prefix_cache_queries, 0);
  EXPECT_EQ(off->stats().prefix_cache_hits, 0);

  auto on = engine(options(true));
  ASSERT_TRUE(on);
  const Result first = run_one(*on, req);
  const Result second = run_one(*on, req);
  ASSERT_EQ(first.tokens.size(), 12u);
  expect_same_output(plain, first, "first run vs caching off");
  expect_same_output(plain, second, "second run (prefix hit) vs caching off");
  // 90 tokens: the first run finds nothing; the second all 5 full blocks (80 tokens).
  EXPECT_EQ(first.queries, 90);
  EXPECT_EQ(first.hits, 0);
  EXPECT_EQ(second.queries, 90);
  EXPECT_EQ(second.hits, 80);
  EXPECT_EQ(first.prefill_tokens, 90);
  EXPECT_EQ(second.prefill_tokens, 10);
  EXPECT_EQ(plain.prefill_tokens, 90);
}

TEST_F(PrefixCacheEngineTest, SeededSamplingGivesTheSameOutputWithAHit) {
  const GenerateParams req = request(*long_a_, 12, 0.9, 1234);
  auto off = engine(options(false));
  ASSERT_TRUE(off);
  const Result plain = run_one(*off, req);
  auto on = engine(options(true));
  ASSERT_TRUE(on);
  const Result first = run_one(*on, req);
  const Result second = run_one(*on, req);
  EXPECT_EQ(second.hits, 80);
  expect_same_output(plain, first, "sampled, first run");
  expect_same_output(plain, second, "sampled, prefix hit");
  // The seed matters (else the comparison above would prove little).
  const Result other = run_one(*on, request(*long_a_, 12, 0.9, 99));
  EXPECT_NE(other.tokens, plain.tokens);
}

TEST_F(PrefixCacheEngineTest, OutputBlocksAreCachedToo) {
  // The second request is the first one's prompt and output: it hits past the prompt.
  auto on = engine(options(true));
  ASSERT_TRUE(on);
  const Result first = run_one(*on, request(*long_a_, 40));
  Tokens follow_up = *long_a_;
  follow_up.insert(follow_up.end(), first.tokens.begin(), first.tokens.end());  // 130 tokens
  const Result second = run_one(*on, request(follow_up, 8));
  // The first run's KV covers 129 tokens (the last output token is never fed): 8 full blocks.
  EXPECT_EQ(second.hits, 128);
  auto off = engine(options(false));
  ASSERT_TRUE(off);
  expect_same_output(run_one(*off, request(follow_up, 8)), second, "prompt + output as a prompt");
}

TEST_F(PrefixCacheEngineTest, PromptShorterThanABlockNeverHits) {
  const Tokens short_prompt(long_a_->begin(), long_a_->begin() + 10);
  auto on = engine(options(true));
  ASSERT_TRUE(on);
  const Result first = run_one(*on, request(short_prompt, 6));
  const Result second = run_one(*on, request(short_prompt, 6));
  EXPECT_EQ(first.hits, 0);
  EXPECT_EQ(second.hits, 0);
  EXPECT_EQ(second.queries, 10);
  EXPECT_EQ(second.prefill_tokens, 10);
  expect_same_output(first, second, "short prompt twice");
}

TEST_F(PrefixCacheEngineTest, PromptOfExactlyNBlocksHitsNMinusOne) {
  const Tokens four_blocks(long_a_->begin(), long_a_->begin() + 64);
  auto on = engine(options(true));
  ASSERT_TRUE(on);
  const Result first = run_one(*on, request(four_blocks, 6));
  const Result second = run_one(*on, request(four_blocks, 6));
  // The last known token must be computed for its logits: the 4th block is recomputed, in a
  // fresh block (no copy-on-write of a cached one).
  EXPECT_EQ(second.hits, 48);
  EXPECT_EQ(second.prefill_tokens, 16);
  expect_same_output(first, second, "4 blocks twice");
  auto off = engine(options(false));
  ASSERT_TRUE(off);
  expect_same_output(run_one(*off, request(four_blocks, 6)), second, "4 blocks vs caching off");
}

TEST_F(PrefixCacheEngineTest, SmallCacheEvictsLeastRecentlyUsedAndStaysCorrect) {
  // 10 blocks of 16 tokens. A (90 + 12 tokens) caches 6 blocks; B (a different 90-token
  // prompt) needs 7: the 4 never used, then 3 evicted — A's tail blocks first (LRU, a
  // sequence's tail released before its head). A again finds its first 3 blocks.
  auto on = engine(options(true, 10));
  ASSERT_TRUE(on);
  auto off = engine(options(false, 10));
  ASSERT_TRUE(off);
  const Result a1 = run_one(*on, request(*long_a_, 12));
  EXPECT_EQ(on->block_pool().num_evictable(), 6);
  const Result b = run_one(*on, request(*long_b_, 12));
  EXPECT_EQ(b.hits, 0);
  const Result a2 = run_one(*on, request(*long_a_, 12));
  EXPECT_EQ(a2.hits, 48);
  expect_same_output(a1, a2, "A after eviction");
  expect_same_output(run_one(*off, request(*long_a_, 12)), a1, "A vs caching off");
  expect_same_output(run_one(*off, request(*long_b_, 12)), b, "B vs caching off");
}

TEST_F(PrefixCacheEngineTest, SharedPrefixUnderPreemptionKeepsGreedyOutput) {
  // Four requests share A's 5 full blocks, each with its own suffix, all running at once in a
  // cache too small for all of them to grow: sequences that share blocks get preempted and
  // come back, and their output is still plain decoding's.
  std::vector<GenerateParams> reqs;
  for (int32_t i = 0; i < 4; ++i) {
    Tokens p = *long_a_;
    p.push_back(100 + i);
    p.push_back(200 + i);
    reqs.push_back(request(p, 40));
  }
  auto on = engine(options(true, 16));
  ASSERT_TRUE(on);
  run_one(*on, request(*long_a_, 1));  // caches A's blocks
  const std::vector<Result> got = run_together(*on, reqs);
  // 4 x 80 at first admission; more only when a preempted sequence came back and hit again.
  EXPECT_GT(on->stats().prefix_cache_hits, 4 * 80) << "no preemption with a prefix hit happened: the test would be vacuous";
  auto off = engine(options(false, 0, 1));
  ASSERT_TRUE(off);
  for (size_t i = 0; i < reqs.size(); ++i) {
    expect_same_output(run_one(*off, reqs[i]), got[i], "request " + std::to_string(i));
  }
}

TEST_F(PrefixCacheEngineTest, LayerSkipDrafterReusesItsOwnCache) {
  // The drafter has its own pool with the same rules: on the second request the target hits
  // and the drafter does too; its drafts (so the acceptance counts) are exactly the first
  // run's, which they could not be if it lacked the KV of the hit prefix.
  DrafterOptions d;
  d.name = "layer_skip";
  d.num_layers = 20;
  d.max_model_len = 512;
  auto drafter = ModelDrafter::create(*model_, d);
  ASSERT_TRUE(drafter.ok()) << drafter.status().to_string();
  EngineOptions o = options(true);
  o.num_speculative_tokens = 3;
  o.adaptive_k = false;
  auto on = engine(o, drafter->get());
  ASSERT_TRUE(on);
  const GenerateParams req = request(*long_a_, 16);
  const Result first = run_one(*on, req);
  const int64_t draft_hits_before = (*drafter)->block_pool().prefix_cache_hits();
  const Result second = run_one(*on, req);
  EXPECT_EQ(second.hits, 80);
  EXPECT_GT((*drafter)->block_pool().prefix_cache_hits(), draft_hits_before) << "the drafter recomputed the hit prefix";
  expect_same_output(first, second, "layer_skip, prefix hit");
  EXPECT_GT(first.spec.num_accepted_tokens, 0) << "no draft accepted: the comparison would be vacuous";
  EXPECT_EQ(second.spec.num_drafts, first.spec.num_drafts);
  EXPECT_EQ(second.spec.num_accepted_tokens, first.spec.num_accepted_tokens);
  EXPECT_EQ(second.spec.accepted_per_pos, first.spec.accepted_per_pos);
  auto off = engine(options(false));
  ASSERT_TRUE(off);
  expect_same_output(run_one(*off, req), second, "layer_skip with hits vs plain decoding without caching");
  EXPECT_EQ((*drafter)->block_pool().num_free(), (*drafter)->block_pool().num_blocks()) << "draft KV blocks leaked";
}

TEST_F(PrefixCacheEngineTest, DrafterWithoutCachingIsStillCorrectNextToACachingTarget) {
  // The target hits, the drafter (caching off) computes the whole prefix itself.
  DrafterOptions d;
  d.name = "layer_skip";
  d.num_layers = 20;
  d.max_model_len = 512;
  d.enable_prefix_caching = false;
  auto drafter = ModelDrafter::create(*model_, d);
  ASSERT_TRUE(drafter.ok());
  EngineOptions o = options(true);
  o.num_speculative_tokens = 3;
  o.adaptive_k = false;
  auto on = engine(o, drafter->get());
  ASSERT_TRUE(on);
  const GenerateParams req = request(*long_a_, 16);
  const Result first = run_one(*on, req);
  const Result second = run_one(*on, req);
  EXPECT_EQ(second.hits, 80);
  EXPECT_EQ((*drafter)->block_pool().prefix_cache_queries(), 0);
  expect_same_output(first, second, "drafter without caching");
  EXPECT_EQ(second.spec.num_accepted_tokens, first.spec.num_accepted_tokens);
}

}  // namespace
}  // namespace specserve
