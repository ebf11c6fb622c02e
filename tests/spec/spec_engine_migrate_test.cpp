// Tests for moving a running sequence between engines (spec/engine.h: export_sequence,
// remove_sequence, add_migrated) with its KV blocks in the checked export format
// (kv/transfer.h): the sequences that move continue exactly as if they had not — tokens, text,
// logprobs, finish — greedy and under seeded sampling (the sampler's random stream moves with
// them), with and without a proposer, for prompts shorter than one block, in the middle of a
// chunked prefill; a damaged export is refused and the sequence recomputes with the same result.
#include <functional>
#include <memory>
#include <vector>

#include "kv/transfer.h"
#include "tests/spec/spec_engine_fixtures.h"

namespace specserve {
namespace {

using namespace spec_testing;
using namespace spec_engine_testing;

struct Outcome {
  std::vector<Tokens> tokens;
  std::vector<std::string> text;
  std::vector<std::vector<SampleResult>> logprobs;
  std::vector<FinishReason> finish;
  int32_t moved = 0;         // sequences that moved
  int32_t kv_loaded = 0;     // ... with their KV imported
  int32_t cached_moved = 0;  // tokens of KV imported
  int64_t prompt_tokens = 0;     // EngineStats::prompt_tokens of both engines
  int64_t generated_tokens = 0;  // EngineStats::generated_tokens of both engines
};

struct MoveOptions {
  int steps_before = 3;         // engine steps on the first engine
  bool corrupt = false;         // flip one payload byte of every export
  Method method = Method::kNgram;
  bool with_proposer = false;
  EngineOptions engine;
};

// Runs `reqs` on engine A for `steps_before` steps, moves every live sequence to engine B
// (state + KV export), finishes them there. Events of A then B, per request.
Outcome run_moved(const std::vector<GenerateParams>& reqs, const MoveOptions& mo) {
  Outcome out;
  out.tokens.resize(reqs.size());
  out.text.resize(reqs.size());
  out.logprobs.resize(reqs.size());
  out.finish.assign(reqs.size(), FinishReason::kNone);
  auto pa = mo.with_proposer ? make_proposer(mo.method) : nullptr;
  auto pb = mo.with_proposer ? make_proposer(mo.method) : nullptr;
  auto a = Engine::create(target(), tokenizer(), pa.get(), mo.engine);
  auto b = Engine::create(target(), tokenizer(), pb.get(), mo.engine);
  if (!a.ok() || !b.ok()) {
    ADD_FAILURE() << "engine create failed";
    return out;
  }
  auto collect = [&](std::map<int64_t, size_t>& index, std::vector<SeqEvent>& evs) {
    for (SeqEvent& e : evs) {
      const size_t i = index.at(e.seq_id);
      out.tokens[i].insert(out.tokens[i].end(), e.tokens.begin(), e.tokens.end());
      out.text[i] += e.text;
      out.logprobs[i].insert(out.logprobs[i].end(), e.logprobs.begin(), e.logprobs.end());
      if (e.finish != FinishReason::kNone) out.finish[i] = e.finish;
    }
    evs.clear();
  };
  std::map<int64_t, size_t> ia, ib;
  for (size_t i = 0; i < reqs.size(); ++i) {
    auto id = (*a)->add_request(reqs[i]);
    EXPECT_TRUE(id.ok()) << id.status().to_string();
    if (id.ok()) ia[*id] = i;
  }
  std::vector<SeqEvent> evs;
  for (int s = 0; s < mo.steps_before && (*a)->has_work(); ++s) {
    EXPECT_TRUE((*a)->step(&evs).ok());
    collect(ia, evs);
  }
  const KvExportFormat fmt = kv_export_format((*a)->kv_storage(), /*model_fingerprint=*/0x5eed);
  for (int64_t id : (*a)->live_sequences()) {
    auto ex = (*a)->export_sequence(id);
    EXPECT_TRUE(ex.ok()) << ex.status().to_string();
    if (!ex.ok()) continue;
    std::vector<uint8_t> bytes;
    if (ex->num_cached > 0) {
      bytes.resize(static_cast<size_t>(kv_export_bytes(fmt, static_cast<int64_t>(ex->blocks.size()))));
      auto h = export_kv_blocks(backend(), (*a)->kv_storage(), fmt, ex->blocks.data(), static_cast<int64_t>(ex->blocks.size()),
                                ex->num_cached, bytes.data(), static_cast<int64_t>(bytes.size()));
      EXPECT_TRUE(h.ok()) << h.status().to_string();
      if (mo.corrupt) bytes.back() ^= 0x40;
    }
    (*a)->remove_sequence(id);
    GenerateParams p = reqs[ia.at(id)];
    p.resume_output = ex->output;
    SequenceImport imp;
    imp.rng_state = ex->rng_state;
    imp.k = ex->k;
    imp.spec = ex->spec;
    imp.num_cached = ex->num_cached;
    // The engine may call load_kv later (when its policy admits the sequence): it owns the bytes.
    auto held = std::make_shared<std::vector<uint8_t>>(std::move(bytes));
    imp.load_kv = [held, fmt](KvStorage& kv, std::span<const int32_t> blocks) -> Status {
      auto h = import_kv_blocks(backend(), kv, fmt, held->data(), static_cast<int64_t>(held->size()), blocks.data(),
                                static_cast<int64_t>(blocks.size()));
      return h.ok() ? Status() : h.status();
    };
    bool loaded = false;
    auto nid = (*b)->add_migrated(std::move(p), std::move(imp), &loaded);
    EXPECT_TRUE(nid.ok()) << nid.status().to_string();
    if (!nid.ok()) continue;
    ib[*nid] = ia.at(id);
    ++out.moved;
    if (loaded) {
      ++out.kv_loaded;
      out.cached_moved += ex->num_cached;
    }
  }
  EXPECT_FALSE((*a)->has_work()) << "sequences left behind on the first engine";
  EXPECT_EQ((*a)->block_pool().num_free(), (*a)->block_pool().num_blocks()) << "the first engine still holds KV";
  for (int guard = 0; (*b)->has_work() && guard < 100000; ++guard) {
    EXPECT_TRUE((*b)->step(&evs).ok());
    collect(ib, evs);
  }
  EXPECT_EQ((*b)->block_pool().num_free(), (*b)->block_pool().num_blocks()) << "the second engine still holds KV";
  out.prompt_tokens = (*a)->stats().prompt_tokens + (*b)->stats().prompt_tokens;
  out.generated_tokens = (*a)->stats().generated_tokens + (*b)->stats().generated_tokens;
  return out;
}

Outcome run_plain(const std::vector<GenerateParams>& reqs, const MoveOptions& mo) {
  MoveOptions m = mo;
  m.steps_before = 1 << 30;  // never moves
  return run_moved(reqs, m);
}

void expect_same(const Outcome& got, const Outcome& want, const std::string& where) {
  ASSERT_EQ(got.tokens.size(), want.tokens.size());
  for (size_t i = 0; i < got.tokens.size(); ++i) {
    const std::string w = where + ", request " + std::to_string(i);
    EXPECT_EQ(got.tokens[i], want.tokens[i]) << w;
    EXPECT_EQ(got.text[i], want.text[i]) << w;
    EXPECT_EQ(finish_reason_name(got.finish[i]), std::string(finish_reason_name(want.finish[i]))) << w;
    expect_same_logprobs(got.logprobs[i], want.logprobs[i], w);
  }
}

std::vector<GenerateParams> mixed_requests(bool sampled) {
  std::mt19937 rng(777);
  std::vector<GenerateParams> reqs;
  for (int i = 0; i < 8; ++i) {
    Tokens prompt = random_tokens(rng, 3 + 11 * i, 512);  // 3 (shorter than one block) .. 80 tokens
    if (i % 2) {
      Tokens pat = random_tokens(rng, 4, 512);
      for (int r = 0; r < 4; ++r) prompt.insert(prompt.end(), pat.begin(), pat.end());  // n-gram material
    }
    GenerateParams p = greedy_request(prompt, 20 + i);
    if (sampled) {
      p.sampling.temperature = 0.9f;
      p.sampling.top_p = 0.95f;
      p.sampling.seed = 1000 + static_cast<uint64_t>(i);
      p.sampling.has_seed = true;
    }
    reqs.push_back(p);
  }
  return reqs;
}

TEST(EngineMigrate, GreedySequencesContinueIdenticallyWithTheirKv) {
  MoveOptions mo;
  mo.engine.max_num_seqs = 8;
  const auto reqs = mixed_requests(false);
  const Outcome want = run_plain(reqs, mo);
  for (int steps : {1, 2, 5, 9}) {
    mo.steps_before = steps;
    const Outcome got = run_moved(reqs, mo);
    expect_same(got, want, "moved after " + std::to_string(steps) + " steps");
    EXPECT_GT(got.moved, 0);
    EXPECT_EQ(got.kv_loaded, got.moved) << "every moved sequence should arrive with its KV (steps " << steps << ")";
    EXPECT_GT(got.cached_moved, 0);
    // The two engines' counters sum to each prompt once and each output token once (a moved
    // request's prompt was counted where it started; its resume_output is not generated again).
    int64_t prompts = 0, outputs = 0;
    for (const auto& r : reqs) prompts += static_cast<int64_t>(r.prompt.size());
    for (const auto& t : got.tokens) outputs += static_cast<int64_t>(t.size());
    EXPECT_EQ(got.prompt_tokens, prompts) << "steps " << steps;
    EXPECT_EQ(got.generated_tokens, outputs) << "steps " << steps;
  }
}

TEST(EngineMigrate, SeededSamplingContinuesTheSameRandomStream) {
  for (bool with_proposer : {false, true}) {
    MoveOptions mo;
    mo.engine = spec_options(3, 8);
    mo.engine.num_speculative_tokens = with_proposer ? 3 : 0;
    mo.with_proposer = with_proposer;
    mo.method = Method::kDraftModel;
    const auto reqs = mixed_requests(true);
    const Outcome want = run_plain(reqs, mo);
    mo.steps_before = 4;
    const Outcome got = run_moved(reqs, mo);
    expect_same(got, want, with_proposer ? "sampling, draft_model k=3" : "sampling, no proposer");
    EXPECT_GT(got.kv_loaded, 0);
  }
}

TEST(EngineMigrate, GreedyWithProposersContinuesIdentically) {
  for (Method m : {Method::kNgram, Method::kDraftModel, Method::kLayerSkip}) {
    MoveOptions mo;
    mo.engine = spec_options(4, 8);
    mo.with_proposer = true;
    mo.method = m;
    const auto reqs = mixed_requests(false);
    const Outcome want = run_plain(reqs, mo);
    mo.steps_before = 3;
    const Outcome got = run_moved(reqs, mo);
    expect_same(got, want, method_name(m));
    EXPECT_GT(got.kv_loaded, 0) << method_name(m);  // batch 8 prefills in chunks: some still had nothing cached
  }
}

TEST(EngineMigrate, MovesInTheMiddleOfAChunkedPrefill) {
  MoveOptions mo;
  mo.engine.max_num_seqs = 8;
  mo.engine.max_num_batched_tokens = 24;  // the long prompts need several steps to prefill
  const auto reqs = mixed_requests(false);
  const Outcome want = run_plain(reqs, mo);
  mo.steps_before = 2;
  const Outcome got = run_moved(reqs, mo);
  expect_same(got, want, "mid-prefill");
  EXPECT_GT(got.kv_loaded, 0);
  EXPECT_LT(got.kv_loaded, got.moved) << "some sequences had nothing cached yet (still waiting) and recompute";
}

TEST(EngineMigrate, ShortPromptShorterThanOneBlockMoves) {
  MoveOptions mo;
  mo.engine.block_size = 16;
  std::vector<GenerateParams> reqs = {greedy_request({5, 9, 13}, 12)};
  const Outcome want = run_plain(reqs, mo);
  mo.steps_before = 3;  // 3 prompt tokens + 2 outputs cached: 5 of 16 slots of one block
  const Outcome got = run_moved(reqs, mo);
  expect_same(got, want, "short prompt");
  EXPECT_EQ(got.kv_loaded, 1);
  EXPECT_EQ(got.cached_moved, 5);
}

TEST(EngineMigrate, DamagedExportIsRefusedAndTheSequenceRecomputes) {
  MoveOptions mo;
  mo.engine.max_num_seqs = 8;
  mo.corrupt = true;
  const auto reqs = mixed_requests(true);
  const Outcome want = run_plain(reqs, mo);
  mo.steps_before = 4;
  const Outcome got = run_moved(reqs, mo);
  expect_same(got, want, "damaged exports");
  EXPECT_GT(got.moved, 0);
  EXPECT_EQ(got.kv_loaded, 0) << "a damaged block must never be imported";
}

TEST(EngineMigrate, BadInput) {
  auto e = Engine::create(target(), tokenizer(), nullptr, EngineOptions{});
  ASSERT_TRUE(e.ok());
  EXPECT_EQ((*e)->export_sequence(42).status().code(), StatusCode::kNotFound);
  GenerateParams p = greedy_request({1, 2, 3}, 8);
  SequenceImport imp;
  imp.rng_state = "not a state";
  auto bad = (*e)->add_migrated(p, imp);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("rng state"), std::string::npos) << bad.status().message();
  EXPECT_FALSE((*e)->has_work()) << "a refused import leaves nothing queued";
  SequenceImport too_many;
  too_many.num_cached = 3;  // == the tokens: nothing left to compute
  auto over = (*e)->add_migrated(p, too_many);
  ASSERT_FALSE(over.ok());
  EXPECT_NE(over.status().message().find("num_cached = 3"), std::string::npos) << over.status().message();
  // A load that fails queues the sequence for recompute instead of failing the request.
  SequenceImport failing;
  failing.num_cached = 2;
  failing.load_kv = [](KvStorage&, std::span<const int32_t>) { return unavailable("peer gone"); };
  bool loaded = true;
  auto ok = (*e)->add_migrated(p, failing, &loaded);
  ASSERT_TRUE(ok.ok()) << ok.status().to_string();
  EXPECT_FALSE(loaded);
  EXPECT_EQ((*e)->num_waiting(), 1);
  EXPECT_EQ((*e)->block_pool().num_free(), (*e)->block_pool().num_blocks()) << "the failed load's blocks are returned";
}

// A sequence exported from its own engine after `steps` steps (its KV export bytes and state).
struct Exported {
  SequenceExport ex;
  std::shared_ptr<std::vector<uint8_t>> bytes;
  KvExportFormat fmt;
};
Exported export_after(const GenerateParams& p, int steps, const EngineOptions& eo) {
  Exported out;
  auto a = Engine::create(target(), tokenizer(), nullptr, eo);
  EXPECT_TRUE(a.ok());
  auto id = (*a)->add_request(p);
  EXPECT_TRUE(id.ok());
  std::vector<SeqEvent> evs;
  for (int s = 0; s < steps; ++s) EXPECT_TRUE((*a)->step(&evs).ok());
  out.ex = (*a)->export_sequence(*id).value();
  out.fmt = kv_export_format((*a)->kv_storage(), 0x5eed);
  out.bytes = std::make_shared<std::vector<uint8_t>>(
      static_cast<size_t>(kv_export_bytes(out.fmt, static_cast<int64_t>(out.ex.blocks.size()))));
  EXPECT_TRUE(export_kv_blocks(backend(), (*a)->kv_storage(), out.fmt, out.ex.blocks.data(),
                               static_cast<int64_t>(out.ex.blocks.size()), out.ex.num_cached, out.bytes->data(),
                               static_cast<int64_t>(out.bytes->size()))
                  .ok());
  return out;
}

// A SequenceImport::load_kv that imports `bytes` (a checked export in `fmt`) into the engine's
// blocks; `*calls` (when given) counts its calls.
std::function<Status(KvStorage&, std::span<const int32_t>)> load_from(std::shared_ptr<std::vector<uint8_t>> bytes,
                                                                      KvExportFormat fmt, int* calls = nullptr) {
  return [bytes = std::move(bytes), fmt, calls](KvStorage& kv, std::span<const int32_t> blocks) -> Status {
    if (calls) ++*calls;
    auto h = import_kv_blocks(backend(), kv, fmt, bytes->data(), static_cast<int64_t>(bytes->size()), blocks.data(),
                              static_cast<int64_t>(blocks.size()));
    return h.ok() ? Status() : h.status();
  };
}

Tokens run_alone(const GenerateParams& p, const EngineOptions& eo) {
  auto e = Engine::create(target(), tokenizer(), nullptr, eo);
  EXPECT_TRUE(e.ok());
  EXPECT_TRUE((*e)->add_request(p).ok());
  std::vector<SeqEvent> evs;
  Tokens out;
  while ((*e)->has_work()) EXPECT_TRUE((*e)->step(&evs).ok());
  for (const SeqEvent& ev : evs) out.insert(out.end(), ev.tokens.begin(), ev.tokens.end());
  return out;
}

// A full receiving engine: the migrated sequence is admitted by the step policy like any other
// (it waits, holding its KV outside the cache, while max_num_seqs run or while the KV blocks of
// its tokens are not free after what running sequences need), then starts with its KV loaded
// and continues exactly as the uninterrupted run.
TEST(EngineMigrate, FullReceivingEngineAdmitsTheMigratedSequenceThroughItsPolicy) {
  std::mt19937 rng(4242);
  const GenerateParams running_req = greedy_request(random_tokens(rng, 40, 512), 6);
  const GenerateParams moved_req = greedy_request(random_tokens(rng, 32, 512), 10);
  struct Case {
    const char* name;
    EngineOptions eo;
  };
  std::vector<Case> cases(2);
  cases[0].name = "max_num_seqs 1";
  cases[0].eo.max_num_seqs = 1;
  cases[0].eo.block_size = 16;
  // 5 blocks of 16: the running request holds 3 (41 tokens) and the moved one (32 tokens cached,
  // 33 known) needs ceil(34 / 16) = 3 to be admitted; only 2 are free.
  cases[1].name = "KV blocks";
  cases[1].eo.max_num_seqs = 8;
  cases[1].eo.block_size = 16;
  cases[1].eo.num_kv_blocks = 5;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const Tokens want_moved = run_alone(moved_req, c.eo);
    const Tokens want_running = run_alone(running_req, c.eo);
    Exported x = export_after(moved_req, 1, c.eo);  // its prompt prefilled, its first token out
    ASSERT_EQ(x.ex.num_cached, 32);

    auto b = Engine::create(target(), tokenizer(), nullptr, c.eo);
    ASSERT_TRUE(b.ok());
    auto rid = (*b)->add_request(running_req);
    ASSERT_TRUE(rid.ok());
    std::vector<SeqEvent> evs;
    ASSERT_TRUE((*b)->step(&evs).ok());  // the running request's prompt is in the cache
    ASSERT_EQ((*b)->num_running(), 1);

    GenerateParams p = moved_req;
    p.resume_output = x.ex.output;
    SequenceImport imp;
    imp.rng_state = x.ex.rng_state;
    imp.num_cached = x.ex.num_cached;
    int loads = 0;
    imp.load_kv = load_from(x.bytes, x.fmt, &loads);
    bool loaded = true;
    auto mid = (*b)->add_migrated(p, std::move(imp), &loaded);
    ASSERT_TRUE(mid.ok()) << mid.status().to_string();
    EXPECT_FALSE(loaded) << "the engine is full: the policy does not admit it now";
    EXPECT_EQ(loads, 0);
    EXPECT_EQ((*b)->num_running(), 1) << "a migrated sequence must not bypass admission";
    EXPECT_EQ((*b)->num_waiting(), 1);

    Tokens got_moved(x.ex.output.begin(), x.ex.output.end()), got_running;
    for (int guard = 0; (*b)->has_work() && guard < 1000; ++guard) {
      ASSERT_TRUE((*b)->step(&evs).ok());
      EXPECT_LE((*b)->num_running(), c.eo.max_num_seqs);
    }
    for (const SeqEvent& ev : evs) {
      Tokens& t = ev.seq_id == *mid ? got_moved : got_running;
      t.insert(t.end(), ev.tokens.begin(), ev.tokens.end());
    }
    EXPECT_EQ(loads, 1) << "admitted later, it starts with its imported KV";
    EXPECT_EQ(got_moved, want_moved);
    EXPECT_EQ(got_running, want_running);
    EXPECT_EQ((*b)->block_pool().num_free(), (*b)->block_pool().num_blocks());
  }
}

// Bug (seen in bench/run_autoscale_bench.sh with MAX_NUM_SEQS=64: a worker aborted on
// "check failed ... running seq 13"): a migrated sequence arriving right after a step in which a
// running sequence finished went through admission with the finished one still in the running
// list (it leaves at the next step), which broke the step policy's invariants (no output left).
TEST(EngineMigrate, ArrivingRightAfterASequenceFinishedIsAdmitted) {
  std::mt19937 rng(99);
  EngineOptions eo;
  eo.block_size = 16;
  const GenerateParams short_req = greedy_request(random_tokens(rng, 20, 512), 1);  // finishes in its first step
  const GenerateParams moved_req = greedy_request(random_tokens(rng, 32, 512), 8);
  const Tokens want_moved = run_alone(moved_req, eo);
  Exported x = export_after(moved_req, 1, eo);
  ASSERT_GT(x.ex.num_cached, 0);

  auto b = Engine::create(target(), tokenizer(), nullptr, eo);
  ASSERT_TRUE(b.ok());
  ASSERT_TRUE((*b)->add_request(short_req).ok());
  std::vector<SeqEvent> evs;
  ASSERT_TRUE((*b)->step(&evs).ok());
  ASSERT_EQ(evs.size(), 1u);
  ASSERT_EQ(evs[0].finish, FinishReason::kLength) << "the short request finished in this step";
  evs.clear();

  GenerateParams p = moved_req;
  p.resume_output = x.ex.output;
  SequenceImport imp;
  imp.rng_state = x.ex.rng_state;
  imp.num_cached = x.ex.num_cached;
  imp.load_kv = load_from(x.bytes, x.fmt);
  bool loaded = false;
  auto mid = (*b)->add_migrated(p, std::move(imp), &loaded);
  ASSERT_TRUE(mid.ok()) << mid.status().to_string();
  EXPECT_TRUE(loaded) << "room enough: admitted at once with its KV";
  Tokens got(x.ex.output.begin(), x.ex.output.end());
  for (int guard = 0; (*b)->has_work() && guard < 1000; ++guard) ASSERT_TRUE((*b)->step(&evs).ok());
  for (const SeqEvent& ev : evs) {
    if (ev.seq_id == *mid) got.insert(got.end(), ev.tokens.begin(), ev.tokens.end());
  }
  EXPECT_EQ(got, want_moved);
  EXPECT_EQ((*b)->block_pool().num_free(), (*b)->block_pool().num_blocks());
}

}  // namespace
}  // namespace specserve
