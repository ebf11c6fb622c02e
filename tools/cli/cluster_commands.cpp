// `specserve up | node | worker | status | client`: the actor runtime's commands (`serve`: serve_command.cpp).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "actors/client.h"
#include "cluster/launch.h"
#include "cluster/process.h"
#include "scheduler/autoscale_policy.h"
#include "tools/cli/cluster_client_lib.h"
#include "tools/cli/common.h"
#include "tools/cli/http_front_end.h"
#include "tools/cli/output_file_lib.h"
#include "tools/cli/registry.h"
#include "tools/cli/spec_options.h"
#include "tools/cli/subcommands.h"

namespace specserve::cli {
namespace {

// A replica's last warm promotion, in ms from the decision: routed / first request sent / first
// token; a part not measured (0) is "-".
std::string promotion_cell(double routable_s, double dispatch_s, double first_token_s) {
  auto part = [](double v, int digits) { return v > 0 ? fmt::format("{:.{}f}", v * 1000, digits) : std::string("-"); };
  return part(routable_s, 3) + "/" + part(dispatch_s, 1) + "/" + part(first_token_s, 1);
}

// ShardLoad's *_by_source vectors as EngineStats::by_source (missing entries 0).
DraftSourceCounts draft_source_counts(const ShardLoad& l) {
  DraftSourceCounts c{};
  auto at = [](const std::vector<int64_t>& v, size_t i) { return i < v.size() ? v[i] : 0; };
  for (size_t i = 0; i < c.size(); ++i) {
    c[i] = {at(l.drafts_by_source, i), at(l.draft_tokens_by_source, i), at(l.accepted_by_source, i)};
  }
  return c;
}

// ---------------------------------------------------------------- status

// A replica's prefill worker's load in `status --json`: what it holds now and its totals.
std::string prefill_json(const ShardLoad& p) {
  return fmt::format("{{\"num_running\": {}, \"num_waiting\": {}, \"kv_blocks_used\": {}, \"kv_blocks_total\": {}, "
                     "\"prompt_tokens\": {}, \"generated_tokens\": {}, \"prefix_cache_queries\": {}, "
                     "\"prefix_cache_hits\": {}, \"num_preemptions\": {}, \"forward_seconds\": {:.3f}}}",
                     p.num_running, p.num_waiting, p.total_kv_blocks - p.free_kv_blocks, p.total_kv_blocks, p.prompt_tokens,
                     p.generated_tokens, p.prefix_cache_queries, p.prefix_cache_hits, p.num_preemptions, p.forward_seconds);
}

int run_status(const std::string& connect, const std::string& token_file, const std::string& config, bool json) {
  auto client = connect_client(connect, token_file, config);
  if (!client.ok()) {
    std::fprintf(stderr, "specserve status: %s\n", client.status().message().c_str());
    return exit_status_for(client.status());
  }
  auto st = (*client)->status();
  if (!st.ok()) return std::fprintf(stderr, "specserve status: %s\n", st.status().message().c_str()), 1;
  const ClusterStatus& s = *st;
  if (json) {
    std::printf("{\"cluster\": \"%s\", \"model\": \"%s\", \"speculative_method\": \"%s\", \"speculative\": \"%s\", \"queued\": %d, \"running\": %d, "
                "\"finished\": %lld, \"requeued\": %lld, \"migrated\": %lld, \"kv_migrated_tokens\": %lld, "
                "\"kv_recomputed_tokens\": %lld, \"draining\": %s, \"max_model_len\": %d, \"tensor_parallel_size\": %d, \"workers\": [",
                json_escape(s.cluster).c_str(), json_escape(s.model).c_str(), s.speculative_method.c_str(), json_escape(s.speculative).c_str(), s.queued,
                s.running, static_cast<long long>(s.finished), static_cast<long long>(s.requeued),
                static_cast<long long>(s.migrated), static_cast<long long>(s.kv_migrated_tokens),
                static_cast<long long>(s.kv_recomputed_tokens), s.draining ? "true" : "false", s.max_model_len,
                s.tensor_parallel_size);
    for (size_t i = 0; i < s.workers.size(); ++i) {
      const auto& w = s.workers[i];
      std::printf("%s{\"node\": \"%s\", \"role\": \"%s\", \"replica\": %d, \"rank\": %d, \"pid\": %d, \"state\": \"%s\", "
                  "\"error\": \"%s\", \"load_seconds\": %.3f, \"warmup_seconds\": %.3f, \"compute\": \"%s\"}",
                  i ? ", " : "", json_escape(w.node).c_str(), w.role.c_str(), w.replica, w.rank, w.pid, w.state.c_str(),
                  json_escape(w.error).c_str(), w.load_seconds, w.warmup_seconds, json_escape(w.compute).c_str());
    }
    std::printf("], \"replicas\": [");
    for (size_t i = 0; i < s.replicas.size(); ++i) {
      const auto& r = s.replicas[i];
      std::printf("%s{\"replica\": %d, \"ready\": %s, \"assigned\": %d, \"kv_blocks_used\": %d, \"kv_blocks_total\": %d, "
                  "\"num_running\": %d, \"num_waiting\": %d, \"generated_tokens\": %lld, \"num_drafts\": %lld, "
                  "\"num_draft_tokens\": %lld, \"num_accepted_tokens\": %lld, \"prompt_tokens\": %lld, "
                  "\"prefix_cache_queries\": %lld, \"prefix_cache_hits\": %lld, \"goodput_drafting\": %lld, "
                  "\"goodput_skipped\": %lld, \"num_preemptions\": %lld, \"accepted_per_pos\": [",
                  i ? ", " : "", r.replica, r.ready ? "true" : "false", r.assigned,
                  r.load.total_kv_blocks - r.load.free_kv_blocks, r.load.total_kv_blocks, r.load.num_running,
                  r.load.num_waiting, static_cast<long long>(r.load.generated_tokens),
                  static_cast<long long>(r.load.num_drafts), static_cast<long long>(r.load.num_draft_tokens),
                  static_cast<long long>(r.load.num_accepted_tokens), static_cast<long long>(r.load.prompt_tokens),
                  static_cast<long long>(r.load.prefix_cache_queries), static_cast<long long>(r.load.prefix_cache_hits),
                  static_cast<long long>(r.load.goodput_drafting), static_cast<long long>(r.load.goodput_skipped),
                  static_cast<long long>(r.load.num_preemptions));
      for (size_t p = 0; p < r.load.accepted_per_pos.size(); ++p) {
        std::printf("%s%lld", p ? ", " : "", static_cast<long long>(r.load.accepted_per_pos[p]));
      }
      std::printf("], \"drafts_by_source\": %s, \"state\": \"%s\", \"state_seconds\": %.3f, \"state_seconds_total\": {",
                  draft_sources_json(draft_source_counts(r.load)).c_str(), r.state.c_str(), r.state_seconds);
      for (size_t k = 0; k < r.state_seconds_total.size() && k < kNumReplicaStates; ++k) {
        std::printf("%s\"%s\": %.3f", k ? ", " : "", replica_state_name(static_cast<ReplicaState>(k)),
                    r.state_seconds_total[k]);
      }
      // A time never measured (no cold start or promotion yet, or its request arrived after the
      // decision) is null, not 0.
      auto secs = [](double v, int digits) { return v > 0 ? fmt::format("{:.{}f}", v, digits) : std::string("null"); };
      std::printf("}, \"prefill_worker\": %s", r.has_prefill_worker ? prefill_json(r.prefill_load).c_str() : "null");
      std::printf(", \"cold_start_seconds\": %s, \"promotion_routable_seconds\": %s, "
                  "\"promotion_dispatch_seconds\": %s, \"promotion_seconds\": %s, \"num_promotions\": %lld, "
                  "\"num_cold_starts\": %lld, \"num_start_failures\": %d, \"last_start_error\": %s, \"draft_lost\": %s}",
                  secs(r.cold_start_seconds, 4).c_str(), secs(r.promotion_routable_seconds, 6).c_str(),
                  secs(r.promotion_dispatch_seconds, 6).c_str(), secs(r.promotion_seconds, 4).c_str(),
                  static_cast<long long>(r.num_promotions), static_cast<long long>(r.num_cold_starts), r.num_start_failures,
                  r.last_start_error.empty() ? "null" : nlohmann::json(r.last_start_error).dump().c_str(),
                  r.draft_lost ? "true" : "false");
    }
    const AutoscaleStatus& a = s.autoscale;
    auto list = [](const std::vector<double>& v) {
      std::string out = "[";
      for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + fmt::format("{:.6f}", v[i]);
      return out + "]";
    };
    // No TTFT sample in the window: null, not 0.
    const std::string p90_json = a.ttft_p90_seconds > 0 ? fmt::format("{:.4f}", a.ttft_p90_seconds) : std::string("null");
    // Counters of replica incarnations that ended (ClusterStatus::ended): with the replicas' own
    // they give the cluster's totals, which never go back (what /metrics exports).
    const ShardLoad& e = s.ended;
    std::printf("], \"ended\": {\"generated_tokens\": %lld, \"prompt_tokens\": %lld, \"num_drafts\": %lld, "
                "\"num_draft_tokens\": %lld, \"num_accepted_tokens\": %lld, \"prefix_cache_queries\": %lld, "
                "\"prefix_cache_hits\": %lld, \"goodput_drafting\": %lld, \"goodput_skipped\": %lld, "
                "\"num_preemptions\": %lld, \"accepted_per_pos\": [",
                static_cast<long long>(e.generated_tokens), static_cast<long long>(e.prompt_tokens),
                static_cast<long long>(e.num_drafts), static_cast<long long>(e.num_draft_tokens),
                static_cast<long long>(e.num_accepted_tokens), static_cast<long long>(e.prefix_cache_queries),
                static_cast<long long>(e.prefix_cache_hits), static_cast<long long>(e.goodput_drafting),
                static_cast<long long>(e.goodput_skipped), static_cast<long long>(e.num_preemptions));
    for (size_t p = 0; p < e.accepted_per_pos.size(); ++p) {
      std::printf("%s%lld", p ? ", " : "", static_cast<long long>(e.accepted_per_pos[p]));
    }
    std::printf("], \"drafts_by_source\": %s", draft_sources_json(draft_source_counts(e)).c_str());
    std::printf("}, \"autoscale\": {\"enabled\": %s, \"min_replicas\": %d, \"max_replicas\": %d, \"warm_pool\": %d, "
                "\"target_ready\": %d, \"wanted\": %d, \"starts_held\": %s, \"ongoing\": %d, \"ttft_p90_seconds\": %s, \"num_promotions\": %lld, "
                "\"num_cold_starts\": %lld, \"num_failed_starts\": %lld, \"num_drains\": %lld, \"num_stops\": %lld, \"last_reason\": \"%s\", "
                "\"last_change_seconds\": %.3f, \"cold_start_seconds\": %s, \"promotion_routable_seconds\": %s, "
                "\"promotion_dispatch_seconds\": %s, \"promotion_seconds\": %s, \"cold_scale_up_seconds\": %s, "
                "\"num_promotions_without_waiting_work\": %lld}}\n",
                a.enabled ? "true" : "false", a.min_replicas, a.max_replicas, a.warm_pool, a.target_ready, a.wanted,
                a.starts_held ? "true" : "false", a.ongoing,
                p90_json.c_str(), static_cast<long long>(a.num_promotions), static_cast<long long>(a.num_cold_starts),
                static_cast<long long>(a.num_failed_starts), static_cast<long long>(a.num_drains), static_cast<long long>(a.num_stops), json_escape(a.last_reason).c_str(),
                a.last_change_seconds, list(a.cold_start_seconds).c_str(), list(a.promotion_routable_seconds).c_str(),
                list(a.promotion_dispatch_seconds).c_str(), list(a.promotion_seconds).c_str(),
                list(a.cold_scale_up_seconds).c_str(), static_cast<long long>(a.num_promotions_without_waiting_work));
    return 0;
  }
  const std::string tp = s.tensor_parallel_size > 1 ? " | tensor-parallel " + std::to_string(s.tensor_parallel_size) + " ranks" : "";
  std::printf("cluster %s | model %s%s | speculative %s | queued %d | on replicas %d | finished %lld | re-queued %lld | "
              "migrated %lld (KV moved for %lld tokens, recomputed %lld)%s\n",
              s.cluster.c_str(), s.model.c_str(), tp.c_str(), s.speculative.empty() ? "off" : s.speculative.c_str(),
              s.queued, s.running, static_cast<long long>(s.finished), static_cast<long long>(s.requeued),
              static_cast<long long>(s.migrated), static_cast<long long>(s.kv_migrated_tokens),
              static_cast<long long>(s.kv_recomputed_tokens), s.draining ? " | draining" : "");
  std::printf("%-14s %-8s %-7s %-5s %-8s %-9s %-9s %-9s %-17s\n", "WORKER", "NODE", "REPLICA", "RANK", "PID", "STATE", "LOAD_S",
              "WARMUP_S", "COMPUTE");
  for (const auto& w : s.workers) {
    // A tensor-parallel follower warms up inside rank 0's warm-up (its collectives): rank 0's
    // figure is the replica's. NOTE: it showed 0.00, as if it had none.
    const std::string warmup = w.rank > 0 ? "-" : fmt::format("{:.2f}", w.warmup_seconds);
    std::printf("%-14s %-8s %-7d %-5d %-8d %-9s %-9.2f %-9s %-17s%s%s\n", w.role.c_str(), w.node.c_str(), w.replica, w.rank,
                w.pid, w.state.c_str(), w.load_seconds, warmup.c_str(), w.compute.empty() ? "-" : w.compute.c_str(),
                w.error.empty() ? "" : "  ", w.error.c_str());
  }
  std::printf("%-7s %-9s %-9s %-6s %-8s %-8s %-8s %-14s %-10s %-11s %-8s %-10s %-8s %-8s %-8s\n", "REPLICA", "STATE", "FOR_S",
              "READY", "ASSIGNED", "RUNNING", "WAITING", "KV_USED", "GENERATED", "ACCEPTANCE", "MEAN_LEN", "PREFIX_HIT",
              "PREEMPT", "COLD_S", "PROMO_MS(ROUTED/SENT/1ST_TOKEN)");
  for (const auto& r : s.replicas) {
    const auto& l = r.load;
    // "-" with no draft yet (speculation off, or nothing drafted): 0.000 / 1.00 read as measured.
    const std::string acc = l.num_draft_tokens ? fmt::format("{:.3f}", double(l.num_accepted_tokens) / l.num_draft_tokens) : "-";
    const std::string mal = l.num_drafts ? fmt::format("{:.2f}", 1.0 + double(l.num_accepted_tokens) / l.num_drafts) : "-";
    const std::string kv = std::to_string(l.total_kv_blocks - l.free_kv_blocks) + "/" + std::to_string(l.total_kv_blocks);
    const std::string cold = r.cold_start_seconds > 0 ? fmt::format("{:.2f}", r.cold_start_seconds) : "-";
    // Its last warm promotion, from the autoscaler's decision: routed / first request sent / first token (ms).
    // A part never measured (no request yet, or the first one arrived after the decision) is "-".
    const std::string promo = r.num_promotions > 0 ? promotion_cell(r.promotion_routable_seconds, r.promotion_dispatch_seconds,
                                                                    r.promotion_seconds)
                                                   : "-";
    // Prefix-cache hit rate: tokens found cached / tokens looked up (vLLM V1's hits / queries).
    const double hit = l.prefix_cache_queries ? double(l.prefix_cache_hits) / l.prefix_cache_queries : 0.0;
    std::printf("%-7d %-9s %-9.1f %-6s %-8d %-8d %-8d %-14s %-10lld %-11s %-8s %-10.3f %-8lld %-8s %-8s\n", r.replica,
                r.state.c_str(), r.state_seconds, r.ready ? "yes" : "no", r.assigned, l.num_running, l.num_waiting, kv.c_str(),
                static_cast<long long>(l.generated_tokens), acc.c_str(), mal.c_str(), hit, static_cast<long long>(l.num_preemptions),
                cold.c_str(), promo.c_str());
  }
  // Disaggregated prefill: the row above is the decode shard's; each prefill worker's own.
  for (const auto& r : s.replicas) {
    if (!r.has_prefill_worker) continue;
    const ShardLoad& p = r.prefill_load;
    const double hit = p.prefix_cache_queries ? double(p.prefix_cache_hits) / p.prefix_cache_queries : 0.0;
    std::printf("replica %d prefill worker: running %d | waiting %d | KV %d/%d | prompt tokens %lld | first tokens %lld | "
                "prefix hit %.3f | preemptions %lld\n",
                r.replica, p.num_running, p.num_waiting, p.total_kv_blocks - p.free_kv_blocks, p.total_kv_blocks,
                static_cast<long long>(p.prompt_tokens), static_cast<long long>(p.generated_tokens), hit,
                static_cast<long long>(p.num_preemptions));
  }
  ShardLoad all = s.ended;
  for (const auto& r : s.replicas) {
    add_counts(all.drafts_by_source, r.load.drafts_by_source);
    add_counts(all.draft_tokens_by_source, r.load.draft_tokens_by_source);
    add_counts(all.accepted_by_source, r.load.accepted_by_source);
  }
  const std::string sources = draft_sources_text(draft_source_counts(all), s.speculative_method);
  if (!sources.empty()) std::printf("drafts by source (every replica, ended ones included): %s\n", sources.c_str());
  // Time spent in each lifecycle state (the current one included), per replica.
  for (const auto& r : s.replicas) {
    std::string line;
    for (size_t k = 0; k < r.state_seconds_total.size() && k < kNumReplicaStates; ++k) {
      line += fmt::format("{}{} {:.1f}", k ? " | " : "", replica_state_name(static_cast<ReplicaState>(k)),
                          r.state_seconds_total[k]);
    }
    if (!line.empty()) std::printf("replica %d seconds in each state: %s\n", r.replica, line.c_str());
    if (r.num_start_failures > 0) {
      std::printf("replica %d: start failed %d time(s) in a row; last: %s\n", r.replica, r.num_start_failures,
                  r.last_start_error.c_str());
    }
    if (r.draft_lost) {
      // NOTE: its row said plain "ready" while it served without speculation.
      std::printf("replica %d: its draft worker is down (or failed to load): it serves without speculation%s\n", r.replica,
                  s.autoscale.enabled ? " (a replica whose draft worker died is replaced)" : "");
    }
  }
  const AutoscaleStatus& a = s.autoscale;
  if (a.enabled) {
    const std::string p90 = a.ttft_p90_seconds > 0 ? fmt::format("{:.3f} s", a.ttft_p90_seconds) : std::string("- (no samples)");
    std::printf("autoscaler: target %d ready (min %d, max %d, warm pool %d) | ongoing %d | TTFT p90 %s | promotions %lld, "
                "cold starts %lld, drains %lld, stops %lld\n",
                a.target_ready, a.min_replicas, a.max_replicas, a.warm_pool, a.ongoing, p90.c_str(),
                static_cast<long long>(a.num_promotions), static_cast<long long>(a.num_cold_starts),
                static_cast<long long>(a.num_drains), static_cast<long long>(a.num_stops));
    if (!a.last_reason.empty()) std::printf("  last change at %.1f s: %s\n", a.last_change_seconds, a.last_reason.c_str());
    if (a.starts_held) {
      std::printf("  cold starts held (CPU-only host: until the promoted replica's first token, at most 5 s); then only what "
                  "the load wants now (%d ready) is started, so ready may stay below the target\n", a.wanted);
    }
    auto ms = [](const std::vector<double>& v) {
      if (v.empty()) return std::string("-");
      return fmt::format("median {:.3f} ms, max {:.3f} ms (n {})", median_of(v) * 1000,
                         *std::max_element(v.begin(), v.end()) * 1000, v.size());
    };
    auto secs = [](const std::vector<double>& v) {  // cold starts: seconds, as COLD_S above
      if (v.empty()) return std::string("-");
      return fmt::format("median {:.3f} s, max {:.3f} s (n {})", median_of(v), *std::max_element(v.begin(), v.end()), v.size());
    };
    std::printf("  warm promotion, from the decision: routed %s | first request sent %s | its first token %s\n",
                ms(a.promotion_routable_seconds).c_str(), ms(a.promotion_dispatch_seconds).c_str(),
                ms(a.promotion_seconds).c_str());
    std::printf("  cold start (process start -> ready) %s | scale-up by cold start, decision -> first token %s\n",
                secs(a.cold_start_seconds).c_str(), secs(a.cold_scale_up_seconds).c_str());
    std::printf("  scale-ups not measured (no request waited for the replica): %lld\n",
                static_cast<long long>(a.num_promotions_without_waiting_work));
  }
  return 0;
}

}  // namespace

void add_cluster_commands(CLI::App& app) {
  add_serve_command(app);  // first: `serve` leads the runtime's commands in --help
  {
    auto o = std::make_shared<UpOptions>();
    auto* sub = app.add_subcommand(
        "up",
        "Launch a cluster from a YAML topology: the head here, each local node as its own process. With an "
        "`autoscale` section the head starts min_replicas ready replicas plus warm_pool standby ones (loaded and "
        "warmed up, not routed) and scales between min_replicas and max_replicas: a standby replica is promoted "
        "at once on load, the pool is refilled by cold starts, idle replicas drain back to the pool or stop");
    // Also as --config, as node, status and client take it (a user tried `up --config FILE`).
    // (two options, not one "config,--config": CLI11 listed that one under both headings, each
    // marked REQUIRED, though either alone is enough; one of them is checked when `up` runs)
    auto* positional = sub->add_option("config", o->config_path, "Topology file (see examples/cluster-local.yaml), or give it as --config");
    sub->add_option("--config", o->config_path, "Topology file, as the first argument")->excludes(positional);
    sub->add_option("--threads-per-worker", o->threads_per_worker, "CPU threads per worker (default: cores / workers on the node)")
        ->check(CLI::Range(0, 1024));
    sub->add_option("--drain-timeout", o->drain_timeout_s, "Seconds to finish in-flight requests on Ctrl-C / SIGTERM")
        ->check(seconds_validator("--drain-timeout"))
        ->capture_default_str();
    sub->add_option("--ready-file", o->ready_file, "Write the head's actor endpoint HOST:PORT (for `client --connect`) to this file once the "
                    "cluster serves: every declared replica ready, or with autoscale min_replicas ready");
    sub->add_flag("--dry-run", o->dry_run,
                  "Only check the topology (fields, ports free, this host's devices, model and head files, trees: every "
                  "problem listed, exit 2; `up` runs the same checks before it starts), print the plan and exit "
                  "without starting anything");
    auto http = std::make_shared<HttpArgs>();
    add_http_flags(sub, http.get(), /*with_port=*/false);  // the port is head.http_port in the topology
    register_command("up", [o, http] {
      if (o->config_path.empty()) {
        return std::fprintf(stderr, "specserve up: a topology file is required: `specserve up FILE` or `--config FILE` (see --help)\n"), 2;
      }
      if (Status st = resolve_http_args(http.get()); !st.ok()) return std::fprintf(stderr, "specserve up: %s\n", st.message().c_str()), 2;
      if (!o->ready_file.empty()) {
        if (Status st = check_replaceable_file("--ready-file", o->ready_file); !st.ok()) return std::fprintf(stderr, "specserve up: %s\n", st.message().c_str()), 2;
      }
      o->front_end = make_http_front_end(*http);
      return run_up(*o);
    });
  }
  {
    auto o = std::make_shared<NodeOptions>();
    auto* sub = app.add_subcommand("node", "Run one node of a topology: start its workers and join the head");
    sub->add_option("--join", o->join, "The head's actor endpoint HOST:PORT")->required();
    sub->add_option("--name", o->name, "This node's name in the topology")->required();
    sub->add_option("--config", o->config_path, "Topology file (the same as the head's)")->required();
    sub->add_option("--threads-per-worker", o->threads_per_worker, "CPU threads per worker (default: cores / workers)")
        ->check(CLI::Range(0, 1024));
    sub->add_flag("--exit-with-parent", o->exit_with_parent, "Stop when the parent process dies (set by `specserve up`)");
    register_command("node", [o] { return run_node(*o); });
  }
  {
    auto o = std::make_shared<WorkerOptions>();
    auto* sub = app.add_subcommand("worker", "Run one worker of a node (started by `specserve node`)");
    sub->add_option("--join", o->join, "The head's actor endpoint HOST:PORT")->required();
    sub->add_option("--node", o->node, "The node's name in the topology")->required();
    sub->add_option("--config", o->config_path, "Topology file")->required();
    sub->add_option("--index", o->index, "Position in the node's workers list")->required();
    sub->add_option("--threads", o->threads, "CPU threads (0: all cores)")->check(CLI::Range(0, 1024));
    register_command("worker", [o] { return run_worker(*o); });
  }
  {
    auto connect = std::make_shared<std::string>(), token = std::make_shared<std::string>(),
         config = std::make_shared<std::string>();
    auto json = std::make_shared<bool>(false);
    auto* sub = app.add_subcommand(
        "status",
        "Show a cluster's speculative settings, workers, replicas, queue, KV use, acceptance rate and prefix-cache hit rate. Each replica's "
        "lifecycle state (starting, loading, warming, standby, ready, draining, stopped) and seconds in it; with an "
        "autoscaler, its target, bounds, last decision and why, and the promotion / cold-start times measured from "
        "its decisions (\"-\": not measured)");
    sub->add_option("--connect", *connect, "The head's actor endpoint HOST:PORT");
    sub->add_option("--token-file", *token, "Cluster token file (default ~/.config/specserve/token)");
    sub->add_option("--config", *config, "Topology file: head endpoint and token file from it");
    sub->add_flag("--json", *json, "Print JSON");
    register_command("status", [=] { return run_status(*connect, *token, *config, *json); });
  }
  add_client_command(app);
}

}  // namespace specserve::cli
