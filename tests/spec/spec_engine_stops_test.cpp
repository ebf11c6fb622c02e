// Tests for spec/engine.h with speculation: stop tokens, max_tokens and stop strings honoured
// exactly inside an accepted block; a failing or garbage proposer degrades to plain decoding.
#include "spec/engine_internal.h"
#include "tests/spec/spec_engine_fixtures.h"

namespace specserve {
namespace {

using namespace spec_testing;
using namespace spec_engine_testing;

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
LoadedModel ascii_target() {
  SyntheticModelSpec ts = target_spec();
  ts.vocab_size = 64;
  ts.seed = 77;
  return make_target(ts, "ascii_target");
}

// 10 random ids of ascii_target's vocabulary, no EOS (id 0).
Tokens ascii_prompt(uint32_t seed) {
  std::mt19937 rng(seed);
  Tokens prompt = random_tokens(rng, 10, 63);
  for (int32_t& t : prompt) t += 1;
  return prompt;
}

TEST(SpecEngineStops, StopStringsCutExactly) {
  LoadedModel m = ascii_target();
  ASSERT_TRUE(m.model && m.tokenizer);
  const Tokens prompt = ascii_prompt(3);
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

// A stop_token_ids token with include_stop_str_in_output: its text ends the output (vLLM's
// detokenizer skips the stop token's text only without the flag); the token itself is not an
// output token either way. The EOS renders as "" (a control token). Plain and speculative alike.
// NOTE: its text was left out with the flag too.
TEST(SpecEngineStops, AStopTokensTextIsIncludedWithIncludeStopStr) {
  LoadedModel m = ascii_target();
  ASSERT_TRUE(m.model && m.tokenizer);
  const Tokens prompt = ascii_prompt(5);
  GenerateParams base = greedy_request(prompt, 30);
  base.sampling.ignore_eos = true;
  RunResult plain = run_engine(*m.model, m.tokenizer.get(), nullptr, spec_options(0, 1), {base});
  const Tokens ref = plain.requests.at(0).tokens;
  ASSERT_EQ(ref.size(), 30u);
  int tested = 0;
  for (size_t j : {0u, 3u, 7u, 12u}) {
    // The first occurrence of ref[j] in the output is where it stops.
    const size_t at = static_cast<size_t>(std::find(ref.begin(), ref.end(), ref[j]) - ref.begin());
    const Tokens before(ref.begin(), ref.begin() + static_cast<std::ptrdiff_t>(at));
    const std::string piece = m.tokenizer->token_to_piece(ref[at], false);
    ASSERT_FALSE(piece.empty());
    for (bool include : {false, true}) {
      GenerateParams p = base;
      p.sampling.stop_token_ids = {ref[at]};
      p.include_stop_str = include;
      OracleProposer oracle;
      oracle.add(prompt, ref);
      RunResult plain_stop = run_engine(*m.model, m.tokenizer.get(), nullptr, spec_options(0, 1), {p});
      RunResult spec_stop = run_engine(*m.model, m.tokenizer.get(), &oracle, spec_options(kOracleK, 1), {p});
      const std::string where = "stop token " + std::to_string(ref[at]) + " include=" + std::to_string(include);
      for (const RunResult* r : {&plain_stop, &spec_stop}) {
        const RequestResult& got = r->requests.at(0);
        EXPECT_EQ(got.tokens, before) << where;
        EXPECT_EQ(got.text, m.tokenizer->decode(before, false) + (include ? piece : "")) << where;
        EXPECT_EQ(got.finish, FinishReason::kStop) << where;
      }
    }
    ++tested;
  }
  EXPECT_EQ(tested, 4);
}

// What a stream may send while a stop string may be starting: never half a character, at most 3
// bytes less than the plain cut, never less as the text grows.
TEST(SendablePrefix, CutsAtCharacterStartsAndOnlyGrows) {
  using engine_internal::sendable_prefix;
  const std::string text = "ab\xCE\xB5\xE6\x97\xA5\xF0\x9F\x98\x80z";  // a b ε 日 😀 z: 1+1+2+3+4+1 bytes
  for (size_t hold = 0; hold <= 6; ++hold) {
    const size_t cut = sendable_prefix(text, hold);
    const size_t plain = text.size() > hold ? text.size() - hold : 0;
    EXPECT_LE(cut, plain) << hold;
    EXPECT_GE(cut + 3, plain) << hold;
    EXPECT_TRUE(cut == text.size() || (static_cast<unsigned char>(text[cut]) & 0xC0) != 0x80) << "hold " << hold << " cuts inside a character";
  }
  EXPECT_EQ(sendable_prefix(text, 1), 11u);  // before "z"
  EXPECT_EQ(sendable_prefix(text, 2), 7u);   // "z" and the emoji's last byte held: the whole emoji waits
  EXPECT_EQ(sendable_prefix(text, 5), 7u);
  EXPECT_EQ(sendable_prefix(text, 6), 4u);   // before 日
  size_t last = 0;
  for (size_t n = 0; n <= text.size(); ++n) {
    const size_t cut = sendable_prefix(text.substr(0, n), 4);
    EXPECT_GE(cut, last) << "prefix of " << n << " bytes";
    last = cut;
  }
  // Bytes that can never be UTF-8 (a run of continuation bytes) do not hold the rest back.
  const std::string junk = "x" + std::string(8, '\x80');
  EXPECT_EQ(sendable_prefix(junk, 2), junk.size() - 2);
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
/// tokens, a tree whose parents are not earlier nodes, probabilities that do not match the
/// tokens, and answers of the wrong size.
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
        case 3: d.tokens.assign(static_cast<size_t>(k), 1), d.parents.assign(static_cast<size_t>(k), 0); break;  // parents[0] = 0: not an earlier node
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
}  // namespace
}  // namespace specserve

namespace specserve {
namespace {

using namespace spec_testing;

// A model whose logits are not finite (here: an infinite output scale, as corrupt weights
// would give) fails each request with an error naming the cause; the engine, and the process,
// keep going — greedy and sampled alike, with and without a proposer.
TEST(SpecEngineFaults, NonFiniteLogitsFailTheRequestNotTheProcess) {
  SyntheticModelSpec spec = spec_engine_testing::target_spec();
  spec.logit_scale = std::numeric_limits<float>::infinity();
  LoadedModel broken = make_target(spec, "nonfinite");
  ASSERT_TRUE(broken.model);
  std::mt19937 rng(5);
  for (float temperature : {0.0f, 0.8f}) {
    for (bool speculate : {false, true}) {
      NgramProposer ngram(1, 3);
      auto e = Engine::create(*broken.model, broken.tokenizer.get(), speculate ? &ngram : nullptr,
                              spec_engine_testing::spec_options(speculate ? 4 : 0, 4));
      ASSERT_TRUE(e.ok()) << e.status().to_string();
      std::vector<int64_t> ids;
      for (int i = 0; i < 3; ++i) {
        GenerateParams p = greedy_request(random_tokens(rng, 10, 512), 8);
        p.sampling.temperature = temperature;
        auto id = (*e)->add_request(p);
        ASSERT_TRUE(id.ok());
        ids.push_back(*id);
      }
      std::map<int64_t, SeqEvent> last;
      for (int steps = 0; (*e)->has_work() && steps < 100; ++steps) {
        std::vector<SeqEvent> evs;
        ASSERT_TRUE((*e)->step(&evs).ok());
        for (auto& ev : evs) last[ev.seq_id] = ev;
      }
      EXPECT_FALSE((*e)->has_work());
      for (int64_t id : ids) {
        ASSERT_TRUE(last.count(id));
        EXPECT_EQ(last[id].finish, FinishReason::kError);
        EXPECT_NE(last[id].error.find("non-finite logits"), std::string::npos) << last[id].error;
        EXPECT_TRUE(last[id].tokens.empty());
      }
      EXPECT_EQ((*e)->block_pool().num_free(), (*e)->block_pool().num_blocks()) << "KV blocks were not released";
    }
  }
}

}  // namespace
}  // namespace specserve
