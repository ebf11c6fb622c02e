// Real processes on loopback: `specserve up` with a topology, workers in their own processes,
// the Client API over the CAF middleman. Two replicas: one target shard is killed with SIGKILL
// mid-generation; its requests must finish on the other replica with the same greedy output,
// and the client must see no error. And the README's cluster-local layout (draft worker and
// target shard in separate processes).

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <fstream>
#include <sstream>

#include "tests/cpu/fp32_kernel_scope.h"
#include "tests/integration/up_process.h"

namespace specserve {
namespace {

using namespace cluster_testing;  // NOLINT: test helpers (tests/integration/up_process.h)

TEST(Cluster, KilledTargetShardRequestsFinishOnTheOtherReplicaWithTheSameOutput) {
  const int32_t kTokens = 64;
  auto prompts = prompt_ids();
  std::vector<std::vector<int32_t>> expected;
  std::vector<std::string> expected_text(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) expected.push_back(testing::greedy_reference(prompts[i], kTokens, &expected_text[i]));

  UpProcess up("  - { name: n0, host: 127.0.0.1, devices: [cpu], workers: [ { role: target_shard, replica: 0, device: cpu } ] }\n"
               "  - { name: n1, host: 127.0.0.1, devices: [cpu], workers: [ { role: target_shard, replica: 1, device: cpu } ] }\n",
               "  speculative: { method: ngram, num_speculative_tokens: 3, prompt_lookup_min: 1, prompt_lookup_max: 3 }\n");
  Client* c = up.connect();
  ASSERT_NE(c, nullptr);
  std::vector<std::shared_ptr<RequestHandle>> hs;
  constexpr int32_t kTopN = 3;  // top logprobs must stay aligned with the tokens across the failover
  for (const auto& p : prompts) {
    GenerateRequest r = greedy(p, kTokens);
    r.sampling.logprobs = kTopN;
    auto h = c->submit(r);
    ASSERT_TRUE(h.ok()) << h.status().to_string();
    hs.push_back(*h);
  }
  // Wait until both replicas are generating, then kill replica 0's target shard.
  const int victim = target_shard_pid_once_generating(c, 0);
  ASSERT_GT(victim, 0) << "replica 0 never started generating";
  ASSERT_EQ(::kill(victim, SIGKILL), 0);

  int32_t requeues = 0;
  for (size_t i = 0; i < hs.size(); ++i) {
    auto r = hs[i]->wait();
    ASSERT_TRUE(r.ok()) << "request " << i << ": " << r.status().to_string();
    EXPECT_EQ(r->finish_reason, "length");
    EXPECT_EQ(r->tokens, expected[i]) << "request " << i << " (re-queued " << r->num_requeues << "x)";
    EXPECT_EQ(r->text, expected_text[i]) << "request " << i << ": the streamed text must survive the failover";
    EXPECT_EQ(r->top_n, kTopN);
    ASSERT_EQ(r->logprobs.size(), r->tokens.size()) << "request " << i;
    ASSERT_EQ(r->top_logprob_ids.size(), r->tokens.size() * kTopN) << "request " << i;
    ASSERT_EQ(r->top_logprob_values.size(), r->top_logprob_ids.size()) << "request " << i;
    for (size_t t = 0; t < r->tokens.size(); ++t) {
      // Greedy: the chosen token is the top-1 entry of its own row.
      EXPECT_EQ(r->top_logprob_ids[t * kTopN], r->tokens[t]) << "request " << i << " token " << t;
      EXPECT_EQ(r->top_logprob_values[t * kTopN], r->logprobs[t]) << "request " << i << " token " << t;
    }
    requeues += r->num_requeues;
  }
  EXPECT_GE(requeues, 1) << "no request was on the killed replica";
  auto st = c->status();
  ASSERT_TRUE(st.ok());
  EXPECT_GE(st->requeued, 1);
  for (const auto& r : st->replicas) {
    if (r.replica == 0) EXPECT_FALSE(r.ready);
    if (r.replica == 1) EXPECT_TRUE(r.ready);
  }
  // The survivor still serves.
  auto again = c->generate(greedy(prompts[0], 8));
  ASSERT_TRUE(again.ok()) << again.status().to_string();
  EXPECT_EQ(again->tokens, std::vector<int32_t>(expected[0].begin(), expected[0].begin() + 8));

  // With the last replica gone too, its request fails at once instead of waiting forever.
  auto last = c->submit(greedy(prompts[0], 400));
  ASSERT_TRUE(last.ok()) << last.status().to_string();
  int survivor = -1;
  const int64_t generated_before = [&] {
    for (const auto& r : st->replicas) {
      if (r.replica == 1) return r.load.generated_tokens;
    }
    return int64_t{0};
  }();
  const auto t_wait = std::chrono::steady_clock::now();
  while (survivor < 0 && std::chrono::steady_clock::now() - t_wait < std::chrono::seconds(60)) {
    auto now = c->status();
    ASSERT_TRUE(now.ok()) << now.status().to_string();
    for (const auto& r : now->replicas) {
      if (r.replica != 1 || r.assigned == 0 || r.load.generated_tokens < generated_before + 8 + 4) continue;
      for (const auto& w : now->workers) {
        if (w.role == "target_shard" && w.replica == 1 && w.state == "ready") survivor = w.pid;
      }
    }
    if (survivor < 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_GT(survivor, 0) << "the long request never ran on replica 1";
  ASSERT_EQ(::kill(survivor, SIGKILL), 0);
  auto none = (*last)->wait();
  ASSERT_FALSE(none.ok()) << "the last replica died mid-request: it cannot finish";
  EXPECT_NE(none.status().message().find("no replica is left"), std::string::npos) << none.status().message();
  EXPECT_NE(none.status().message().find("scheduler.worker_restarts is 0"), std::string::npos) << none.status().message();

  // Both nodes exited with their only workers: nothing can serve, so up stops by itself.
  const std::vector<int> pids = up.worker_pids();
  EXPECT_EQ(up.wait_exit(60), 1);
  for (int pid : pids) EXPECT_FALSE(alive(pid)) << "worker pid " << pid << " outlived `specserve up`";
}

// scheduler.worker_restarts (cluster/node_supervisor.h): the only replica's target shard killed
// with SIGKILL mid-generation is restarted by its node; its requests wait for it, then finish
// with the output of an undisturbed run, and the replica serves again. The topology file was
// edited into an invalid one before the kill: the restarted worker reads what up validated
// (cluster/topology_snapshot.h), not the file.
TEST(Cluster, TheOnlyReplicasKilledTargetShardIsRestartedAndItsRequestsFinish) {
  const int32_t kTokens = 48;
  auto prompts = prompt_ids();
  prompts.resize(2);
  std::vector<std::vector<int32_t>> expected;
  for (const auto& p : prompts) expected.push_back(testing::greedy_reference(p, kTokens));
  UpProcess up("  - { name: n0, host: 127.0.0.1, devices: [cpu], workers: [ { role: target_shard, replica: 0, device: cpu } ] }\n",
               "", "64MiB", {}, "", ", worker_restarts: 2, worker_restart_timeout_s: 120");
  Client* c = up.connect();
  ASSERT_NE(c, nullptr);
  std::vector<std::shared_ptr<RequestHandle>> hs;
  for (const auto& p : prompts) {
    auto h = c->submit(greedy(p, kTokens));
    ASSERT_TRUE(h.ok()) << h.status().to_string();
    hs.push_back(*h);
  }
  const int victim = target_shard_pid_once_generating(c, 0);
  ASSERT_GT(victim, 0) << "the replica never started generating";
  std::ofstream(up.config(), std::ios::app) << "bogus_key: 1\n";
  ASSERT_EQ(::kill(victim, SIGKILL), 0);
  int32_t requeues = 0;
  for (size_t i = 0; i < hs.size(); ++i) {
    auto r = hs[i]->wait();
    ASSERT_TRUE(r.ok()) << "request " << i << ": " << r.status().to_string();
    EXPECT_EQ(r->finish_reason, "length");
    EXPECT_EQ(r->tokens, expected[i]) << "request " << i << " (re-queued " << r->num_requeues << "x)";
    requeues += r->num_requeues;
  }
  EXPECT_GE(requeues, 1) << "no request was on the killed target shard";
  auto st = c->status();
  ASSERT_TRUE(st.ok());
  ASSERT_EQ(st->replicas.size(), 1u);
  EXPECT_TRUE(st->replicas[0].ready) << "the restarted replica does not serve";
  int restarted = -1;
  for (const auto& w : st->workers) {
    if (w.role == "target_shard" && w.state == "ready") restarted = w.pid;
  }
  EXPECT_GT(restarted, 0);
  EXPECT_NE(restarted, victim) << "the target shard that serves now is the killed one";
  EXPECT_TRUE(alive(restarted));
  // A new request is served by the restarted worker.
  auto again = c->generate(greedy(prompts[0], 8));
  ASSERT_TRUE(again.ok()) << again.status().to_string();
  EXPECT_EQ(again->tokens, std::vector<int32_t>(expected[0].begin(), expected[0].begin() + 8));
  // Stopped with SIGTERM, a target shard drains and quits on its own: its node does not restart
  // it and the head does not wait worker_restart_timeout_s (120 s) for it.
  ASSERT_EQ(::kill(restarted, SIGTERM), 0);
  const auto t_stop = std::chrono::steady_clock::now();
  auto none = c->generate(greedy(prompts[1], 8));
  while (none.ok() && std::chrono::steady_clock::now() - t_stop < std::chrono::seconds(30)) {
    none = c->generate(greedy(prompts[1], 8));  // it may have been served before the drain
  }
  ASSERT_FALSE(none.ok());
  // "no replica is left", or the connection lost when up already stopped (below).
  EXPECT_TRUE(none.status().message().find("no replica is left") != std::string::npos ||
              none.status().code() == StatusCode::kUnavailable)
      << none.status().to_string();
  EXPECT_EQ(none.status().message().find("not restarted within"), std::string::npos) << none.status().message();
  if (none.status().code() != StatusCode::kUnavailable) {
    EXPECT_NE(none.status().message().find("stopped on its own"), std::string::npos) << none.status().message();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t_stop, std::chrono::seconds(60)) << "waited for a restart that never comes";
  // Its node had no other worker and exited; with no node left up stops by itself, exit 1.
  EXPECT_EQ(up.wait_exit(60), 1);
  EXPECT_FALSE(alive(restarted)) << "the restarted worker outlived `specserve up`";
}

// The parent pid of `pid` (/proc), -1 when it is gone.
int parent_of(int pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(in, line)) return -1;
  // pid (comm) state ppid ...: comm may hold spaces, so read after its closing parenthesis.
  std::istringstream rest(line.substr(line.rfind(')') + 1));
  char state = 0;
  int ppid = -1;
  rest >> state >> ppid;
  return ppid;
}

// `up` whose only node process is killed (SIGKILL), then its worker (SIGKILL too: left alone it
// would get SIGTERM from the kernel and might finish the request first) in the middle of a
// request: nothing can serve any more, so up stops by itself with exit 1 (it stayed, answering 503
// on /health, for good), and the request fails at once although scheduler.worker_restarts is on
// (it waited worker_restart_timeout_s for a node that is gone, and the drain's timeout).
TEST(Cluster, UpStopsWhenEveryNodeProcessIsGone) {
  UpProcess up("  - { name: n0, host: 127.0.0.1, devices: [cpu], workers: [ { role: target_shard, replica: 0, device: cpu } ] }\n",
               "", "64MiB", {}, "", ", worker_restarts: 2, worker_restart_timeout_s: 600");
  Client* c = up.connect();
  ASSERT_NE(c, nullptr);
  auto h = c->submit(greedy(prompt_ids()[0], 400));
  ASSERT_TRUE(h.ok()) << h.status().to_string();
  const int worker = target_shard_pid_once_generating(c, 0);
  ASSERT_GT(worker, 0) << "the request never started";
  const int node = parent_of(worker);
  ASSERT_GT(node, 1);
  ASSERT_EQ(::kill(node, SIGKILL), 0);
  ::kill(worker, SIGKILL);  // may be gone already (SIGTERM from the kernel)
  const auto killed_at = std::chrono::steady_clock::now();
  auto r = (*h)->wait();
  ASSERT_FALSE(r.ok()) << "finished with its only node gone";
  EXPECT_NE(r.status().message().find("no replica is left"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("every node process"), std::string::npos) << r.status().message();
  // Bounds, not timings: well under the drain timeout (30 s) and worker_restart_timeout_s (600 s).
  EXPECT_EQ(up.wait_exit(20), 1) << "up did not stop with its only node gone";
  EXPECT_LT(std::chrono::steady_clock::now() - killed_at, std::chrono::seconds(20));
}

// A tensor-parallel replica whose two ranks are worker processes of two nodes (actors/tp_group.h):
// they join through the head, connect Gloo through its rendezvous store, and serve greedy
// requests identical to the target alone; killing either rank's process in the middle of a
// generation stops the other within seconds (the head stops the rest of the group; rank 0 does not
// wait a command timeout for a dead rank's answer) instead of leaving the replica half alive.
class ClusterTensorParallel : public ::testing::TestWithParam<int32_t> {};

TEST_P(ClusterTensorParallel, RanksInTwoProcessesServeIdenticalOutputAndDieTogether) {
  const int32_t killed = GetParam();
  const int32_t kTokens = 32;
  auto prompts = prompt_ids();
  prompts.resize(2);
  // Greedy identity across ranks is an fp32 property (under the int8 kernel TP drifts:
  // tests/model/tensor_parallel_model_test.cpp): the ranks run float32, this process the same
  // kernel for the reference, also where the run set SPECSERVE_CPU_MATMUL.
  std::vector<std::vector<int32_t>> expected;
  {
    testing::Fp32MatmulScope fp32;
    for (const auto& p : prompts) expected.push_back(testing::greedy_reference(p, kTokens));
  }

  UpProcess up("  - { name: n0, host: 127.0.0.1, devices: [cpu], workers: [ { role: target_shard, replica: 0, rank: 0, device: cpu } ] }\n"
               "  - { name: n1, host: 127.0.0.1, devices: [cpu], workers: [ { role: target_shard, replica: 0, rank: 1, device: cpu } ] }\n",
               "  speculative: { method: ngram, num_speculative_tokens: 3, prompt_lookup_min: 1, prompt_lookup_max: 3 }\n",
               "64MiB", {}, ", tensor_parallel_size: 2, dtype: float32");
  Client* c = up.connect();
  ASSERT_NE(c, nullptr);
  auto st = c->status();
  ASSERT_TRUE(st.ok()) << st.status().to_string();
  std::map<int32_t, int32_t> pid_of_rank;
  for (const auto& w : st->workers) {
    if (w.role == "target_shard" && w.state == "ready") pid_of_rank[w.rank] = w.pid;
  }
  ASSERT_EQ(pid_of_rank.size(), 2u) << "both ranks registered ready";
  EXPECT_NE(pid_of_rank[0], pid_of_rank[1]) << "the ranks are separate processes";
  std::vector<std::shared_ptr<RequestHandle>> hs;
  for (const auto& p : prompts) {
    auto h = c->submit(greedy(p, kTokens));
    ASSERT_TRUE(h.ok()) << h.status().to_string();
    hs.push_back(*h);
  }
  for (size_t i = 0; i < hs.size(); ++i) {
    auto r = hs[i]->wait();
    ASSERT_TRUE(r.ok()) << "request " << i << ": " << r.status().to_string();
    EXPECT_EQ(r->tokens, expected[i]) << "request " << i;
  }
  // Kill one rank in the middle of a long generation: the other is inside a forward pass then,
  // waiting in a collective or for the dead rank's answer.
  auto long_request = c->submit(greedy(prompts[0], 400));
  ASSERT_TRUE(long_request.ok()) << long_request.status().to_string();
  const auto start = std::chrono::steady_clock::now();
  while (std::chrono::steady_clock::now() - start < std::chrono::seconds(60)) {
    auto now = c->status();
    if (now.ok() && !now->replicas.empty() && now->replicas[0].load.generated_tokens >= 2 * kTokens + 8) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const int32_t other = 1 - killed;
  ASSERT_EQ(::kill(pid_of_rank[killed], SIGKILL), 0);
  const auto killed_at = std::chrono::steady_clock::now();
  const auto end = killed_at + std::chrono::seconds(30);
  while (alive(pid_of_rank[other]) && std::chrono::steady_clock::now() < end) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_FALSE(alive(pid_of_rank[other])) << "rank " << other << " kept running without rank " << killed;
  // Within a few seconds, not after a command timeout (a dead process never answers).
  EXPECT_LT(std::chrono::steady_clock::now() - killed_at, std::chrono::seconds(15));
  auto lost = (*long_request)->wait();
  EXPECT_FALSE(lost.ok()) << "the only replica died: the request cannot finish";
  // Both nodes exited with their ranks: nothing can serve, so up stops by itself.
  EXPECT_EQ(up.wait_exit(60), 1);
}

INSTANTIATE_TEST_SUITE_P(KilledRank, ClusterTensorParallel, ::testing::Values(0, 1),
                         [](const ::testing::TestParamInfo<int32_t>& i) { return "rank" + std::to_string(i.param); });

TEST(Cluster, DraftWorkerInItsOwnProcessAndTokenChecks) {
  const int32_t kTokens = 24;
  auto prompts = prompt_ids();
  UpProcess up("  - name: n0\n    host: 127.0.0.1\n    devices: [cpu]\n    workers:\n"
               "      - { role: target_shard, replica: 0, device: cpu }\n      - { role: draft_worker, replica: 0, device: cpu }\n",
               "  speculative: { method: draft_model, model: " + testing::default_model_path() +
                   ", num_speculative_tokens: 3 }\n");
  Client* c = up.connect();
  ASSERT_NE(c, nullptr);
  auto st = c->status();
  ASSERT_TRUE(st.ok());
  ASSERT_EQ(st->workers.size(), 2u);
  std::set<int32_t> pids;
  for (const auto& w : st->workers) {
    EXPECT_EQ(w.state, "ready") << w.role;
    EXPECT_GT(w.load_seconds, 0.0) << w.role;
    pids.insert(w.pid);
  }
  EXPECT_EQ(pids.size(), 2u) << "draft worker and target shard must be separate processes";
  EXPECT_EQ(pids.count(static_cast<int32_t>(::getpid())), 0u);
  auto r = c->generate(greedy(prompts[1], kTokens));
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->tokens, testing::greedy_reference(prompts[1], kTokens));
  EXPECT_GT(r->num_drafts, 0);
  EXPECT_EQ(r->num_accepted_tokens, r->num_draft_tokens) << "the draft is the target itself: every draft token is accepted";

  // A peer with the wrong token is refused at the port's gateway, and the cluster keeps serving.
  auto bad = Client::connect("127.0.0.1", static_cast<uint16_t>(up.port()), "not-the-token");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("refused: wrong cluster token"), std::string::npos) << bad.status().message();
  // Without the token nothing reaches CAF (actors/token_gate.h): a plain CAF peer gets no
  // handle, and the bytes that crash CAF 0.17's reader (a garbage header; a header announcing a
  // 4 GiB payload) only get the connection closed.
  {
    ActorRuntime rt;
    auto g = rt.middleman().remote_actor("127.0.0.1", static_cast<uint16_t>(up.port()));
    EXPECT_FALSE(static_cast<bool>(g));
  }
  for (const std::string& bytes : {std::string(8, '\0') + std::string(32, '\xff'),
                                   std::string("\x01\x00\x00\x00\xff\xff\xff\xff", 8) + std::string(24, '\0')}) {
    EXPECT_TRUE(testing::raw_connection_is_closed("127.0.0.1", static_cast<uint16_t>(up.port()), bytes));
  }
  auto again = Client::connect("127.0.0.1", static_cast<uint16_t>(up.port()), read_token(up));
  ASSERT_TRUE(again.ok()) << again.status().to_string();
  auto ok = (*again)->generate(greedy(prompts[0], 4));
  EXPECT_TRUE(ok.ok()) << ok.status().to_string();
  again->reset();

  // A silent draft worker (SIGSTOP: its socket stays open) is noticed by the heartbeat within
  // seconds; the replica goes on without drafts, with the same greedy output.
  int draft_pid = -1;
  for (const auto& w : st->workers) {
    if (w.role == "draft_worker") draft_pid = w.pid;
  }
  ASSERT_GT(draft_pid, 0);
  ASSERT_EQ(::kill(draft_pid, SIGSTOP), 0);
  const auto t0 = std::chrono::steady_clock::now();
  bool gone = false;
  while (!gone && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(20)) {
    auto s2 = c->status();
    ASSERT_TRUE(s2.ok());
    gone = false;
    for (const auto& w : s2->workers) gone = gone || (w.role == "draft_worker" && w.state == "down");
    if (!gone) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  const double noticed_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_TRUE(gone) << "the stopped draft worker was not noticed within 20 s";
  EXPECT_LT(noticed_s, 15.0);
  auto plain = c->generate(greedy(prompts[1], kTokens));
  ASSERT_TRUE(plain.ok()) << plain.status().to_string();
  EXPECT_EQ(plain->tokens, r->tokens);
  EXPECT_EQ(plain->num_drafts, 0);
  ::kill(draft_pid, SIGKILL);
  EXPECT_TRUE(up.ready_file_exists());
  EXPECT_EQ(up.terminate(60), 0);
  // Stopped: the ready file says so by being gone (a trial found it left behind, so the next
  // run's waiters saw "ready" at once).
  EXPECT_FALSE(up.ready_file_exists());
}

TEST(Cluster, WorkerThatCannotLoadStopsUpWithItsError) {
  // 1 KiB of KV cache holds no block: the target shard fails after loading, `up` says why and
  // exits 1. Tensor-parallel size 2: `up`'s own check before the launch sizes the KV pool only
  // for size 1 (a rank's pool counts its share of the heads), so here the workers find it
  // (actors/worker_config.cpp engine_options_for).
  UpProcess up("  - { name: n0, host: 127.0.0.1, devices: [cpu], workers: [ { role: target_shard, replica: 0, rank: 0, device: cpu } ] }\n"
               "  - { name: n1, host: 127.0.0.1, devices: [cpu], workers: [ { role: target_shard, replica: 0, rank: 1, device: cpu } ] }\n",
               "", "1KiB", {}, ", tensor_parallel_size: 2");
  EXPECT_EQ(up.wait_exit(180), 1);
}

TEST(Cluster, WorkerOnAGpuThatDoesNotExistStopsUp) {
  // `device: cuda:63` fails on every machine (no CUDA build, no GPU, or no 64th GPU): `up`'s
  // check before it starts anything (cluster/up_plan.h) names the field and exits 2 (bad input);
  // no worker is started. (A remote node's `specserve node` finds it in the worker's backend
  // factory instead: actors/backend_factory.h.)
  UpProcess up("  - { name: n0, host: 127.0.0.1, devices: [cuda:63], workers: [ { role: target_shard, replica: 0, device: cuda:63 } ] }\n",
               "");
  EXPECT_EQ(up.wait_exit(180), 2);
}

// models.target.dtype reaches every worker process (each applies it when it starts: bf16 AMX
// tiles where this CPU has them, else fp32), `status` shows each worker's arithmetic, and the
// greedy output is what this process computes under the same kernel. float16, which the CPU
// cannot run, stops `up` before any worker starts (exit 2, bad input).
TEST(Cluster, TargetDtypeReachesEveryWorkerAndStatusShowsIt) {
  const bool amx = amx_usable();  // the workers run on this machine's CPU
  // (float32 runs AVX2 where the CPU lacks avx512f or the run sets SPECSERVE_CPU_MATMUL=avx2.)
  const bool avx512 = __builtin_cpu_supports("avx512f") && cpu_kernel_env("SPECSERVE_CPU_MATMUL") != "avx2";
  const std::string want = amx ? "amx bf16" : (avx512 ? "avx512 fp32" : "avx2 fp32");
  const MatmulIsa saved = matmul_isa();
  // The kernel the workers will run (also where this run set SPECSERVE_CPU_MATMUL=vnni).
  ASSERT_TRUE(set_matmul_isa(amx ? MatmulIsa::kAmx : avx512 ? MatmulIsa::kAvx512 : MatmulIsa::kAvx2));
  const std::vector<int32_t> prompt = prompt_ids()[1];
  const std::vector<int32_t> expected = testing::greedy_reference(prompt, 24);
  set_matmul_isa(saved);

  UpProcess up("  - { name: n0, host: 127.0.0.1, devices: [cpu], workers: [ { role: target_shard, replica: 0, device: cpu }, "
               "{ role: draft_worker, replica: 0, device: cpu } ] }\n",
               "  speculative: { method: ngram, num_speculative_tokens: 3, prompt_lookup_min: 1, prompt_lookup_max: 3 }\n",
               "64MiB", {}, amx ? ", dtype: bfloat16" : ", dtype: float32");
  Client* c = up.connect();
  ASSERT_NE(c, nullptr);
  auto st = c->status();
  ASSERT_TRUE(st.ok()) << st.status().to_string();
  ASSERT_EQ(st->workers.size(), 2u);
  for (const auto& w : st->workers) EXPECT_EQ(w.compute, want) << w.role;
  auto h = c->submit(greedy(prompt, 24));
  ASSERT_TRUE(h.ok()) << h.status().to_string();
  auto result = (*h)->wait();
  ASSERT_TRUE(result.ok()) << result.status().to_string();
  EXPECT_EQ(result->tokens, expected);
  EXPECT_EQ(up.terminate(60), 0);

  UpProcess f16("  - { name: n0, host: 127.0.0.1, devices: [cpu], workers: [ { role: target_shard, replica: 0, device: cpu } ] }\n",
                "", "64MiB", {}, ", dtype: float16");
  EXPECT_EQ(f16.wait_exit(60), 2);
}

// `specserve client` with several requests of which one is refused (a prompt too long for the
// context) answers the others: under --json one object per request, the refused one with its
// error (a trial found the finished answers thrown away and nothing on stdout), exit 2.
TEST(Cluster, ClientAnswersEveryRequestWhenOneIsRefused) {
  UpProcess up("  - { name: n0, host: 127.0.0.1, devices: [cpu], workers: [ { role: target_shard, replica: 0, device: cpu } ] }\n", "");
  ASSERT_NE(up.connect(), nullptr);
  std::string long_prompt;
  for (int i = 0; i < 700; ++i) long_prompt += "word ";
  const auto r = testing::run_specserve("client --config " + up.config() + " --json --max-tokens 4 --prompt 'Once upon a time' --prompt '" +
                                            long_prompt + "' --prompt 'The capital of France is'",
                                        120);
  EXPECT_EQ(r.exit_code, 2) << r.out;
  std::vector<nlohmann::json> objects;
  std::istringstream lines(r.out);
  for (std::string line; std::getline(lines, line);) {
    if (!line.empty() && line[0] == '{') objects.push_back(nlohmann::json::parse(line));
  }
  ASSERT_EQ(objects.size(), 3u) << r.out;
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(objects[i]["index"], i);
  EXPECT_EQ(objects[0]["completion_tokens"], 4);
  EXPECT_EQ(objects[2]["completion_tokens"], 4);
  EXPECT_EQ(objects[1]["finish_reason"], "error");
  EXPECT_NE(objects[1]["error"].get<std::string>().find("max_model_len"), std::string::npos) << objects[1].dump();
  EXPECT_EQ(up.terminate(60), 0);
}

}  // namespace
}  // namespace specserve
