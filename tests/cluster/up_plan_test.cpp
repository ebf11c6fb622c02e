// `specserve up --dry-run`'s checks and plan (cluster/up_plan.h): a valid CPU topology passes and
// is described worker by worker; a device this machine lacks and a model file that is not GGUF
// are refused naming the file position, the field path and the value.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "cluster/up_plan.h"
#include "config/topology.h"
#include "tests/test_util.h"

namespace specserve {
namespace {

namespace fs = std::filesystem;

Expected<Topology> parse(const std::string& model, const std::string& device) {
  // Two workers sharing one GPU must split it (their fractions sum to at most 1).
  const std::string dev = device + (device == "cpu" ? "" : ", gpu_memory_utilization: 0.4");
  const std::string yaml =
      "cluster: {name: plan}\n"
      "models:\n"
      "  target: {path: " + model + ", max_model_len: 512}\n"
      "  speculative: {method: ngram, num_speculative_tokens: 3}\n"
      "nodes:\n"
      "  - name: n0\n"
      "    devices: [" + device + "]\n"
      "    workers:\n"
      "      - {role: target_shard, replica: 0, device: " + dev + "}\n"
      "      - {role: target_shard, replica: 1, device: " + dev + "}\n"
      "  - {name: far, host: 10.0.0.9, devices: [cuda:5], workers: [{role: target_shard, replica: 2, device: cuda:5}]}\n";
  return parse_topology(yaml, "plan.yaml", "");
}

TEST(UpPlan, ValidCpuTopologyIsDescribed) {
  auto t = parse(testing::default_model_path(), "cpu");
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  // The remote node's cuda:5 is not checked here: its own `specserve node` checks it.
  EXPECT_TRUE(check_up_plan(*t).ok()) << check_up_plan(*t).to_string();
  const std::string plan = describe_up_plan(*t);
  for (const char* want : {"cluster 'plan'", "max_model_len 512", "speculative: ngram, num_speculative_tokens 3",
                           "node 'n0' on 127.0.0.1 (started here)", "target_shard: replica 1, rank 0, device cpu",
                           "node 'far' on 10.0.0.9 (remote", "autoscale: off"}) {
    EXPECT_NE(plan.find(want), std::string::npos) << "'" << want << "' not in:\n" << plan;
  }
}

TEST(UpPlan, MissingGpuIsNamedWithItsField) {
  auto t = parse(testing::default_model_path(), "cuda:63");
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  const Status st = check_up_plan(*t);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("plan.yaml:9:"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("nodes[0].workers[0].device"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("cuda:63"), std::string::npos) << st.message();
}

TEST(UpPlan, ModelFileThatIsNotGgufIsRefused) {
  const fs::path bad = fs::temp_directory_path() / ("up_plan_test_" + std::to_string(::getpid()) + ".gguf");
  std::ofstream(bad) << "this is not a GGUF file, only text that a user pointed at by mistake\n";
  auto t = parse(bad.string(), "cpu");
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  const Status st = check_up_plan(*t);
  fs::remove(bad);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("models.target.path"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find(bad.string()), std::string::npos) << st.message();
}

}  // namespace
}  // namespace specserve
