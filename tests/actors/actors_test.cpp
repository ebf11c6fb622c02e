// The actor runtime in one process on the real default model: a head (scheduler actor), a
// target shard, and (in one suite) a draft worker as a separate actor, driven through the
// Client API. Outputs are compared with the Engine called directly, without speculation.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <limits>
#include <thread>

#include "actors/client.h"
#include "actors/draft_worker.h"
#include "actors/head.h"
#include "actors/target_shard.h"
#include "cpu/cpu_backend.h"
#include "model/model_loader.h"
#include "spec/engine.h"
#include "tests/actors/actors_cluster_fixture.h"
#include "tests/test_util.h"

namespace specserve {
namespace {

using namespace actors_testing;  // NOLINT: the shared in-process cluster helpers

// Greedy reference with top-n logprobs: the engine alone, no proposer; one SampleResult per token.
std::vector<SampleResult> reference_logprobs(const std::vector<int32_t>& prompt, int32_t max_tokens, int32_t top_n) {
  static std::unique_ptr<Backend> backend = make_cpu_backend(1);
  static LoadedModel m = std::move(load_model(testing::default_model_path(), *backend, true).value());
  EngineOptions eo;
  eo.max_model_len = 512;
  auto e = Engine::create(*m.model, m.tokenizer.get(), nullptr, eo);
  EXPECT_TRUE(e.ok());
  GenerateParams p;
  p.prompt = prompt;
  p.max_tokens = max_tokens;
  p.sampling.temperature = 0;
  p.sampling.ignore_eos = true;
  p.sampling.logprobs = top_n;
  EXPECT_TRUE((*e)->add_request(p).ok());
  std::vector<SampleResult> out;
  std::vector<SeqEvent> ev;
  while ((*e)->has_work()) {
    EXPECT_TRUE((*e)->step(&ev).ok());
  }
  for (auto& x : ev) out.insert(out.end(), x.logprobs.begin(), x.logprobs.end());
  return out;
}

SpeculativeSpec ngram_spec() {
  SpeculativeSpec s;
  s.method = SpeculativeMethod::kNgram;
  s.num_speculative_tokens = 4;
  s.prompt_lookup_min = 1;
  s.prompt_lookup_max = 4;
  return s;
}

class ActorsNgram : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { cluster_ = new Cluster(ngram_spec(), false); }
  static void TearDownTestSuite() {
    delete cluster_;
    cluster_ = nullptr;
  }
  static Cluster* cluster_;
};
Cluster* ActorsNgram::cluster_ = nullptr;

TEST_F(ActorsNgram, WorkerReportsReadyWithLoadAndWarmupTimes) {
  auto st = cluster_->client().status();
  ASSERT_TRUE(st.ok()) << st.status().to_string();
  ASSERT_EQ(st->workers.size(), 1u);
  EXPECT_EQ(st->workers[0].state, "ready");
  EXPECT_EQ(st->workers[0].role, "target_shard");
  EXPECT_GT(st->workers[0].load_seconds, 0.0);
  EXPECT_GT(st->workers[0].warmup_seconds, 0.0);
  EXPECT_EQ(st->workers[0].pid, static_cast<int32_t>(::getpid()));
  EXPECT_EQ(st->speculative_method, "ngram");
  EXPECT_TRUE(st->speculative.starts_with("ngram, num_speculative_tokens ")) << st->speculative;
  // The KV cache is known from the worker's hello, before its first step report (status showed
  // KV_USED 0/0 until a first request); nothing served yet in this process: all of it free.
  ASSERT_EQ(st->replicas.size(), 1u);
  EXPECT_GT(st->replicas[0].load.total_kv_blocks, 0);
  EXPECT_EQ(st->replicas[0].load.free_kv_blocks, st->replicas[0].load.total_kv_blocks);
}

TEST_F(ActorsNgram, ConcurrentGreedyRequestsMatchTheTargetAlone) {
  auto ps = prompts(cluster_->head());
  std::vector<std::shared_ptr<RequestHandle>> hs;
  for (const auto& p : ps) {
    auto h = cluster_->client().submit(greedy(p, 24));
    ASSERT_TRUE(h.ok()) << h.status().to_string();
    hs.push_back(*h);
  }
  int64_t drafts = 0;
  for (size_t i = 0; i < hs.size(); ++i) {
    auto r = hs[i]->wait();
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_EQ(r->finish_reason, "length");
    EXPECT_EQ(r->tokens, testing::greedy_reference(ps[i], 24)) << "prompt " << i;
    EXPECT_EQ(r->completion_tokens, 24);
    EXPECT_EQ(r->prompt_tokens, static_cast<int32_t>(ps[i].size()));
    EXPECT_EQ(r->logprobs.size(), r->tokens.size());
    drafts += r->num_drafts;
  }
  EXPECT_GT(drafts, 0) << "the n-gram proposer never drafted on repetitive prompts";
}

TEST_F(ActorsNgram, PerRequestSpeculationSetting) {
  auto ps = prompts(cluster_->head());
  GenerateRequest off = greedy(ps[0], 16);
  off.num_speculative_tokens = 0;
  GenerateRequest one = greedy(ps[0], 16);
  one.num_speculative_tokens = 1;
  auto h0 = cluster_->client().submit(off);
  auto h1 = cluster_->client().submit(one);
  ASSERT_TRUE(h0.ok() && h1.ok());
  auto r0 = (*h0)->wait();
  auto r1 = (*h1)->wait();
  ASSERT_TRUE(r0.ok() && r1.ok());
  EXPECT_EQ(r0->num_drafts, 0);
  EXPECT_GT(r1->num_drafts, 0);
  EXPECT_EQ(r1->num_draft_tokens, r1->num_drafts) << "a cap of 1 drafts one token per step";
  EXPECT_EQ(r0->tokens, r1->tokens);
}

TEST_F(ActorsNgram, StreamsChunksBeforeTheEnd) {
  auto ps = prompts(cluster_->head());
  std::atomic<int> chunks{0};
  auto h = cluster_->client().submit(greedy(ps[2], 16), [&](const StreamChunk&) { ++chunks; });
  ASSERT_TRUE(h.ok());
  std::vector<int32_t> pulled;
  int pulls = 0;
  while (auto c = (*h)->next()) {
    pulled.insert(pulled.end(), c->tokens.begin(), c->tokens.end());
    ++pulls;
  }
  EXPECT_GT(pulls, 2);
  EXPECT_EQ(chunks.load(), pulls);
  EXPECT_EQ(pulled, testing::greedy_reference(ps[2], 16));
  EXPECT_TRUE((*h)->done());
}

TEST_F(ActorsNgram, ChatMessagesAndTextPrompts) {
  GenerateRequest r;
  r.messages = {{"user", "What is 2+2?"}};
  r.max_tokens = 8;
  r.sampling.temperature = 0;
  auto res = cluster_->client().generate(r);
  ASSERT_TRUE(res.ok()) << res.status().to_string();
  EXPECT_FALSE(res->text.empty());
  GenerateRequest t;
  t.prompt = "Hello, my name is";
  t.max_tokens = 4;
  t.sampling.temperature = 0;
  auto res2 = cluster_->client().generate(t);
  ASSERT_TRUE(res2.ok()) << res2.status().to_string();
  EXPECT_EQ(res2->completion_tokens, static_cast<int32_t>(res2->tokens.size()));
}

TEST_F(ActorsNgram, TopLogprobsMatchTheEngineAlone) {
  constexpr int32_t kTopN = 5, kTokens = 20;
  auto ps = prompts(cluster_->head());
  GenerateRequest r = greedy(ps[0], kTokens);
  r.sampling.logprobs = kTopN;
  auto h = cluster_->client().submit(r);
  ASSERT_TRUE(h.ok()) << h.status().to_string();
  // Every chunk is consistent on its own: tokens, logprobs and top arrays of matching lengths.
  while (auto c = (*h)->next()) {
    EXPECT_EQ(c->logprobs.size(), c->tokens.size());
    if (!c->tokens.empty()) EXPECT_EQ(c->top_n, kTopN);
    EXPECT_EQ(c->top_logprob_ids.size(), c->tokens.size() * static_cast<size_t>(c->top_n));
    EXPECT_EQ(c->top_logprob_values.size(), c->top_logprob_ids.size());
  }
  auto res = (*h)->wait();
  ASSERT_TRUE(res.ok()) << res.status().to_string();
  ASSERT_GT(res->num_drafts, 0) << "the logprobs must also come through verification steps";
  const auto ref = reference_logprobs(ps[0], kTokens, kTopN);
  ASSERT_EQ(ref.size(), static_cast<size_t>(kTokens));
  ASSERT_EQ(res->tokens.size(), ref.size());
  EXPECT_EQ(res->top_n, kTopN);
  ASSERT_EQ(res->logprobs.size(), ref.size());
  ASSERT_EQ(res->top_logprob_ids.size(), ref.size() * kTopN);
  ASSERT_EQ(res->top_logprob_values.size(), ref.size() * kTopN);
  for (size_t t = 0; t < ref.size(); ++t) {
    EXPECT_EQ(res->tokens[t], ref[t].token) << "token " << t;
    // NOTE: exact equality: every backend op is batch-invariant (model/backend.h), so a verify
    // row's logits equal a plain decode row's bit for bit.
    EXPECT_EQ(res->logprobs[t], ref[t].logprob) << "token " << t;
    ASSERT_EQ(ref[t].top_logprobs.size(), static_cast<size_t>(kTopN));
    for (int32_t j = 0; j < kTopN; ++j) {
      EXPECT_EQ(res->top_logprob_ids[t * kTopN + j], ref[t].top_logprobs[j].token) << "token " << t << " rank " << j;
      EXPECT_EQ(res->top_logprob_values[t * kTopN + j], ref[t].top_logprobs[j].logprob) << "token " << t << " rank " << j;
    }
    // Greedy: the chosen token is the top-1, with the same logprob.
    EXPECT_EQ(res->top_logprob_ids[t * kTopN], res->tokens[t]) << "token " << t;
    EXPECT_EQ(res->top_logprob_values[t * kTopN], res->logprobs[t]) << "token " << t;
  }
  // Without logprobs nothing extra travels.
  auto plain = cluster_->client().generate(greedy(ps[0], 4));
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(plain->top_n, 0);
  EXPECT_TRUE(plain->top_logprob_ids.empty());
  EXPECT_TRUE(plain->top_logprob_values.empty());
  EXPECT_EQ(plain->logprobs.size(), plain->tokens.size());
}

TEST_F(ActorsNgram, StatusReportsPromptTokensAcceptedPerPositionAndMaxModelLen) {
  // The previous test's last chunk may reach its client before the shard's idle ShardLoad
  // reaches the scheduler: start from the load of an idle shard.
  const ClusterStatus before = status_when(cluster_->client(), [](const ShardLoad& l) {
    return l.num_running == 0 && l.num_waiting == 0;
  });
  ASSERT_EQ(before.replicas.size(), 1u);
  ASSERT_EQ(before.replicas[0].load.num_running, 0);
  const int64_t prompt_before = before.replicas[0].load.prompt_tokens;
  const int64_t accepted_before = before.replicas[0].load.num_accepted_tokens;
  auto ps = prompts(cluster_->head());
  int64_t prompt_sum = 0, accepted = 0;
  for (const auto& p : ps) {
    auto r = cluster_->client().generate(greedy(p, 16));
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    prompt_sum += static_cast<int64_t>(p.size());
    accepted += r->num_accepted_tokens;
  }
  ASSERT_GT(accepted, 0) << "the n-gram proposer never had a draft accepted on repetitive prompts";
  // An idle shard's load: one sent during the last request has the by-source counts ahead.
  const ClusterStatus st = status_when(cluster_->client(), [&](const ShardLoad& l) {
    return l.prompt_tokens >= prompt_before + prompt_sum && l.num_accepted_tokens >= accepted_before + accepted &&
           l.num_running == 0 && l.num_waiting == 0;
  });
  ASSERT_EQ(st.replicas.size(), 1u);
  const ShardLoad& l = st.replicas[0].load;
  // No other request runs in this suite at the same time: the engine total grew by exactly ours.
  EXPECT_EQ(l.prompt_tokens, prompt_before + prompt_sum);
  EXPECT_EQ(l.num_accepted_tokens, accepted_before + accepted);
  ASSERT_EQ(l.accepted_per_pos.size(), 4u) << "one entry per draft position up to num_speculative_tokens";
  EXPECT_EQ(sum(l.accepted_per_pos), l.num_accepted_tokens);
  EXPECT_GT(l.accepted_per_pos[0], 0);
  for (size_t i = 1; i < l.accepted_per_pos.size(); ++i) {
    // Position i is accepted only after position i - 1 was.
    EXPECT_LE(l.accepted_per_pos[i], l.accepted_per_pos[i - 1]) << "position " << i;
  }
  EXPECT_LE(l.accepted_per_pos[0], l.num_drafts);
  EXPECT_EQ(st.max_model_len, 512);
  EXPECT_EQ(l.goodput_drafting, 0) << "disable_by_goodput is off";
  EXPECT_EQ(l.goodput_skipped, 0) << "disable_by_goodput is off";
  // Drafts by source: all own-text n-gram matches (no history), equal to the idle totals.
  const auto src = [](DraftSource d) { return static_cast<size_t>(d); };
  ASSERT_EQ(l.drafts_by_source.size(), static_cast<size_t>(kNumDraftSources));
  EXPECT_EQ(l.drafts_by_source[src(DraftSource::kPromptLookup)], l.num_drafts);
  EXPECT_EQ(l.draft_tokens_by_source[src(DraftSource::kPromptLookup)], l.num_draft_tokens);
  EXPECT_EQ(l.accepted_by_source[src(DraftSource::kPromptLookup)], l.num_accepted_tokens);
  EXPECT_EQ(l.drafts_by_source[src(DraftSource::kModel)], 0);
  EXPECT_EQ(l.drafts_by_source[src(DraftSource::kCachedRequests)], 0);
}

TEST_F(ActorsNgram, StatusReportsPrefixCacheQueriesAndHits) {
  const ClusterStatus before = status_when(cluster_->client(), [](const ShardLoad& l) {
    return l.num_running == 0 && l.num_waiting == 0;
  });
  ASSERT_EQ(before.replicas.size(), 1u);
  const ShardLoad& b = before.replicas[0].load;
  // A prompt of a few blocks (block size 16) sent twice: the second admission hits.
  auto ps = prompts(cluster_->head());
  std::vector<int32_t> p = ps[1];
  p.insert(p.end(), ps[1].begin(), ps[1].end());
  ASSERT_GT(p.size(), 33u);
  auto first = cluster_->client().generate(greedy(p, 4));
  ASSERT_TRUE(first.ok()) << first.status().to_string();
  auto second = cluster_->client().generate(greedy(p, 4));
  ASSERT_TRUE(second.ok()) << second.status().to_string();
  EXPECT_EQ(second->tokens, first->tokens);
  const int64_t n = static_cast<int64_t>(p.size());
  const ClusterStatus st = status_when(cluster_->client(), [&](const ShardLoad& l) {
    return l.prefix_cache_queries >= b.prefix_cache_queries + 2 * n;
  });
  const ShardLoad& l = st.replicas[0].load;
  EXPECT_EQ(l.prefix_cache_queries, b.prefix_cache_queries + 2 * n);
  // At least the second request's whole blocks before its last token.
  EXPECT_GE(l.prefix_cache_hits - b.prefix_cache_hits, (n - 1) / 16 * 16);
  EXPECT_LE(l.prefix_cache_hits, l.prefix_cache_queries);
}

// disable_by_goodput through the actors: greedy output stays the target's, and the shard's load
// (the status, /metrics) carries the policy's counters.
TEST(ActorsNgramGoodput, GreedyIdentityAndTheLoadCarriesThePolicyCounters) {
  SpeculativeSpec spec = ngram_spec();
  spec.disable_by_goodput = true;
  Cluster cluster(spec, false);
  auto ps = prompts(cluster.head());
  int64_t drafts = 0;
  for (const auto& p : ps) {
    auto r = cluster.client().generate(greedy(p, 24));
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_EQ(r->tokens, testing::greedy_reference(p, 24));
    drafts += r->num_drafts;
  }
  const ClusterStatus st = status_when(cluster.client(), [&](const ShardLoad& l) {
    return l.num_running == 0 && l.num_drafts >= drafts && l.goodput_drafting + l.goodput_skipped > 0;
  });
  ASSERT_EQ(st.replicas.size(), 1u);
  const ShardLoad& l = st.replicas[0].load;
  EXPECT_GT(l.goodput_drafting + l.goodput_skipped, 0) << "no decode step was decided by the policy";
  // A sequence the policy let draft may still find no n-gram match; one it left out never drafts.
  EXPECT_LE(l.num_drafts, l.goodput_drafting);
  std::printf("[actors] disable_by_goodput: %lld sequence-steps drafting, %lld left out, %lld drafts\n",
              static_cast<long long>(l.goodput_drafting), static_cast<long long>(l.goodput_skipped),
              static_cast<long long>(l.num_drafts));
}

TEST_F(ActorsNgram, CancelAndTimeout) {
  auto ps = prompts(cluster_->head());
  auto h = cluster_->client().submit(greedy(ps[0], 400));
  ASSERT_TRUE(h.ok());
  auto first = (*h)->next(std::chrono::seconds(60));
  ASSERT_TRUE(first.has_value());
  (*h)->cancel();
  auto r = (*h)->wait();
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->finish_reason, "abort");
  EXPECT_LT(r->completion_tokens, 400);

  GenerateRequest slow = greedy(ps[1], 400);
  slow.timeout_s = 0.3;
  auto r2 = cluster_->client().generate(slow);
  ASSERT_TRUE(r2.ok()) << r2.status().to_string();
  EXPECT_EQ(r2->finish_reason, "timeout");
  EXPECT_LT(r2->completion_tokens, 400);
  // A first token's time only when one came (-1 otherwise; it was the total time).
  EXPECT_GE(r->first_token_seconds, 0.0);
  EXPECT_LE(r->first_token_seconds, r->seconds);
  GenerateRequest instant = greedy(ps[2], 400);
  instant.timeout_s = 1e-4;
  auto r3 = cluster_->client().generate(instant);
  ASSERT_TRUE(r3.ok()) << r3.status().to_string();
  EXPECT_EQ(r3->finish_reason, "timeout");
  if (r3->completion_tokens == 0) {
    EXPECT_EQ(r3->first_token_seconds, -1.0);
  } else {
    EXPECT_GE(r3->first_token_seconds, 0.0);
  }
}

TEST_F(ActorsNgram, BadRequestsAreRefusedWithTheField) {
  struct Case {
    GenerateRequest req;
    std::string expect;
  };
  std::vector<Case> cases;
  cases.push_back({GenerateRequest{}, "prompt: empty"});
  GenerateRequest two = greedy({1, 2}, 4);
  two.prompt = "text too";
  cases.push_back({two, "exactly one of prompt, messages, prompt_token_ids"});
  GenerateRequest inf_p = greedy({1, 2, 3}, 4);
  inf_p.sampling.top_p = std::numeric_limits<float>::infinity();
  cases.push_back({inf_p, "top_p"});
  GenerateRequest nan_t = greedy({1, 2, 3}, 4);
  nan_t.sampling.temperature = std::numeric_limits<float>::quiet_NaN();
  cases.push_back({nan_t, "temperature"});
  GenerateRequest inf_timeout = greedy({1, 2, 3}, 4);
  inf_timeout.timeout_s = std::numeric_limits<double>::infinity();
  cases.push_back({inf_timeout, "timeout_s"});
  GenerateRequest oov = greedy({1, 2, 999999}, 4);
  cases.push_back({oov, "prompt_token_ids[2]: token id 999999"});
  GenerateRequest zero = greedy({1, 2, 3}, 0);
  cases.push_back({zero, "max_tokens = 0"});
  GenerateRequest topp = greedy({1, 2, 3}, 4);
  topp.sampling.top_p = 1.5f;
  cases.push_back({topp, "top_p"});
  GenerateRequest long_prompt = greedy(std::vector<int32_t>(600, 5), 4);
  cases.push_back({long_prompt, "max_model_len"});
  GenerateRequest bad_k = greedy({1, 2, 3}, 4);
  bad_k.num_speculative_tokens = 65;
  cases.push_back({bad_k, "num_speculative_tokens = 65"});
  GenerateRequest empty_stop = greedy({1, 2, 3}, 4);
  empty_stop.stop = {""};
  cases.push_back({empty_stop, "stop"});
  for (auto& c : cases) {
    auto h = cluster_->client().submit(c.req);
    ASSERT_FALSE(h.ok()) << c.expect;
    EXPECT_NE(h.status().message().find(c.expect), std::string::npos) << h.status().message();
  }
  // The server keeps serving.
  auto ok = cluster_->client().generate(greedy({1, 2, 3}, 2));
  EXPECT_TRUE(ok.ok()) << ok.status().to_string();
}

TEST_F(ActorsNgram, WrongTokenIsRefused) {
  auto bad = Client::in_process(cluster_->client().system(), cluster_->client().scheduler(), "wrong-token");
  auto h = bad->submit(greedy({1, 2, 3}, 2));
  ASSERT_FALSE(h.ok());
  EXPECT_NE(h.status().message().find("token"), std::string::npos);
  EXPECT_FALSE(bad->status().ok());
}

TEST(ActorsQueue, RequestSubmittedBeforeAnyReplicaIsReadyWaitsForOne) {
  ActorRuntime rt;
  Topology t = make_topology(std::nullopt, false);
  auto head = Head::start(rt, t, kToken, /*publish=*/false);
  ASSERT_TRUE(head.ok());
  auto client = Client::in_process(rt.system(), (*head)->scheduler(), kToken);
  auto none = client->status();
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->max_model_len, 0) << "no target shard registered yet";
  auto h = client->submit(greedy({1, 2, 3, 4}, 4));
  ASSERT_TRUE(h.ok()) << h.status().to_string();
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_FALSE((*h)->done());
  WorkerConfig wc;
  wc.node = "local";
  wc.topology = t;
  wc.threads = 1;
  wc.token = kToken;
  wc.scheduler = (*head)->scheduler();
  spawn_target_shard(rt.system(), wc);  // loads while the request waits in the queue
  auto r = (*h)->wait();
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->finish_reason, "length");
  EXPECT_EQ(r->tokens, testing::greedy_reference({1, 2, 3, 4}, 4));
  client.reset();
  (*head)->stop();
}

// The head's books hold a request before its client hears it finished: one status read right
// after each answer (no polling) counts it as finished, its tokens in the replica's load, and
// the replica idle again. (The shard sends a request's last event after the load report that
// counts it, the request actor tells the scheduler before the client.)
TEST(ActorsStatus, AStatusReadRightAfterAnAnswerCountsTheRequest) {
  Cluster c(std::nullopt, false);
  auto before = c.client().status();
  ASSERT_TRUE(before.ok());
  ASSERT_EQ(before->replicas.size(), 1u);
  const int64_t finished0 = before->finished;
  const int64_t generated0 = before->replicas[0].load.generated_tokens;
  constexpr int32_t kTokens = 6;
  for (int32_t i = 0; i < 12; ++i) {
    auto r = c.client().generate(greedy({1, 2, 3, 4, 5 + i}, kTokens));
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    ASSERT_EQ(r->completion_tokens, kTokens);
    auto st = c.client().status();
    ASSERT_TRUE(st.ok());
    ASSERT_EQ(st->replicas.size(), 1u);
    EXPECT_EQ(st->finished, finished0 + i + 1) << "request " << i;
    EXPECT_GE(st->replicas[0].load.generated_tokens, generated0 + int64_t{kTokens} * (i + 1)) << "request " << i;
    EXPECT_EQ(st->replicas[0].load.num_running, 0) << "request " << i;
    EXPECT_EQ(st->replicas[0].load.num_waiting, 0) << "request " << i;
  }
}

TEST(ActorsKv, ASequenceThatOutgrowsTheCacheFailsAloneAndItsBatchMateFinishes) {
  // 4 KV blocks of 16 tokens: the long request cannot fit 64 + 1 positions.
  const int64_t block_bytes = 2 * 30 * 3 * 64 * 4 * 16;  // K and V, 30 layers, 3 KV heads x 64, fp32, 16 tokens
  Cluster c(std::nullopt, false, 4 * block_bytes);
  auto st = c.client().status();
  ASSERT_TRUE(st.ok());
  ASSERT_EQ(st->replicas.size(), 1u);
  ASSERT_TRUE(st->replicas[0].ready);
  auto long_req = c.client().submit(greedy({1, 2, 3, 4, 5, 6, 7, 8}, 200));
  auto short_req = c.client().submit(greedy({1, 2, 3, 4, 5}, 6));
  ASSERT_TRUE(long_req.ok() && short_req.ok());
  auto rs = (*short_req)->wait();
  ASSERT_TRUE(rs.ok()) << rs.status().to_string();
  EXPECT_EQ(rs->tokens, testing::greedy_reference({1, 2, 3, 4, 5}, 6));
  auto rl = (*long_req)->wait();
  ASSERT_FALSE(rl.ok());
  EXPECT_NE(rl.status().message().find("KV"), std::string::npos) << rl.status().message();
  // The replica keeps serving.
  auto again = c.client().generate(greedy({1, 2, 3}, 4));
  EXPECT_TRUE(again.ok()) << again.status().to_string();
}

}  // namespace
}  // namespace specserve
