// Tests for spec/engine.h's min_tokens (vLLM's: no stop before that many output tokens, the stop
// tokens masked until then) and stop_reason (SeqEvent::stop_token / stop_string), with and
// without speculation.
#include "tests/spec/spec_engine_fixtures.h"

namespace specserve {
namespace {

using namespace spec_testing;
using namespace spec_engine_testing;

// A target whose 64-token vocabulary is EOS plus 63 ASCII characters (every output decodes to
// plain text, as in spec_engine_stops_test), a prompt without EOS, and its plain greedy output of
// 40 tokens under ignore_eos.
struct AsciiRun {
  LoadedModel m;
  Tokens prompt;
  GenerateParams base;
  Tokens ref;
  std::string text_of(size_t n) const {
    return m.tokenizer->decode(Tokens(ref.begin(), ref.begin() + static_cast<std::ptrdiff_t>(n)), false);
  }
};

AsciiRun ascii_run(const std::string& name) {
  AsciiRun a;
  SyntheticModelSpec ts = target_spec();
  ts.vocab_size = 64;
  ts.seed = 77;
  a.m = make_target(ts, name);
  if (!a.m.model || !a.m.tokenizer) return a;
  std::mt19937 rng(3);
  a.prompt = random_tokens(rng, 10, 63);
  for (int32_t& t : a.prompt) t += 1;
  a.base = greedy_request(a.prompt, 40);
  a.base.sampling.ignore_eos = true;
  a.ref = run_engine(*a.m.model, a.m.tokenizer.get(), nullptr, spec_options(0, 1), {a.base}).requests.at(0).tokens;
  return a;
}

// The greedy token of each output position below min_tokens is the argmax over the vocabulary
// without the stop tokens: with a stop token that the plain output reaches at index j, a request
// with min_tokens > j keeps the output before j, never shows the stop token before min_tokens,
// and every proposer gives the plain engine's tokens.
TEST(SpecEngineMinTokens, StopTokenIsMaskedUntilMinTokensWithTheSameOutputForEveryProposer) {
  std::mt19937 rng(41);
  int tested = 0;
  for (int attempt = 0; attempt < 40 && tested < 4; ++attempt) {
    const Tokens prompt = random_tokens(rng, 10 + attempt % 7, 512);
    const Tokens ref = run_engine(target(), nullptr, nullptr, spec_options(0, 1), {greedy_request(prompt, 40)}).requests.at(0).tokens;
    ASSERT_EQ(ref.size(), 40u);
    const int32_t j = 2 + attempt % 6;
    const int32_t stop = ref[static_cast<size_t>(j)];
    if (std::find(ref.begin(), ref.begin() + j, stop) != ref.begin() + j) continue;  // not its first occurrence
    // min_tokens = j: the stop at index j comes after j tokens, so it stops there as without.
    {
      GenerateParams p = greedy_request(prompt, 40);
      p.sampling.stop_token_ids = {stop};
      p.sampling.min_tokens = j;
      const RequestResult at = run_engine(target(), nullptr, nullptr, spec_options(0, 1), {p}).requests.at(0);
      EXPECT_EQ(at.tokens, Tokens(ref.begin(), ref.begin() + j)) << "min_tokens = stop index " << j;
      EXPECT_EQ(at.finish, FinishReason::kStop);
      EXPECT_EQ(at.stop_token, stop);
    }
    for (const int32_t min_tokens : {j + 1, j + 6}) {
      GenerateParams p = greedy_request(prompt, 40);
      p.sampling.stop_token_ids = {stop};
      p.sampling.min_tokens = min_tokens;
      const RunResult plain = run_engine(target(), nullptr, nullptr, spec_options(0, 1), {p});
      const RequestResult& want = plain.requests.at(0);
      const std::string where = "stop token " + std::to_string(stop) + " at " + std::to_string(j) + ", min_tokens " +
                                std::to_string(min_tokens);
      ASSERT_GE(want.tokens.size(), static_cast<size_t>(min_tokens)) << where;
      EXPECT_EQ(Tokens(want.tokens.begin(), want.tokens.begin() + j), Tokens(ref.begin(), ref.begin() + j)) << where;
      EXPECT_EQ(std::count(want.tokens.begin(), want.tokens.begin() + min_tokens, stop), 0) << where;
      EXPECT_NE(want.tokens[static_cast<size_t>(j)], stop) << where;
      if (want.finish == FinishReason::kStop) {
        EXPECT_EQ(want.stop_token, stop) << where;
      } else {
        EXPECT_EQ(want.finish, FinishReason::kLength) << where;
        EXPECT_EQ(want.tokens.size(), 40u) << where;
      }
      for (Method m : {Method::kNgram, Method::kDraftModel, Method::kLayerSkip}) {
        auto proposer = make_proposer(m);
        ASSERT_TRUE(proposer);
        const RunResult got = run_engine(target(), nullptr, proposer.get(), spec_options(4, 1), {p});
        EXPECT_EQ(got.requests.at(0).tokens, want.tokens) << where << ", " << method_name(m);
        EXPECT_EQ(got.requests.at(0).finish, want.finish) << where << ", " << method_name(m);
        EXPECT_EQ(got.requests.at(0).stop_token, want.stop_token) << where << ", " << method_name(m);
      }
      // The oracle drafts the unconstrained output, stop token included: rejected below min_tokens.
      OracleProposer oracle;
      oracle.add(prompt, ref);
      const RunResult got = run_engine(target(), nullptr, &oracle, spec_options(4, 1), {p});
      EXPECT_EQ(got.requests.at(0).tokens, want.tokens) << where << ", oracle";
    }
    ++tested;
  }
  EXPECT_GE(tested, 3);
}

// Sampled requests: the stop token never comes before min_tokens, whatever the draws.
TEST(SpecEngineMinTokens, SampledOutputHasNoStopTokenBeforeMinTokens) {
  std::mt19937 rng(5);
  const Tokens prompt = random_tokens(rng, 12, 512);
  // A hot temperature over a 512-token vocabulary with 64 stop tokens: without the mask about
  // one draw in eight would stop.
  std::vector<int32_t> stops;
  for (int32_t t = 0; t < 64; ++t) stops.push_back(t * 8);
  int stopped_early_without = 0;
  for (uint64_t seed = 1; seed <= 6; ++seed) {
    GenerateParams p = greedy_request(prompt, 30);
    p.sampling.temperature = 1.5f;
    p.sampling.seed = seed;
    p.sampling.has_seed = true;
    p.sampling.stop_token_ids = stops;
    const RunResult unmasked = run_engine(target(), nullptr, nullptr, spec_options(0, 1), {p});
    stopped_early_without += unmasked.requests.at(0).tokens.size() < 20;
    p.sampling.min_tokens = 20;
    auto proposer = make_proposer(Method::kDraftModel);
    for (Proposer* prop : {static_cast<Proposer*>(nullptr), proposer.get()}) {
      const RunResult r = run_engine(target(), nullptr, prop, spec_options(prop ? 4 : 0, 1), {p});
      const RequestResult& got = r.requests.at(0);
      ASSERT_GE(got.tokens.size(), 20u) << "seed " << seed;
      for (size_t i = 0; i < 20; ++i) {
        EXPECT_EQ(std::count(stops.begin(), stops.end(), got.tokens[i]), 0) << "seed " << seed << " index " << i;
      }
      if (got.finish == FinishReason::kStop) EXPECT_NE(std::count(stops.begin(), stops.end(), got.stop_token), 0);
    }
  }
  EXPECT_GT(stopped_early_without, 0) << "the stop set never stopped an unmasked request early: the test shows nothing";
}

// EOS is masked too (also under ignore_eos, as vLLM masks the model's EOS whatever ignore_eos
// says); its stop_reason is none.
TEST(SpecEngineMinTokens, EosWaitsForMinTokens) {
  for (uint32_t seed = 1; seed < 400; ++seed) {
    std::mt19937 rng(seed);
    Tokens prompt = random_tokens(rng, 8, 512);
    prompt.push_back(kSyntheticEosId);
    GenerateParams p = greedy_request(prompt, 40);
    const RunResult plain = run_engine(target(), tokenizer(), nullptr, spec_options(0, 1), {p});
    const RequestResult& ref = plain.requests.at(0);
    if (ref.finish != FinishReason::kStop || ref.tokens.size() > 20) continue;
    EXPECT_EQ(ref.stop_token, -1) << "EOS has no stop_reason";
    EXPECT_TRUE(ref.stop_string.empty());
    const int32_t j = static_cast<int32_t>(ref.tokens.size());  // EOS came at output index j
    p.sampling.min_tokens = j;  // the edge: EOS at index j comes after j tokens
    const RunResult edge = run_engine(target(), tokenizer(), nullptr, spec_options(0, 1), {p});
    EXPECT_EQ(edge.requests.at(0).tokens, ref.tokens);
    EXPECT_EQ(edge.requests.at(0).finish, FinishReason::kStop);
    p.sampling.min_tokens = j + 5;
    const RunResult held = run_engine(target(), tokenizer(), nullptr, spec_options(0, 1), {p});
    const RequestResult& got = held.requests.at(0);
    ASSERT_GE(got.tokens.size(), static_cast<size_t>(j + 5));
    EXPECT_EQ(Tokens(got.tokens.begin(), got.tokens.begin() + j), ref.tokens);
    EXPECT_EQ(std::count(got.tokens.begin(), got.tokens.begin() + j + 5, kSyntheticEosId), 0);
    auto proposer = make_proposer(Method::kLayerSkip);
    const RunResult spec = run_engine(target(), tokenizer(), proposer.get(), spec_options(4, 1), {p});
    EXPECT_EQ(spec.requests.at(0).tokens, got.tokens);
    EXPECT_EQ(spec.requests.at(0).finish, got.finish);
    // ignore_eos: EOS is an ordinary token after min_tokens, still masked before.
    p.sampling.ignore_eos = true;
    const RunResult ignoring = run_engine(target(), tokenizer(), nullptr, spec_options(0, 1), {p});
    EXPECT_EQ(Tokens(ignoring.requests.at(0).tokens.begin(), ignoring.requests.at(0).tokens.begin() + j), ref.tokens);
    EXPECT_EQ(std::count(ignoring.requests.at(0).tokens.begin(), ignoring.requests.at(0).tokens.begin() + j + 5, kSyntheticEosId), 0);
    EXPECT_EQ(ignoring.requests.at(0).tokens.size(), 40u) << "ignore_eos runs to max_tokens";
    return;
  }
  FAIL() << "no prompt found whose greedy output stops on EOS within 20 tokens: pick other prompts";
}

// A resumed request (failover, migration) counts its resumed tokens toward min_tokens: a stop
// string inside their text that ends before the floor is no stop, and the continuation is the
// uninterrupted request's; one that ends after the floor means it had finished (refused).
TEST(SpecEngineMinTokens, ResumedOutputCountsTowardMinTokens) {
  const AsciiRun a = ascii_run("min_tokens_resume_target");
  ASSERT_TRUE(a.m.model && a.m.tokenizer);
  ASSERT_EQ(a.ref.size(), 40u);
  const LoadedModel& m = a.m;
  const Tokens& ref = a.ref;
  // A one-character stop string first matched in output token j's text: min_tokens j + 3 lets it
  // pass; a resume after j + 1 tokens holds that match below the floor.
  int tested = 0;
  for (size_t j = 2; j < 20 && tested < 3; ++j) {
    const std::string piece = m.tokenizer->token_to_piece(ref[j], false);
    if (piece.size() != 1 || a.text_of(j).find(piece) != std::string::npos) continue;  // first match at token j
    GenerateParams p = a.base;
    p.stop = {piece};
    p.sampling.min_tokens = static_cast<int32_t>(j) + 3;
    const RequestResult whole = run_engine(*m.model, m.tokenizer.get(), nullptr, spec_options(0, 1), {p}).requests.at(0);
    ASSERT_GE(whole.tokens.size(), j + 3);
    GenerateParams r = p;
    r.resume_output.assign(whole.tokens.begin(), whole.tokens.begin() + static_cast<std::ptrdiff_t>(j + 1));
    const RunResult rest = run_engine(*m.model, m.tokenizer.get(), nullptr, spec_options(0, 1), {r});
    ASSERT_EQ(rest.requests.size(), 1u);
    EXPECT_EQ(rest.requests.at(0).tokens, Tokens(whole.tokens.begin() + static_cast<std::ptrdiff_t>(j + 1), whole.tokens.end())) << "j " << j;
    EXPECT_EQ(rest.requests.at(0).finish, whole.finish) << "j " << j;
    // Without min_tokens the same resumed text holds a stop: the request had finished.
    r.sampling.min_tokens = 0;
    auto engine = Engine::create(*m.model, m.tokenizer.get(), nullptr, spec_options(0, 1));
    ASSERT_TRUE(engine.ok());
    auto refused = (*engine)->add_request(r);
    ASSERT_FALSE(refused.ok()) << "j " << j;
    EXPECT_NE(refused.status().message().find("already holds stop string"), std::string::npos) << refused.status().message();
    ++tested;
  }
  EXPECT_GE(tested, 2);
}

// Stop strings: a match that ends within the text of the first min_tokens - 1 tokens does not
// count; the first one ending after it does (vLLM checks stop strings from the min_tokens-th
// token on). Stop strings are not tokens, so the tokens are the unconstrained output's.
TEST(SpecEngineMinTokens, StopStringMustEndAfterMinTokens) {
  const AsciiRun a = ascii_run("min_tokens_ascii_target");
  ASSERT_TRUE(a.m.model && a.m.tokenizer);
  ASSERT_EQ(a.ref.size(), 40u);
  const LoadedModel& m = a.m;
  const Tokens& prompt = a.prompt;
  const GenerateParams& base = a.base;
  const Tokens& ref = a.ref;
  auto text_of = [&](size_t n) { return a.text_of(n); };
  const std::string full = text_of(ref.size());
  int tested = 0, continued = 0;
  for (const std::string piece : {full.substr(4, 1), full.substr(6, 2), full.substr(3, 1)}) {
    for (int32_t min_tokens = 1; min_tokens <= 30; min_tokens += 3) {
      // The expected cut: the first match that ends after the text of min_tokens - 1 tokens.
      const size_t floor = text_of(static_cast<size_t>(min_tokens - 1)).size();
      size_t at = std::string::npos;
      for (size_t p = full.find(piece); p != std::string::npos; p = full.find(piece, p + 1)) {
        if (p + piece.size() > floor) {
          at = p;
          break;
        }
      }
      continued += at != full.find(piece);
      GenerateParams p = base;
      p.stop = {piece};
      p.sampling.min_tokens = min_tokens;
      OracleProposer oracle;
      oracle.add(prompt, ref);
      for (Proposer* prop : {static_cast<Proposer*>(nullptr), static_cast<Proposer*>(&oracle)}) {
        const RunResult r = run_engine(*m.model, m.tokenizer.get(), prop, spec_options(prop ? 4 : 0, 1), {p});
        const RequestResult& got = r.requests.at(0);
        const std::string where = "stop '" + piece + "', min_tokens " + std::to_string(min_tokens) + (prop ? ", oracle" : ", plain");
        if (at == std::string::npos) {
          EXPECT_EQ(got.finish, FinishReason::kLength) << where;
          EXPECT_EQ(got.text, full) << where;
          EXPECT_TRUE(got.stop_string.empty()) << where;
          continue;
        }
        size_t n_emit = 1;
        while (text_of(n_emit).size() < at + piece.size()) ++n_emit;
        EXPECT_EQ(got.finish, FinishReason::kStop) << where;
        EXPECT_EQ(got.text, full.substr(0, at)) << where;
        EXPECT_EQ(got.tokens, Tokens(ref.begin(), ref.begin() + static_cast<std::ptrdiff_t>(n_emit))) << where;
        EXPECT_GE(got.tokens.size(), static_cast<size_t>(min_tokens)) << where;
        EXPECT_EQ(got.stop_string, piece) << where;
        EXPECT_EQ(got.stop_token, -1) << where;
      }
      ++tested;
    }
  }
  EXPECT_GE(tested, 20);
  EXPECT_GT(continued, 0) << "min_tokens never moved the cut: the test shows nothing";
}

TEST(SpecEngineMinTokens, ImpossibleValuesAreRefused) {
  auto engine = Engine::create(target(), nullptr, nullptr, spec_options(0, 1));
  ASSERT_TRUE(engine.ok());
  GenerateParams p = greedy_request({1, 2, 3}, 8);
  p.sampling.min_tokens = 9;
  auto r = (*engine)->add_request(p);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("min_tokens = 9"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("max_tokens = 8"), std::string::npos) << r.status().message();
  p.sampling.min_tokens = -1;
  r = (*engine)->add_request(p);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("min_tokens"), std::string::npos) << r.status().message();
  p.sampling.min_tokens = 8;  // = max_tokens: every token, then the length
  ASSERT_TRUE((*engine)->add_request(p).ok());
}

}  // namespace
}  // namespace specserve
