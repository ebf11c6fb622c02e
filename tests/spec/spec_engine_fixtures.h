// Shared fixtures of the speculative engine tests (spec_engine_test.cpp,
// spec_engine_stops_test.cpp): synthetic target/draft models, proposers, prompts, comparisons.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <ostream>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "spec/engine.h"
#include "spec/model_drafter.h"
#include "spec/ngram_proposer.h"
#include "tests/spec/spec_test_util.h"

namespace specserve::spec_engine_testing {

using namespace spec_testing;
using Tokens = std::vector<int32_t>;

// ---- models -------------------------------------------------------------------------------

// Target: 3 layers, hidden 64, GQA 4/2, vocab 512, context 256. residual_scale 0.3 makes the
// first layer a fair predictor of the whole model (acceptance ~0.4 greedy) without making the
// later layers irrelevant.
inline SyntheticModelSpec target_spec() {
  SyntheticModelSpec s;
  s.name = "spec-test-target";
  s.num_layers = 3;
  s.hidden_size = 64;
  s.num_heads = 4;
  s.num_kv_heads = 2;
  s.ffn_size = 128;
  s.vocab_size = 512;
  s.context_length = 256;
  s.residual_scale = 0.3f;
  s.seed = 20240611;
  return s;
}

inline SyntheticDraftSpec draft_spec() {
  SyntheticDraftSpec d;
  d.num_layers = 1;
  d.noise = 0.05f;
  d.noise_seed = 7;
  return d;
}

struct Models {
  LoadedModel target, draft, short_draft;
};

inline Models& models() {
  static Models* m = [] {
    auto* ms = new Models;
    ms->target = make_target(target_spec(), "target");
    ms->draft = make_draft(target_spec(), draft_spec(), "draft");
    SyntheticDraftSpec sd = draft_spec();
    sd.context_length = 128;
    ms->short_draft = make_draft(target_spec(), sd, "short_draft");
    return ms;
  }();
  return *m;
}

Transformer& target() { return *models().target.model; }
const Tokenizer* tokenizer() { return models().target.tokenizer.get(); }

// ---- proposers ----------------------------------------------------------------------------

enum class Method { kNgram, kDraftModel, kLayerSkip };

inline const char* method_name(Method m) {
  switch (m) {
    case Method::kNgram: return "ngram";
    case Method::kDraftModel: return "draft_model";
    case Method::kLayerSkip: return "layer_skip";
  }
  return "?";
}

inline std::unique_ptr<Proposer> make_proposer(Method m, Transformer* draft_model = nullptr) {
  switch (m) {
    case Method::kNgram: return std::make_unique<NgramProposer>(1, 3);
    case Method::kDraftModel: {
      DrafterOptions o;
      o.target_vocab_size = static_cast<int32_t>(target().config().vocab_size);
      auto d = ModelDrafter::create(draft_model ? *draft_model : *models().draft.model, o);
      EXPECT_TRUE(d.ok()) << d.status().to_string();
      return d.ok() ? std::move(*d) : nullptr;
    }
    case Method::kLayerSkip: {
      DrafterOptions o;
      o.name = "layer_skip";
      o.num_layers = 1;
      auto d = ModelDrafter::create(target(), o);
      EXPECT_TRUE(d.ok()) << d.status().to_string();
      return d.ok() ? std::move(*d) : nullptr;
    }
  }
  return nullptr;
}

/// Proposes exactly the target's own greedy continuation (recorded beforehand per prompt), so
/// every draft token is accepted: the test double for stop rules inside an accepted block.
class OracleProposer final : public Proposer {
 public:
  void add(const Tokens& prompt, const Tokens& continuation) { refs_[prompt] = continuation; }
  std::string name() const override { return "oracle"; }
  Status propose(const std::vector<DraftRequest>& reqs, std::vector<DraftTree>* out) override {
    out->assign(reqs.size(), DraftTree{});
    for (size_t i = 0; i < reqs.size(); ++i) {
      const DraftRequest& r = reqs[i];
      const Tokens prompt(r.tokens.begin(), r.tokens.begin() + r.prompt_len);
      auto it = refs_.find(prompt);
      if (it == refs_.end()) continue;
      const Tokens& ref = it->second;
      const size_t done = r.tokens.size() - static_cast<size_t>(r.prompt_len);
      if (done > ref.size() || !std::equal(r.tokens.begin() + r.prompt_len, r.tokens.end(), ref.begin())) continue;
      const size_t take = std::min(ref.size() - done, static_cast<size_t>(r.num_tokens));
      (*out)[i].tokens.assign(ref.begin() + static_cast<std::ptrdiff_t>(done), ref.begin() + static_cast<std::ptrdiff_t>(done + take));
    }
    ++calls_;
    return Status();
  }
  int calls() const { return calls_; }

 private:
  std::map<Tokens, Tokens> refs_;
  int calls_ = 0;
};

// ---- prompts ------------------------------------------------------------------------------

inline Tokens random_tokens(std::mt19937& rng, int n, int vocab) {
  Tokens t;
  for (int i = 0; i < n; ++i) t.push_back(static_cast<int32_t>(rng() % static_cast<uint32_t>(vocab)));
  return t;
}

inline GenerateParams greedy_request(Tokens prompt, int32_t max_tokens) {
  GenerateParams p;
  p.prompt = std::move(prompt);
  p.max_tokens = max_tokens;
  p.sampling.temperature = 0.0f;
  p.sampling.logprobs = 5;
  return p;
}

/// 60 greedy requests: random prompts of varied length (some with penalties), prompts of repeated n-grams (so the
/// n-gram proposer has something to find), prompts ending 1..12 tokens before max_model_len,
/// tiny max_tokens, and stop tokens that the unconstrained output does reach.
inline std::vector<GenerateParams> identity_requests() {
  std::mt19937 rng(12345);
  const int V = 512, ctx = 256;
  std::vector<GenerateParams> reqs;
  for (int i = 0; i < 20; ++i) reqs.push_back(greedy_request(random_tokens(rng, 1 + static_cast<int>(rng() % 90), V), 24 + i % 17));
  // Penalties change the greedy choice with the output so far, token by token inside a block.
  for (int i = 0; i < 6; ++i) {
    GenerateParams& p = reqs[static_cast<size_t>(i)];
    p.sampling.repetition_penalty = 1.3f;
    p.sampling.frequency_penalty = i % 2 ? 0.4f : 0.0f;
    p.sampling.presence_penalty = i % 3 ? 0.3f : 0.0f;
  }
  for (int i = 0; i < 16; ++i) {
    Tokens pat = random_tokens(rng, 2 + i % 5, V);
    Tokens p = random_tokens(rng, static_cast<int>(rng() % 8), V);
    for (int r = 0; r < 3 + i % 6; ++r) p.insert(p.end(), pat.begin(), pat.end());
    if (i % 2) p.insert(p.end(), pat.begin(), pat.begin() + 1);  // ends inside the pattern
    reqs.push_back(greedy_request(p, 32));
  }
  for (int gap : {1, 2, 3, 4, 5, 7, 9, 12}) {
    Tokens p = random_tokens(rng, ctx - gap - 6, V);
    Tokens pat = random_tokens(rng, 3, V);
    p.insert(p.end(), pat.begin(), pat.end());
    p.insert(p.end(), pat.begin(), pat.end());
    reqs.push_back(greedy_request(p, 40));  // finishes on max_model_len, mid-draft for large k
  }
  for (int mt : {1, 2, 3, 5}) reqs.push_back(greedy_request(random_tokens(rng, 10 + mt, V), mt));
  // Stop tokens: taken from a plain run's output at index 3..12, so the stop lands at varied
  // offsets of the speculative blocks.
  std::vector<GenerateParams> stop_reqs;
  for (int i = 0; i < 12; ++i) {
    Tokens pat = random_tokens(rng, 3, V);
    Tokens p = random_tokens(rng, 5 + i, V);
    for (int r = 0; r < 3; ++r) p.insert(p.end(), pat.begin(), pat.end());
    stop_reqs.push_back(greedy_request(p, 30));
  }
  EngineOptions o;
  o.max_num_seqs = 16;
  RunResult plain = run_engine(target(), nullptr, nullptr, o, stop_reqs);
  for (size_t i = 0; i < stop_reqs.size() && i < plain.requests.size(); ++i) {
    const Tokens& out = plain.requests[i].tokens;
    const size_t at = std::min(out.size() - 1, 3 + i);
    stop_reqs[i].sampling.stop_token_ids = {out[at], static_cast<int32_t>(V - 1 - i)};
    reqs.push_back(stop_reqs[i]);
  }
  return reqs;
}

// ---- comparisons --------------------------------------------------------------------------

inline void expect_same_logprobs(const std::vector<SampleResult>& got, const std::vector<SampleResult>& want, const std::string& where) {
  ASSERT_EQ(got.size(), want.size()) << where;
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].token, want[i].token) << where << " token " << i;
    EXPECT_NEAR(got[i].logprob, want[i].logprob, 1e-6) << where << " token " << i;
    ASSERT_EQ(got[i].top_logprobs.size(), want[i].top_logprobs.size()) << where << " token " << i;
    for (size_t j = 0; j < got[i].top_logprobs.size(); ++j) {
      EXPECT_EQ(got[i].top_logprobs[j].token, want[i].top_logprobs[j].token) << where << " token " << i << " top " << j;
      EXPECT_NEAR(got[i].top_logprobs[j].logprob, want[i].top_logprobs[j].logprob, 1e-6) << where << " token " << i << " top " << j;
    }
  }
}

/// Every request's tokens, finish reason, text and logprobs equal the reference run's.
inline void expect_same_outputs(const RunResult& got, const RunResult& want, const std::string& where) {
  ASSERT_EQ(got.requests.size(), want.requests.size()) << where;
  for (size_t i = 0; i < got.requests.size(); ++i) {
    const std::string w = where + ", request " + std::to_string(i);
    const RequestResult& g = got.requests[i];
    const RequestResult& r = want.requests[i];
    EXPECT_EQ(g.tokens, r.tokens) << w;
    EXPECT_EQ(finish_reason_name(g.finish), std::string(finish_reason_name(r.finish))) << w;
    EXPECT_EQ(g.text, r.text) << w;
    EXPECT_EQ(g.num_events_after_finish, 0) << w;
    expect_same_logprobs(g.logprobs, r.logprobs, w);
  }
  EXPECT_EQ(got.stats.generated_tokens, want.stats.generated_tokens) << where;
  EXPECT_EQ(got.final_blocks_used, 0) << where << ": KV blocks still held after every request finished";
}

inline EngineOptions spec_options(int32_t k, int32_t batch) {
  EngineOptions o;
  o.num_speculative_tokens = k;
  o.adaptive_k = false;  // exactly k every step
  o.max_num_seqs = batch;
  // Batch 8: a small token budget, so long prompts prefill in chunks next to decoding
  // sequences and drafts are cut by the budget.
  o.max_num_batched_tokens = batch > 1 ? 96 : 2048;
  return o;
}

// The reference: plain decoding (no proposer), one sequence at a time.
inline const std::vector<GenerateParams>& requests() {
  static const std::vector<GenerateParams> r = identity_requests();
  return r;
}

inline const RunResult& reference() {
  static const RunResult r = run_engine(target(), tokenizer(), nullptr, spec_options(0, 1), requests());
  return r;
}


}  // namespace specserve::spec_engine_testing
