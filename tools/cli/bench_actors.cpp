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
// paths, the client sweeps and the /proc probes in bench_actors_paths.{h,cpp}.
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
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
#include "tools/cli/common.h"
#include "tools/cli/output_file_lib.h"
#include "tools/cli/registry.h"
#include "tools/cli/spec_options.h"
#include "tools/cli/subcommands.h"

namespace specserve::cli {
namespace {

using namespace bench_actors;

struct BenchArgs {
  std::string model;
  std::string questions = std::string(SPECSERVE_SOURCE_DIR) + "/../shared/data/spec_bench/question.jsonl";
  std::string mode = "all";
  int threads = 0;
  int max_tokens = 128;
  int repeats = 5;
  int num_prompts = 2;
  int max_prompt_tokens = 256;
  std::vector<int> concurrency = {1, 2, 4, 8, 16, 32};
  int sweep_max_tokens = 64;
  int requests_per_client = 1;
  int min_requests = 4;
  bool processes = false;
  bool no_network = false;
  std::vector<std::string> paths = {"direct", "actor", "network"};
  bool no_sweep_direct = false;
  bool sweep_speculative = false;
  int max_num_seqs = 64;
  int max_num_batched_tokens = 2048;
  int max_model_len = 4096;
  int scheduler_threads = 0;
  double quiet_cores = 0.1;
  int retries = 1;
  double quiet_wait_s = 30;
  std::string kv_cache_bytes = "2GiB";
  std::string out;
  SpecArgs spec;
};

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

// ---------------------------------------------------------------- the topology shared by all paths

int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

// Writes DIR/cluster.yaml (one node, one target shard, loopback) and parses it back: the parsed
// Topology is what every path runs with.
Expected<Topology> write_topology(const std::string& dir, const BenchArgs& a, const std::string& model,
                                  const std::optional<SpeculativeSpec>& spec, std::string* yaml_path) {
  *yaml_path = dir + "/cluster.yaml";
  std::ofstream(*yaml_path) << "cluster: { name: bench-actors, token_file: " << dir << "/token }\n"
                            << "head: { host: 127.0.0.1, actor_port: " << free_port() << ", http_port: " << free_port() << " }\n"
                            << "models:\n  target: { path: \"" << model << "\", max_model_len: " << a.max_model_len << " }\n"
                            << speculative_yaml(spec)
                            << "nodes:\n  - { name: n0, host: 127.0.0.1, devices: [cpu], "
                               "workers: [ { role: target_shard, replica: 0, rank: 0, device: cpu } ] }\n"
                            << "scheduler: { max_num_seqs: " << a.max_num_seqs
                            << ", max_num_batched_tokens: " << a.max_num_batched_tokens
                            << ", kv_cache_bytes: " << a.kv_cache_bytes << " }\n";
  return load_topology_file(*yaml_path);
}

// ---------------------------------------------------------------- overhead

struct OverheadConfig {
  std::string name;
  std::optional<SpeculativeSpec> spec;
};

Expected<json> run_overhead(const BenchArgs& a, const std::string& model, int threads, LoadedModel* lm, Backend* backend,
                            const std::vector<Question>& questions, const OverheadConfig& cfg, std::string* markdown) {
  char tmpl[] = "/tmp/specserve-bench-actors-XXXXXX";
  if (!::mkdtemp(tmpl)) return internal_error("mkdtemp failed");
  const std::string dir = tmpl;
  std::string yaml;
  auto topo = write_topology(dir, a, model, cfg.spec, &yaml);
  if (!topo.ok()) return topo.status();
  // The direct Engine always runs (it is the peer); the actor paths the flags ask for.
  std::vector<std::string> paths = {"direct"};
  for (const char* p : {"actor", "network"}) {
    if (std::find(a.paths.begin(), a.paths.end(), p) != a.paths.end() && !(a.no_network && std::string(p) == "network")) {
      paths.push_back(p);
    }
  }
  if (paths.size() < 2) return invalid_argument("--paths: name at least one of actor, network");
  std::string names;
  for (const auto& p : paths) names += (names.empty() ? "" : ", ") + p;
  std::fprintf(stderr, "[bench-actors] overhead, speculation %s: starting the paths (%s)\n", cfg.name.c_str(), names.c_str());
  const auto has = [&](const char* p) { return std::find(paths.begin(), paths.end(), p) != paths.end(); };
  DirectPath direct;
  SPECSERVE_RETURN_IF_ERROR(direct.start(*topo, lm, backend));
  std::unique_ptr<InProcessPath> actor;
  if (has("actor")) {
    actor = std::make_unique<InProcessPath>();
    SPECSERVE_RETURN_IF_ERROR(actor->start(*topo, threads, a.scheduler_threads));
  }
  std::unique_ptr<NetworkPath> network;
  if (has("network")) {
    network = std::make_unique<NetworkPath>();
    SPECSERVE_RETURN_IF_ERROR(network->start(dir, yaml, *topo, threads, a.scheduler_threads));
  }
  const size_t np = std::min<size_t>(static_cast<size_t>(a.num_prompts), questions.size());
  auto run_path = [&](const std::string& p, size_t q, int64_t* fts, int max_tokens) -> Expected<Sample> {
    const TreeCounters c0 = tree_counters();
    Expected<Sample> s = p == "direct"  ? direct.run(questions[q].prompt, max_tokens, fts)
                         : p == "actor" ? run_client(actor->client(), "actor", questions[q].prompt, max_tokens)
                                        : run_client(network->client(), "network", questions[q].prompt, max_tokens);
    const TreeCounters c1 = tree_counters();
    if (s.ok()) {
      s->cost.cpu_s = c1.cpu_s - c0.cpu_s;
      s->cost.voluntary = c1.voluntary - c0.voluntary;
      s->cost.involuntary = c1.involuntary - c0.involuntary;
      const double wall = std::chrono::duration<double>(c1.at - c0.at).count();
      s->others_cores = std::max(0.0, (c1.busy_s - c0.busy_s) - s->cost.cpu_s) / std::max(wall, 1e-9);
    }
    return s;
  };
  // Warm-up: a short request per prompt and path (first-touch allocations, the middleman's
  // connection); the direct Engine's full-length output is the reference.
  std::vector<int64_t> first_token_steps(np, 1);
  std::vector<std::vector<int32_t>> reference(np);
  for (size_t q = 0; q < np; ++q) {
    for (const auto& p : paths) {
      auto s = run_path(p, q, nullptr, std::min(a.max_tokens, 16));
      if (!s.ok()) return Status(s.status().code(), "warm-up, " + p + ": " + s.status().message());
    }
    auto s = run_path("direct", q, &first_token_steps[q], a.max_tokens);
    if (!s.ok()) return Status(s.status().code(), "reference, direct: " + s.status().message());
    reference[q] = s->output;
  }
  std::fprintf(stderr, "[bench-actors] overhead, speculation %s: warmed up; %d repeats x %zu prompts x %zu paths, %d tokens each\n",
               cfg.name.c_str(), a.repeats, np, paths.size(), a.max_tokens);
  // The runtimes idle (every path started, nothing submitted): what they cost the other paths.
  json idle;
  {
    const TreeCounters i0 = tree_counters();
    const auto t0 = Clock::now();
    std::this_thread::sleep_for(std::chrono::seconds(2));
    const TreeCounters i1 = tree_counters();
    const double w = since(t0);
    idle = {{"cores", (i1.cpu_s - i0.cpu_s) / w},
            {"context_switches_per_s", static_cast<double>(i1.voluntary - i0.voluntary + i1.involuntary - i0.involuntary) / w}};
  }
  const CpuSample c0 = cpu_sample();
  const std::string load0 = loadavg();
  json runs = json::array();
  std::vector<Unit> units;
  int mismatches = 0, retried = 0;
  double waited = 0;
  for (int r = 0; r < a.repeats; ++r) {
    for (size_t q = 0; q < np; ++q) {
      for (int attempt = 0;; ++attempt) {
        if (a.quiet_wait_s > 0) waited += wait_for_quiet(a.quiet_cores, a.quiet_wait_s);
        Unit u;
        u.repeat = r;
        u.prompt = q;
        u.decode_steps_offset = first_token_steps[q];
        std::string line;
        // Rotate the order so that no path always runs first or last.
        for (size_t k = 0; k < paths.size(); ++k) {
          const std::string& p = paths[(k + static_cast<size_t>(r) + q) % paths.size()];
          auto s = run_path(p, q, nullptr, a.max_tokens);
          if (!s.ok()) return Status(s.status().code(), p + ": " + s.status().message());
          if (s->steps <= 0) return internal_error(p + ": no steps counted");
          const bool match = s->output == reference[q];
          mismatches += !match;
          u.others_max = std::max(u.others_max, s->others_cores);
          runs.push_back({{"repeat", r}, {"prompt", q}, {"attempt", attempt}, {"question_id", questions[q].id},
                          {"path", p}, {"seconds", s->seconds}, {"ttft_s", s->ttft_s}, {"tokens", s->tokens},
                          {"steps", s->steps}, {"forward_s", s->forward_s}, {"draft_s", s->draft_s},
                          {"cpu_s", s->cost.cpu_s}, {"voluntary_context_switches", s->cost.voluntary},
                          {"involuntary_context_switches", s->cost.involuntary},
                          {"other_processes_cores", s->others_cores}, {"matches_direct", match}});
          char buf[160];
          std::snprintf(buf, sizeof buf, "  %s %.3f s", p.c_str(), s->seconds);
          line += buf;
          u.s[p] = std::move(*s);
        }
        u.quiet = u.others_max <= a.quiet_cores;
        std::fprintf(stderr, "[bench-actors] %s repeat %d/%d prompt %zu/%zu:%s  (%lld steps; other processes %.2f cores%s)\n",
                     cfg.name.c_str(), r + 1, a.repeats, q + 1, np, line.c_str(),
                     static_cast<long long>(u.s["direct"].steps), u.others_max, u.quiet ? "" : ": noisy");
        units.push_back(std::move(u));
        if (units.back().quiet || attempt >= a.retries) break;
        ++retried;
      }
    }
  }
  const CpuSample c1 = cpu_sample();
  json out;
  out["speculation"] = cfg.name;
  out["topology_yaml"] = [&] {
    std::ifstream in(yaml);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  }();
  out["loadavg_before"] = load0;
  out["loadavg_after"] = loadavg();
  out["machine_during"] = others_between(c0, c1);
  out["runtimes_idle"] = idle;
  out["greedy_mismatches"] = mismatches;
  out["quiet_cores_threshold"] = a.quiet_cores;
  out["units"] = units.size();
  int num_quiet = 0;
  for (const auto& u : units) num_quiet += u.quiet;
  out["quiet_units"] = num_quiet;
  out["retried_units"] = retried;
  out["seconds_waited_for_quiet"] = waited;
  out["runs"] = runs;
  out["summary_all"] = summarize(units, paths, false);
  out["summary_quiet"] = summarize(units, paths, true);
  // The table reports the quiet units when there are enough of them.
  const bool use_quiet = num_quiet >= std::max(3, static_cast<int>(units.size()) / 2);
  out["table_from"] = use_quiet ? "quiet units" : "all units";
  const json& summary = use_quiet ? out["summary_quiet"] : out["summary_all"];
  char buf[600];
  for (const auto& p : paths) {
    const json& s = summary[p];
    auto pct = [](const json& sp) {
      char b[96];
      std::snprintf(b, sizeof b, "%+.2f%% (median %+.2f) [%+.2f, %+.2f]", sp["mean"].get<double>() * 100,
                    sp["median"].get<double>() * 100, sp["min"].get<double>() * 100, sp["max"].get<double>() * 100);
      return std::string(b);
    };
    const bool is_base = p == "direct";
    const std::string units_cell = std::to_string(use_quiet ? num_quiet : static_cast<int>(units.size())) + " of " +
                                   std::to_string(units.size()) + (use_quiet ? " (quiet)" : num_quiet < static_cast<int>(units.size()) ? " (all; noisy)" : " (all)");
    std::snprintf(buf, sizeof buf, "| %s | %s | %s | %.2f | %.2f | %.2f | %.2f | %.3f | %.1f | %.1f / %.1f | %s | %s | %s |\n",
                  cfg.name.c_str(),
                  p == "direct" ? "direct Engine" : p == "actor" ? "actors, one process" : "actors, worker process + loopback",
                  units_cell.c_str(), s["ms_per_output_token"].get<double>(), s["ms_per_step"].get<double>(),
                  s["tokens_per_step"].get<double>(), s["forward_ms_per_step"].get<double>(),
                  s["outside_engine_ms_per_step"].get<double>(), s["cpu_ms_per_step"].get<double>(),
                  s["voluntary_context_switches_per_step"].get<double>(),
                  s["involuntary_context_switches_per_step"].get<double>(),
                  is_base ? "peer" : pct(s["overhead_vs_direct"]).c_str(),
                  is_base ? "peer" : pct(s["decode_overhead_vs_direct"]).c_str(),
                  is_base ? "-"
                          : (std::to_string(static_cast<int>(std::lround(s["overhead_us_per_step"]["median"].get<double>()))) + " µs")
                                .c_str());
    *markdown += buf;
  }
  if (out["machine_during"]["other_processes_cores"].get<double>() > 0.1) {
    std::fprintf(stderr, "[bench-actors] WARNING: other processes kept %.2f cores busy: the paths competed with them for "
                 "the CPU, and the spread below is mostly theirs\n", out["machine_during"]["other_processes_cores"].get<double>());
  }
  std::fprintf(stderr, "[bench-actors] overhead, speculation %s: other processes used %.2f cores meanwhile (load %s -> %s); "
               "greedy mismatches %d\n",
               cfg.name.c_str(), out["machine_during"]["other_processes_cores"].get<double>(), load0.c_str(),
               out["loadavg_after"].get<std::string>().c_str(), mismatches);
  std::error_code ec;
  network.reset();
  std::filesystem::remove_all(dir, ec);
  return out;
}

// ---------------------------------------------------------------- concurrency

// Request j of a level goes to client j % N; each client submits its next request when the
// previous one finished (closed loop).
int level_requests(const BenchArgs& a, int n) { return std::max(n * a.requests_per_client, a.min_requests); }

Expected<json> run_concurrency(const BenchArgs& a, const std::string& model, int threads, LoadedModel* lm, Backend* backend,
                               const std::vector<Question>& qs, const std::optional<SpeculativeSpec>& spec,
                               std::string* markdown) {
  char tmpl[] = "/tmp/specserve-bench-actors-XXXXXX";
  if (!::mkdtemp(tmpl)) return internal_error("mkdtemp failed");
  const std::string dir = tmpl;
  std::string yaml;
  auto topo = write_topology(dir, a, model, spec, &yaml);
  if (!topo.ok()) return topo.status();
  const std::string actor_name = a.processes ? "network" : "actor";
  std::fprintf(stderr, "[bench-actors] concurrency: starting the %s\n",
               a.processes ? "cluster (`specserve up`: worker process, client over loopback)" : "in-process actors");
  std::unique_ptr<DirectPath> direct;
  if (!a.no_sweep_direct) {
    direct = std::make_unique<DirectPath>();
    SPECSERVE_RETURN_IF_ERROR(direct->start(*topo, lm, backend));
  }
  std::unique_ptr<InProcessPath> inproc;
  std::unique_ptr<NetworkPath> network;
  Client* client = nullptr;
  if (a.processes) {
    network = std::make_unique<NetworkPath>();
    SPECSERVE_RETURN_IF_ERROR(network->start(dir, yaml, *topo, threads, a.scheduler_threads));
    client = &network->client();
  } else {
    inproc = std::make_unique<InProcessPath>();
    SPECSERVE_RETURN_IF_ERROR(inproc->start(*topo, threads, a.scheduler_threads));
    client = &inproc->client();
  }
  // Warm-up: a short batch on each.
  {
    const int w = std::min(4, a.concurrency.empty() ? 1 : *std::max_element(a.concurrency.begin(), a.concurrency.end()));
    sweep_clients(*client, qs, w, w, 8);
    if (direct) {
      auto r = sweep_direct(direct->engine(), qs, w, w, 8);
      if (!r.ok()) return r.status();
    }
  }
  const CpuSample c0 = cpu_sample();
  const std::string load0 = loadavg();
  json levels = json::array();
  for (int n : a.concurrency) {
    const int requests = level_requests(a, n);
    json lv;
    lv["clients"] = n;
    std::string line;
    LevelResult d;
    if (direct) {
      if (a.quiet_wait_s > 0) wait_for_quiet(a.quiet_cores, a.quiet_wait_s);
      const CpuSample m0 = cpu_sample();
      auto r = sweep_direct(direct->engine(), qs, n, requests, a.sweep_max_tokens);
      if (!r.ok()) return r.status();
      d = *r;
      lv["direct"] = d.to_json();
      lv["direct"]["machine_during"] = others_between(m0, cpu_sample());
    }
    if (a.quiet_wait_s > 0) wait_for_quiet(a.quiet_cores, a.quiet_wait_s);
    const CpuSample m0 = cpu_sample();
    LevelResult x = sweep_clients(*client, qs, n, requests, a.sweep_max_tokens);
    lv[actor_name] = x.to_json();
    lv[actor_name]["machine_during"] = others_between(m0, cpu_sample());
    double others = lv[actor_name]["machine_during"]["other_processes_cores"].get<double>();
    if (direct) others = std::max(others, lv["direct"]["machine_during"]["other_processes_cores"].get<double>());
    levels.push_back(lv);
    const double xt = x.seconds > 0 ? x.tokens / x.seconds : 0;
    const double dt = d.seconds > 0 ? d.tokens / d.seconds : 0;
    char buf[400];
    const Spread xs = spread(x.ttft), ds = spread(d.ttft);
    if (direct) {
      std::snprintf(buf, sizeof buf, "| %d | %d | %.1f | %.1f | %.3f | %.0f | %.0f | %.3f | %.2f | %d |\n", n, requests, xt,
                    dt, dt > 0 ? xt / dt : 0.0, xs.mean * 1e3, ds.mean * 1e3, ds.mean > 0 ? xs.mean / ds.mean : 0.0, others,
                    x.errors);
    } else {
      std::snprintf(buf, sizeof buf, "| %d | %d | %.1f | - | - | %.0f | - | - | %.2f | %d |\n", n, requests, xt,
                    xs.mean * 1e3, others, x.errors);
    }
    *markdown += buf;
    std::fprintf(stderr, "[bench-actors] concurrency %2d clients, %3d requests: %s %.1f tokens/s (mean TTFT %.0f ms)%s\n", n,
                 requests, actor_name.c_str(), xt, xs.mean * 1e3,
                 direct ? (", direct " + std::to_string(static_cast<int>(std::lround(dt))) + " tokens/s (mean TTFT " +
                           std::to_string(static_cast<int>(std::lround(ds.mean * 1e3))) + " ms)").c_str()
                        : "");
    if (x.errors) return internal_error(std::to_string(x.errors) + " request(s) failed at concurrency " + std::to_string(n));
  }
  const CpuSample c1 = cpu_sample();
  json out;
  out["path"] = actor_name;
  out["speculation"] = spec ? speculative_yaml(spec) : "off";
  out["topology_yaml"] = [&] {
    std::ifstream in(yaml);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  }();
  out["loadavg_before"] = load0;
  out["loadavg_after"] = loadavg();
  out["machine_during"] = others_between(c0, c1);
  out["levels"] = levels;
  std::fprintf(stderr, "[bench-actors] concurrency: other processes used %.2f cores meanwhile (load %s -> %s)\n",
               out["machine_during"]["other_processes_cores"].get<double>(), load0.c_str(),
               out["loadavg_after"].get<std::string>().c_str());
  network.reset();
  inproc.reset();
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
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
  json report;
  report["command"] = "specserve bench-actors";
  report["model"] = model;
  report["threads"] = threads;
  report["max_tokens"] = a.max_tokens;
  report["repeats"] = a.repeats;
  report["num_prompts"] = a.num_prompts;
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
  sub->add_option("--paths", a->paths,
                  "Overhead: the paths to start and interleave: direct (always), actor (in-process actors), network "
                  "(`specserve up`, target shard in a worker process, client over loopback). Each started path's "
                  "runtime stays up (idle) while the others run")
      ->delimiter(',')
      ->check(CLI::IsMember({"direct", "actor", "network"}));
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
  sub->add_option("--concurrency", a->concurrency, "Concurrency: numbers of clients (e.g. 1,2,4,8,16,32)")
      ->delimiter(',')
      ->check(CLI::Range(1, 4096));
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
