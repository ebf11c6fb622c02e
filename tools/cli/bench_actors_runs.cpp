// `specserve bench-actors`: the overhead and concurrency measurements over the shared topology
// (bench_actors_runs.h).
#include "tools/cli/bench_actors_runs.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <thread>

#include "tools/cli/bench_actors_paths.h"

namespace specserve::cli::bench_actors {
namespace {

/// A mkdtemp directory (the topology, the cluster token, the `up` log) removed when the run
/// returns after finishing (done()); after an error it stays, and the path is printed, since the
/// errors point at its up.log. Declared before the paths, so it goes after they have stopped.
/// NOTE: it stayed without a word on every error return, and once the run ended that way the
/// error's "its log: DIR/up.log" was the only trace of it.
class RunDir {
 public:
  RunDir() {
    char tmpl[] = "/tmp/specserve-bench-actors-XXXXXX";
    if (::mkdtemp(tmpl)) path_ = tmpl;
    set_run_dir_for_signals(path_);
  }
  ~RunDir() {
    set_run_dir_for_signals("");
    if (path_.empty()) return;
    if (!done_) {
      std::fprintf(stderr, "[bench-actors] kept %s (the topology and the cluster's up.log) for a look; remove it when done\n",
                   path_.c_str());
      return;
    }
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  RunDir(const RunDir&) = delete;
  RunDir& operator=(const RunDir&) = delete;
  const std::string& path() const { return path_; }  ///< "" when mkdtemp failed
  void done() { done_ = true; }

 private:
  std::string path_;
  bool done_ = false;
};

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

// The fields both reports record about the run's setting: the topology as written and what else
// the machine did meanwhile (load average before / after, other processes' cores between c0 and c1).
void add_machine_fields(json* out, const std::string& yaml, const std::string& load0, const CpuSample& c0, const CpuSample& c1) {
  std::ifstream in(yaml);
  (*out)["topology_yaml"] = std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  (*out)["loadavg_before"] = load0;
  (*out)["loadavg_after"] = loadavg();
  (*out)["machine_during"] = others_between(c0, c1);
}

}  // namespace

// ---------------------------------------------------------------- overhead

Expected<json> run_overhead(const BenchArgs& a, const std::string& model, int threads, LoadedModel* lm, Backend* backend,
                            const std::vector<Question>& questions, const OverheadConfig& cfg, std::string* markdown) {
  // The direct Engine always runs (it is the peer); the actor paths the flags ask for.
  std::vector<std::string> paths = {"direct"};
  for (const char* p : {"actor", "network"}) {
    if (std::find(a.paths.begin(), a.paths.end(), p) != a.paths.end() && !(a.no_network && std::string(p) == "network")) {
      paths.push_back(p);
    }
  }
  if (paths.size() < 2) return invalid_argument("--paths: name at least one of actor, network");
  RunDir run_dir;
  if (run_dir.path().empty()) return internal_error(std::string("mkdtemp /tmp/specserve-bench-actors-XXXXXX: ") + std::strerror(errno));
  const std::string& dir = run_dir.path();
  std::string yaml;
  auto topo = write_topology(dir, a, model, cfg.spec, &yaml);
  if (!topo.ok()) return topo.status();
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
  add_machine_fields(&out, yaml, load0, c0, c1);
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
  run_dir.done();
  return out;
}

// ---------------------------------------------------------------- concurrency

namespace {

// Request j of a level goes to client j % N; each client submits its next request when the
// previous one finished (closed loop).
int level_requests(const BenchArgs& a, int n) { return std::max(n * a.requests_per_client, a.min_requests); }

}  // namespace

Expected<json> run_concurrency(const BenchArgs& a, const std::string& model, int threads, LoadedModel* lm, Backend* backend,
                               const std::vector<Question>& qs, const std::optional<SpeculativeSpec>& spec,
                               std::string* markdown) {
  RunDir run_dir;
  if (run_dir.path().empty()) return internal_error(std::string("mkdtemp /tmp/specserve-bench-actors-XXXXXX: ") + std::strerror(errno));
  const std::string& dir = run_dir.path();
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
  add_machine_fields(&out, yaml, load0, c0, c1);
  out["levels"] = levels;
  std::fprintf(stderr, "[bench-actors] concurrency: other processes used %.2f cores meanwhile (load %s -> %s)\n",
               out["machine_during"]["other_processes_cores"].get<double>(), load0.c_str(),
               out["loadavg_after"].get<std::string>().c_str());
  run_dir.done();
  return out;
}

}  // namespace specserve::cli::bench_actors
