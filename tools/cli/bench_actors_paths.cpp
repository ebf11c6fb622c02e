// `specserve bench-actors`: the three paths, the client sweeps and the /proc probes
// (bench_actors_paths.h).
#include "tools/cli/bench_actors_paths.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

#include "actors/proposer_factory.h"
#include "actors/target_shard.h"
#include "actors/worker_config.h"

namespace specserve::cli::bench_actors {
namespace {

const char* kInProcessToken = "bench-actors-in-process-token";

// The running `up` child, for the signal handler: a benchmark stopped by SIGINT/SIGTERM takes
// its cluster with it instead of leaving it orphaned.
std::atomic<pid_t> g_up_pid{-1};
// The run's folder, for the handler's message: a fixed buffer the handler reads only while
// g_run_dir_set says it is whole (filled first, then published).
char g_run_dir[1024] = {};
std::atomic<bool> g_run_dir_set{false};

std::map<int, std::pair<int, double>> proc_table() {  // pid -> (ppid, utime + stime seconds)
  std::map<int, std::pair<int, double>> t;
  const double hz = static_cast<double>(::sysconf(_SC_CLK_TCK));
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/proc", ec)) {
    const std::string name = e.path().filename().string();
    if (name.empty() || !std::all_of(name.begin(), name.end(), ::isdigit)) continue;
    std::ifstream in(e.path() / "stat");
    std::string line;
    if (!std::getline(in, line)) continue;
    const size_t rp = line.rfind(')');
    if (rp == std::string::npos) continue;
    std::istringstream rest(line.substr(rp + 2));
    std::vector<std::string> f;
    std::string x;
    while (rest >> x && f.size() < 13) f.push_back(x);
    if (f.size() < 13) continue;
    t[std::stoi(name)] = {std::stoi(f[1]), (std::stod(f[11]) + std::stod(f[12])) / hz};
  }
  return t;
}

// The machine's CPU seconds by kind (/proc/stat's "cpu" line: user, nice, system, idle, iowait,
// irq, softirq, steal, guest, guest_nice), every core.
std::array<double, 10> cpu_seconds() {
  const double hz = static_cast<double>(::sysconf(_SC_CLK_TCK));
  std::ifstream in("/proc/stat");
  std::string cpu;
  std::array<double, 10> v{};
  in >> cpu;
  for (double& x : v) in >> x;
  for (double& x : v) x /= hz;
  return v;
}

// user + nice + system + irq + softirq of cpu_seconds().
double busy_seconds(const std::array<double, 10>& v) { return v[0] + v[1] + v[2] + v[5] + v[6]; }

// This process and its descendants among the pids of `t` (proc_table()).
std::set<int> tree_pids(const std::map<int, std::pair<int, double>>& t) {
  std::set<int> ours = {static_cast<int>(::getpid())};
  for (bool grew = true; grew;) {
    grew = false;
    for (const auto& [pid, e] : t) {
      if (!ours.count(pid) && ours.count(e.first)) grew = ours.insert(pid).second;
    }
  }
  return ours;
}

}  // namespace

CpuSample cpu_sample() {
  CpuSample s;
  const auto v = cpu_seconds();
  s.busy_s = busy_seconds(v);
  s.steal_s = v[7];
  const auto t = proc_table();
  for (int pid : tree_pids(t)) {
    auto it = t.find(pid);
    if (it != t.end()) s.ours_s += it->second.second;
  }
  return s;
}

TreeCounters tree_counters() {
  TreeCounters c;
  c.busy_s = busy_seconds(cpu_seconds());
  const auto t = proc_table();
  for (int pid : tree_pids(t)) {
    auto it = t.find(pid);
    if (it != t.end()) c.cpu_s += it->second.second;
    std::error_code ec;
    for (const auto& task : std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/task", ec)) {
      std::ifstream in(task.path() / "status");
      std::string line;
      while (std::getline(in, line)) {
        if (line.rfind("voluntary_ctxt_switches:", 0) == 0) c.voluntary += std::stoll(line.substr(24));
        if (line.rfind("nonvoluntary_ctxt_switches:", 0) == 0) c.involuntary += std::stoll(line.substr(27));
      }
    }
  }
  return c;
}

double wait_for_quiet(double max_cores, double max_wait_s) {
  const auto t0 = Clock::now();
  bool said = false;
  for (;;) {
    const TreeCounters a = tree_counters();
    std::this_thread::sleep_for(std::chrono::seconds(1));
    const TreeCounters b = tree_counters();
    const double wall = std::chrono::duration<double>(b.at - a.at).count();
    const double others = std::max(0.0, (b.busy_s - a.busy_s) - (b.cpu_s - a.cpu_s)) / wall;
    if (others <= max_cores || since(t0) >= max_wait_s) {
      if (said) std::fprintf(stderr, "\n");
      return since(t0) - wall;
    }
    std::fprintf(stderr, "\r[bench-actors] other processes use %.2f cores: waiting for quiet (%.0f s of at most %.0f)", others,
                 since(t0), max_wait_s);
    said = true;
  }
}

std::string loadavg() {
  std::ifstream in("/proc/loadavg");
  std::string a, b, c;
  in >> a >> b >> c;
  return a + " " + b + " " + c;
}

Status DirectPath::start(const Topology& t, LoadedModel* lm, Backend* backend) {
  auto eo = engine_options_for(t, lm->model->config());
  if (!eo.ok()) return eo.status();
  if (t.models.speculative) {
    ProposerBuildOptions bo;
    bo.max_model_len = eo->max_model_len;
    auto p = build_proposer(*t.models.speculative, *lm, *backend, bo);
    if (!p.ok()) return p.status();
    proposer_ = std::move(*p);
  }
  auto e = Engine::create(*lm->model, lm->tokenizer.get(), proposer_.get(), *eo);
  if (!e.ok()) return e.status();
  engine_ = std::move(*e);
  return Status();
}

Expected<Sample> DirectPath::run(const std::vector<int32_t>& prompt, int max_tokens, int64_t* first_token_steps) {
  const EngineStats before = engine_->stats();
  GenerateParams p;
  p.prompt = prompt;
  p.max_tokens = max_tokens;
  p.sampling.temperature = 0;
  p.sampling.ignore_eos = true;
  Sample s;
  s.path = "direct";
  const auto t0 = Clock::now();
  auto id = engine_->add_request(p);
  if (!id.ok()) return id.status();
  std::vector<SeqEvent> ev;
  int64_t steps = 0;
  while (engine_->has_work()) {
    ev.clear();
    SPECSERVE_RETURN_IF_ERROR(engine_->step(&ev));
    ++steps;
    for (auto& e : ev) {
      if (s.output.empty() && !e.tokens.empty()) {
        s.ttft_s = since(t0);
        if (first_token_steps) *first_token_steps = steps;
      }
      s.output.insert(s.output.end(), e.tokens.begin(), e.tokens.end());
    }
  }
  s.seconds = since(t0);
  engine_->take_finished_stats(*id);
  const EngineStats& after = engine_->stats();
  s.tokens = static_cast<int64_t>(s.output.size());
  s.steps = after.num_steps - before.num_steps;
  s.forward_s = after.forward_seconds - before.forward_seconds;
  s.draft_s = after.draft_seconds - before.draft_seconds;
  return s;
}

Expected<ShardLoad> settled_load(Client& c) {
  const auto end = Clock::now() + std::chrono::seconds(30);
  while (Clock::now() < end) {
    auto st = c.status();
    if (!st.ok()) return st.status();
    if (!st->replicas.empty() && st->replicas[0].load.num_running == 0 && st->replicas[0].load.num_waiting == 0 &&
        st->replicas[0].assigned == 0) {
      return st->replicas[0].load;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return deadline_exceeded("the replica did not report idle within 30 s");
}

Expected<Sample> run_client(Client& c, const std::string& name, const std::vector<int32_t>& prompt, int max_tokens) {
  auto before = settled_load(c);
  if (!before.ok()) return before.status();
  GenerateRequest r;
  r.prompt_token_ids = prompt;
  r.max_tokens = max_tokens;
  r.sampling.temperature = 0;
  r.sampling.ignore_eos = true;
  Sample s;
  s.path = name;
  const auto t0 = Clock::now();
  auto h = c.submit(std::move(r));
  if (!h.ok()) return h.status();
  auto res = (*h)->wait();
  s.seconds = since(t0);
  if (!res.ok()) return res.status();
  s.ttft_s = res->first_token_seconds >= 0 ? res->first_token_seconds : s.seconds;  // (-1: no token came)
  s.output = res->tokens;
  s.tokens = static_cast<int64_t>(s.output.size());
  auto after = settled_load(c);
  if (!after.ok()) return after.status();
  s.steps = after->num_steps - before->num_steps;
  s.forward_s = after->forward_seconds - before->forward_seconds;
  s.draft_s = after->draft_seconds - before->draft_seconds;
  return s;
}

Status wait_ready(Client& c, double timeout_s) {
  const auto end = Clock::now() + std::chrono::duration<double>(timeout_s);
  while (Clock::now() < end) {
    auto st = c.status(std::chrono::seconds(5));
    if (st.ok()) {
      for (const auto& w : st->workers) {
        if (w.state == "failed") return internal_error("worker " + w.role + " failed: " + w.error);
      }
      if (!st->replicas.empty() && st->replicas[0].ready) return Status();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return deadline_exceeded("the replica was not ready within " + std::to_string(timeout_s) + " s");
}

Status InProcessPath::start(const Topology& t, int threads, int scheduler_threads) {
  RuntimeOptions o;
  o.scheduler_threads = scheduler_threads;
  rt_ = std::make_unique<ActorRuntime>(o);
  auto h = Head::start(*rt_, t, kInProcessToken, /*publish=*/false);
  if (!h.ok()) return h.status();
  head_ = std::move(*h);
  WorkerConfig wc;
  wc.node = "n0";
  wc.topology = t;
  wc.threads = threads;
  wc.token = kInProcessToken;
  wc.scheduler = head_->scheduler();
  spawn_target_shard(rt_->system(), wc);
  client_ = Client::in_process(rt_->system(), head_->scheduler(), kInProcessToken);
  return wait_ready(*client_, 600);
}

InProcessPath::~InProcessPath() {
  client_.reset();
  if (head_) head_->stop();
  head_.reset();
  rt_.reset();
}

void set_run_dir_for_signals(const std::string& dir) {
  g_run_dir_set.store(false, std::memory_order_release);
  if (dir.empty() || dir.size() >= sizeof g_run_dir) return;
  std::memcpy(g_run_dir, dir.c_str(), dir.size() + 1);
  g_run_dir_set.store(true, std::memory_order_release);
}

extern "C" void stop_up_and_exit(int sig) {
  const pid_t pid = g_up_pid.load();
  if (pid > 0) ::kill(pid, SIGTERM);
  if (g_run_dir_set.load(std::memory_order_acquire)) {  // (write(2) only: async-signal-safe)
    static const char head[] = "\n[bench-actors] interrupted: kept ";
    static const char tail[] = " (the topology and the cluster's up.log); remove it when done\n";
    ssize_t ignored = ::write(STDERR_FILENO, head, sizeof head - 1);
    ignored = ::write(STDERR_FILENO, g_run_dir, std::strlen(g_run_dir));
    ignored = ::write(STDERR_FILENO, tail, sizeof tail - 1);
    (void)ignored;
  }
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

Status NetworkPath::start(const std::string& dir, const std::string& yaml, const Topology& t, int threads, int scheduler_threads) {
  const std::string ready = dir + "/ready";
  log_ = dir + "/up.log";
  // The children's log lines go to DIR/up.log, not to the benchmark's terminal.
  auto c = spawn_child({"/bin/sh", "-c", "exec \"$0\" up \"$1\" --ready-file \"$2\" --threads-per-worker \"$3\" "
                                         "--drain-timeout 5 2>\"$4\"",
                        self_executable(), yaml, ready, std::to_string(threads), log_},
                       {}, "specserve up");
  if (!c.ok()) return c.status();
  up_ = *c;
  g_up_pid = up_.pid;
  const auto end = Clock::now() + std::chrono::seconds(600);
  while (!std::filesystem::exists(ready)) {
    int status = 0;
    if (::waitpid(up_.pid, &status, WNOHANG) == up_.pid) {
      up_.pid = -1;
      return unavailable("specserve up exited before it was ready; its log: " + log_ + "\n" + tail_log());
    }
    if (Clock::now() > end) return deadline_exceeded("specserve up was not ready within 600 s; its log: " + log_);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  auto token = read_cluster_token(t.cluster.token_file);
  if (!token.ok()) return token.status();
  RuntimeOptions o;
  o.scheduler_threads = scheduler_threads;
  auto cl = Client::connect(t.head.host, static_cast<uint16_t>(t.head.actor_port), *token, o);
  if (!cl.ok()) return cl.status();
  client_ = std::move(*cl);
  return wait_ready(*client_, 60);
}

NetworkPath::~NetworkPath() {
  client_.reset();
  if (up_.pid > 0) {
    std::vector<Child> cs = {up_};
    stop_children(&cs, 20.0);  // SIGTERM: up drains, stops its node, which stops the worker
  }
  g_up_pid = -1;
}

std::string NetworkPath::tail_log() {
  std::ifstream in(log_);
  std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return all.size() > 2000 ? all.substr(all.size() - 2000) : all;
}

LevelResult sweep_clients(Client& c, const std::vector<Question>& qs, int n, int requests, int max_tokens) {
  LevelResult lr;
  lr.clients = n;
  lr.requests = requests;
  std::mutex mu;
  std::atomic<int64_t> tokens{0};
  std::atomic<int> errors{0};
  const auto t0 = Clock::now();
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      for (int j = i; j < requests; j += n) {
        GenerateRequest r;
        r.messages = {{"user", qs[static_cast<size_t>(j) % qs.size()].text}};
        r.max_tokens = max_tokens;
        r.sampling.temperature = 0;
        r.sampling.ignore_eos = true;
        auto res = c.generate(std::move(r));
        if (!res.ok()) {
          ++errors;
          std::lock_guard<std::mutex> l(mu);
          std::fprintf(stderr, "[bench-actors] request failed: %s\n", res.status().message().c_str());
          continue;
        }
        tokens += res->completion_tokens;
        std::lock_guard<std::mutex> l(mu);
        if (res->first_token_seconds >= 0) lr.ttft.push_back(res->first_token_seconds);  // (none: no token came)
      }
    });
  }
  for (auto& t : threads) t.join();
  lr.seconds = since(t0);
  lr.tokens = tokens.load();
  lr.errors = errors.load();
  return lr;
}

Expected<LevelResult> sweep_direct(Engine& e, const std::vector<Question>& qs, int n, int requests, int max_tokens) {
  LevelResult lr;
  lr.clients = n;
  lr.requests = requests;
  struct InFlight { int client; Clock::time_point t0; bool first = false; };
  std::map<int64_t, InFlight> by_seq;
  std::vector<int> next(static_cast<size_t>(n));
  const auto t0 = Clock::now();
  auto submit = [&](int client) -> Status {
    const int j = next[static_cast<size_t>(client)];
    if (j >= requests) return Status();
    next[static_cast<size_t>(client)] = j + n;
    GenerateParams p;
    p.prompt = qs[static_cast<size_t>(j) % qs.size()].prompt;
    p.max_tokens = max_tokens;
    p.sampling.temperature = 0;
    p.sampling.ignore_eos = true;
    auto id = e.add_request(p);
    if (!id.ok()) return id.status();
    by_seq[*id] = InFlight{client, Clock::now()};
    return Status();
  };
  for (int i = 0; i < n; ++i) {
    next[static_cast<size_t>(i)] = i;
    SPECSERVE_RETURN_IF_ERROR(submit(i));
  }
  std::vector<SeqEvent> ev;
  while (e.has_work()) {
    ev.clear();
    SPECSERVE_RETURN_IF_ERROR(e.step(&ev));
    for (auto& x : ev) {
      auto it = by_seq.find(x.seq_id);
      if (it == by_seq.end()) continue;
      lr.tokens += static_cast<int64_t>(x.tokens.size());
      if (!it->second.first && !x.tokens.empty()) {
        it->second.first = true;
        lr.ttft.push_back(since(it->second.t0));
      }
      if (x.finish != FinishReason::kNone) {
        const int client = it->second.client;
        e.take_finished_stats(x.seq_id);
        by_seq.erase(it);
        SPECSERVE_RETURN_IF_ERROR(submit(client));
      }
    }
  }
  lr.seconds = since(t0);
  return lr;
}

}  // namespace specserve::cli::bench_actors
