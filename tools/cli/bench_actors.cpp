// `specserve bench-actors`: what the actor runtime costs on top of the Engine, and how output
// tokens/s grow with the number of concurrent clients.
//
//   overhead:    the same greedy requests at batch 1 through (a) the Engine called directly
//                (add_request + step loop), (b) the actor path in this process (Head + target
//                shard actor + in-process Client) and (c) the actor path over loopback (`specserve
//                up` in a child process: head there, the target shard in its own worker process,
//                the Client here connected over the CAF middleman). Runs are interleaved
//                (a, b, c rotate) and repeated; overhead = (actor - direct) / direct per repeat.
//                Steps come from EngineStats (direct) and ShardLoad::num_steps via ClusterStatus
//                (actors), so the overhead is also given per step. Once without speculation, once
//                with the speculative flags (default: n-gram, k = 4, lookup 1..5).
//   concurrency: N clients (threads) in a closed loop, each submitting Spec-Bench questions
//                (first turn, chat template), greedy; total output tokens/s and time to first
//                token, for the actor path and, as the peer, the Engine driven directly with the
//                same closed loop.
//
// All three paths get one topology (written as YAML, parsed by the same code `up` uses), so the
// engine options, the proposer and the CPU threads of the target are the same in each.
// NOTE: CPU time of every other process during each phase is measured from /proc and printed,
// because on a shared 2-core machine a neighbour's build is the largest error term.
//
// The pure parts (records, statistics, summaries) are in bench_actors_lib.{h,cpp}; the three
// paths, the client sweeps and the /proc probes in bench_actors_paths.{h,cpp}; the two
// measurements over the shared topology, and the flags they read, in bench_actors_runs.{h,cpp}.
#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "config/topology.h"
#include "cpu/cpu_backend.h"
#include "model/chat_template.h"
#include "spec/engine.h"
#include "tools/cli/bench_actors_lib.h"
#include "tools/cli/bench_actors_paths.h"
#include "tools/cli/bench_actors_runs.h"
#include "tools/cli/common.h"
#include "tools/cli/output_file_lib.h"
#include "tools/cli/registry.h"
#include "tools/cli/spec_options.h"
#include "tools/cli/subcommands.h"

namespace specserve::cli {
namespace {

using namespace bench_actors;

// ---------------------------------------------------------------- prompts

// Spec-Bench questions, round-robin over its six tasks (mt_bench, translation, summarization, qa,
// math_reasoning, rag), those with more than `max_prompt_tokens` prompt tokens left out.
Expected<std::vector<Question>> load_questions(const std::string& path, const LoadedModel& lm, int max_prompt_tokens,
                                               int* skipped) {
  std::ifstream in(path);
  if (!in) return not_found("--questions: cannot read " + path);
  std::map<std::string, std::vector<Question>> by_task;
  std::string line;
  int lineno = 0;
  *skipped = 0;
  while (std::getline(in, line)) {
    ++lineno;
    if (line.empty()) continue;
    json j;
    try {
      j = json::parse(line);
    } catch (const std::exception& e) {
      return invalid_argument("--questions: " + path + ":" + std::to_string(lineno) + ": malformed JSON: " + e.what());
    }
    if (!j.contains("turns") || !j["turns"].is_array() || j["turns"].empty() || !j.contains("category")) {
      return invalid_argument("--questions: " + path + ":" + std::to_string(lineno) + ": needs 'category' and a non-empty 'turns'");
    }
    Question q;
    q.id = j.value("question_id", lineno);
    q.task = task_of(j["category"].get<std::string>());
    q.text = j["turns"][0].get<std::string>();
    auto text = apply_chat_template(*lm.file, {{"user", q.text}}, true);
    if (!text.ok()) return text.status();
    // The scheduler's tokenization of `messages` (actors/scheduler.cpp to_work_item).
    q.prompt = lm.tokenizer->encode(*text, /*add_special=*/true, /*parse_special=*/true);
    if (static_cast<int>(q.prompt.size()) > max_prompt_tokens) {
      ++*skipped;
      continue;
    }
    by_task[q.task].push_back(std::move(q));
  }
  std::vector<Question> out;
  const char* order[] = {"mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag"};
  for (size_t i = 0;; ++i) {
    bool any = false;
    for (const char* t : order) {
      auto& v = by_task[t];
      if (i < v.size()) out.push_back(v[i]), any = true;
    }
    if (!any) break;
  }
  if (out.empty()) return invalid_argument("--questions: no question of " + path + " has <= " + std::to_string(max_prompt_tokens) + " prompt tokens");
  return out;
}

// ---------------------------------------------------------------- main

int fail(const Status& st) {
  std::fprintf(stderr, "specserve bench-actors: %s\n", st.message().c_str());
  return 1;
}

int run_bench(const BenchArgs& a) {
  if (a.mode != "overhead" && a.mode != "concurrency" && a.mode != "all") {
    return fail(invalid_argument("--mode " + a.mode + ": one of overhead, concurrency, all"));
  }
  if (!a.out.empty()) {
    if (Status st = check_output_file("--out", a.out); !st.ok()) return fail(st);
  }
  ::signal(SIGPIPE, SIG_IGN);
  ::signal(SIGINT, stop_up_and_exit);
  ::signal(SIGTERM, stop_up_and_exit);
  ::setenv("SPECSERVE_LOG_LEVEL", "warn", /*overwrite=*/0);  // the shards' info lines would bury the progress
  const std::string model = std::filesystem::absolute(a.model.empty() ? default_model_path() : a.model).string();
  const int threads = a.threads > 0 ? a.threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  // The speculative configuration: the flags, or n-gram k = 4 with lookup 1..5 (bench/results' setting).
  EngineOptions eo;
  eo.max_model_len = a.max_model_len;
  auto parsed = parse_spec_args(a.spec, &eo);
  if (!parsed.ok()) return fail(parsed.status());
  SpeculativeSpec spec;
  if (parsed->has_value()) {
    spec = **parsed;
    if (eo.disable_by_batch_size > 0) spec.disable_by_batch_size = eo.disable_by_batch_size;
  } else {
    spec.method = SpeculativeMethod::kNgram;
    spec.num_speculative_tokens = 4;
    spec.prompt_lookup_min = 1;
    spec.prompt_lookup_max = 5;
  }
  std::fprintf(stderr, "[bench-actors] model %s, %d threads for the target, load average %s\n", model.c_str(), threads,
               loadavg().c_str());
  auto backend = make_cpu_backend(threads);
  auto lm = load_model(model, *backend, /*quiet=*/true);
  if (!lm.ok()) return fail(lm.status());
  int skipped = 0;
  auto qs = load_questions(a.questions, *lm, a.max_prompt_tokens, &skipped);
  if (!qs.ok()) return fail(qs.status());
  std::fprintf(stderr, "[bench-actors] %zu Spec-Bench questions with <= %d prompt tokens (%d longer ones left out)\n",
               qs->size(), a.max_prompt_tokens, skipped);
  if (static_cast<size_t>(a.num_prompts) > qs->size() && (a.mode == "overhead" || a.mode == "all")) {
    // NOTE: it ran the smaller number under the larger one's name without a word.
    std::fprintf(stderr, "[bench-actors] warning: --prompts %d but only %zu questions are left: the overhead runs use %zu\n",
                 a.num_prompts, qs->size(), qs->size());
  }
  json report;
  report["command"] = "specserve bench-actors";
  report["model"] = model;
  report["threads"] = threads;
  report["max_tokens"] = a.max_tokens;
  report["repeats"] = a.repeats;
  report["num_prompts"] = std::min<size_t>(static_cast<size_t>(a.num_prompts), qs->size());  // used (--prompts capped)
  report["max_prompt_tokens"] = a.max_prompt_tokens;
  report["questions_left_out"] = skipped;
  report["sweep_max_tokens"] = a.sweep_max_tokens;
  report["hardware_concurrency"] = std::thread::hardware_concurrency();
  report["scheduler_threads"] = a.scheduler_threads;
  report["paths"] = a.paths;
  report["loadavg_start"] = loadavg();
  std::string md;
  const auto t_start = Clock::now();
  if (a.mode == "overhead" || a.mode == "all") {
    std::string rows;
    json ov = json::array();
    for (const OverheadConfig& cfg : {OverheadConfig{"off", std::nullopt}, OverheadConfig{spec_name(spec), spec}}) {
      auto r = run_overhead(a, model, threads, &*lm, backend.get(), *qs, cfg, &rows);
      if (!r.ok()) return fail(r.status());
      ov.push_back(*r);
    }
    report["overhead"] = ov;
    char head[400];
    const size_t np = std::min<size_t>(static_cast<size_t>(a.num_prompts), qs->size());
    std::snprintf(head, sizeof head,
                  "\n## Control overhead at batch 1: greedy, %zu Spec-Bench prompts x %d repeats (interleaved), %d tokens, "
                  "%d threads\n\n",
                  np, a.repeats, a.max_tokens, threads);
    md += head;
    md += "| speculation | path | units | ms / output token | ms / step | tokens / step | target forward ms / step | "
          "outside forward+draft ms / step | CPU ms / step (process tree) | context switches / step (voluntary / involuntary) | "
          "overhead vs direct, mean (median) [min, max] | decode-phase overhead | overhead per step (median) |\n";
    md += "|---|---|---|---|---|---|---|---|---|---|---|---|---|\n";
    md += rows;
    int mism = 0;
    for (const auto& o : ov) mism += o["greedy_mismatches"].get<int>();
    char tail[1400];
    std::snprintf(tail, sizeof tail,
                  "\nA unit is one prompt through every path back to back (order rotated). Overhead: (actor - direct) / "
                  "direct wall time of each unit (submit to last token, prefill included); decode phase: after the first "
                  "token. Overhead per step: the wall-time difference over the unit's engine steps (EngineStats / "
                  "ShardLoad::num_steps). Quiet: other processes used <= %.2f cores during each run of the unit (before each "
                  "unit the benchmark waited up to %.0f s for that; noisy units were run again up to %d time(s)). CPU and context switches: every thread of this process and its "
                  "children (the `up` tree), idle runtimes of the other paths included. Greedy outputs differing from the "
                  "direct Engine's: %d.\n",
                  a.quiet_cores, a.quiet_wait_s, a.retries, mism);
    md += tail;
    for (const auto& o : ov) {
      char b[500];
      std::snprintf(b, sizeof b,
                    "Speculation %s: %d of %d units quiet; other processes used %.2f cores on average during the runs "
                    "(load average %s before); the runtimes idle (all paths up, nothing submitted) used %.3f cores and "
                    "%.0f context switches/s.\n",
                    o["speculation"].get<std::string>().c_str(), o["quiet_units"].get<int>(), o["units"].get<int>(),
                    o["machine_during"]["other_processes_cores"].get<double>(), o["loadavg_before"].get<std::string>().c_str(),
                    o["runtimes_idle"]["cores"].get<double>(), o["runtimes_idle"]["context_switches_per_s"].get<double>());
      md += b;
    }
  }
  if (a.mode == "concurrency" || a.mode == "all") {
    std::string rows;
    std::optional<SpeculativeSpec> sweep_spec;
    if (a.sweep_speculative) sweep_spec = spec;
    auto r = run_concurrency(a, model, threads, &*lm, backend.get(), *qs, sweep_spec, &rows);
    if (!r.ok()) return fail(r.status());
    report["concurrency"] = *r;
    char head[400];
    std::snprintf(head, sizeof head,
                  "\n## Output tokens/s vs concurrent clients: %s, speculation %s, greedy, %d tokens per request, "
                  "%d threads\n\n",
                  a.processes ? "actors with the target shard in a worker process, client over loopback"
                              : "actors in one process",
                  a.sweep_speculative ? spec_name(spec).c_str() : "off", a.sweep_max_tokens, threads);
    md += head;
    md += "| clients | requests | actor tokens/s | direct tokens/s | actor / direct | actor mean TTFT ms | "
          "direct mean TTFT ms | TTFT actor / direct | other processes (cores, max of the two runs) | errors |\n"
          "|---|---|---|---|---|---|---|---|---|---|\n";
    md += rows;
    char b[600];
    std::snprintf(b, sizeof b,
                  "\nEach client (a thread) submits its next request when the previous one finished; request j goes to "
                  "client j mod N and asks Spec-Bench question j of the round-robin over the six tasks (first turn, "
                  "chat template; questions over %d prompt tokens left out). Direct: the Engine with the same closed "
                  "loop and engine options. Other processes used %.2f cores during the sweep.\n",
                  a.max_prompt_tokens, (*r)["machine_during"]["other_processes_cores"].get<double>());
    md += b;
  }
  report["seconds"] = since(t_start);
  report["loadavg_end"] = loadavg();
  report["markdown"] = md;
  std::printf("%s", md.c_str());
  std::fflush(stdout);
  if (!a.out.empty()) {
    if (Status st = write_output_file("--out", a.out, report.dump(1) + "\n"); !st.ok()) return fail(st);
    std::fprintf(stderr, "[bench-actors] wrote %s (%.0f s)\n", a.out.c_str(), report["seconds"].get<double>());
  }
  return 0;
}

}  // namespace

void add_bench_actors(CLI::App& app) {
  auto a = std::make_shared<BenchArgs>();
  auto* sub = app.add_subcommand(
      "bench-actors",
      "Control overhead of the actor path against the Engine at batch 1, and output tokens/s vs concurrent clients (a benchmark)");
  sub->add_option("--mode", a->mode, "overhead | concurrency | all")->check(CLI::IsMember({"overhead", "concurrency", "all"}));
  sub->add_option("--model", a->model, "Target GGUF (default: the fetched SmolLM2-135M-Instruct)")->check(non_empty_path());
  sub->add_option("--questions", a->questions,
                  "Spec-Bench question.jsonl (default: ../shared/data/spec_bench/question.jsonl beside the checkout)");
  sub->add_option("--threads", a->threads, "CPU threads of the target in every path (default: all cores)")
      ->check(CLI::Range(0, 1024));
  sub->add_option("--max-tokens", a->max_tokens, "Overhead: tokens per request (ignore_eos)")->check(CLI::Range(1, 4096));
  sub->add_option("--repeats", a->repeats, "Overhead: interleaved repeats")->check(CLI::Range(1, 1000));
  sub->add_option("--prompts", a->num_prompts, "Overhead: prompts per repeat (the first N of the task round-robin)")
      ->check(CLI::Range(1, 480));
  sub->add_option("--max-prompt-tokens", a->max_prompt_tokens, "Leave out questions with longer prompts (prefill on 2 cores is slow)")
      ->check(CLI::Range(8, 1 << 20));
  add_list_option(sub, "--paths",
                  "Overhead: the paths to start and interleave: direct (always), actor (in-process actors), network "
                  "(`specserve up`, target shard in a worker process, client over loopback). Each started path's "
                  "runtime stays up (idle) while the others run",
                  CLI::IsMember({"direct", "actor", "network"}), [a](const std::vector<std::string>& v) { a->paths = v; });
  sub->add_flag("--no-network", a->no_network, "Overhead: skip path (c), the target shard in a worker process");
  sub->add_option("--quiet-cores", a->quiet_cores,
                  "Overhead: a unit (one prompt through every path) is quiet when other processes used at most this many "
                  "cores during each of its runs; the table reports the quiet units when at least half are")
      ->check(CLI::Range(0.0, 1024.0));
  sub->add_option("--retries", a->retries, "Overhead: times a noisy unit is run again")->check(CLI::Range(0, 100));
  sub->add_option("--quiet-wait", a->quiet_wait_s,
                  "Before each overhead unit and each concurrency run, wait up to this many seconds for other "
                  "processes to use at most --quiet-cores (0: do not wait)")
      ->check(CLI::Range(0.0, 3600.0));
  add_list_option(sub, "--concurrency", "Concurrency: numbers of clients (e.g. 1,2,4,8,16,32)", int64_in_range(1, 4096),
                  [a](const std::vector<std::string>& v) {
                    a->concurrency.clear();
                    for (const std::string& x : v) a->concurrency.push_back(std::stoi(x));
                  });
  sub->add_option("--sweep-max-tokens", a->sweep_max_tokens, "Concurrency: tokens per request (ignore_eos)")
      ->check(CLI::Range(1, 4096));
  sub->add_option("--requests-per-client", a->requests_per_client,
                  "Concurrency: requests per client at each level (at least --min-requests in all)")
      ->check(CLI::Range(1, 1000));
  sub->add_option("--min-requests", a->min_requests, "Concurrency: requests per level at least")->check(CLI::Range(1, 100000));
  sub->add_flag("--processes", a->processes,
                "Concurrency: run the target shard in a worker process (`specserve up`), the clients over loopback");
  sub->add_flag("--no-sweep-direct", a->no_sweep_direct, "Concurrency: skip the direct-Engine peer");
  sub->add_flag("--sweep-speculative", a->sweep_speculative, "Concurrency: with the speculative configuration (default: off)");
  sub->add_option("--max-num-seqs", a->max_num_seqs, "Engine: sequences running at once")->check(CLI::Range(1, 4096));
  sub->add_option("--max-num-batched-tokens", a->max_num_batched_tokens, "Engine: tokens per forward pass")
      ->check(CLI::Range(1, 1 << 20));
  sub->add_option("--max-model-len", a->max_model_len, "Engine: context length")->check(CLI::Range(16, 1 << 20));
  sub->add_option("--kv-cache-bytes", a->kv_cache_bytes, "Engine: KV cache size (e.g. 2GiB)");
  sub->add_option("--scheduler-threads", a->scheduler_threads,
                  "CAF worker threads of this process's actor systems (in-process head and shard, the client); "
                  "0: CAF's default (cores). `up`'s processes keep their default")
      ->check(CLI::Range(0, 1024));
  sub->add_option("--out", a->out, "Write the results as JSON here");
  add_spec_options(*sub, &a->spec);
  sub->footer(
      "The overhead runs once without speculation and once with the speculative flags (default: "
      "{\"method\":\"ngram\",\"num_speculative_tokens\":4,\"prompt_lookup_min\":1,\"prompt_lookup_max\":5}).\n"
      "Progress goes to stderr, the Markdown tables to stdout. bench/run_actor_bench.sh records a run.");
  register_command("bench-actors", [a] { return run_bench(*a); });
}

}  // namespace specserve::cli
