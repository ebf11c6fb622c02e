// Real processes on loopback: a sequence's KV moving between worker processes over UCX (tcp and
// shared memory) when a worker is stopped, drained or fails mid-transfer, continuing with the
// output of an undisturbed run (issue 7's migration tests, split from cluster_test.cpp).
#include <gtest/gtest.h>

#include "tests/integration/up_process.h"

namespace specserve {
namespace {

using namespace cluster_testing;  // NOLINT: test helpers (tests/integration/up_process.h)

// ---------------------------------------------------------------- KV data plane (migration)

// Tokens of one request run alone on an Engine with the n-gram proposer the migration
// topologies use (prompt_lookup 1..3, k = 3, adaptive k): the uninterrupted reference, also for
// seeded sampling (speculative sampling draws its uniforms differently from plain sampling).
std::vector<int32_t> reference_ngram(const std::vector<int32_t>& prompt, const SamplingParams& sp, int32_t max_tokens) {
  static std::unique_ptr<Backend> backend = make_cpu_backend(1);
  static LoadedModel m = std::move(load_model(testing::default_model_path(), *backend, true).value());
  NgramProposer ngram(1, 3);
  EngineOptions eo;
  eo.max_model_len = 512;
  eo.num_speculative_tokens = 3;
  auto e = Engine::create(*m.model, m.tokenizer.get(), &ngram, eo);
  GenerateParams p;
  p.prompt = prompt;
  p.max_tokens = max_tokens;
  p.sampling = sp;
  p.sampling.ignore_eos = true;
  EXPECT_TRUE((*e)->add_request(p).ok());
  std::vector<int32_t> out;
  std::vector<SeqEvent> ev;
  while ((*e)->has_work()) EXPECT_TRUE((*e)->step(&ev).ok());
  for (auto& x : ev) out.insert(out.end(), x.tokens.begin(), x.tokens.end());
  return out;
}

const char* kTwoReplicas =
    "  - { name: n0, host: 127.0.0.1, devices: [cpu], workers: [ { role: target_shard, replica: 0, device: cpu } ] }\n"
    "  - { name: n1, host: 127.0.0.1, devices: [cpu], workers: [ { role: target_shard, replica: 1, device: cpu } ] }\n";
const char* kNgram = "  speculative: { method: ngram, num_speculative_tokens: 3, prompt_lookup_min: 1, prompt_lookup_max: 3 }\n";

SamplingParams seeded(uint64_t seed) {
  SamplingParams sp;
  sp.temperature = 0.8f;
  sp.top_p = 0.95f;
  sp.seed = seed;
  sp.has_seed = true;
  return sp;
}

// Submits 4 greedy requests and 2 seeded sampled ones, waits until replica 0 is generating for
// some of them, and returns the pid of replica 0's target shard.
struct MigrationRun {
  std::vector<GenerateRequest> reqs;
  std::vector<std::vector<int32_t>> expected;
  std::vector<std::shared_ptr<RequestHandle>> handles;
};

MigrationRun start_migration_run(Client* c, int32_t max_tokens) {
  MigrationRun run;
  const auto prompts = prompt_ids();
  for (const auto& p : prompts) {
    GenerateRequest r = greedy(p, max_tokens);
    run.reqs.push_back(r);
  }
  for (uint64_t seed : {11u, 12u}) {
    GenerateRequest r = greedy(prompts[seed % prompts.size()], max_tokens);
    r.sampling = seeded(seed);
    r.sampling.ignore_eos = true;
    run.reqs.push_back(r);
  }
  for (const auto& r : run.reqs) run.expected.push_back(reference_ngram(r.prompt_token_ids, r.sampling, max_tokens));
  for (const auto& r : run.reqs) {
    auto h = c->submit(r);
    EXPECT_TRUE(h.ok()) << h.status().to_string();
    if (h.ok()) run.handles.push_back(*h);
  }
  return run;
}

int shard_pid(const ClusterStatus& st, int32_t replica) {
  for (const auto& w : st.workers) {
    if (w.role == "target_shard" && w.replica == replica) return w.pid;
  }
  return -1;
}

// Waits until replica 0 holds requests and has generated a few tokens; its target shard's pid.
int wait_generating_on_replica0(Client* c) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (std::chrono::steady_clock::now() < end) {
    auto st = c->status();
    if (!st.ok()) return -1;
    for (const auto& r : st->replicas) {
      if (r.replica == 0 && r.assigned >= 2 && r.load.generated_tokens >= 6) return shard_pid(*st, 0);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return -1;
}

class ClusterMigrate : public ::testing::TestWithParam<std::string> {};

// A target shard whose worker is stopped (SIGTERM) while the cluster goes on moves its running
// sequences, with their KV over UCX (tcp, or shared memory), to the other replica: every request
// finishes with exactly the tokens of an uninterrupted run — greedy, and seeded sampling too (the
// sampler's random stream moves with the sequence) — and none is recomputed.
TEST_P(ClusterMigrate, StoppedWorkerMovesItsSequencesWithTheirKv) {
  const int32_t kTokens = 48;
  UpProcess up(kTwoReplicas, kNgram, "64MiB", {{"UCX_TLS", GetParam()}});
  Client* c = up.connect();
  ASSERT_NE(c, nullptr);
  MigrationRun run = start_migration_run(c, kTokens);
  ASSERT_EQ(run.handles.size(), run.reqs.size());
  const int victim = wait_generating_on_replica0(c);
  ASSERT_GT(victim, 0) << "replica 0 never started generating";
  ASSERT_EQ(::kill(victim, SIGTERM), 0);
  int32_t migrations = 0;
  for (size_t i = 0; i < run.handles.size(); ++i) {
    auto r = run.handles[i]->wait();
    ASSERT_TRUE(r.ok()) << "request " << i << ": " << r.status().to_string();
    EXPECT_EQ(r->finish_reason, "length") << "request " << i;
    EXPECT_EQ(r->tokens, run.expected[i]) << "request " << i << " (migrated " << r->num_migrations << "x)";
    EXPECT_EQ(r->num_requeues, 0) << "request " << i << ": a drain must not look like a failure";
    migrations += r->num_migrations;
  }
  EXPECT_GE(migrations, 2) << "replica 0 held at least two requests when it was stopped";
  auto st = c->status();
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->migrated, migrations);
  EXPECT_GT(st->kv_migrated_tokens, 0) << "the KV must move, not be recomputed";
  EXPECT_EQ(st->kv_recomputed_tokens, 0);
  // The stopped worker is gone; the other replica still serves.
  for (const auto& w : st->workers) {
    if (w.role == "target_shard" && w.replica == 0) EXPECT_EQ(w.state, "down");
  }
  auto again = c->generate(greedy(run.reqs[0].prompt_token_ids, 8));
  ASSERT_TRUE(again.ok()) << again.status().to_string();
  EXPECT_EQ(again->tokens, std::vector<int32_t>(run.expected[0].begin(), run.expected[0].begin() + 8));
  EXPECT_EQ(up.terminate(60), 0);
}

INSTANTIATE_TEST_SUITE_P(Ucx, ClusterMigrate, ::testing::Values("tcp", "sm"),
                         [](const ::testing::TestParamInfo<std::string>& i) { return i.param; });

// The source of a migration dies while the receiver is about to read its KV: the receiver's
// transfer fails (UCX peer error or deadline), the sequence recomputes its KV instead, and the
// request still finishes with the uninterrupted tokens; nothing hangs, no worker crashes.
TEST(ClusterMigrateFault, SourceKilledMidTransferFallsBackToRecompute) {
  const int32_t kTokens = 40;
  UpProcess up(kTwoReplicas, kNgram, "64MiB", {{"UCX_TLS", "tcp"}, {"SPECSERVE_TEST_KV_FETCH_DELAY_MS", "1500"}});
  Client* c = up.connect();
  ASSERT_NE(c, nullptr);
  MigrationRun run = start_migration_run(c, kTokens);
  const int victim = wait_generating_on_replica0(c);
  ASSERT_GT(victim, 0);
  ASSERT_EQ(::kill(victim, SIGTERM), 0);
  // As soon as the head has handed the first sequence over, the source dies (the receiver waits
  // 1.5 s before it reads, so the read meets a dead peer).
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  bool handed = false;
  while (!handed && std::chrono::steady_clock::now() < end) {
    auto st = c->status();
    ASSERT_TRUE(st.ok());
    handed = st->migrated >= 1;
    if (!handed) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_TRUE(handed) << "no sequence was handed over";
  ::kill(victim, SIGKILL);
  for (size_t i = 0; i < run.handles.size(); ++i) {
    auto r = run.handles[i]->wait();
    ASSERT_TRUE(r.ok()) << "request " << i << ": " << r.status().to_string();
    EXPECT_EQ(r->finish_reason, "length") << "request " << i;
    if (run.reqs[i].sampling.is_greedy()) {
      EXPECT_EQ(r->tokens, run.expected[i]) << "request " << i;
    } else {
      // NOTE: a recomputed sequence's first step after the move is a prefill, which samples
      // without drafts, while the uninterrupted run verified drafts there: the random stream
      // moved, but speculative sampling consumes it differently for that step, so seeded output
      // is only guaranteed identical when the KV moves (ClusterMigrate above). Greedy is.
      EXPECT_EQ(r->tokens.size(), run.expected[i].size()) << "request " << i;
    }
  }
  auto st = c->status();
  ASSERT_TRUE(st.ok());
  EXPECT_GT(st->kv_recomputed_tokens, 0) << "the fetch from the dead source must have failed over to recompute";
  for (const auto& w : st->workers) {
    if (w.role == "target_shard" && w.replica == 1) EXPECT_EQ(w.state, "ready") << "the receiver must survive";
  }
  EXPECT_EQ(up.terminate(60), 0);
}

// Disaggregated prefill: a prefill_worker takes every new request, runs its prompt to the first
// token and ships the KV to the replica's decode shard, which continues with identical output.
TEST(ClusterMigrate, PrefillWorkerHandsPromptsToTheDecodeShard) {
  const int32_t kTokens = 24;
  UpProcess up("  - { name: n0, host: 127.0.0.1, devices: [cpu], workers: [ { role: target_shard, replica: 0, device: cpu },"
               " { role: prefill_worker, replica: 0, device: cpu } ] }\n",
               kNgram);
  Client* c = up.connect();
  ASSERT_NE(c, nullptr);
  // `up` is ready once the decode shard is; the prefill worker may still be warming up.
  bool prefill_ready = false;
  for (const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(120);
       !prefill_ready && std::chrono::steady_clock::now() < end;) {
    auto st = c->status();
    ASSERT_TRUE(st.ok());
    for (const auto& w : st->workers) prefill_ready = prefill_ready || (w.role == "prefill_worker" && w.state == "ready");
    if (!prefill_ready) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_TRUE(prefill_ready) << "the prefill worker never became ready";
  MigrationRun run = start_migration_run(c, kTokens);
  int64_t prompt_tokens = 0, output_tokens = 0;
  for (size_t i = 0; i < run.handles.size(); ++i) {
    auto r = run.handles[i]->wait();
    ASSERT_TRUE(r.ok()) << "request " << i << ": " << r.status().to_string();
    EXPECT_EQ(r->tokens, run.expected[i]) << "request " << i;
    EXPECT_EQ(r->num_migrations, 1) << "request " << i << ": prefill worker -> decode shard";
    prompt_tokens += r->prompt_tokens;
    output_tokens += static_cast<int64_t>(r->tokens.size());
  }
  // The cluster's totals (what /metrics and `status` show) count each prompt once (on the
  // prefill worker) and each output token once (the first on the prefill worker, the rest on
  // the decode shard). The last step reports reach the head on their own: polled briefly.
  int64_t counted_prompt = 0, counted_output = 0, prefill_prompt = 0;
  Expected<ClusterStatus> st = c->status();
  for (const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);;) {
    st = c->status();
    ASSERT_TRUE(st.ok());
    counted_prompt = st->ended.prompt_tokens, counted_output = st->ended.generated_tokens, prefill_prompt = 0;
    for (const auto& r : st->replicas) {
      EXPECT_TRUE(r.has_prefill_worker);
      counted_prompt += r.load.prompt_tokens + r.prefill_load.prompt_tokens;
      counted_output += r.load.generated_tokens + r.prefill_load.generated_tokens;
      prefill_prompt += r.prefill_load.prompt_tokens;
    }
    if ((counted_prompt == prompt_tokens && counted_output == output_tokens) || std::chrono::steady_clock::now() > end) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(counted_prompt, prompt_tokens);
  EXPECT_EQ(prefill_prompt, prompt_tokens) << "every prompt started on the prefill worker";
  EXPECT_EQ(counted_output, output_tokens);
  EXPECT_EQ(st->migrated, static_cast<int64_t>(run.handles.size()));
  EXPECT_GE(st->kv_migrated_tokens, prompt_tokens) << "each prompt's KV comes from the prefill worker";
  EXPECT_EQ(st->kv_recomputed_tokens, 0);
  EXPECT_EQ(up.terminate(60), 0);
}

}  // namespace
}  // namespace specserve
