// Tests for GenerateParams::num_speculative_tokens (spec/engine.h): per-request speculation.
// -1 follows the engine, 0 never speculates (and never reaches the proposer), 1..64 caps the
// draft tokens per step at min(value, engine's k), adaptive k included; greedy output stays that
// of plain decoding whatever the mix in a batch (DESIGN.md section 4). The policy rule itself
// (RunningSeq::k 0 gets no drafts) is a row of step_policy_test.cpp.
#include <cstdint>

#include "spec/lookup_first_proposer.h"
#include "spec/ngram_proposer.h"
#include "tests/spec/spec_engine_fixtures.h"

namespace specserve {
namespace {

using namespace spec_testing;
using namespace spec_engine_testing;

/// Passes every call on to `inner`, recording, per sequence id, the k of each DraftRequest
/// and the number of release() calls.
class RecordingProposer final : public Proposer {
 public:
  explicit RecordingProposer(Proposer* inner) : inner_(inner) {}
  std::string name() const override { return "recording"; }
  bool drafts_trees() const override { return inner_->drafts_trees(); }
  int32_t max_draft_depth(int32_t k) const override { return inner_->max_draft_depth(k); }
  Status propose(const std::vector<DraftRequest>& reqs, std::vector<DraftTree>* out) override {
    for (const DraftRequest& r : reqs) asked[r.seq_id].push_back(r.num_tokens);
    return inner_->propose(reqs, out);
  }
  void release(int64_t id) override {
    ++releases[id];
    inner_->release(id);
  }
  /// The largest k asked for `id`, 0 when never asked.
  int32_t max_asked(int64_t id) const {
    auto it = asked.find(id);
    return it == asked.end() ? 0 : *std::max_element(it->second.begin(), it->second.end());
  }
  std::map<int64_t, std::vector<int32_t>> asked;
  std::map<int64_t, int> releases;

 private:
  Proposer* inner_;
};

/// run_engine gives the requests ids 1, 2, ... in the order given.
int64_t seq_id_of(size_t i) { return static_cast<int64_t>(i) + 1; }

/// Checks one request's counters and proposer traffic against its cap under an engine of k
/// `engine_k` (with a proposer).
void expect_within_cap(const RequestResult& r, const RecordingProposer& p, int64_t id, int32_t setting, int32_t engine_k,
                       const std::string& where) {
  const int32_t cap = setting < 0 ? engine_k : std::min(setting, engine_k);
  EXPECT_EQ(r.spec.accepted_per_pos.size(), static_cast<size_t>(cap)) << where;
  EXPECT_LE(r.spec.num_draft_tokens, cap * r.spec.num_drafts) << where;
  EXPECT_LE(p.max_asked(id), cap) << where;
  if (cap == 0) {
    EXPECT_EQ(r.spec.num_drafts, 0) << where;
    EXPECT_EQ(r.spec.num_draft_tokens, 0) << where;
    EXPECT_EQ(p.asked.count(id), 0u) << where << ": the proposer was asked for a request that never speculates";
    EXPECT_EQ(p.releases.count(id), 0u) << where << ": release() for a request the proposer never saw";
  }
}

TEST(SpecEnginePerRequest, MixedSettingsInOneBatchKeepGreedyIdentity) {
  // The 60 identity requests with -1, 0 and 2 in turn, batch 8, engine k = 4.
  const std::vector<int32_t> settings = {-1, 0, 2};
  std::vector<GenerateParams> reqs = requests();
  for (size_t i = 0; i < reqs.size(); ++i) reqs[i].num_speculative_tokens = settings[i % settings.size()];
  for (Method m : {Method::kDraftModel, Method::kNgram}) {
    for (bool adaptive : {false, true}) {
      const std::string where = std::string(method_name(m)) + (adaptive ? " adaptive" : " fixed k");
      auto inner = make_proposer(m);
      ASSERT_TRUE(inner);
      RecordingProposer p(inner.get());
      EngineOptions o = spec_options(4, 8);
      o.adaptive_k = adaptive;
      RunResult got = run_engine(target(), tokenizer(), &p, o, reqs);
      expect_same_outputs(got, reference(), where);
      ASSERT_EQ(got.requests.size(), reqs.size());
      std::map<int32_t, SpecStats> by_setting;
      std::map<int32_t, int32_t> max_asked;
      for (size_t i = 0; i < reqs.size(); ++i) {
        const int32_t setting = reqs[i].num_speculative_tokens;
        expect_within_cap(got.requests[i], p, seq_id_of(i), setting, 4, where + ", request " + std::to_string(i));
        by_setting[setting].add(got.requests[i].spec);
        max_asked[setting] = std::max(max_asked[setting], p.max_asked(seq_id_of(i)));
      }
      // Not vacuous: the neighbours of the 0 requests drafted, -1 ones beyond the cap of 2.
      EXPECT_EQ(by_setting[0].num_drafts, 0) << where;
      EXPECT_GT(by_setting[2].num_drafts, 0) << where;
      EXPECT_GT(by_setting[-1].num_drafts, 0) << where;
      EXPECT_GT(by_setting[-1].num_accepted_tokens, 0) << where;
      EXPECT_EQ(max_asked[2], 2) << where;
      EXPECT_EQ(max_asked[-1], 4) << where;
      EXPECT_EQ(got.stats.spec.num_drafts, by_setting[-1].num_drafts + by_setting[2].num_drafts) << where;
    }
  }
}

/// A prompt and the target's plain greedy output for it (max_tokens 40, no stop rules).
struct OracleSetup {
  Tokens prompt;
  Tokens ref;
};

OracleSetup oracle_setup(uint32_t seed) {
  std::mt19937 rng(seed);
  OracleSetup s;
  s.prompt = random_tokens(rng, 12, 512);
  RunResult r = run_engine(target(), nullptr, nullptr, spec_options(0, 1), {greedy_request(s.prompt, 40)});
  s.ref = r.requests.at(0).tokens;
  return s;
}

TEST(SpecEnginePerRequest, ZeroNeverDraftsNextToARequestThatDoes) {
  // The same prompt twice in one batch, an oracle that would accept every draft: the request
  // with 0 decodes plainly (no drafts, never sent to the proposer), the -1 one drafts.
  const OracleSetup s = oracle_setup(31);
  ASSERT_EQ(s.ref.size(), 40u);
  OracleProposer oracle;
  oracle.add(s.prompt, s.ref);
  RecordingProposer p(&oracle);
  std::vector<GenerateParams> reqs(2, greedy_request(s.prompt, 40));
  reqs[0].num_speculative_tokens = 0;
  reqs[1].num_speculative_tokens = -1;
  int32_t max_running = 0;
  RunResult got = run_engine(target(), nullptr, &p, spec_options(4, 2), reqs,
                             [&](Engine& e) { max_running = std::max(max_running, e.num_running()); });
  EXPECT_EQ(max_running, 2);
  for (size_t i = 0; i < reqs.size(); ++i) EXPECT_EQ(got.requests[i].tokens, s.ref) << "request " << i;
  const SpecStats& plain = got.requests[0].spec;
  const SpecStats& drafted = got.requests[1].spec;
  EXPECT_EQ(plain.num_drafts, 0);
  EXPECT_EQ(plain.num_draft_tokens, 0);
  EXPECT_TRUE(plain.accepted_per_pos.empty());
  EXPECT_EQ(p.asked.count(seq_id_of(0)), 0u);
  EXPECT_EQ(p.releases.count(seq_id_of(0)), 0u);
  EXPECT_GT(drafted.num_drafts, 0);
  EXPECT_EQ(drafted.num_accepted_tokens, drafted.num_draft_tokens);  // the oracle is always right
  EXPECT_EQ(p.releases[seq_id_of(1)], 1);
  EXPECT_EQ(got.stats.spec.num_drafts, drafted.num_drafts);
  EXPECT_EQ(got.final_blocks_used, 0);
}

TEST(SpecEnginePerRequest, CapHoldsUnderAdaptiveK) {
  // Adaptive k grows by 2 after every fully accepted draft (the oracle's always are) up to the
  // cap: 1 stays at one draft token per step, 2 at two, -1 goes to the engine's 8.
  const OracleSetup s = oracle_setup(32);
  OracleProposer oracle;
  oracle.add(s.prompt, s.ref);
  RecordingProposer p(&oracle);
  const std::vector<int32_t> settings = {1, 2, -1, 5};
  std::vector<GenerateParams> reqs;
  for (int32_t v : settings) {
    reqs.push_back(greedy_request(s.prompt, 40));
    reqs.back().num_speculative_tokens = v;
  }
  EngineOptions o = spec_options(8, 4);
  o.adaptive_k = true;
  RunResult got = run_engine(target(), nullptr, &p, o, reqs);
  for (size_t i = 0; i < reqs.size(); ++i) {
    const std::string where = "num_speculative_tokens " + std::to_string(settings[i]);
    const RequestResult& r = got.requests[i];
    EXPECT_EQ(r.tokens, s.ref) << where;
    expect_within_cap(r, p, seq_id_of(i), settings[i], 8, where);
    EXPECT_GT(r.spec.num_drafts, 0) << where;
  }
  // A cap of 1: exactly one draft token in every draft.
  EXPECT_EQ(got.requests[0].spec.num_draft_tokens, got.requests[0].spec.num_drafts);
  EXPECT_EQ(p.max_asked(seq_id_of(0)), 1);
  EXPECT_EQ(p.max_asked(seq_id_of(1)), 2);
  EXPECT_EQ(p.max_asked(seq_id_of(2)), 8);
  EXPECT_EQ(p.max_asked(seq_id_of(3)), 5);
  // Fewer tokens per step, so more steps: the capped requests draft more often.
  EXPECT_GT(got.requests[0].spec.num_drafts, got.requests[2].spec.num_drafts);
}

/// Always wrong: drafts token ids the reference never holds, as a chain or (`trees`) as that
/// many children of the last known token (a tree proposer).
class WrongProposer final : public Proposer {
 public:
  WrongProposer(const Tokens& ref, bool trees) : trees_(trees) {
    for (int32_t t = 511; static_cast<int32_t>(bad_.size()) < 64 && t >= 0; --t) {
      if (std::find(ref.begin(), ref.end(), t) == ref.end()) bad_.push_back(t);
    }
  }
  std::string name() const override { return "wrong"; }
  bool drafts_trees() const override { return trees_; }
  int32_t max_draft_depth(int32_t k) const override { return trees_ ? 1 : k; }
  Status propose(const std::vector<DraftRequest>& reqs, std::vector<DraftTree>* out) override {
    out->assign(reqs.size(), DraftTree{});
    for (size_t i = 0; i < reqs.size(); ++i) {
      (*out)[i].tokens.assign(bad_.begin(), bad_.begin() + reqs[i].num_tokens);
      if (trees_) (*out)[i].parents.assign(static_cast<size_t>(reqs[i].num_tokens), -1);
    }
    return Status();
  }

 private:
  bool trees_;
  Tokens bad_;
};

TEST(SpecEnginePerRequest, AdaptiveKShrinksChainsNotTreeBudgets) {
  // Adaptive k (EngineOptions::adaptive_k): -1 after each rejected chain, down to 1; a tree
  // proposer's k is its node budget and stays. Also behind a prompt lookup
  // (spec/lookup_first_proposer.h) whose chains a tree proposer's k must not follow.
  // The prompt holds a quarter of the vocabulary, each id once: the 1-gram lookup drafts whenever the
  // last token is one of them.
  OracleSetup s;
  for (int32_t t = 0; t < 128; ++t) s.prompt.push_back((t * 37 + 11) % 128);
  s.ref = run_engine(target(), nullptr, nullptr, spec_options(0, 1), {greedy_request(s.prompt, 40)}).requests.at(0).tokens;
  for (bool trees : {false, true}) {
    for (bool behind_lookup : {false, true}) {
      WrongProposer wrong(s.ref, trees);
      auto recording = std::make_unique<RecordingProposer>(&wrong);
      RecordingProposer& rec = *recording;
      std::unique_ptr<LookupFirstProposer> lookup;
      if (behind_lookup) lookup = std::make_unique<LookupFirstProposer>(std::move(recording), 1, 2);
      EngineOptions o = spec_options(8, 1);
      o.adaptive_k = true;
      RunResult got = run_engine(target(), nullptr, lookup ? static_cast<Proposer*>(lookup.get()) : &rec, o, {greedy_request(s.prompt, 40)});
      const std::string where = std::string(trees ? "tree" : "chain") + (behind_lookup ? " behind the lookup" : "");
      EXPECT_EQ(got.requests.at(0).tokens, s.ref) << where;
      const std::vector<int32_t>& asked = rec.asked[seq_id_of(0)];
      ASSERT_GE(asked.size(), 12u) << where;
      // (Behind the lookup a chain may start lower: a rejected lookup chain came first.)
      if (trees || !behind_lookup) EXPECT_EQ(asked.front(), 8) << where;
      if (lookup) EXPECT_GE(lookup->num_lookup_drafts(), 3) << where << ": the lookup never drafted, the case is vacuous";
      if (trees) {
        // Every ask but the last few (the request's remaining tokens cap them) is the budget.
        for (size_t i = 0; i + 8 < asked.size(); ++i) EXPECT_EQ(asked[i], 8) << where << ", ask " << i;
      } else {
        EXPECT_EQ(*std::min_element(asked.begin(), asked.end()), 1) << where << ": k never shrank";
        EXPECT_EQ(asked[asked.size() / 2], 1) << where;
      }
    }
  }
}

TEST(SpecEngineLookupHistory, CachedRequestsDraftMoreAndKeepGreedyIdentity) {
  // lookup_cached_requests (spec/lookup_history.h): one request after another, each finished
  // output joins the searched text of the next ones. Greedy output stays plain decoding's.
  SpecStats without, with;
  for (int32_t cached : {0, 64}) {
    NgramProposer p(2, 3, cached);
    const RunResult got = run_engine(target(), tokenizer(), &p, spec_options(4, 1), requests());
    expect_same_outputs(got, reference(), "lookup_cached_requests " + std::to_string(cached));
    (cached ? with : without) = got.stats.spec;
    // Drafts by source (counted per step) add up to the totals (counted at finish) once every
    // request finished; the history drafts only when it is on; ngram never drafts as a model.
    const auto& by = got.stats.by_source;
    const DraftSourceStats& own = by[static_cast<size_t>(DraftSource::kPromptLookup)];
    const DraftSourceStats& hist = by[static_cast<size_t>(DraftSource::kCachedRequests)];
    EXPECT_EQ(by[static_cast<size_t>(DraftSource::kModel)].num_drafts, 0);
    EXPECT_GT(own.num_drafts, 0);
    EXPECT_EQ(own.num_drafts + hist.num_drafts, got.stats.spec.num_drafts);
    EXPECT_EQ(own.num_draft_tokens + hist.num_draft_tokens, got.stats.spec.num_draft_tokens);
    EXPECT_EQ(own.num_accepted_tokens + hist.num_accepted_tokens, got.stats.spec.num_accepted_tokens);
    if (cached) {
      EXPECT_GT(hist.num_drafts, 0) << "earlier outputs never drafted";
    } else {
      EXPECT_EQ(hist.num_drafts, 0);
    }
  }
  EXPECT_GT(with.num_drafts, without.num_drafts) << "earlier outputs never drafted";
  EXPECT_GT(with.num_accepted_tokens, without.num_accepted_tokens);
  std::printf("[ history  ] drafts %lld -> %lld, accepted %lld -> %lld\n", static_cast<long long>(without.num_drafts),
              static_cast<long long>(with.num_drafts), static_cast<long long>(without.num_accepted_tokens),
              static_cast<long long>(with.num_accepted_tokens));
}

// A seeded sampled request gives the same text whatever earlier requests generated: earlier
// outputs do not draft for it (spec/ngram_proposer.h history_may_draft). NOTE: they did, and the
// sampler's draws follow the drafts, so the same seeded request gave another text once its own
// earlier output (or another client's) was in the history. Greedy and unseeded requests still
// draft from the history.
TEST(SpecEngineLookupHistory, ASeededSampledRequestGivesTheSameTextWhateverCameBefore) {
  for (size_t which : {20u, 23u, 27u}) {
    GenerateParams seeded = greedy_request(requests()[which].prompt, 48);
    seeded.sampling.temperature = 0.8f;
    seeded.sampling.has_seed = true;
    seeded.sampling.seed = 7 + which;
    NgramProposer fresh(2, 3, 64);
    const RunResult first = run_engine(target(), tokenizer(), &fresh, spec_options(4, 1), {seeded});
    ASSERT_EQ(first.requests.size(), 1u);
    // The history now holds this request's output (twice) and the greedy output of its prompt.
    NgramProposer used(2, 3, 64);
    GenerateParams greedy = greedy_request(requests()[which].prompt, 48);
    run_engine(target(), tokenizer(), &used, spec_options(4, 1), {seeded, greedy, seeded});
    const RunResult again = run_engine(target(), tokenizer(), &used, spec_options(4, 1), {seeded});
    const std::string where = "request " + std::to_string(which);
    EXPECT_EQ(again.requests[0].tokens, first.requests[0].tokens) << where;
    EXPECT_EQ(again.stats.by_source[static_cast<size_t>(DraftSource::kCachedRequests)].num_drafts, 0) << where;
    // Not vacuous: the same prompt greedy, or sampled without a seed, drafts from the history.
    GenerateParams unseeded = seeded;
    unseeded.sampling.has_seed = false;
    const RunResult others = run_engine(target(), tokenizer(), &used, spec_options(4, 1), {greedy, unseeded});
    EXPECT_GT(others.stats.by_source[static_cast<size_t>(DraftSource::kCachedRequests)].num_drafts, 0) << where;
  }
}

TEST(SpecEnginePerRequest, CapAboveTheEnginesIsTheEngines) {
  const OracleSetup s = oracle_setup(33);
  OracleProposer oracle;
  oracle.add(s.prompt, s.ref);
  RecordingProposer p(&oracle);
  std::vector<GenerateParams> reqs(2, greedy_request(s.prompt, 40));
  reqs[0].num_speculative_tokens = 8;
  reqs[1].num_speculative_tokens = 64;
  RunResult got = run_engine(target(), nullptr, &p, spec_options(2, 2), reqs);
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(got.requests[i].tokens, s.ref) << "request " << i;
    EXPECT_EQ(p.max_asked(seq_id_of(i)), 2) << "request " << i;
    EXPECT_EQ(got.requests[i].spec.accepted_per_pos.size(), 2u) << "request " << i;
  }
}

TEST(SpecEnginePerRequest, NothingToDraftWithIsNotAnError) {
  // No proposer, or an engine with k 0: a request asking for drafts is accepted and decodes.
  const OracleSetup s = oracle_setup(34);
  std::vector<GenerateParams> reqs(2, greedy_request(s.prompt, 40));
  reqs[0].num_speculative_tokens = 3;
  reqs[1].num_speculative_tokens = 64;
  RunResult none = run_engine(target(), nullptr, nullptr, spec_options(4, 2), reqs);
  OracleProposer oracle;
  oracle.add(s.prompt, s.ref);
  RecordingProposer p(&oracle);
  RunResult off = run_engine(target(), nullptr, &p, spec_options(0, 2), reqs);
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(none.requests[i].tokens, s.ref) << "request " << i;
    EXPECT_EQ(off.requests[i].tokens, s.ref) << "request " << i;
    EXPECT_EQ(none.requests[i].spec.num_drafts, 0) << "request " << i;
    EXPECT_EQ(off.requests[i].spec.num_drafts, 0) << "request " << i;
  }
  EXPECT_TRUE(p.asked.empty());
  EXPECT_TRUE(p.releases.empty());
}

TEST(SpecEnginePerRequest, PreemptedZeroRequestNeverReachesTheProposer) {
  // KV pressure (as in SpecEngineKv.PreemptionUnderKvPressureKeepsIdentity): sequences are
  // preempted and recomputed; those with 0 still never reach the proposer, and the output is
  // that of plain decoding.
  std::mt19937 rng(21);
  std::vector<GenerateParams> reqs;
  for (int i = 0; i < 8; ++i) {
    reqs.push_back(greedy_request(random_tokens(rng, i % 2 ? 70 : 6, 512), 40));
    reqs.back().num_speculative_tokens = i % 3 == 0 ? 0 : (i % 3 == 1 ? -1 : 2);
  }
  RunResult plain = run_engine(target(), nullptr, nullptr, spec_options(0, 1), reqs);
  auto inner = make_proposer(Method::kDraftModel);
  RecordingProposer p(inner.get());
  EngineOptions o = spec_options(4, 8);
  o.block_size = 4;
  o.num_kv_blocks = 64;
  o.max_num_batched_tokens = 48;
  RunResult got = run_engine(target(), nullptr, &p, o, reqs);
  int num_preempted = 0;
  for (const auto& [id, n] : p.releases) num_preempted += n - 1;
  EXPECT_GT(num_preempted, 0) << "no speculating sequence was preempted";
  for (size_t i = 0; i < reqs.size(); ++i) {
    const std::string where = "request " + std::to_string(i);
    EXPECT_EQ(got.requests[i].tokens, plain.requests[i].tokens) << where;
    expect_within_cap(got.requests[i], p, seq_id_of(i), reqs[i].num_speculative_tokens, 4, where);
  }
  EXPECT_EQ(got.final_blocks_used, 0);
}

TEST(SpecEnginePerRequest, Validation) {
  NgramProposer ngram(1, 3);
  auto engine = Engine::create(target(), tokenizer(), &ngram, spec_options(4, 8));
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  Engine& e = **engine;
  for (int32_t bad : {-2, -100, 65, 1000, INT32_MIN, INT32_MAX}) {
    GenerateParams p = greedy_request({5, 6, 7}, 4);
    p.num_speculative_tokens = bad;
    auto id = e.add_request(p);
    ASSERT_FALSE(id.ok()) << bad;
    EXPECT_EQ(id.status().code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(id.status().message().find("num_speculative_tokens"), std::string::npos) << id.status().message();
    EXPECT_NE(id.status().message().find(std::to_string(bad)), std::string::npos) << id.status().message();
  }
  EXPECT_EQ(e.num_waiting(), 0);
  for (int32_t good : {-1, 0, 1, 4, 5, 64}) {
    GenerateParams p = greedy_request({5, 6, 7}, 4);
    p.num_speculative_tokens = good;
    EXPECT_TRUE(e.add_request(p).ok()) << good;
  }
  EXPECT_EQ(e.num_waiting(), 6);
  // The default is the engine's setting.
  EXPECT_EQ(GenerateParams{}.num_speculative_tokens, -1);
}

}  // namespace
}  // namespace specserve
