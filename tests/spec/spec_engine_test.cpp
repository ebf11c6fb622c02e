// Tests for spec/engine.h with speculation, on synthetic llama models (model/synthetic_model.h):
// DESIGN.md section 4 — greedy output and logprobs identical to plain decoding for every proposer,
// k and batch size; a draft with a shorter context; KV blocks released; draft vocabulary checks;
// disable_by_batch_size. Stop rules and faulty proposers: spec_engine_stops_test.cpp.
#include <cstdlib>
#include <string>

#include "tests/spec/spec_engine_fixtures.h"

namespace specserve {
namespace {

using namespace spec_testing;
using namespace spec_engine_testing;

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

// expect_same_outputs, and every token's logprob equal to the last bit.
void expect_same_outputs_and_logprob_bits(const RunResult& a, const RunResult& b, const std::string& where) {
  expect_same_outputs(a, b, where);
  for (size_t i = 0; i < a.requests.size() && i < b.requests.size(); ++i) {
    for (size_t t = 0; t < a.requests[i].logprobs.size() && t < b.requests[i].logprobs.size(); ++t) {
      ASSERT_EQ(a.requests[i].logprobs[t].logprob, b.requests[i].logprobs[t].logprob) << where << " request " << i << " token " << t;
    }
  }
}

// The greedy fast path (EngineOptions::argmax_on_device: the backend's argmax_rows instead of
// whole logit rows) gives the same tokens and the same logprob bits as the full path, plain and
// speculative, while requests that need whole rows (penalties, top logprobs) share its batches.
TEST(SpecEngineGreedy, ArgmaxOnDeviceGivesTheSameTokensAndLogprobs) {
  std::vector<GenerateParams> reqs = requests();
  int fast = 0;
  for (size_t i = 0; i < reqs.size(); ++i) {
    if (i % 3 == 0) continue;  // keeps its top-5 logprobs: whole rows
    reqs[i].sampling.logprobs = 0;
    const SamplingParams& sp = reqs[i].sampling;
    fast += sp.repetition_penalty == 1.0f && sp.frequency_penalty == 0.0f && sp.presence_penalty == 0.0f;
  }
  ASSERT_GT(fast, 20);
  for (int m = -1; m < 2; ++m) {  // -1: no speculation
    auto proposer = m < 0 ? nullptr : make_proposer(m == 0 ? Method::kNgram : Method::kDraftModel);
    EngineOptions on = spec_options(m < 0 ? 0 : 4, 8), off = on;
    off.argmax_on_device = false;
    const std::string where = m < 0 ? "plain" : method_name(m == 0 ? Method::kNgram : Method::kDraftModel);
    const RunResult a = run_engine(target(), tokenizer(), proposer.get(), on, reqs);
    auto proposer2 = m < 0 ? nullptr : make_proposer(m == 0 ? Method::kNgram : Method::kDraftModel);
    const RunResult b = run_engine(target(), tokenizer(), proposer2.get(), off, reqs);
    expect_same_outputs_and_logprob_bits(a, b, where);
    EXPECT_GT(a.stats.argmax_rows, 0) << where << ": the fast path never ran";
    EXPECT_EQ(b.stats.argmax_rows, 0) << where;
    if (m >= 0) EXPECT_GT(a.stats.spec.num_accepted_tokens, 0) << where;
  }
}

// Seeded requests with only a temperature draw their plain steps' tokens on the backend
// (sample_rows) with the uniform their sampler would have used: the same tokens and logprob bits
// as drawing on the host, plain and with n-gram drafts (whose steps with a draft verify on the
// host), next to requests with top-p / top-k (always on the host).
TEST(SpecEngineSampled, DrawsOnTheBackendGiveTheHostsTokens) {
  std::vector<GenerateParams> reqs = requests();
  for (size_t i = 0; i < reqs.size(); ++i) {
    SamplingParams& sp = reqs[i].sampling;
    sp = SamplingParams{};
    sp.temperature = 0.6f + 0.1f * static_cast<float>(i % 5);
    sp.has_seed = true;
    sp.seed = 1000 + i;
    if (i % 5 == 1) sp.top_p = 0.9f;
    if (i % 5 == 2) sp.top_k = 40;
  }
  for (int m = -1; m < 1; ++m) {  // -1: no speculation; 0: n-gram
    auto p1 = m < 0 ? nullptr : make_proposer(Method::kNgram);
    auto p2 = m < 0 ? nullptr : make_proposer(Method::kNgram);
    EngineOptions on = spec_options(m < 0 ? 0 : 4, 8), off = on;
    off.argmax_on_device = false;
    const std::string where = m < 0 ? "plain" : "ngram";
    const RunResult a = run_engine(target(), tokenizer(), p1.get(), on, reqs);
    const RunResult b = run_engine(target(), tokenizer(), p2.get(), off, reqs);
    expect_same_outputs_and_logprob_bits(a, b, where);
    EXPECT_GT(a.stats.argmax_rows, 100) << where << ": the backend drew no tokens";
    EXPECT_EQ(b.stats.argmax_rows, 0) << where;
    // Not a greedy run in disguise: sampled output differs from the greedy reference.
    int differ = 0;
    for (size_t i = 0; i < a.requests.size(); ++i) differ += a.requests[i].tokens != reference().requests[i].tokens;
    EXPECT_GT(differ, static_cast<int>(reqs.size()) / 2) << where;
  }
}

// SPECSERVE_ARGMAX_ON_DEVICE takes 1 or 0 (or nothing); any other value is refused by name.
TEST(SpecEngineGreedy, ArgmaxOnDeviceEnvironmentVariable) {
  const char* saved = std::getenv("SPECSERVE_ARGMAX_ON_DEVICE");
  const std::string keep = saved ? saved : "";
  unsetenv("SPECSERVE_ARGMAX_ON_DEVICE");
  EXPECT_TRUE(*argmax_on_device_from_env(true));
  EXPECT_FALSE(*argmax_on_device_from_env(false));
  setenv("SPECSERVE_ARGMAX_ON_DEVICE", "0", 1);
  EXPECT_FALSE(*argmax_on_device_from_env(true));
  setenv("SPECSERVE_ARGMAX_ON_DEVICE", "1", 1);
  EXPECT_TRUE(*argmax_on_device_from_env(false));
  setenv("SPECSERVE_ARGMAX_ON_DEVICE", "false", 1);
  const auto bad = argmax_on_device_from_env(true);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("SPECSERVE_ARGMAX_ON_DEVICE = 'false'"), std::string::npos) << bad.status().to_string();
  auto e = Engine::create(target(), tokenizer(), nullptr, spec_options(0, 1));
  EXPECT_FALSE(e.ok()) << "Engine::create must refuse the bad value";
  if (saved) {
    setenv("SPECSERVE_ARGMAX_ON_DEVICE", keep.c_str(), 1);
  } else {
    unsetenv("SPECSERVE_ARGMAX_ON_DEVICE");
  }
}

TEST(SpecEngineGreedy, AdaptiveKKeepsIdentity) {
  auto proposer = make_proposer(Method::kDraftModel);
  EngineOptions o = spec_options(8, 8);
  o.adaptive_k = true;
  RunResult got = run_engine(target(), tokenizer(), proposer.get(), o, requests());
  expect_same_outputs(got, reference(), "draft_model adaptive k<=8 batch 8");
  EXPECT_GT(got.stats.spec.num_accepted_tokens, 0);
  // drafted_per_pos: every draft reaches depth 1; a chain of n tokens counts at depths 1..n, so
  // the column sums to the draft tokens; adaptive k leaves deeper depths undrafted in some steps.
  const SpecStats& s = got.stats.spec;
  ASSERT_EQ(s.drafted_per_pos.size(), 8u);
  EXPECT_EQ(s.drafted_per_pos[0], s.num_drafts);
  int64_t sum = 0;
  for (size_t i = 0; i < 8; ++i) {
    sum += s.drafted_per_pos[i];
    EXPECT_LE(s.accepted_per_pos[i], s.drafted_per_pos[i]) << "depth " << i + 1;
    if (i > 0) EXPECT_LE(s.drafted_per_pos[i], s.drafted_per_pos[i - 1]) << "depth " << i + 1;
  }
  EXPECT_EQ(sum, s.num_draft_tokens);
  EXPECT_LT(s.drafted_per_pos[7], s.num_drafts) << "adaptive k never drafted fewer than 8";
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
