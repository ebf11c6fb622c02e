// The HTTP front end's /metrics (server/http_server.h) over a fake scheduler actor whose
// ClusterStatus the tests set: latency histograms, counters summed over replicas, lifecycle.
#include "tests/server/http_server_fixture.h"

namespace specserve {
namespace {

using namespace http_testing;

// The latency histograms follow vLLM V1: one inter-token observation per engine step that
// produced tokens (a speculative step's chunk holds several), one time-per-output-token and one
// time-to-first-token observation per request.
TEST_F(HttpServerTest, LatencyHistogramsCountStepsAndRequests) {
  fc_->tokens_per_chunk = 3;
  start();
  auto c = client();
  auto r = c.Post("/v1/completions", R"({"prompt": "x", "max_tokens": 7})", "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(json::parse(r->body)["choices"][0]["text"], "aaaaaaa");
  auto m = c.Get("/metrics");
  ASSERT_TRUE(m);
  auto count = [&](const std::string& family) {
    const std::string key = family + "_count{model_name=\"fake\"} ";
    const size_t at = m->body.find(key);
    return at == std::string::npos ? -1L : std::stol(m->body.substr(at + key.size()));
  };
  EXPECT_EQ(count("specserve:time_to_first_token_seconds"), 1) << m->body;
  EXPECT_EQ(count("specserve:inter_token_latency_seconds"), 2) << m->body;  // chunks of 3, 3, 1 tokens
  EXPECT_EQ(count("specserve:request_time_per_output_token_seconds"), 1) << m->body;
  EXPECT_EQ(count("specserve:e2e_request_latency_seconds"), 1) << m->body;
}

// vLLM V1's prefix-cache counters: the replicas' totals (ShardLoad) summed, as *_total counters.
TEST_F(HttpServerTest, PrefixCacheCountersSumTheReplicas) {
  fc_->prefix_cache_queries = 1000;
  fc_->prefix_cache_hits = 250;
  start();
  auto c = client();
  auto m = c.Get("/metrics");
  ASSERT_TRUE(m);
  EXPECT_NE(m->body.find("# TYPE specserve:prefix_cache_queries_total counter"), std::string::npos) << m->body;
  EXPECT_NE(m->body.find("specserve:prefix_cache_queries_total{model_name=\"fake\"} 2000\n"), std::string::npos) << m->body;
  EXPECT_NE(m->body.find("specserve:prefix_cache_hits_total{model_name=\"fake\"} 500\n"), std::string::npos) << m->body;
}

// vLLM's num_preemptions: the replicas' totals plus those of ended replica loads, a counter.
TEST_F(HttpServerTest, PreemptionCounterSumsTheReplicas) {
  fc_->num_preemptions = 4;
  fc_->ended.num_preemptions = 3;
  start();
  auto c = client();
  auto m = c.Get("/metrics");
  ASSERT_TRUE(m);
  EXPECT_NE(m->body.find("# TYPE specserve:num_preemptions_total counter"), std::string::npos) << m->body;
  EXPECT_NE(m->body.find("specserve:num_preemptions_total{model_name=\"fake\"} 11\n"), std::string::npos) << m->body;
}

// Disaggregated prefill: a replica's prefill worker counts in every family — its prompts and
// first tokens in the counters (the decode shard counts each prompt once, where it started:
// EngineStats::prompt_tokens), what it holds now in the gauges of a ready replica.
TEST_F(HttpServerTest, PrefillWorkersLoadCountsInTheClusterFamilies) {
  fc_->with_prefill = true;
  fc_->shard0.num_running = 2;
  fc_->shard0.total_kv_blocks = 150;
  fc_->shard0.free_kv_blocks = 100;
  fc_->shard0.generated_tokens = 40;  // the rest of each output
  fc_->shard0.forward_seconds = 1.5;
  fc_->prefill.num_running = 1;
  fc_->prefill.num_waiting = 2;
  fc_->prefill.total_kv_blocks = 50;
  fc_->prefill.free_kv_blocks = 0;
  fc_->prefill.prompt_tokens = 70;
  fc_->prefill.generated_tokens = 3;  // one first token per request
  fc_->prefill.forward_seconds = 0.5;
  fc_->prefill.prefix_cache_queries = 64;
  fc_->prefill.prefix_cache_hits = 32;
  start();
  auto m = client().Get("/metrics");
  ASSERT_TRUE(m);
  for (const char* want : {"specserve:num_requests_running{model_name=\"fake\"} 3\n",
                           "specserve:num_requests_waiting{model_name=\"fake\"} 2\n",
                           "specserve:kv_cache_usage_perc{model_name=\"fake\"} 0.5\n",
                           "specserve:prompt_tokens_total{model_name=\"fake\"} 70\n",
                           "specserve:generation_tokens_total{model_name=\"fake\"} 43\n",
                           "specserve:spec_decode_verify_seconds_total{model_name=\"fake\"} 2\n",
                           "specserve:prefix_cache_queries_total{model_name=\"fake\"} 64\n",
                           "specserve:prefix_cache_hits_total{model_name=\"fake\"} 32\n"}) {
    EXPECT_NE(m->body.find(want), std::string::npos) << want << m->body;
  }
}

// disable_by_goodput's counters: the replicas' totals plus those of ended replica loads, as
// *_total counters.
TEST_F(HttpServerTest, GoodputCountersSumTheReplicas) {
  fc_->goodput_drafting = 30;
  fc_->goodput_skipped = 7;
  fc_->ended.goodput_drafting = 5;  // a replica incarnation that ended: still counted
  fc_->ended.prompt_tokens = 11;
  start();
  auto c = client();
  auto m = c.Get("/metrics");
  ASSERT_TRUE(m);
  EXPECT_NE(m->body.find("# TYPE specserve:spec_decode_goodput_drafting_total counter"), std::string::npos) << m->body;
  EXPECT_NE(m->body.find("specserve:spec_decode_goodput_drafting_total{model_name=\"fake\"} 65\n"), std::string::npos) << m->body;
  EXPECT_NE(m->body.find("specserve:spec_decode_goodput_skipped_total{model_name=\"fake\"} 14\n"), std::string::npos) << m->body;
  EXPECT_NE(m->body.find("specserve:prompt_tokens_total{model_name=\"fake\"} 11\n"), std::string::npos) << m->body;
}

// Drafts by who drafted them (spec/proposer.h DraftSource): one series per source that drafted,
// summed over the replicas (two here) and the ended loads; a source that never drafted has none.
TEST_F(HttpServerTest, DraftCountersBySourceSumTheReplicas) {
  fc_->by_source.drafts_by_source = {7, 20, 0};  // model, prompt_lookup, cached_requests
  fc_->by_source.draft_tokens_by_source = {14, 60, 0};
  fc_->by_source.accepted_by_source = {3, 25, 0};
  fc_->ended.drafts_by_source = {0, 1, 2};
  fc_->ended.draft_tokens_by_source = {0, 4, 6};
  fc_->ended.accepted_by_source = {0, 2, 5};
  {
    // First scrape: cached_requests has not drafted yet, so it has no series.
    const std::vector<int64_t> saved = fc_->ended.drafts_by_source;
    fc_->ended.drafts_by_source = {0, 1, 0};
    start();
    auto m = client().Get("/metrics");
    ASSERT_TRUE(m);
    EXPECT_NE(m->body.find("source=\"prompt_lookup\"} 41\n"), std::string::npos) << m->body;
    EXPECT_EQ(m->body.find("source=\"cached_requests\""), std::string::npos) << m->body;
    std::lock_guard<std::mutex> lock(fc_->mu);
    fc_->ended.drafts_by_source = saved;
  }
  auto c = client();
  auto m = c.Get("/metrics");
  ASSERT_TRUE(m);
  const std::string& b = m->body;
  EXPECT_NE(b.find("# TYPE specserve:spec_decode_num_drafts_by_source_total counter"), std::string::npos) << b;
  EXPECT_NE(b.find("specserve:spec_decode_num_drafts_by_source_total{model_name=\"fake\",source=\"model\"} 14\n"), std::string::npos) << b;
  EXPECT_NE(b.find("specserve:spec_decode_num_drafts_by_source_total{model_name=\"fake\",source=\"prompt_lookup\"} 41\n"), std::string::npos) << b;
  EXPECT_NE(b.find("specserve:spec_decode_num_drafts_by_source_total{model_name=\"fake\",source=\"cached_requests\"} 2\n"), std::string::npos) << b;
  EXPECT_NE(b.find("specserve:spec_decode_num_draft_tokens_by_source_total{model_name=\"fake\",source=\"prompt_lookup\"} 124\n"), std::string::npos) << b;
  EXPECT_NE(b.find("specserve:spec_decode_num_accepted_tokens_by_source_total{model_name=\"fake\",source=\"model\"} 6\n"), std::string::npos) << b;
  EXPECT_NE(b.find("specserve:spec_decode_num_accepted_tokens_by_source_total{model_name=\"fake\",source=\"cached_requests\"} 5\n"), std::string::npos) << b;
}

// The replica lifecycle as metrics: a one-hot state gauge and the seconds spent in each state
// per replica, the warm pool's size, and the last promotion's three times.
TEST_F(HttpServerTest, LifecycleMetricsShowStatesTimeInEachAndPromotionTimes) {
  fc_->lifecycle = true;
  start();
  auto c = client();
  auto m = c.Get("/metrics");
  ASSERT_TRUE(m);
  const std::string& b = m->body;
  auto has = [&](const std::string& line) { return b.find(line + "\n") != std::string::npos; };
  EXPECT_TRUE(has(R"(specserve:replica_state{model_name="fake",replica="0",state="ready"} 1)")) << b;
  EXPECT_TRUE(has(R"(specserve:replica_state{model_name="fake",replica="0",state="standby"} 0)")) << b;
  EXPECT_TRUE(has(R"(specserve:replica_state{model_name="fake",replica="1",state="standby"} 1)")) << b;
  EXPECT_TRUE(has(R"(specserve:replica_state_seconds_total{model_name="fake",replica="0",state="loading"} 1.5)")) << b;
  EXPECT_TRUE(has(R"(specserve:replica_state_seconds_total{model_name="fake",replica="0",state="ready"} 10)")) << b;
  EXPECT_TRUE(has(R"(specserve:replica_state_seconds_total{model_name="fake",replica="1",state="standby"} 12)")) << b;
  EXPECT_TRUE(has(R"(specserve:num_replicas_standby{model_name="fake"} 1)")) << b;
  EXPECT_TRUE(has(R"(specserve:replica_cold_start_seconds{model_name="fake",replica="0"} 2.25)")) << b;
  EXPECT_TRUE(has(R"(specserve:replica_promotion_seconds{model_name="fake",replica="0"} 0.04)")) << b;
  EXPECT_NE(b.find(R"(specserve:replica_promotion_routable_seconds{model_name="fake",replica="0"} )"), std::string::npos) << b;
  EXPECT_NE(b.find(R"(specserve:replica_promotion_dispatch_seconds{model_name="fake",replica="0"} )"), std::string::npos) << b;
  EXPECT_TRUE(has(R"(specserve:autoscaler_promotions_total{model_name="fake"} 1)")) << b;
  // Helper review of the autoscaler: failed starts counted as cold starts with nothing to tell
  // them apart.
  EXPECT_TRUE(has(R"(specserve:autoscaler_cold_starts_total{model_name="fake"} 3)")) << b;
  EXPECT_TRUE(has(R"(specserve:autoscaler_failed_starts_total{model_name="fake"} 2)")) << b;
}

// Helper review of the autoscaler: a request that failed on the cluster (finish_reason error)
// was counted nowhere in /metrics, so a cluster failing every request looked idle.
TEST_F(HttpServerTest, FailedRequestsAreCountedApartFromSuccesses) {
  start();
  auto c = client();
  // 0 before the first failure (no sample at all before: rate() had nothing to work on).
  auto m0 = c.Get("/metrics");
  ASSERT_TRUE(m0);
  EXPECT_NE(m0->body.find("specserve:request_failure_total{model_name=\"fake\"} 0\n"), std::string::npos) << m0->body;
  auto ok = c.Post("/v1/completions", R"({"prompt": "x", "max_tokens": 2})", "application/json");
  ASSERT_TRUE(ok);
  ASSERT_EQ(ok->status, 200) << ok->body;
  fc_->fail_with = "the replica failed";
  for (int i = 0; i < 2; ++i) {
    auto bad = c.Post("/v1/completions", R"({"prompt": "x", "max_tokens": 2})", "application/json");
    ASSERT_TRUE(bad);
    EXPECT_EQ(bad->status, 500) << bad->body;
  }
  auto m = c.Get("/metrics");
  ASSERT_TRUE(m);
  const std::string& b = m->body;
  EXPECT_NE(b.find("specserve:request_failure_total{model_name=\"fake\"} 2\n"), std::string::npos) << b;
  EXPECT_NE(b.find("specserve:request_success_total{model_name=\"fake\",finished_reason=\"length\"} 1\n"), std::string::npos) << b;
  EXPECT_EQ(b.find("finished_reason=\"error\""), std::string::npos) << b;
}

// Choices the server cancels count as finished_reason "abort" (vLLM V1): a gone client's, streamed
// or not, and a failed choice's siblings; a streamed choice that failed counts as a failure.
// (None of them were counted before.)
TEST_F(HttpServerTest, CancelledChoicesCountAsAbortAndAStreamedFailureAsAFailure) {
  fc_->hold = true;
  start();
  for (const char* body : {R"({"prompt": "Hi", "max_tokens": 500})", R"({"prompt": "Hi", "max_tokens": 500, "stream": true})"}) {
    const int fd = connect_to(server_->port());
    ASSERT_GE(fd, 0);
    send_all(fd, post_request("/v1/completions", body));
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    ::close(fd);
  }
  // (the fake may see a request cancelled twice: by the server, then by its dropped handle)
  auto c = client();
  const std::string aborted2 = "specserve:request_success_total{model_name=\"fake\",finished_reason=\"abort\"} 2\n";
  std::string body;
  for (int i = 0; i < 100 && body.find(aborted2) == std::string::npos; ++i) {
    if (i > 0) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    auto got = c.Get("/metrics");
    ASSERT_TRUE(got);
    body = got->body;
  }
  EXPECT_NE(body.find(aborted2), std::string::npos) << body;
  EXPECT_NE(body.find("specserve:request_failure_total{model_name=\"fake\"} 0\n"), std::string::npos) << body;

  fc_->hold = false;
  fc_->fail_with = "the replica failed";
  auto bad = c.Post("/v1/completions", R"({"prompt": "x", "max_tokens": 2, "stream": true})", "application/json");
  ASSERT_TRUE(bad);
  EXPECT_NE(bad->body.find("the replica failed"), std::string::npos) << bad->body;
  auto m = c.Get("/metrics");
  ASSERT_TRUE(m);
  EXPECT_NE(m->body.find("specserve:request_failure_total{model_name=\"fake\"} 1\n"), std::string::npos) << m->body;
  EXPECT_NE(m->body.find("specserve:request_success_total{model_name=\"fake\",finished_reason=\"abort\"} 2\n"), std::string::npos)
      << m->body;
}

// A non-streamed request whose choice fails: its sibling choices are cancelled at once (counted
// "abort") and the error answered; they ran on to max_tokens (here: held for ever).
TEST_F(HttpServerTest, ANonStreamedChoiceThatFailsCancelsItsSiblings) {
  fc_->hold = true;
  fc_->fail_with = "the replica failed";
  fc_->fail_only_id = fc_->next_id + 1;  // the second choice
  start();
  auto c = client();
  c.set_read_timeout(10, 0);
  const auto t0 = Clock::now();
  auto r = c.Post("/v1/completions", R"({"prompt": "x", "max_tokens": 50, "n": 2})", "application/json");
  ASSERT_TRUE(r) << "no answer within 10 s";
  EXPECT_EQ(r->status, 500) << r->body;
  EXPECT_NE(r->body.find("the replica failed"), std::string::npos) << r->body;
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 5.0);
  EXPECT_TRUE(fc_->wait_cancelled(1, 5.0)) << "the sibling was not cancelled";
  auto m = c.Get("/metrics");
  ASSERT_TRUE(m);
  EXPECT_NE(m->body.find("specserve:request_failure_total{model_name=\"fake\"} 1\n"), std::string::npos) << m->body;
  EXPECT_NE(m->body.find("specserve:request_success_total{model_name=\"fake\",finished_reason=\"abort\"} 1\n"), std::string::npos)
      << m->body;
}

// A choice that cannot be submitted (here the second prompt of two, past max_model_len): the
// request is answered 400 and the choices already submitted are cancelled, counted "abort".
// NOTE: they were cancelled and counted nowhere in /metrics.
TEST_F(HttpServerTest, ChoicesCancelledBecauseALaterOneWasRefusedCountAsAbort) {
  fc_->hold = true;
  fc_->refuse_submit = fc_->next_id + 2;  // the third choice
  start();
  auto c = client();
  auto r = c.Post("/v1/completions", R"({"prompt": ["x", "y"], "max_tokens": 50, "n": 2})", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400) << r->body;
  EXPECT_NE(r->body.find("max_model_len"), std::string::npos) << r->body;
  EXPECT_TRUE(fc_->wait_cancelled(2, 5.0)) << "the two submitted choices were not cancelled";
  auto m = c.Get("/metrics");
  ASSERT_TRUE(m);
  EXPECT_NE(m->body.find("specserve:request_success_total{model_name=\"fake\",finished_reason=\"abort\"} 2\n"), std::string::npos)
      << m->body;
  EXPECT_NE(m->body.find("specserve:request_failure_total{model_name=\"fake\"} 0\n"), std::string::npos) << m->body;
}

}  // namespace
}  // namespace specserve
