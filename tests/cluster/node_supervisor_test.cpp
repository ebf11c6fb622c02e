// A node's worker restarts (cluster/node_supervisor.h): which exits are restarted, the backoff,
// real child processes killed by signals restarted up to the limit, and the topology fields that
// set it (scheduler.worker_restarts, scheduler.worker_restart_timeout_s).
#include "cluster/node_supervisor.h"

#include <csignal>

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <thread>

#include "config/topology.h"
#include "tests/test_util.h"

namespace specserve {
namespace {

ChildExit exit_of(bool signaled, int code) {
  ChildExit e;
  e.signaled = signaled;
  e.code = code;
  return e;
}

TEST(WorkerRestartPolicy, OnlyWorkersKilledBySignalsOtherThanAStopAreRestartedWithinTheLimit) {
  EXPECT_TRUE(should_restart_worker(exit_of(true, SIGKILL), 0, 2));
  EXPECT_TRUE(should_restart_worker(exit_of(true, SIGSEGV), 1, 2));
  EXPECT_TRUE(should_restart_worker(exit_of(true, SIGABRT), 0, 1));
  EXPECT_FALSE(should_restart_worker(exit_of(true, SIGKILL), 2, 2)) << "past the limit";
  EXPECT_FALSE(should_restart_worker(exit_of(true, SIGKILL), 0, 0)) << "restarts off";
  EXPECT_FALSE(should_restart_worker(exit_of(true, SIGTERM), 0, 2)) << "asked to stop";
  EXPECT_FALSE(should_restart_worker(exit_of(true, SIGINT), 0, 2)) << "asked to stop";
  EXPECT_FALSE(should_restart_worker(exit_of(false, 0), 0, 2)) << "exited on its own";
  EXPECT_FALSE(should_restart_worker(exit_of(false, 1), 0, 2)) << "could not load: the same again would fail";
  // Lost its connection to a live head (stopped longer than the head waits): join again, within
  // the limit. NOTE: it exited 0 and was never restarted.
  EXPECT_TRUE(should_restart_worker(exit_of(false, kExitLostHead), 0, 2));
  EXPECT_FALSE(should_restart_worker(exit_of(false, kExitLostHead), 2, 2)) << "past the limit";
  EXPECT_FALSE(should_restart_worker(exit_of(false, kExitLostHead), 0, 0)) << "restarts off";
}

TEST(WorkerRestartPolicy, BackoffDoublesFromOneSecondUpToThirty) {
  EXPECT_DOUBLE_EQ(worker_restart_backoff_s(0), 1.0);
  EXPECT_DOUBLE_EQ(worker_restart_backoff_s(1), 2.0);
  EXPECT_DOUBLE_EQ(worker_restart_backoff_s(2), 4.0);
  EXPECT_DOUBLE_EQ(worker_restart_backoff_s(4), 16.0);
  EXPECT_DOUBLE_EQ(worker_restart_backoff_s(5), 30.0);
  EXPECT_DOUBLE_EQ(worker_restart_backoff_s(50), 30.0);
}

// Pumps until the supervisor is done or `seconds` pass.
void pump_until_done(NodeSupervisor& sup, bool* failed, double seconds) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (!sup.done() && std::chrono::steady_clock::now() < end) {
    sup.pump(failed);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

SupervisedWorker shell(const std::string& script, const std::string& name, bool restartable = true) {
  SupervisedWorker w;
  w.argv = {"/bin/sh", "-c", script};
  w.name = name;
  w.restartable = restartable;
  return w;
}

TEST(NodeSupervisor, AWorkerKilledBySigkillIsRestartedUpToTheLimitThenTheNodeFails) {
  // Each run appends a line, then the shell kills itself: 1 start + 2 restarts = 3 lines.
  const std::string log = ::testing::TempDir() + "/supervisor_runs_" + std::to_string(::getpid());
  std::filesystem::remove(log);
  NodeSupervisor sup("n0", 2);
  ASSERT_TRUE(sup.start({shell("echo run >> " + log + "; kill -9 $$", "worker n0/0 target_shard")}).ok());
  bool failed = false;
  pump_until_done(sup, &failed, 20);  // backoff 1 s, then 2 s
  ASSERT_TRUE(sup.done());
  EXPECT_EQ(sup.restarts(), 2);
  EXPECT_TRUE(failed) << "the third death has no restart left";
  EXPECT_EQ(testing::read_file(log), "run\nrun\nrun\n");
  std::filesystem::remove(log);
}

TEST(NodeSupervisor, ExitsStopsAndTensorParallelRanksAreNotRestarted) {
  NodeSupervisor sup("n0", 3);
  ASSERT_TRUE(sup.start({shell("exit 0", "clean"), shell("exit 3", "load failure"), shell("kill -TERM $$", "stopped"),
                         shell("kill -9 $$", "tp rank", /*restartable=*/false)})
                  .ok());
  bool failed = false;
  pump_until_done(sup, &failed, 10);
  ASSERT_TRUE(sup.done());
  EXPECT_EQ(sup.restarts(), 0);
  EXPECT_TRUE(failed) << "exit 3, SIGTERM and the killed rank are failures";
}

TEST(NodeSupervisor, ACleanExitIsNotAFailure) {
  NodeSupervisor sup("n0", 3);
  ASSERT_TRUE(sup.start({shell("exit 0", "clean")}).ok());
  bool failed = false;
  pump_until_done(sup, &failed, 10);
  EXPECT_TRUE(sup.done());
  EXPECT_FALSE(failed);
}

TEST(NodeSupervisor, StopEndsRunningWorkersAndForgetsPendingRestarts) {
  NodeSupervisor sup("n0", 3);
  ASSERT_TRUE(sup.start({shell("exec sleep 30", "sleeper"), shell("kill -9 $$", "dies")}).ok());
  bool failed = false;
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (sup.running().size() > 1 && std::chrono::steady_clock::now() < end) {
    sup.pump(&failed);  // the second one dies and waits for its restart
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(sup.running().size(), 1u);
  EXPECT_FALSE(sup.done()) << "a restart is pending";
  const auto t0 = std::chrono::steady_clock::now();
  sup.stop(5);
  EXPECT_TRUE(sup.done());
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(4)) << "sleep 30 ends at SIGTERM";
}

// The topology fields.
std::string topology_with(const std::string& scheduler) {
  return "cluster: {name: t, token_file: /tmp/specserve-test-token}\n"
         "models: {target: {path: " + testing::default_model_path() + "}}\n"
         "nodes: [{name: n0, host: 127.0.0.1, devices: [cpu], workers: [{role: target_shard, device: cpu}]}]\n"
         "scheduler: {" + scheduler + "}\n";
}

TEST(TopologyWorkerRestarts, DefaultsAreOffAndSixtySeconds) {
  auto t = parse_topology(topology_with("max_num_seqs: 4"), "t.yaml");
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  EXPECT_EQ(t->scheduler.worker_restarts, 0);
  EXPECT_DOUBLE_EQ(t->scheduler.worker_restart_timeout_s, 60.0);
  auto set = parse_topology(topology_with("worker_restarts: 3, worker_restart_timeout_s: 12.5"), "t.yaml");
  ASSERT_TRUE(set.ok()) << set.status().to_string();
  EXPECT_EQ(set->scheduler.worker_restarts, 3);
  EXPECT_DOUBLE_EQ(set->scheduler.worker_restart_timeout_s, 12.5);
}

TEST(TopologyWorkerRestarts, UnderTheAutoscalerTheyAreIgnoredWithANote) {
  auto t = parse_topology(topology_with("worker_restarts: 2") + "autoscale: {min_replicas: 0, max_replicas: 1}\n", "t.yaml");
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  bool noted = false;
  for (const auto& n : t->notes) noted = noted || n.find("scheduler.worker_restarts '2' is ignored") != std::string::npos;
  EXPECT_TRUE(noted) << "no note says worker_restarts is ignored under the autoscaler";
  auto plain = parse_topology(topology_with("worker_restarts: 2"), "t.yaml");
  ASSERT_TRUE(plain.ok());
  for (const auto& n : plain->notes) EXPECT_EQ(n.find("worker_restarts"), std::string::npos) << n;
}

// Review of the tensor-parallel serving: a killed rank's requests failed naming
// worker_restart_timeout_s, though ranks are never restarted: the topology says so up front.
TEST(TopologyWorkerRestarts, TensorParallelRanksAreNotRestartedAndANoteSaysSo) {
  const std::string tp =
      "cluster: {name: t, token_file: /tmp/specserve-test-token}\n"
      "models: {target: {path: " + testing::default_model_path() + ", tensor_parallel_size: 2}}\n"
      "nodes: [{name: n0, host: 127.0.0.1, devices: [cpu], workers: [{role: target_shard, device: cpu, rank: 0}, "
      "{role: target_shard, device: cpu, rank: 1}]}]\n";
  auto t = parse_topology(tp + "scheduler: {worker_restarts: 2}\n", "t.yaml");
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  bool noted = false;
  for (const auto& n : t->notes) {
    noted = noted || (n.find("scheduler.worker_restarts '2' restarts draft workers only") != std::string::npos &&
                      n.find("tensor_parallel_size 2") != std::string::npos);
  }
  EXPECT_TRUE(noted) << "no note says tensor-parallel ranks are not restarted";
  auto plain = parse_topology(tp + "scheduler: {max_num_seqs: 4}\n", "t.yaml");
  ASSERT_TRUE(plain.ok()) << plain.status().to_string();
  for (const auto& n : plain->notes) EXPECT_EQ(n.find("worker_restarts"), std::string::npos) << n;
}

TEST(TopologyWorkerRestarts, BadValuesNameTheFieldAndTheValue) {
  for (const auto& [yaml, field, value] : std::vector<std::tuple<std::string, std::string, std::string>>{
           {"worker_restarts: -1", "scheduler.worker_restarts", "-1"},
           {"worker_restarts: 101", "scheduler.worker_restarts", "101"},
           {"worker_restarts: two", "scheduler.worker_restarts", "two"},
           {"worker_restart_timeout_s: -5", "scheduler.worker_restart_timeout_s", "-5"},
           {"worker_restart_timeout_s: 1e300", "scheduler.worker_restart_timeout_s", "1e300"},
           {"worker_restart_timeout_s: .nan", "scheduler.worker_restart_timeout_s", ".nan"}}) {
    auto t = parse_topology(topology_with(yaml), "t.yaml");
    ASSERT_FALSE(t.ok()) << yaml;
    EXPECT_NE(t.status().message().find(field), std::string::npos) << t.status().message();
    EXPECT_NE(t.status().message().find(value), std::string::npos) << t.status().message();
  }
}

}  // namespace
}  // namespace specserve
