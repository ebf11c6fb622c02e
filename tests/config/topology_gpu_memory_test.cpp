// Topology YAML: a worker's gpu_memory_utilization (vLLM's fraction of a GPU's total memory) —
// parsed, range-checked with its location, path and value; workers sharing one GPU of one machine
// refused when their fractions sum past 1, with the node, the device and every fraction named.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "config/topology.h"
#include "tests/test_util.h"

namespace specserve {
namespace {

namespace fs = std::filesystem;

// A target shard and a draft worker on one GPU; TARGET and DRAFT stand for their extra keys.
// Columns below are 1-based and counted by hand from these lines.
const char* kShared =
    "models:\n"                                                                           // 1
    "  target: {path: MODEL}\n"                                                           // 2
    "  speculative: {method: ngram, num_speculative_tokens: 4}\n"                         // 3
    "nodes:\n"                                                                            // 4
    "  - name: gpu0\n"                                                                    // 5
    "    devices: [cuda:0, cuda:1]\n"                                                     // 6
    "    workers:\n"                                                                      // 7
    "      - {role: target_shard, device: cuda:0TARGET}\n"                                // 8
    "      - {role: draft_worker, device: cuda:0DRAFT}\n";                                // 9

std::string fill(std::string text, const std::string& key, const std::string& value) {
  const size_t at = text.find(key);
  EXPECT_NE(at, std::string::npos) << key;
  if (at != std::string::npos) text.replace(at, key.size(), value);
  return text;
}

Expected<Topology> parse(const std::string& target, const std::string& draft, std::string yaml = kShared) {
  yaml = fill(fill(fill(yaml, "TARGET", target), "DRAFT", draft), "MODEL",
              fs::path(testing::default_model_path()).filename().string());
  return parse_topology(yaml, "t.yaml", fs::path(testing::default_model_path()).parent_path().string());
}

void expect_has(const Status& st, const std::vector<std::string>& wants) {
  for (const auto& w : wants) EXPECT_NE(st.message().find(w), std::string::npos) << "'" << w << "' not in: " << st.message();
}

TEST(TopologyGpuMemory, FractionsThatSumToAtMostOneShareADevice) {
  auto t = parse(", gpu_memory_utilization: 0.6", ", gpu_memory_utilization: 0.4");
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  ASSERT_EQ(t->nodes[0].workers.size(), 2u);
  EXPECT_DOUBLE_EQ(t->nodes[0].workers[0].gpu_memory_utilization, 0.6);
  EXPECT_DOUBLE_EQ(t->nodes[0].workers[1].gpu_memory_utilization, 0.4);
  EXPECT_TRUE(t->notes.empty());
}

TEST(TopologyGpuMemory, DefaultIsVllmsPointNine) {
  auto t = parse("", "", fill(kShared, "device: cuda:0DRAFT", "device: cuda:1DRAFT"));
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  EXPECT_DOUBLE_EQ(t->nodes[0].workers[0].gpu_memory_utilization, 0.9);
  EXPECT_DOUBLE_EQ(t->nodes[0].workers[1].gpu_memory_utilization, 0.9);
  auto one = parse(", gpu_memory_utilization: 1", "", fill(kShared, "device: cuda:0DRAFT", "device: cuda:1DRAFT"));
  ASSERT_TRUE(one.ok()) << one.status().to_string();
  EXPECT_DOUBLE_EQ(one->nodes[0].workers[0].gpu_memory_utilization, 1.0);
}

TEST(TopologyGpuMemory, OutOfRangeOrNotANumberIsRefusedWithLocationPathAndValue) {
  // Line 8: the value is at column 70 (after "      - {role: target_shard, device: cuda:0, gpu_memory_utilization: ").
  for (const std::string v : {"0", "0.0", "-0.5", "1.01", "90"}) {
    auto t = parse(", gpu_memory_utilization: " + v, "", fill(kShared, "device: cuda:0DRAFT", "device: cuda:1DRAFT"));
    ASSERT_FALSE(t.ok()) << v;
    EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument);
    expect_has(t.status(), {"t.yaml:8:70: nodes[0].workers[0].gpu_memory_utilization: '" + v + "' must be in (0, 1]"});
  }
  auto t = parse("", ", gpu_memory_utilization: most", fill(kShared, "device: cuda:0TARGET", "device: cuda:1TARGET"));
  ASSERT_FALSE(t.ok());
  expect_has(t.status(), {"t.yaml:9:70: nodes[0].workers[1].gpu_memory_utilization", "expected a number", "'most'"});
}

TEST(TopologyGpuMemory, SharedDeviceOverOneIsRefusedNamingNodeDeviceAndFractions) {
  auto t = parse(", gpu_memory_utilization: 0.6", ", gpu_memory_utilization: 0.5");
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument);
  expect_has(t.status(), {"t.yaml:9:70: nodes[0].workers[1].gpu_memory_utilization: 'cuda:0' on host '127.0.0.1' is shared by "
                          "nodes[0].workers[0] (node 'gpu0') '0.6' + nodes[0].workers[1] (node 'gpu0') '0.5': "
                          "gpu_memory_utilization sums to 1.1 > 1",
                          "so that they sum to at most 1"});
}

TEST(TopologyGpuMemory, AnUnsetFractionCountsAsTheDefault) {
  // 0.9 (default) + 0.3: the message says which one was not set, at the second worker's device.
  auto t = parse("", ", gpu_memory_utilization: 0.3");
  ASSERT_FALSE(t.ok());
  expect_has(t.status(), {"t.yaml:9:70: nodes[0].workers[1].gpu_memory_utilization:",
                          "nodes[0].workers[0] (node 'gpu0') '0.9' (default) + nodes[0].workers[1] (node 'gpu0') '0.3'",
                          "sums to 1.2 > 1"});
  auto both_default = parse("", "");
  ASSERT_FALSE(both_default.ok());
  expect_has(both_default.status(), {"t.yaml:9:38: nodes[0].workers[1].device: 'cuda:0'", "sums to 1.8 > 1"});
}

TEST(TopologyGpuMemory, ExactlyOneInBinaryRoundingIsAllowed) {
  auto t = parse(", gpu_memory_utilization: 0.7", ", gpu_memory_utilization: 0.3");  // 1.0000000000000002 in doubles
  ASSERT_TRUE(t.ok()) << t.status().to_string();
}

TEST(TopologyGpuMemory, IgnoredOnTheCpuWithANote) {
  std::string yaml = fill(fill(kShared, "device: cuda:0TARGET", "device: cpuTARGET"), "device: cuda:0DRAFT", "device: cpuDRAFT");
  yaml = fill(yaml, "devices: [cuda:0, cuda:1]", "devices: [cpu]");
  auto t = parse(", gpu_memory_utilization: 0.8", ", gpu_memory_utilization: 0.8", yaml);
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  ASSERT_EQ(t->notes.size(), 2u);
  EXPECT_NE(t->notes[0].find("nodes[0].workers[0].gpu_memory_utilization: '0.8' is ignored on device 'cpu'"), std::string::npos)
      << t->notes[0];
}

TEST(TopologyGpuMemory, TheGpuExampleParses) {
  auto t = load_topology_file(std::string(SPECSERVE_SOURCE_DIR) + "/examples/cluster-gpu.yaml");
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  ASSERT_EQ(t->nodes.size(), 1u);
  ASSERT_EQ(t->nodes[0].workers.size(), 2u);
  EXPECT_EQ(t->nodes[0].workers[0].device, t->nodes[0].workers[1].device);
  EXPECT_DOUBLE_EQ(t->nodes[0].workers[0].gpu_memory_utilization, 0.6);
  EXPECT_DOUBLE_EQ(t->nodes[0].workers[1].gpu_memory_utilization, 0.3);
  EXPECT_TRUE(t->notes.empty());
}

}  // namespace
}  // namespace specserve
