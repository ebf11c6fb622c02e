// Tests for spec/engine.h with speculation, on synthetic llama models (model/synthetic_model.h):
// DESIGN.md section 4 — greedy output identical to plain decoding for every proposer, k and batch
// size; logprobs identical; stop tokens, max_tokens and stop strings honoured exactly inside an
// accepted block; a failing or garbage proposer degrades to plain decoding; a draft with a
// shorter context; KV blocks released; draft vocabulary checks; disable_by_batch_size.
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

namespace specserve {
namespace {

using namespace spec_testing;
using Tokens = std::vector<int32_t>;

// ---- models -------------------------------------------------------------------------------

// Target: 3 layers, hidden 64, GQA 4/2, vocab 512, context 256. residual_scale 0.3 makes the
// first layer a fair predictor of the whole model (acceptance ~0.4 greedy) without making the
// later layers irrelevant.
SyntheticModelSpec target_spec() {
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

SyntheticDraftSpec draft_spec() {
  SyntheticDraftSpec d;
  d.num_layers = 1;
  d.noise = 0.05f;
  d.noise_seed = 7;
  return d;
}

struct Models {
  LoadedModel target, draft, short_draft;
};

Models& models() {
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

const char* method_name(Method m) {
  switch (m) {
    case Method::kNgram: return "ngram";
    case Method::kDraftModel: return "draft_model";
    case Method::kLayerSkip: return "layer_skip";
  }
  return "?";
}

std::unique_ptr<Proposer> make_proposer(Method m, Transformer* draft_model = nullptr) {
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

Tokens random_tokens(std::mt19937& rng, int n, int vocab) {
  Tokens t;
  for (int i = 0; i < n; ++i) t.push_back(static_cast<int32_t>(rng() % static_cast<uint32_t>(vocab)));
  return t;
}

GenerateParams greedy_request(Tokens prompt, int32_t max_tokens) {
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
std::vector<GenerateParams> identity_requests() {
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

void expect_same_logprobs(const std::vector<SampleResult>& got, const std::vector<SampleResult>& want, const std::string& where) {
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
void expect_same_outputs(const RunResult& got, const RunResult& want, const std::string& where) {
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

EngineOptions spec_options(int32_t k, int32_t batch) {
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
const std::vector<GenerateParams>& requests() {
  static const std::vector<GenerateParams> r = identity_requests();
  return r;
}

const RunResult& reference() {
  static const RunResult r = run_engine(target(), tokenizer(), nullptr, spec_options(0, 1), requests());
  return r;
}

// ---- greedy identity ----------------------------------------------------------------------

TEST(SpecEngineGreedy, ReferenceIsNotDegenerate) {
  const RunResult& ref = reference();
  ASSERT_EQ(ref.requests.size(), requests().size());
  ASSERT_GE(ref.requests.size(), 50u);
  std::set<int32_t> distinct;
  int stopped = 0, at_len = 0;
  for (const RequestResult& r : ref.requests) {
    distinct.insert(r.tokens.begin(), r.tokens.end());
    stopped += r.finish == FinishReason::kStop;
    at_len += r.finish == FinishReason::kLength;
  }
  EXPECT_GT(distinct.size(), 100u);  // the model does not emit one token forever
  EXPECT_GE(stopped, 12);            // every stop-token request stops (EOS may stop others)
  EXPECT_GT(at_len, 30);
  EXPECT_EQ(ref.final_blocks_used, 0);
}

TEST(SpecEngineGreedy, PlainDecodingIsBatchInvariant) {
  RunResult batched = run_engine(target(), tokenizer(), nullptr, spec_options(0, 8), requests());
  expect_same_outputs(batched, reference(), "no speculation, batch 8");
}

struct IdentityCase {
  Method method;
  int32_t k;
  int32_t batch;
};

void PrintTo(const IdentityCase& c, std::ostream* os) { *os << method_name(c.method) << " k=" << c.k << " batch=" << c.batch; }

class SpecEngineIdentity : public ::testing::TestWithParam<IdentityCase> {};

TEST_P(SpecEngineIdentity, GreedyTokensAndLogprobsEqualPlainDecoding) {
  const IdentityCase c = GetParam();
  auto proposer = make_proposer(c.method);
  ASSERT_TRUE(proposer);
  RunResult got = run_engine(target(), tokenizer(), proposer.get(), spec_options(c.k, c.batch), requests());
  const std::string where = std::string(method_name(c.method)) + " k=" + std::to_string(c.k) + " batch=" + std::to_string(c.batch);
  expect_same_outputs(got, reference(), where);
  // Not vacuous: drafts were made and some were accepted.
  EXPECT_GT(got.stats.spec.num_drafts, 0) << where;
  EXPECT_GT(got.stats.spec.num_accepted_tokens, 0) << where;
  EXPECT_LE(got.stats.spec.num_accepted_tokens, got.stats.spec.num_draft_tokens) << where;
  // Per-request counters add up to the engine's.
  SpecStats sum;
  for (const RequestResult& r : got.requests) sum.add(r.spec);
  EXPECT_EQ(sum.num_drafts, got.stats.spec.num_drafts) << where;
  EXPECT_EQ(sum.num_accepted_tokens, got.stats.spec.num_accepted_tokens) << where;
}

std::vector<IdentityCase> identity_cases() {
  std::vector<IdentityCase> out;
  for (Method m : {Method::kNgram, Method::kDraftModel, Method::kLayerSkip})
    for (int32_t k : {1, 2, 4, 8})
      for (int32_t b : {1, 8}) out.push_back({m, k, b});
  return out;
}

INSTANTIATE_TEST_SUITE_P(AllMethods, SpecEngineIdentity, ::testing::ValuesIn(identity_cases()),
                         [](const ::testing::TestParamInfo<IdentityCase>& i) {
                           return std::string(method_name(i.param.method)) + "_k" + std::to_string(i.param.k) + "_batch" +
                                  std::to_string(i.param.batch);
                         });

TEST(SpecEngineGreedy, AdaptiveKKeepsIdentity) {
  auto proposer = make_proposer(Method::kDraftModel);
  EngineOptions o = spec_options(8, 8);
  o.adaptive_k = true;
  RunResult got = run_engine(target(), tokenizer(), proposer.get(), o, requests());
  expect_same_outputs(got, reference(), "draft_model adaptive k<=8 batch 8");
  EXPECT_GT(got.stats.spec.num_accepted_tokens, 0);
}

TEST(SpecEngineGreedy, QuantizedTargetKeepsIdentity) {
  for (GgmlType storage : {GgmlType::Q8_0, GgmlType::Q4_1}) {
    SyntheticModelSpec s = target_spec();
    s.storage = storage;
    LoadedModel q = make_target(s, std::string("target_") + ggml_type_name(static_cast<uint32_t>(storage)));
    ASSERT_TRUE(q.model);
    std::vector<GenerateParams> reqs(requests().begin(), requests().begin() + 24);
    RunResult plain = run_engine(*q.model, q.tokenizer.get(), nullptr, spec_options(0, 1), reqs);
    DrafterOptions o;
    o.name = "layer_skip";
    o.num_layers = 1;
    auto ls = ModelDrafter::create(*q.model, o);
    ASSERT_TRUE(ls.ok());
    RunResult got = run_engine(*q.model, q.tokenizer.get(), ls->get(), spec_options(4, 8), reqs);
    expect_same_outputs(got, plain, std::string("layer_skip on ") + ggml_type_name(static_cast<uint32_t>(storage)));
    EXPECT_GT(got.stats.spec.num_accepted_tokens, 0);
    // Quantised weights are close to, but not, the F32 ones: the outputs differ somewhere.
    bool any_diff = false;
    for (size_t i = 0; i < reqs.size(); ++i) any_diff |= plain.requests[i].tokens != reference().requests[i].tokens;
    EXPECT_TRUE(any_diff) << "quantised model behaves exactly like F32: storage ignored?";
  }
}

// ---- stop rules inside an accepted block ---------------------------------------------------

// With the oracle and k = 4 (adaptive off) the blocks are fixed: the prefill step emits output
// token 0; every later step drafts 4 tokens (all accepted) and adds the bonus token, so output
// index j is draft position (j - 1) % 5 of block (j - 1) / 5, or the bonus when that is 4.
constexpr int32_t kOracleK = 4;

struct OracleSetup {
  Tokens prompt;
  Tokens ref;  // plain greedy output, max_tokens 40, no stop rules
};

OracleSetup oracle_setup(uint32_t seed) {
  std::mt19937 rng(seed);
  OracleSetup s;
  s.prompt = random_tokens(rng, 12, 512);
  GenerateParams p = greedy_request(s.prompt, 40);
  RunResult r = run_engine(target(), nullptr, nullptr, spec_options(0, 1), {p});
  s.ref = r.requests.at(0).tokens;
  return s;
}

TEST(SpecEngineStops, StopTokenInsideAcceptedBlock) {
  const OracleSetup s = oracle_setup(99);
  ASSERT_EQ(s.ref.size(), 40u);
  int tested = 0;
  std::set<int32_t> offsets;
  for (int32_t j = 1; j < 25; ++j) {
    const int32_t stop = s.ref[static_cast<size_t>(j)];
    if (std::find(s.ref.begin(), s.ref.begin() + j, stop) != s.ref.begin() + j) continue;  // not its first occurrence
    OracleProposer oracle;
    oracle.add(s.prompt, s.ref);
    GenerateParams p = greedy_request(s.prompt, 40);
    p.sampling.stop_token_ids = {stop};
    RunResult r = run_engine(target(), nullptr, &oracle, spec_options(kOracleK, 1), {p});
    const RequestResult& got = r.requests.at(0);
    const std::string where = "stop at output index " + std::to_string(j);
    // [a, b, STOP, c, d]: the output ends before STOP, nothing after it is emitted or counted.
    EXPECT_EQ(got.tokens, Tokens(s.ref.begin(), s.ref.begin() + j)) << where;
    EXPECT_EQ(got.finish, FinishReason::kStop) << where;
    EXPECT_EQ(got.num_events_after_finish, 0) << where;
    EXPECT_EQ(r.stats.generated_tokens, j) << where;
    // Accepted drafts: 4 per completed block, plus, in the stopping block, the drafts before
    // STOP and STOP itself (it was accepted; the tokens after it are not counted).
    const int32_t block = (j - 1) / (kOracleK + 1), pos = (j - 1) % (kOracleK + 1);
    const int32_t want_accepted = kOracleK * block + std::min(pos + 1, kOracleK);
    EXPECT_EQ(got.spec.num_accepted_tokens, want_accepted) << where;
    EXPECT_EQ(got.spec.num_drafts, block + 1) << where;
    EXPECT_EQ(r.final_blocks_used, 0) << where;
    offsets.insert(pos);
    ++tested;
  }
  EXPECT_GE(tested, 10);
  EXPECT_GE(offsets.size(), 4u) << "the stop should land on several positions within a block";
}

TEST(SpecEngineStops, EosInsideAcceptedBlockStopsOnlyWithTokenizer) {
  // EOS (id 0) is an end-of-generation token of the tokenizer: find a prompt whose greedy
  // continuation contains it, then check the same cut as for stop_token_ids.
  for (uint32_t seed = 1; seed < 400; ++seed) {
    std::mt19937 rng(seed);
    Tokens prompt = random_tokens(rng, 8, 512);
    prompt.push_back(kSyntheticEosId);  // the model has seen EOS: it tends to come again
    GenerateParams p = greedy_request(prompt, 40);
    RunResult plain = run_engine(target(), nullptr, nullptr, spec_options(0, 1), {p});
    const Tokens& ref = plain.requests.at(0).tokens;
    auto it = std::find(ref.begin(), ref.end(), kSyntheticEosId);
    if (it == ref.end() || it == ref.begin()) continue;
    const int32_t j = static_cast<int32_t>(it - ref.begin());
    OracleProposer oracle;
    oracle.add(prompt, ref);
    RunResult with_tok = run_engine(target(), tokenizer(), &oracle, spec_options(kOracleK, 1), {p});
    EXPECT_EQ(with_tok.requests.at(0).tokens, Tokens(ref.begin(), it));
    EXPECT_EQ(with_tok.requests.at(0).finish, FinishReason::kStop);
    p.sampling.ignore_eos = true;
    RunResult ignore = run_engine(target(), tokenizer(), &oracle, spec_options(kOracleK, 1), {p});
    EXPECT_EQ(ignore.requests.at(0).tokens, ref) << "ignore_eos: EOS at " << j << " is an ordinary token";
    return;
  }
  GTEST_SKIP() << "no prompt found whose greedy output contains EOS";
}

TEST(SpecEngineStops, MaxTokensInsideBlock) {
  const OracleSetup s = oracle_setup(5);
  for (int32_t m = 1; m <= 14; ++m) {
    OracleProposer oracle;
    oracle.add(s.prompt, s.ref);
    GenerateParams p = greedy_request(s.prompt, m);
    RunResult r = run_engine(target(), nullptr, &oracle, spec_options(kOracleK, 1), {p});
    const RequestResult& got = r.requests.at(0);
    EXPECT_EQ(got.tokens, Tokens(s.ref.begin(), s.ref.begin() + m)) << "max_tokens " << m;
    EXPECT_EQ(got.finish, FinishReason::kLength) << "max_tokens " << m;
    EXPECT_EQ(r.stats.generated_tokens, m);
    EXPECT_LE(got.spec.num_accepted_tokens, std::max(0, m - 1)) << "accepted past max_tokens";
    EXPECT_EQ(got.logprobs.size(), static_cast<size_t>(m));
  }
}

// Stop strings need text: a second target whose 64-token vocabulary is EOS plus 63 ASCII
// characters (letters, space, digits), so every output decodes to plain ASCII.
TEST(SpecEngineStops, StopStringsCutExactly) {
  SyntheticModelSpec ts = target_spec();
  ts.vocab_size = 64;
  ts.seed = 77;
  LoadedModel m = make_target(ts, "ascii_target");
  ASSERT_TRUE(m.model && m.tokenizer);
  std::mt19937 rng(3);
  Tokens prompt = random_tokens(rng, 10, 63);
  for (int32_t& t : prompt) t += 1;  // no EOS in the prompt
  GenerateParams base = greedy_request(prompt, 40);
  base.sampling.ignore_eos = true;
  RunResult plain = run_engine(*m.model, m.tokenizer.get(), nullptr, spec_options(0, 1), {base});
  const Tokens ref = plain.requests.at(0).tokens;
  ASSERT_EQ(ref.size(), 40u);
  auto text_of = [&](size_t n) { return m.tokenizer->decode(Tokens(ref.begin(), ref.begin() + static_cast<std::ptrdiff_t>(n)), false); };
  const std::string full = text_of(ref.size());
  ASSERT_EQ(plain.requests.at(0).text, full);

  int tested = 0;
  for (size_t j = 2; j + 1 < 30; ++j) {
    // A stop string spanning output tokens j-1 .. j+1 (the middle of a block for most j).
    const std::string piece = m.tokenizer->token_to_piece(ref[j - 1], false) + m.tokenizer->token_to_piece(ref[j], false) +
                              m.tokenizer->token_to_piece(ref[j + 1], false);
    if (piece.size() != 3) continue;  // EOS renders as ""
    const size_t at = full.find(piece);
    ASSERT_NE(at, std::string::npos);
    // The token that completes the first match is the last one emitted.
    size_t n_emit = 1;
    while (text_of(n_emit).size() < at + piece.size()) ++n_emit;
    for (bool include : {false, true}) {
      OracleProposer oracle;
      oracle.add(prompt, ref);
      GenerateParams p = base;
      p.stop = {piece, "this never matches"};
      p.include_stop_str = include;
      RunResult plain_stop = run_engine(*m.model, m.tokenizer.get(), nullptr, spec_options(0, 1), {p});
      RunResult spec_stop = run_engine(*m.model, m.tokenizer.get(), &oracle, spec_options(kOracleK, 1), {p});
      const std::string where = "stop '" + piece + "' include=" + std::to_string(include);
      for (const RunResult* r : {&plain_stop, &spec_stop}) {
        const RequestResult& got = r->requests.at(0);
        EXPECT_EQ(got.text, full.substr(0, at + (include ? piece.size() : 0))) << where;
        EXPECT_EQ(got.tokens, Tokens(ref.begin(), ref.begin() + static_cast<std::ptrdiff_t>(n_emit))) << where;
        EXPECT_EQ(got.finish, FinishReason::kStop) << where;
        EXPECT_EQ(r->final_blocks_used, 0) << where;
      }
      EXPECT_GT(oracle.calls(), 0);
    }
    ++tested;
  }
  EXPECT_GE(tested, 10);
}

// ---- proposers that fail or talk nonsense --------------------------------------------------

class FailingProposer final : public Proposer {
 public:
  explicit FailingProposer(Proposer* inner, int fail_every) : inner_(inner), fail_every_(fail_every) {}
  std::string name() const override { return "failing"; }
  Status propose(const std::vector<DraftRequest>& reqs, std::vector<DraftTree>* out) override {
    ++calls_;
    if (calls_ % fail_every_ == 0) {
      // Half-written output, then the error: the engine must not use any of it.
      out->assign(reqs.size(), DraftTree{{1, 2, 3}, {}, {}});
      return internal_error("draft worker gone");
    }
    return inner_->propose(reqs, out);
  }
  void release(int64_t id) override { inner_->release(id); }

 private:
  Proposer* inner_;
  int fail_every_;
  int calls_ = 0;
};

/// Returns drafts the engine must reject: out-of-vocabulary and negative ids, more than k
/// tokens, a tree, probabilities that do not match the tokens, and answers of the wrong size.
class GarbageProposer final : public Proposer {
 public:
  std::string name() const override { return "garbage"; }
  Status propose(const std::vector<DraftRequest>& reqs, std::vector<DraftTree>* out) override {
    ++calls_;
    const int32_t V = static_cast<int32_t>(target().config().vocab_size);
    if (calls_ % 7 == 0) {  // fewer answers than requests
      std::vector<DraftTree>().swap(*out);  // storage freed: reading past it is a bug
      return Status();
    }
    out->assign(reqs.size(), DraftTree{});
    for (size_t i = 0; i < reqs.size(); ++i) {
      DraftTree& d = (*out)[i];
      const int32_t k = reqs[i].num_tokens;
      switch ((calls_ + static_cast<int>(i)) % 6) {
        case 0: d.tokens.assign(static_cast<size_t>(k), V + 3); break;
        case 1: d.tokens.assign(static_cast<size_t>(k), -1); break;
        case 2: d.tokens.assign(static_cast<size_t>(k + 1), 1); break;
        case 3: d.tokens.assign(static_cast<size_t>(k), 1), d.parents.assign(static_cast<size_t>(k), -1); break;
        case 4: d.tokens.assign(static_cast<size_t>(k), 1), d.probs.assign(static_cast<size_t>(k + 1), std::vector<float>(V, 0.0f)); break;
        default: d.tokens = {1, V}; if (k < 2) d.tokens = {V}; break;
      }
    }
    return Status();
  }

 private:
  int calls_ = 0;
};

TEST(SpecEngineFaults, FailingProposerDegradesToPlainDecoding) {
  for (int fail_every : {1, 3}) {
    auto inner = make_proposer(Method::kDraftModel);
    FailingProposer p(inner.get(), fail_every);
    RunResult got = run_engine(target(), tokenizer(), &p, spec_options(4, 8), requests());
    expect_same_outputs(got, reference(), "failing proposer, every " + std::to_string(fail_every));
    if (fail_every == 1) {
      EXPECT_EQ(got.stats.spec.num_drafts, 0);
    } else {
      EXPECT_GT(got.stats.spec.num_accepted_tokens, 0);
    }
  }
}

TEST(SpecEngineFaults, GarbageDraftsAreIgnored) {
  GarbageProposer p;
  RunResult got = run_engine(target(), tokenizer(), &p, spec_options(4, 8), requests());
  expect_same_outputs(got, reference(), "garbage proposer");
  EXPECT_EQ(got.stats.spec.num_drafts, 0) << "an invalid draft was verified";
}

/// Valid draft tokens, but q rows shorter than the vocabulary (or with the wrong count) for a
/// sampling request: the verifier would read past them.
class ShortQProposer final : public Proposer {
 public:
  std::string name() const override { return "short_q"; }
  Status propose(const std::vector<DraftRequest>& reqs, std::vector<DraftTree>* out) override {
    out->assign(reqs.size(), DraftTree{});
    for (size_t i = 0; i < reqs.size(); ++i) {
      DraftTree& d = (*out)[i];
      d.tokens.assign(static_cast<size_t>(reqs[i].num_tokens), 3);
      for (size_t t = 0; t < d.tokens.size(); ++t) d.probs.push_back(std::vector<float>(2, 0.5f));  // 2 of 512 entries
    }
    return Status();
  }
};

TEST(SpecEngineFaults, DraftProbabilitiesOfTheWrongShapeAreIgnored) {
  std::mt19937 rng(4);
  std::vector<GenerateParams> reqs;
  for (int i = 0; i < 6; ++i) {
    GenerateParams p = greedy_request(random_tokens(rng, 5 + i, 512), 20);
    p.sampling.temperature = 1.0f;
    p.sampling.seed = 1000 + static_cast<uint64_t>(i);
    p.sampling.has_seed = true;
    reqs.push_back(p);
  }
  // With every draft ignored the sampler draws exactly as in plain decoding: same seed, same output.
  RunResult plain = run_engine(target(), nullptr, nullptr, spec_options(0, 8), reqs);
  ShortQProposer p;
  RunResult got = run_engine(target(), nullptr, &p, spec_options(4, 8), reqs);
  expect_same_outputs(got, plain, "short q rows");
  EXPECT_EQ(got.stats.spec.num_drafts, 0);
}

/// Records how many sequences were running each time the engine asked for drafts.
class RecordingProposer final : public Proposer {
 public:
  explicit RecordingProposer(Proposer* inner) : inner_(inner) {}
  std::string name() const override { return "recording"; }
  Status propose(const std::vector<DraftRequest>& reqs, std::vector<DraftTree>* out) override {
    running_at_call.push_back(engine ? engine->num_running() : -1);
    return inner_->propose(reqs, out);
  }
  void release(int64_t id) override {
    ++num_releases;
    inner_->release(id);
  }
  const Engine* engine = nullptr;
  int num_releases = 0;
  std::vector<int32_t> running_at_call;

 private:
  Proposer* inner_;
};

// ---- contexts and KV ----------------------------------------------------------------------

TEST(SpecEngineContext, DraftWithShorterContext) {
  const int32_t draft_ctx = static_cast<int32_t>(models().short_draft.model->config().context_length);
  ASSERT_EQ(draft_ctx, 128);
  std::mt19937 rng(41);
  std::vector<GenerateParams> reqs;
  for (int gap : {1, 2, 3, 5, 8}) {
    Tokens p = random_tokens(rng, draft_ctx - gap, 512);
    reqs.push_back(greedy_request(p, 200));  // runs on to the target's 256
  }
  RunResult plain = run_engine(target(), tokenizer(), nullptr, spec_options(0, 1), reqs);
  auto proposer = make_proposer(Method::kDraftModel, models().short_draft.model.get());
  for (int32_t batch : {1, 8}) {
    RunResult got = run_engine(target(), tokenizer(), proposer.get(), spec_options(4, batch), reqs);
    expect_same_outputs(got, plain, "draft context 128, batch " + std::to_string(batch));
    EXPECT_GT(got.stats.spec.num_drafts, 0) << "the draft should propose while it has room";
  }
}

TEST(SpecEngineKv, RejectedSlotsAreReleasedEveryStep) {
  // block_size 1: after every step a running sequence holds one block per token whose KV is
  // cached, plus at most one for its pending token — never blocks for rejected drafts.
  auto proposer = make_proposer(Method::kDraftModel);
  EngineOptions o = spec_options(8, 1);
  o.block_size = 1;
  o.num_kv_blocks = 1024;
  std::mt19937 rng(8);
  GenerateParams p = greedy_request(random_tokens(rng, 30, 512), 60);
  size_t emitted = 0;
  int checked = 0;
  bool done = false;
  auto engine = Engine::create(target(), nullptr, proposer.get(), o);
  ASSERT_TRUE(engine.ok());
  Engine& e = **engine;
  ASSERT_TRUE(e.add_request(p).ok());
  while (e.has_work()) {
    std::vector<SeqEvent> ev;
    ASSERT_TRUE(e.step(&ev).ok());
    for (const SeqEvent& x : ev) emitted += x.tokens.size(), done |= x.finish != FinishReason::kNone;
    const int32_t used = e.block_pool().num_blocks() - e.block_pool().num_free();
    if (done) {
      EXPECT_EQ(used, 0);
    } else if (emitted > 0) {
      const int32_t tokens = static_cast<int32_t>(p.prompt.size() + emitted);  // cached + the pending one
      EXPECT_LE(used, tokens) << "after " << emitted << " tokens: blocks of rejected drafts kept";
      EXPECT_GE(used, tokens - 1) << "after " << emitted << " tokens: blocks of cached tokens lost";
      ++checked;
    }
  }
  EXPECT_EQ(emitted, 60u);
  EXPECT_GT(checked, 5);
  EXPECT_GT(e.stats().spec.num_draft_tokens, e.stats().spec.num_accepted_tokens) << "no rejection happened";
}

TEST(SpecEngineKv, PreemptionUnderKvPressureKeepsIdentity) {
  // Too few blocks for every sequence: the engine preempts (recompute) and still produces the
  // plain-decoding output. Long prompts prefill in chunks while short ones already decode.
  std::mt19937 rng(21);
  std::vector<GenerateParams> reqs;
  for (int i = 0; i < 8; ++i) reqs.push_back(greedy_request(random_tokens(rng, i % 2 ? 70 : 6, 512), 40));
  RunResult plain = run_engine(target(), nullptr, nullptr, spec_options(0, 1), reqs);
  for (Method m : {Method::kNgram, Method::kDraftModel}) {
    auto inner = make_proposer(m);
    RecordingProposer proposer(inner.get());  // counts release(): once per finish, once per preemption
    EngineOptions o = spec_options(4, 8);
    o.block_size = 4;
    o.num_kv_blocks = 64;  // 256 tokens for 8 sequences that need up to 110 each
    o.max_num_batched_tokens = 48;
    RunResult got = run_engine(target(), nullptr, &proposer, o, reqs);
    EXPECT_GT(proposer.num_releases, static_cast<int>(reqs.size())) << method_name(m) << ": no preemption happened";
    EXPECT_GT(got.stats.spec.num_accepted_tokens, 0) << method_name(m);
    for (size_t i = 0; i < reqs.size(); ++i) {
      EXPECT_EQ(got.requests[i].tokens, plain.requests[i].tokens) << method_name(m) << " request " << i;
      expect_same_logprobs(got.requests[i].logprobs, plain.requests[i].logprobs, method_name(m));
    }
    EXPECT_EQ(got.final_blocks_used, 0);
  }
}

TEST(SpecEngineKv, AdmissionCountsBlocksPromisedInTheSamePass) {
  // 40 one-token prompts, 16 blocks of 16 tokens: each sequence needs one block for its whole
  // life (1 + 4 tokens), so 16 run at a time and nothing is ever preempted. (Before the fix every
  // waiting sequence was admitted against the same 16 free blocks, and 24 of them were
  // preempted again in every step.)
  std::mt19937 rng(23);
  std::vector<GenerateParams> reqs;
  for (int i = 0; i < 40; ++i) reqs.push_back(greedy_request(random_tokens(rng, 1, 512), 4));
  NgramProposer ngram(1, 3);
  RecordingProposer proposer(&ngram);  // release(): once per finish, once per preemption
  EngineOptions o = spec_options(2, 64);
  o.num_kv_blocks = 16;
  int32_t max_running = 0;
  RunResult got = run_engine(target(), nullptr, &proposer, o, reqs, [&](Engine& e) { max_running = std::max(max_running, e.num_running()); });
  EXPECT_EQ(proposer.num_releases, 40) << "sequences were preempted";
  EXPECT_LE(max_running, 16);
  RunResult plain = run_engine(target(), nullptr, nullptr, spec_options(0, 1), reqs);
  for (size_t i = 0; i < reqs.size(); ++i) EXPECT_EQ(got.requests[i].tokens, plain.requests[i].tokens) << "request " << i;
}

// ---- draft vocabulary ---------------------------------------------------------------------

TEST(CheckDraftVocab, SizesAndTexts) {
  const std::vector<std::string> t = synthetic_vocab(512);
  EXPECT_TRUE(check_draft_vocab(t, t).ok());
  EXPECT_TRUE(check_draft_vocab(t, synthetic_vocab(512 - 128)).ok());  // padding rows: within 128
  EXPECT_TRUE(check_draft_vocab(synthetic_vocab(512 + 128), t).ok());

  Status st = check_draft_vocab(t, synthetic_vocab(300));
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("512"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("300"), std::string::npos) << st.message();
  st = check_draft_vocab(synthetic_vocab(300), t);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("300"), std::string::npos) << st.message();

  std::vector<std::string> d = t;
  d[77] = "zzz-different";
  st = check_draft_vocab(t, d);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("77"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("zzz-different"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find(t[77]), std::string::npos) << st.message();
}

TEST(CheckDraftVocab, SyntheticDraftSharesTheTargetVocabulary) {
  std::vector<std::string> a, b;
  for (int32_t i = 0; i < models().target.tokenizer->vocab_size(); ++i) a.push_back(models().target.tokenizer->token_text(i));
  for (int32_t i = 0; i < models().draft.tokenizer->vocab_size(); ++i) b.push_back(models().draft.tokenizer->token_text(i));
  EXPECT_TRUE(check_draft_vocab(a, b).ok());
  EXPECT_EQ(a, synthetic_vocab(512));
}

// ---- disable_by_batch_size ----------------------------------------------------------------

TEST(SpecEngineBatch, DisableByBatchSize) {
  std::mt19937 rng(17);
  std::vector<GenerateParams> reqs;
  for (int i = 0; i < 8; ++i) reqs.push_back(greedy_request(random_tokens(rng, 12, 512), 8 + 8 * i));  // finish one by one
  RunResult plain = run_engine(target(), nullptr, nullptr, spec_options(0, 1), reqs);

  auto inner = make_proposer(Method::kLayerSkip);
  RecordingProposer rec(inner.get());
  EngineOptions o = spec_options(4, 8);
  o.disable_by_batch_size = 4;
  auto engine = Engine::create(target(), nullptr, &rec, o);
  ASSERT_TRUE(engine.ok());
  Engine& e = **engine;
  rec.engine = &e;
  std::map<int64_t, size_t> idx;
  for (size_t i = 0; i < reqs.size(); ++i) idx[*e.add_request(reqs[i])] = i;
  std::vector<Tokens> out(reqs.size());
  std::vector<SpecStats> stats(reqs.size());
  bool saw_full_batch = false;
  while (e.has_work()) {
    std::vector<SeqEvent> ev;
    ASSERT_TRUE(e.step(&ev).ok());
    for (const SeqEvent& x : ev) {
      const size_t i = idx.at(x.seq_id);
      out[i].insert(out[i].end(), x.tokens.begin(), x.tokens.end());
      if (x.finish != FinishReason::kNone) stats[i] = *e.take_finished_stats(x.seq_id);
    }
    saw_full_batch |= e.num_running() > 4;
  }
  EXPECT_TRUE(saw_full_batch);
  ASSERT_FALSE(rec.running_at_call.empty()) << "speculation never switched back on";
  for (int32_t n : rec.running_at_call) EXPECT_LE(n, 4) << "drafts requested while " << n << " sequences ran";
  for (size_t i = 0; i < reqs.size(); ++i) EXPECT_EQ(out[i], plain.requests[i].tokens) << "request " << i;
  // Requests 0..3 finish while 8, 7, 6, 5 sequences run: they never drafted.
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(stats[i].num_drafts, 0) << "request " << i;
  EXPECT_GT(e.stats().spec.num_drafts, 0);
}

}  // namespace
}  // namespace specserve
