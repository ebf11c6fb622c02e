// Tests for GenerateParams::resume_output (spec/engine.h): a request that died on one replica
// after m output tokens and is resumed on another with those tokens continues exactly as the
// uninterrupted request — tokens, logprobs, finish reason, and text (the first replica's events
// followed by the second's), with and without speculation, with penalties, stop tokens and a
// stop string that straddles the resume boundary; and the validation of resume_output.
#include "tests/spec/spec_engine_fixtures.h"

namespace specserve {
namespace {

using namespace spec_testing;
using namespace spec_engine_testing;

/// Every event of every request, in order (requests in the order given).
std::vector<std::vector<SeqEvent>> run_events(Transformer& model, const Tokenizer* tok, Proposer* proposer, EngineOptions opts,
                                              const std::vector<GenerateParams>& reqs) {
  std::vector<std::vector<SeqEvent>> out(reqs.size());
  auto engine = Engine::create(model, tok, proposer, opts);
  if (!engine.ok()) {
    ADD_FAILURE() << engine.status().to_string();
    return out;
  }
  Engine& e = **engine;
  std::map<int64_t, size_t> index;
  for (size_t i = 0; i < reqs.size(); ++i) {
    auto id = e.add_request(reqs[i]);
    if (!id.ok()) {
      ADD_FAILURE() << "request " << i << ": " << id.status().to_string();
      return out;
    }
    index[*id] = i;
  }
  for (int guard = 0; e.has_work() && guard < 100000; ++guard) {
    std::vector<SeqEvent> ev;
    Status st = e.step(&ev);
    if (!st.ok()) {
      ADD_FAILURE() << st.to_string();
      return out;
    }
    for (SeqEvent& x : ev) out[index.at(x.seq_id)].push_back(std::move(x));
  }
  EXPECT_FALSE(e.has_work()) << "engine does not finish";
  EXPECT_EQ(e.block_pool().num_free(), e.block_pool().num_blocks()) << "KV blocks still held";
  return out;
}

Tokens tokens_of(const std::vector<SeqEvent>& evs) {
  Tokens t;
  for (const SeqEvent& e : evs) t.insert(t.end(), e.tokens.begin(), e.tokens.end());
  return t;
}

std::string text_of(const std::vector<SeqEvent>& evs) {
  std::string s;
  for (const SeqEvent& e : evs) s += e.text;
  return s;
}

std::vector<SampleResult> logprobs_of(const std::vector<SeqEvent>& evs) {
  std::vector<SampleResult> l;
  for (const SeqEvent& e : evs) l.insert(l.end(), e.logprobs.begin(), e.logprobs.end());
  return l;
}

FinishReason finish_of(const std::vector<SeqEvent>& evs) { return evs.empty() ? FinishReason::kNone : evs.back().finish; }

/// The text a client had received once the first `m` output tokens were streamed: the events
/// up to (and including) the one that carried token m. A replica dies between steps, so m ends
/// an event; plain decoding streams one token per event.
std::string text_sent_after(const std::vector<SeqEvent>& evs, size_t m) {
  std::string s;
  size_t n = 0;
  for (const SeqEvent& e : evs) {
    if (n >= m) break;
    n += e.tokens.size();
    s += e.text;
  }
  EXPECT_EQ(n, m) << "token " << m << " does not end an event";
  return s;
}

GenerateParams resumed(const GenerateParams& p, const Tokens& ref, size_t m) {
  GenerateParams r = p;
  r.resume_output.assign(ref.begin(), ref.begin() + static_cast<std::ptrdiff_t>(m));
  return r;
}

// ---- greedy continuation ------------------------------------------------------------------

TEST(SpecEngineResume, GreedyContinuesExactlyAsUninterrupted) {
  // Random prompts (the first six with repetition/frequency/presence penalties, which see the
  // resumed tokens as output), prompts that run into max_model_len, and stop-token requests.
  std::vector<GenerateParams> reqs;
  for (size_t i : {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 20, 25, 38, 39, 40, 43, 48, 50, 52, 55, 57, 59}) {
    reqs.push_back(requests().at(i));
  }
  const auto plain = run_events(target(), tokenizer(), nullptr, spec_options(0, 1), reqs);
  std::vector<GenerateParams> resumed_reqs;
  std::vector<size_t> cut;
  int num_resumable = 0;
  for (size_t i = 0; i < reqs.size(); ++i) {
    const Tokens ref = tokens_of(plain[i]);
    // A request with one output token has nothing to resume: it runs from the start (m = 0).
    const size_t m = ref.size() < 2 ? 0 : 1 + (i * 7) % (ref.size() - 1);  // 1 .. n-1
    num_resumable += m > 0;
    cut.push_back(m);
    resumed_reqs.push_back(resumed(reqs[i], ref, m));
  }
  ASSERT_GE(num_resumable, 20);
  auto draft = make_proposer(Method::kDraftModel);
  struct Run { const char* name; Proposer* proposer; EngineOptions opts; };
  for (const Run& run : {Run{"plain batch 8", nullptr, spec_options(0, 8)}, Run{"draft_model k=4 batch 8", draft.get(), spec_options(4, 8)},
                         Run{"draft_model k=4 batch 1", draft.get(), spec_options(4, 1)}}) {
    const auto got = run_events(target(), tokenizer(), run.proposer, run.opts, resumed_reqs);
    for (size_t i = 0; i < reqs.size(); ++i) {
      const std::string where = std::string(run.name) + ", request " + std::to_string(i) + " resumed after " + std::to_string(cut[i]);
      const Tokens ref = tokens_of(plain[i]);
      EXPECT_EQ(tokens_of(got[i]), Tokens(ref.begin() + static_cast<std::ptrdiff_t>(cut[i]), ref.end())) << where;
      EXPECT_EQ(finish_reason_name(finish_of(got[i])), std::string(finish_reason_name(finish_of(plain[i])))) << where;
      EXPECT_EQ(text_sent_after(plain[i], cut[i]) + text_of(got[i]), text_of(plain[i])) << where;
      const auto ref_lp = logprobs_of(plain[i]);
      expect_same_logprobs(logprobs_of(got[i]), std::vector<SampleResult>(ref_lp.begin() + static_cast<std::ptrdiff_t>(cut[i]), ref_lp.end()),
                           where);
    }
  }
}

TEST(SpecEngineResume, ResumedTokensArePenalisedAsOutputNotPrompt) {
  // Frequency and presence penalties apply to output tokens only: moving the resumed tokens into
  // the prompt changes some penalised greedy continuation, so the identity above is not vacuous.
  int differ = 0;
  for (size_t i = 0; i < 8; ++i) {
    GenerateParams p = requests().at(i);
    p.sampling.frequency_penalty = 1.5f;
    p.sampling.presence_penalty = 1.5f;
    const auto plain = run_events(target(), nullptr, nullptr, spec_options(0, 1), {p});
    const Tokens ref = tokens_of(plain[0]);
    const size_t m = ref.size() / 2;
    GenerateParams as_prompt = p;
    as_prompt.prompt.insert(as_prompt.prompt.end(), ref.begin(), ref.begin() + static_cast<std::ptrdiff_t>(m));
    as_prompt.max_tokens = p.max_tokens - static_cast<int32_t>(m);
    const auto moved = run_events(target(), nullptr, nullptr, spec_options(0, 1), {as_prompt});
    differ += tokens_of(moved[0]) != Tokens(ref.begin() + static_cast<std::ptrdiff_t>(m), ref.end());
  }
  EXPECT_GT(differ, 0);
}

// ---- stop strings across the boundary -------------------------------------------------------

TEST(SpecEngineResume, StopStringStraddlingTheResumeBoundary) {
  // The 64-token ASCII vocabulary of StopStringsCutExactly: every output decodes to plain text.
  SyntheticModelSpec ts = target_spec();
  ts.vocab_size = 64;
  ts.seed = 77;
  LoadedModel m = make_target(ts, "resume_ascii_target");
  ASSERT_TRUE(m.model && m.tokenizer);
  std::mt19937 rng(3);
  Tokens prompt = random_tokens(rng, 10, 63);
  for (int32_t& t : prompt) t += 1;  // no EOS in the prompt
  GenerateParams base = greedy_request(prompt, 40);
  base.sampling.ignore_eos = true;
  const Tokens ref = tokens_of(run_events(*m.model, m.tokenizer.get(), nullptr, spec_options(0, 1), {base})[0]);
  ASSERT_EQ(ref.size(), 40u);
  const std::string full = m.tokenizer->decode(ref, false);

  int tested = 0;
  for (size_t j = 2; j + 1 < 30; ++j) {
    // A stop string over output tokens j-1 .. j+1; the resume cut falls inside it (after j-1
    // or after j) or just before it.
    const std::string piece = m.tokenizer->token_to_piece(ref[j - 1], false) + m.tokenizer->token_to_piece(ref[j], false) +
                              m.tokenizer->token_to_piece(ref[j + 1], false);
    if (piece.size() != 3) continue;
    const size_t at = full.find(piece);
    ASSERT_NE(at, std::string::npos);
    // Only where this is the first match, so that the cut falls inside or just before it.
    if (at != m.tokenizer->decode(Tokens(ref.begin(), ref.begin() + static_cast<std::ptrdiff_t>(j - 1)), false).size()) continue;
    for (bool include : {false, true}) {
      GenerateParams p = base;
      // The long second string makes the engine hold back 17 bytes: the text of the resumed
      // tokens was not all sent by the first replica.
      p.stop = {piece, "this never matches"};
      p.include_stop_str = include;
      const auto first = run_events(*m.model, m.tokenizer.get(), nullptr, spec_options(0, 1), {p});
      const Tokens want_tokens = tokens_of(first[0]);
      ASSERT_EQ(text_of(first[0]), full.substr(0, at + (include ? piece.size() : 0)));
      ASSERT_EQ(finish_of(first[0]), FinishReason::kStop);
      for (size_t cut = j - 1; cut <= j + 1 && cut < want_tokens.size(); ++cut) {
        OracleProposer oracle;
        oracle.add(prompt, ref);
        for (Proposer* proposer : {static_cast<Proposer*>(nullptr), static_cast<Proposer*>(&oracle)}) {
          const std::string where = "stop '" + piece + "' include=" + std::to_string(include) + " cut " + std::to_string(cut) +
                                    (proposer ? " oracle k=4" : " plain");
          const auto got = run_events(*m.model, m.tokenizer.get(), proposer, spec_options(proposer ? 4 : 0, 1),
                                      {resumed(p, want_tokens, cut)});
          EXPECT_EQ(tokens_of(got[0]), Tokens(want_tokens.begin() + static_cast<std::ptrdiff_t>(cut), want_tokens.end())) << where;
          EXPECT_EQ(text_sent_after(first[0], cut) + text_of(got[0]), text_of(first[0])) << where;
          EXPECT_EQ(finish_of(got[0]), FinishReason::kStop) << where;
        }
      }
    }
    ++tested;
  }
  EXPECT_GE(tested, 5);
}

// ---- validation ---------------------------------------------------------------------------

TEST(SpecEngineResume, InvalidResumeOutputIsRefused) {
  auto engine = Engine::create(target(), tokenizer(), nullptr, spec_options(0, 1));
  ASSERT_TRUE(engine.ok());
  Engine& e = **engine;
  auto expect_error = [&](const GenerateParams& p, StatusCode code, const std::string& what) {
    auto id = e.add_request(p);
    ASSERT_FALSE(id.ok()) << what;
    EXPECT_EQ(id.status().code(), code) << what << ": " << id.status().to_string();
    EXPECT_NE(id.status().message().find("resume_output"), std::string::npos) << what << ": " << id.status().message();
  };
  GenerateParams p = greedy_request({5, 6, 7}, 4);
  p.resume_output = {8, 9, 10, 11};
  expect_error(p, StatusCode::kInvalidArgument, "as many tokens as max_tokens");
  p.resume_output = {8, 9, 10, 11, 12};
  expect_error(p, StatusCode::kInvalidArgument, "more tokens than max_tokens");
  p.max_tokens = 10;
  p.resume_output = {8, 512};
  expect_error(p, StatusCode::kInvalidArgument, "token outside the vocabulary");
  p.resume_output = {-1};
  expect_error(p, StatusCode::kInvalidArgument, "negative token");
  p.resume_output = {8, 9};
  p.sampling.stop_token_ids = {9};
  expect_error(p, StatusCode::kInvalidArgument, "a stop token");
  p.sampling.stop_token_ids.clear();
  p.resume_output = {8, kSyntheticEosId};
  expect_error(p, StatusCode::kInvalidArgument, "EOS");
  p.sampling.ignore_eos = true;
  EXPECT_TRUE(e.add_request(p).ok()) << "EOS is an ordinary token with ignore_eos";
  p.sampling.ignore_eos = false;
  p.resume_output = {8, 9, 10};
  p.stop = {tokenizer()->decode(Tokens{9, 10}, false)};
  expect_error(p, StatusCode::kInvalidArgument, "a complete stop string");
  p.stop.clear();
  GenerateParams longp = greedy_request(Tokens(200, 3), 100);
  longp.resume_output.assign(56, 4);  // 256 = max_model_len
  expect_error(longp, StatusCode::kOutOfRange, "no room left in max_model_len");
  longp.resume_output.assign(55, 4);
  EXPECT_TRUE(e.add_request(longp).ok()) << "one position left";
  p.resume_output = {8, 9};
  EXPECT_TRUE(e.add_request(p).ok());
}

TEST(SpecEngineResume, ResumedTokensCountTowardMaxTokensOnly) {
  // A resumed request generates max_tokens - m tokens; the engine's counters see the prompt and
  // the new tokens only (the resumed ones were counted by the replica that produced them).
  const GenerateParams p = greedy_request({11, 12, 13, 14}, 9);
  const auto plain = run_events(target(), nullptr, nullptr, spec_options(0, 1), {p});
  const Tokens ref = tokens_of(plain[0]);
  ASSERT_EQ(ref.size(), 9u);
  auto engine = Engine::create(target(), nullptr, nullptr, spec_options(0, 1));
  ASSERT_TRUE(engine.ok());
  Engine& e = **engine;
  ASSERT_TRUE(e.add_request(resumed(p, ref, 8)).ok());
  std::vector<SeqEvent> ev;
  while (e.has_work()) ASSERT_TRUE(e.step(&ev).ok());
  EXPECT_EQ(tokens_of(ev), Tokens{ref.back()});
  EXPECT_EQ(finish_of(ev), FinishReason::kLength);
  EXPECT_EQ(e.stats().generated_tokens, 1);
  EXPECT_EQ(e.stats().prompt_tokens, 4);
}

}  // namespace
}  // namespace specserve
