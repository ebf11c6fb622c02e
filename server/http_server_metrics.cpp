// specserve server: the front end's Prometheus families (vLLM V1's names under specserve:),
// refreshed from the scheduler's ClusterStatus on each scrape, and the per-choice latency
// histograms observed as chunks arrive.
#include <chrono>
#include <string>
#include <vector>

#include "server/http_server_internal.h"
#include "server/metrics.h"

namespace specserve {

using namespace http_server_internal;


void HttpServer::Impl::declare_metrics() {
  using K = MetricsRegistry::Kind;
  metrics.declare("specserve:num_requests_running", K::kGauge, "Number of requests in model execution batches.");
  metrics.declare("specserve:num_requests_waiting", K::kGauge, "Number of requests waiting to be processed.");
  metrics.declare("specserve:kv_cache_usage_perc", K::kGauge, "KV-cache usage. 1 means 100 percent usage.");
  metrics.declare("specserve:num_replicas_ready", K::kGauge, "Replicas ready to serve.");
  metrics.declare("specserve:prompt_tokens", K::kCounter, "Number of prefill tokens processed.");
  metrics.declare("specserve:generation_tokens", K::kCounter, "Number of generation tokens processed.");
  metrics.declare("specserve:request_success", K::kCounter, "Count of successfully processed requests (HTTP).");
  metrics.declare("specserve:request_failure", K::kCounter,
                  "Count of requests (choices) that failed while being served: finish_reason error (HTTP).");
  // A sample from the start (0), so rate() and alerts on it work before the first failure.
  metrics.add("specserve:request_failure", labels, 0);
  metrics.declare("specserve:time_to_first_token_seconds", K::kHistogram, "Histogram of time to first token in seconds.",
                  ttft_buckets());
  metrics.declare("specserve:inter_token_latency_seconds", K::kHistogram,
                  "Histogram of inter-token latency in seconds (one per engine step that produced tokens).", itl_buckets());
  metrics.declare("specserve:request_time_per_output_token_seconds", K::kHistogram,
                  "Histogram of time per output token in seconds, per request (first to last token).", itl_buckets());
  metrics.declare("specserve:e2e_request_latency_seconds", K::kHistogram,
                  "Histogram of end to end request latency in seconds.", e2e_buckets());
  metrics.declare("specserve:spec_decode_num_drafts", K::kCounter, "Number of spec decoding drafts.");
  metrics.declare("specserve:spec_decode_num_draft_tokens", K::kCounter, "Number of draft tokens.");
  metrics.declare("specserve:spec_decode_num_accepted_tokens", K::kCounter, "Number of accepted tokens.");
  metrics.declare("specserve:spec_decode_num_accepted_tokens_per_pos", K::kCounter,
                  "Accepted tokens per draft position.");
  metrics.declare("specserve:spec_decode_num_drafts_by_source", K::kCounter,
                  "Drafts by who drafted them (source: model, prompt_lookup, cached_requests), counted at each verification step.");
  metrics.declare("specserve:spec_decode_num_draft_tokens_by_source", K::kCounter, "Draft tokens by who drafted them.");
  metrics.declare("specserve:spec_decode_num_accepted_tokens_by_source", K::kCounter, "Accepted tokens by who drafted them.");
  metrics.declare("specserve:prefix_cache_queries", K::kCounter,
                  "Prefix cache queries: tokens looked up in the prefix cache at admission.");
  metrics.declare("specserve:prefix_cache_hits", K::kCounter, "Prefix cache hits: tokens found in the prefix cache.");
  metrics.declare("specserve:num_preemptions", K::kCounter,
                  "Cumulative number of preemptions: running sequences whose KV was released for lack of blocks (recomputed later).");
  metrics.declare("specserve:spec_decode_draft_seconds", K::kCounter, "Seconds spent proposing draft tokens.");
  metrics.declare("specserve:spec_decode_verify_seconds", K::kCounter,
                  "Seconds spent in target forward passes, which verify the drafts (prefill included).");
  metrics.declare("specserve:spec_decode_goodput_drafting", K::kCounter,
                  "Sequence-steps that could draft in which disable_by_goodput asked for a draft.");
  metrics.declare("specserve:spec_decode_goodput_skipped", K::kCounter,
                  "Sequence-steps that could draft in which disable_by_goodput left the sequence out.");
  // Families with labels only appear once observed: give the histograms their zero series.
  metrics.observe("specserve:time_to_first_token_seconds", labels, 0, 0);
  metrics.observe("specserve:inter_token_latency_seconds", labels, 0, 0);
  metrics.observe("specserve:request_time_per_output_token_seconds", labels, 0, 0);
  metrics.observe("specserve:e2e_request_latency_seconds", labels, 0, 0);
  declare_lifecycle_metrics();
}

void HttpServer::Impl::declare_lifecycle_metrics() {
  using K = MetricsRegistry::Kind;
  metrics.declare("specserve:replica_state", K::kGauge,
                  "1 for the replica's current lifecycle state (starting, loading, warming, ready, draining, standby, stopped), else 0.");
  metrics.declare("specserve:replica_state_seconds", K::kCounter, "Seconds each replica spent in each lifecycle state.");
  metrics.declare("specserve:num_replicas_standby", K::kGauge, "Standby replicas: loaded and warm, not routed (the warm pool).");
  metrics.declare("specserve:autoscaler_target_replicas", K::kGauge, "Ready replicas the autoscaler wants.");
  metrics.declare("specserve:autoscaler_promotions", K::kCounter, "Standby replicas promoted to ready.");
  metrics.declare("specserve:autoscaler_cold_starts", K::kCounter,
                  "Replica processes started by the autoscaler (failed starts included: autoscaler_failed_starts).");
  metrics.declare("specserve:autoscaler_failed_starts", K::kCounter,
                  "Replica starts that failed: the launcher's error, a target shard that failed to load, or a start "
                  "abandoned after start_timeout_s.");
  metrics.declare("specserve:autoscaler_drains", K::kCounter, "Ready replicas drained by the autoscaler.");
  metrics.declare("specserve:replica_cold_start_seconds", K::kGauge,
                  "The replica's last cold start: process start requested to ready (loaded and warmed up).");
  metrics.declare("specserve:replica_promotion_routable_seconds", K::kGauge,
                  "The replica's last warm promotion: the autoscaler's decision to the replica being routed.");
  metrics.declare("specserve:replica_promotion_dispatch_seconds", K::kGauge,
                  "The replica's last warm promotion: the autoscaler's decision to the first request sent to it.");
  metrics.declare("specserve:replica_promotion_seconds", K::kGauge,
                  "The replica's last warm promotion: the autoscaler's decision to the first token of the first request sent to it that had none yet.");
}

void HttpServer::Impl::refresh_lifecycle_metrics(const ClusterStatus& st) {
  static const char* const kStates[] = {"starting", "loading", "warming", "ready", "draining", "standby", "stopped"};
  int64_t standby = 0;
  for (const ReplicaStatus& r : st.replicas) {
    if (r.state.empty()) continue;
    standby += r.state == "standby";
    MetricLabels rl = labels;
    rl.emplace_back("replica", std::to_string(r.replica));
    for (size_t k = 0; k < std::size(kStates); ++k) {
      MetricLabels l = rl;
      l.emplace_back("state", kStates[k]);
      metrics.set("specserve:replica_state", l, r.state == kStates[k] ? 1.0 : 0.0);
      if (k < r.state_seconds_total.size()) {
        metrics.set_counter_at_least("specserve:replica_state_seconds", l, r.state_seconds_total[k]);
      }
    }
    if (r.cold_start_seconds > 0) metrics.set("specserve:replica_cold_start_seconds", rl, r.cold_start_seconds);
    if (r.num_promotions > 0) {
      metrics.set("specserve:replica_promotion_routable_seconds", rl, r.promotion_routable_seconds);
      if (r.promotion_dispatch_seconds > 0) metrics.set("specserve:replica_promotion_dispatch_seconds", rl, r.promotion_dispatch_seconds);
    }
    if (r.promotion_seconds > 0) metrics.set("specserve:replica_promotion_seconds", rl, r.promotion_seconds);
  }
  metrics.set("specserve:num_replicas_standby", labels, static_cast<double>(standby));
  const AutoscaleStatus& a = st.autoscale;
  metrics.set("specserve:autoscaler_target_replicas", labels, a.enabled ? a.target_ready : 0.0);
  metrics.set_counter_at_least("specserve:autoscaler_promotions", labels, static_cast<double>(a.num_promotions));
  metrics.set_counter_at_least("specserve:autoscaler_cold_starts", labels, static_cast<double>(a.num_cold_starts));
  metrics.set_counter_at_least("specserve:autoscaler_failed_starts", labels, static_cast<double>(a.num_failed_starts));
  metrics.set_counter_at_least("specserve:autoscaler_drains", labels, static_cast<double>(a.num_drains));
}

void HttpServer::Impl::refresh_cluster_metrics() {
  auto st = cluster_status(0.0);
  if (!st) return;
  int64_t running = 0, waiting = st->queued, used = 0, total = 0, ready = 0;
  double prompt = 0, gen = 0, drafts = 0, draft_tokens = 0, accepted = 0, draft_s = 0, forward_s = 0;
  double pc_queries = 0, pc_hits = 0, gp_drafting = 0, gp_skipped = 0, preemptions = 0;
  std::vector<int64_t> per_pos;
  std::vector<int64_t> by_source[3];  // drafts, draft tokens, accepted tokens; [source] (load_source_name)
  // Counters: the loads of replica incarnations that ended (ClusterStatus::ended) plus every
  // replica's own, down ones included (they stay in the status), so they never go back. A
  // replica's prefill worker counts its prompts and their first tokens, its decode shard the
  // rest (EngineStats::prompt_tokens: each prompt once, where the request started).
  std::vector<const ShardLoad*> loads{&st->ended};
  for (const ReplicaStatus& r : st->replicas) {
    loads.push_back(&r.load);
    loads.push_back(&r.prefill_load);
    if (r.ready) {
      ++ready;
      for (const ShardLoad* l : {&r.load, &r.prefill_load}) {
        running += l->num_running;
        waiting += l->num_waiting;
        used += l->total_kv_blocks - l->free_kv_blocks;
        total += l->total_kv_blocks;
      }
    }
  }
  for (const ShardLoad* lp : loads) {
    const ShardLoad& l = *lp;
    prompt += static_cast<double>(l.prompt_tokens);
    gen += static_cast<double>(l.generated_tokens);
    drafts += static_cast<double>(l.num_drafts);
    draft_tokens += static_cast<double>(l.num_draft_tokens);
    accepted += static_cast<double>(l.num_accepted_tokens);
    draft_s += l.draft_seconds;
    forward_s += l.forward_seconds;
    pc_queries += static_cast<double>(l.prefix_cache_queries);
    pc_hits += static_cast<double>(l.prefix_cache_hits);
    preemptions += static_cast<double>(l.num_preemptions);
    gp_drafting += static_cast<double>(l.goodput_drafting);
    gp_skipped += static_cast<double>(l.goodput_skipped);
    add_counts(per_pos, l.accepted_per_pos);
    add_counts(by_source[0], l.drafts_by_source);
    add_counts(by_source[1], l.draft_tokens_by_source);
    add_counts(by_source[2], l.accepted_by_source);
  }
  metrics.set("specserve:num_requests_running", labels, static_cast<double>(running));
  metrics.set("specserve:num_requests_waiting", labels, static_cast<double>(waiting));
  metrics.set("specserve:kv_cache_usage_perc", labels, total > 0 ? static_cast<double>(used) / static_cast<double>(total) : 0.0);
  metrics.set("specserve:num_replicas_ready", labels, static_cast<double>(ready));
  metrics.set_counter_at_least("specserve:prompt_tokens", labels, prompt);
  metrics.set_counter_at_least("specserve:generation_tokens", labels, gen);
  metrics.set_counter_at_least("specserve:spec_decode_num_drafts", labels, drafts);
  metrics.set_counter_at_least("specserve:spec_decode_num_draft_tokens", labels, draft_tokens);
  metrics.set_counter_at_least("specserve:spec_decode_num_accepted_tokens", labels, accepted);
  metrics.set_counter_at_least("specserve:spec_decode_draft_seconds", labels, draft_s);
  metrics.set_counter_at_least("specserve:spec_decode_verify_seconds", labels, forward_s);
  metrics.set_counter_at_least("specserve:prefix_cache_queries", labels, pc_queries);
  metrics.set_counter_at_least("specserve:prefix_cache_hits", labels, pc_hits);
  metrics.set_counter_at_least("specserve:num_preemptions", labels, preemptions);
  metrics.set_counter_at_least("specserve:spec_decode_goodput_drafting", labels, gp_drafting);
  metrics.set_counter_at_least("specserve:spec_decode_goodput_skipped", labels, gp_skipped);
  for (size_t i = 0; i < per_pos.size(); ++i) {
    MetricLabels l = labels;
    l.emplace_back("position", std::to_string(i));
    metrics.set_counter_at_least("specserve:spec_decode_num_accepted_tokens_per_pos", l, static_cast<double>(per_pos[i]));
  }
  // A source's series appear once it has drafted (the `ngram` method never drafts as "model").
  for (size_t src = 0; src < by_source[0].size() && load_source_name(src) != nullptr; ++src) {
    if (by_source[0][src] == 0) continue;
    MetricLabels l = labels;
    l.emplace_back("source", load_source_name(src));
    const char* names[3] = {"specserve:spec_decode_num_drafts_by_source", "specserve:spec_decode_num_draft_tokens_by_source",
                            "specserve:spec_decode_num_accepted_tokens_by_source"};
    for (int f = 0; f < 3; ++f) {
      const double v = src < by_source[f].size() ? static_cast<double>(by_source[f][src]) : 0.0;
      metrics.set_counter_at_least(names[f], l, v);
    }
  }
  refresh_lifecycle_metrics(*st);
}

void HttpServer::Impl::observe_choice(const ChoiceTiming& t, Clock::time_point start, Clock::time_point end,
                                      const std::string& finish) {
  if (t.first_token) {
    metrics.observe("specserve:time_to_first_token_seconds", labels,
                    std::chrono::duration<double>(*t.first_token - start).count());
  }
  metrics.observe("specserve:e2e_request_latency_seconds", labels, std::chrono::duration<double>(end - start).count());
  if (t.first_token && t.num_tokens > 1) {
    metrics.observe("specserve:request_time_per_output_token_seconds", labels,
                    std::chrono::duration<double>(t.last_token - *t.first_token).count() / static_cast<double>(t.num_tokens - 1));
  }
  MetricLabels l = labels;
  l.emplace_back("finished_reason", finish);
  // vLLM V1 counts every finished request by its reason (stop, length, abort); failures are not successes.
  // NOTE: a failure was counted nowhere, so a cluster failing every request looked idle.
  if (finish != "error") {
    metrics.add("specserve:request_success", l, 1);
  } else {
    metrics.add("specserve:request_failure", labels, 1);
  }
}

void HttpServer::Impl::observe_abandoned(std::vector<ChoiceTiming>& timing, Clock::time_point start) {
  const auto now = Clock::now();
  for (ChoiceTiming& t : timing) {
    if (t.finished) continue;
    t.finished = true;
    observe_choice(t, start, now, "abort");
  }
}

void HttpServer::Impl::observe_tokens(ChoiceTiming& t, const Arrival& a) {
  const size_t k = a.chunk.tokens.size();
  if (k == 0) return;
  if (!t.first_token) {
    t.first_token = a.at;
  } else {
    // NOTE: vLLM V1's meaning: one observation per engine step that produced tokens for the
    // request (a chunk holds all of a step's tokens, several with speculation), so speculation
    // shows as fewer, not shorter, gaps; per-token time is request_time_per_output_token.
    const double gap = std::chrono::duration<double>(a.at - t.last_token).count();
    metrics.observe("specserve:inter_token_latency_seconds", labels, gap);
  }
  t.num_tokens += static_cast<int64_t>(k);
  t.last_token = a.at;
}

}  // namespace specserve
