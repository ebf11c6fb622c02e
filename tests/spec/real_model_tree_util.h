// Token-tree speculation on the real default model (SmolLM2-135M-Instruct Q4_1): shared by
// real_model_tree_test.cpp (the quick default-set check) and real_model_tree_slow_test.cpp.
// Prompts come from the recorded llama.cpp reference (tests/data/llama_ref/smollm2_greedy.json),
// cut to their tail to keep the runs short on two cores.
#pragma once

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
#include "tests/spec/tree_test_util.h"
#include "tests/test_util.h"

namespace specserve::real_tree_testing {

using tree_testing::Tokens;

struct RealModel {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<GgufFile> file;
  std::unique_ptr<Transformer> model;
  std::unique_ptr<Tokenizer> tokenizer;
};

/// The default model on a one-thread CPU backend, loaded once per process.
inline RealModel& real_model() {
  static RealModel* m = [] {
    auto* r = new RealModel;
    r->backend = make_cpu_backend(1);
    auto f = GgufFile::open(testing::default_model_path());
    EXPECT_TRUE(f.ok()) << f.status().to_string() << " (scripts/fetch-model.sh fetches it)";
    if (!f.ok()) return r;
    r->file = std::make_unique<GgufFile>(std::move(*f));
    auto t = Transformer::load(*r->file, *r->backend);
    EXPECT_TRUE(t.ok()) << t.status().to_string();
    if (t.ok()) r->model = std::move(*t);
    auto tok = Tokenizer::from_gguf(*r->file);
    EXPECT_TRUE(tok.ok());
    if (tok.ok()) r->tokenizer = std::make_unique<Tokenizer>(std::move(*tok));
    return r;
  }();
  return *m;
}

/// The first `n` reference prompts, each cut to its last `max_len` tokens.
inline std::vector<Tokens> reference_prompts(size_t n, size_t max_len) {
  std::ifstream in(testing::data_path("llama_ref/smollm2_greedy.json"));
  EXPECT_TRUE(in.good());
  std::vector<Tokens> out;
  if (!in.good()) return out;
  nlohmann::json j = nlohmann::json::parse(in);
  for (const auto& p : j["cases"]) {
    Tokens ids = p["prompt_ids"].get<Tokens>();
    if (ids.size() > max_len) ids.erase(ids.begin(), ids.end() - static_cast<std::ptrdiff_t>(max_len));
    out.push_back(ids);
    if (out.size() == n) break;
  }
  return out;
}

struct TreeRun {
  std::vector<Tokens> tokens;                // per prompt
  std::vector<std::vector<float>> logprobs;  // per prompt
  SpecStats spec;
  int32_t blocks_left = -1;
};

/// Greedy run of every prompt (batch `batch`, `max_tokens` each), with `proposer` (null: plain).
inline TreeRun run_greedy(Proposer* proposer, int32_t k, int32_t batch, int32_t max_tokens, const std::vector<Tokens>& prompts,
                          bool typical = false) {
  RealModel& m = real_model();
  EngineOptions o;
  o.max_num_seqs = batch;
  o.max_model_len = 1024;
  o.num_speculative_tokens = proposer ? k : 0;
  o.typical_acceptance = typical;
  auto e = Engine::create(*m.model, m.tokenizer.get(), proposer, o);
  EXPECT_TRUE(e.ok()) << e.status().to_string();
  TreeRun r;
  if (!e.ok()) return r;
  r.tokens.resize(prompts.size());
  r.logprobs.resize(prompts.size());
  std::map<int64_t, size_t> which;
  for (size_t i = 0; i < prompts.size(); ++i) {
    GenerateParams p;
    p.prompt = prompts[i];
    p.max_tokens = max_tokens;
    p.sampling.temperature = 0;
    p.sampling.ignore_eos = true;
    p.sampling.logprobs = 1;
    auto id = (*e)->add_request(p);
    EXPECT_TRUE(id.ok());
    which[*id] = i;
  }
  std::vector<SeqEvent> evs;
  while ((*e)->has_work()) {
    evs.clear();
    Status st = (*e)->step(&evs);
    EXPECT_TRUE(st.ok()) << st.to_string();
    if (!st.ok()) break;
    for (const auto& ev : evs) {
      auto& t = r.tokens[which[ev.seq_id]];
      t.insert(t.end(), ev.tokens.begin(), ev.tokens.end());
      for (const auto& lp : ev.logprobs) r.logprobs[which[ev.seq_id]].push_back(lp.logprob);
    }
  }
  r.spec = (*e)->stats().spec;
  r.blocks_left = (*e)->block_pool().num_blocks() - (*e)->block_pool().num_free();
  return r;
}

/// Same tokens and logprobs as the plain run; drafts were accepted; no KV block leaked.
inline void expect_same(const TreeRun& base, const TreeRun& got, const std::string& what) {
  ASSERT_EQ(base.tokens.size(), got.tokens.size()) << what;
  for (size_t i = 0; i < base.tokens.size(); ++i) {
    EXPECT_EQ(got.tokens[i], base.tokens[i]) << what << ": prompt " << i;
    ASSERT_EQ(got.logprobs[i].size(), base.logprobs[i].size()) << what;
    for (size_t t = 0; t < base.logprobs[i].size(); ++t) {
      EXPECT_EQ(got.logprobs[i][t], base.logprobs[i][t]) << what << ": prompt " << i << " token " << t;
    }
  }
  EXPECT_GT(got.spec.num_accepted_tokens, got.spec.num_drafts / 2) << what << ": trees should be accepted often";
  EXPECT_EQ(got.blocks_left, 0) << what << ": KV blocks leaked";
}

/// An oracle tree proposer over `shape` that knows the plain run's continuations.
inline std::unique_ptr<tree_testing::OracleTreeProposer> oracle(const TokenTree& shape, const std::vector<Tokens>& prompts,
                                                                const TreeRun& base, double miss_rate, uint64_t seed) {
  auto p = std::make_unique<tree_testing::OracleTreeProposer>(shape, static_cast<int32_t>(real_model().model->config().vocab_size),
                                                              miss_rate, seed);
  for (size_t i = 0; i < prompts.size(); ++i) p->add(prompts[i], base.tokens[i]);
  return p;
}

}  // namespace specserve::real_tree_testing
