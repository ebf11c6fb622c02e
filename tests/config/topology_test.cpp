// Topology YAML: the example files parse; every bad input is rejected with its
// file:line:column, field path and value.
#include "config/topology.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "tests/config/topology_test_util.h"
#include "tests/test_util.h"

namespace specserve {
namespace {

using namespace topology_testing;

TEST(Topology, BaseYamlIsValid) {
  auto t = parse(base_yaml());
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  EXPECT_EQ(t->cluster.name, "t");
  EXPECT_EQ(t->head.actor_port, 7420);
  EXPECT_EQ(t->models.target.path, fs::absolute(testing::default_model_path()).lexically_normal().string());
  ASSERT_TRUE(t->models.speculative.has_value());
  EXPECT_EQ(t->models.speculative->method, SpeculativeMethod::kNgram);
  EXPECT_EQ(t->models.speculative->num_speculative_tokens, 4);
  ASSERT_EQ(t->nodes.size(), 1u);
  ASSERT_EQ(t->nodes[0].workers.size(), 2u);
  EXPECT_EQ(t->nodes[0].workers[0].device, (DeviceSpec{DeviceKind::kCuda, 0}));
  EXPECT_EQ(t->nodes[0].workers[0].model, "target");
  EXPECT_EQ(t->nodes[0].workers[1].role, WorkerRole::kDraftWorker);
  EXPECT_EQ(t->nodes[0].workers[1].model, "speculative");
  EXPECT_EQ(t->scheduler.kv_cache_bytes, int64_t{1} << 30);
  EXPECT_TRUE(t->scheduler.enable_prefix_caching);  // vLLM V1's default
  EXPECT_TRUE(t->scheduler.rebalance_running);
  EXPECT_EQ(t->autoscale.max_replicas, 1);
  EXPECT_EQ(t->autoscale.min_replicas, 0);
  EXPECT_TRUE(t->notes.empty());
  EXPECT_EQ(t->where("head.http_port"), "t.yaml:2:54");
  EXPECT_EQ(t->where("autoscale.upscale_delay_s"), "t.yaml");  // a default: no line
}

struct BadCase {
  const char* name;
  const char* from;  // text in base_yaml() ...
  const char* to;    // ... replaced by this
  std::vector<std::string> want;  // substrings of the message: location, field path, value
  StatusCode code = StatusCode::kInvalidArgument;
};

// clang-format off
const BadCase kBadCases[] = {
  {"malformed_flow_map", "http_port: 8000}", "http_port: 8000", {"t.yaml:3:7:", "malformed YAML"}},
  {"malformed_indent", "    host: 127.0.0.1", "   host: 127.0.0.1", {"t.yaml:8:4:", "malformed YAML"}},
  {"unknown_top_key", "autoscale:", "autoscaler:", {"t.yaml:14:1:", "autoscaler", "'autoscaler'", "did you mean 'autoscale'"}},
  {"unknown_worker_key", "rank: 0, device: cuda:0", "rnak: 0, device: cuda:0", {"t.yaml:11:30:", "nodes[0].workers[0].rnak", "'rnak'", "'rank'"}},
  {"unknown_speculative_key", "prompt_lookup_max: 5", "prompt_lookup_maximum: 5", {"t.yaml:5:81:", "models.speculative.prompt_lookup_maximum", "'prompt_lookup_maximum'"}},
  {"duplicate_key", "{name: t,", "{name: t, name: u,", {"t.yaml:1:20:", "cluster.name", "duplicate key 'name'", "t.yaml:1:11"}},
  {"port_not_int", "actor_port: 7420", "actor_port: abc", {"t.yaml:2:37:", "head.actor_port", "expected an integer", "'abc'"}},
  {"devices_not_sequence", "devices: [cpu, cuda:0, cuda:1]", "devices: cpu", {"t.yaml:9:14:", "nodes[0].devices", "'cpu'", "sequence"}},
  {"tp_is_sequence", "tensor_parallel_size: 1", "tensor_parallel_size: [1]", {"t.yaml:4:34:", "models.target.tensor_parallel_size", "a sequence '[1]'"}},
  {"missing_target", "  target: {tensor_parallel_size: 1, path: MODEL}", "  # no target\n  x: {path: MODEL}", {"t.yaml:5:3:", "models.x", "'x'"}},
  {"missing_target_only", "  target: {tensor_parallel_size: 1, path: MODEL}", "  # no target", {"t.yaml:5:3:", "models.target", "missing required field"}},
  {"gpu_given_twice", "device: cpu}", "device: cuda:0}", {"t.yaml:12:38:", "nodes[0].workers[1].device", "'cuda:0'", "nodes[0].workers[0]"}},
  {"draft_tp_two", "prompt_lookup_max: 5}", "prompt_lookup_max: 5, draft_tensor_parallel_size: 2}", {"t.yaml:5:131:", "models.speculative.draft_tensor_parallel_size", "'2'", "only 1 is supported"}},
  {"tp_more_than_shards", "tensor_parallel_size: 1", "tensor_parallel_size: 2", {"t.yaml:4:34:", "models.target.tensor_parallel_size", "'2'", "missing rank(s) 1"}},
  {"rank_taken_twice", "{role: draft_worker, device: cpu}", "{role: target_shard, rank: 0, device: cpu}", {"t.yaml:12:36:", "nodes[0].workers[1].rank", "'0'", "nodes[0].workers[0]"}},
  {"rank_past_tp", "rank: 0", "rank: 1", {"t.yaml:11:36:", "nodes[0].workers[0].rank", "'1'", "0..0"}},
  {"no_target_shard", "{role: target_shard, rank: 0, device: cuda:0}", "{role: prefill_worker, device: cuda:0}", {"t.yaml:7:3:", "nodes:", "no target_shard worker", "'1'"}},
  {"draft_model_needs_model", "method: ngram, num_speculative_tokens: 4, prompt_lookup_min: 1, prompt_lookup_max: 5}", "method: draft_model, num_speculative_tokens: 4}", {"t.yaml:5:16:", "models.speculative.model", "missing required field", "'draft_model'"}},
  {"ngram_takes_no_model", "method: ngram,", "method: ngram, model: x.gguf,", {"t.yaml:5:39:", "models.speculative.model", "'x.gguf'"}},
  {"lookup_min_over_max", "prompt_lookup_min: 1, prompt_lookup_max: 5", "prompt_lookup_min: 6, prompt_lookup_max: 5", {"t.yaml:5:100:", "models.speculative.prompt_lookup_max", "'6'", "'5'"}},
  {"lookup_min_over_max_for_layer_skip", "method: ngram, num_speculative_tokens: 4, prompt_lookup_min: 1", "method: layer_skip, num_speculative_tokens: 4, prompt_lookup_min: 6", {"t.yaml:5:105:", "models.speculative.prompt_lookup_max", "'6'", "'5'"}},
  {"unknown_method", "method: ngram", "method: lookahead", {"t.yaml:5:25:", "models.speculative.method", "'lookahead'"}},
  {"too_many_spec_tokens", "num_speculative_tokens: 4", "num_speculative_tokens: 65", {"t.yaml:5:56:", "models.speculative.num_speculative_tokens", "'65'", "1..64"}},
  {"zero_block_size", "block_size: 16", "block_size: 0", {"t.yaml:13:73:", "scheduler.block_size", "'0'"}},
  {"negative_max_num_seqs", "max_num_seqs: 64", "max_num_seqs: -1", {"t.yaml:13:27:", "scheduler.max_num_seqs", "'-1'", ">= 1"}},
  {"max_num_seqs_past_int32", "max_num_seqs: 64", "max_num_seqs: 2147483648", {"t.yaml:13:27:", "scheduler.max_num_seqs", "'2147483648'", "out of range 1..2147483647"}},
  {"batched_below_seqs", "max_num_batched_tokens: 2048", "max_num_batched_tokens: 32", {"t.yaml:13:55:", "scheduler.max_num_batched_tokens", "'32'", "'64'"}},
  {"bad_kv_unit", "kv_cache_bytes: 1GiB", "kv_cache_bytes: 1GiBs", {"t.yaml:13:93:", "scheduler.kv_cache_bytes", "'1GiBs'"}},
  {"zero_kv_bytes", "kv_cache_bytes: 1GiB", "kv_cache_bytes: 0MiB", {"t.yaml:13:93:", "scheduler.kv_cache_bytes", "'0MiB'"}},
  {"negative_kv_bytes", "kv_cache_bytes: 1GiB", "kv_cache_bytes: -1GiB", {"t.yaml:13:93:", "scheduler.kv_cache_bytes", "'-1GiB'", "negative"}},
  {"rebalance_running_not_bool", "kv_cache_bytes: 1GiB}", "kv_cache_bytes: 1GiB, rebalance_running: 2}", {"t.yaml:13:", "scheduler.rebalance_running", "'2'"}},
  {"prefix_caching_not_bool", "kv_cache_bytes: 1GiB}", "kv_cache_bytes: 1GiB, enable_prefix_caching: maybe}", {"t.yaml:13:", "scheduler.enable_prefix_caching", "'maybe'"}},
  {"min_over_max_replicas", "min_replicas: 0, max_replicas: 1", "min_replicas: 3, max_replicas: 2", {"t.yaml:14:27:", "autoscale.min_replicas", "'3'", "'2'"}},
  {"negative_warm_pool", "warm_pool: 0", "warm_pool: -1", {"t.yaml:14:58:", "autoscale.warm_pool", "'-1'"}},
  {"negative_delay", "warm_pool: 0}", "warm_pool: 0, upscale_delay_s: -5}", {"t.yaml:14:78:", "autoscale.upscale_delay_s", "'-5'"}},
  {"device_not_on_node", "device: cpu}", "device: cuda:7}", {"t.yaml:12:38:", "nodes[0].workers[1].device", "'cuda:7'", "nodes[0].devices [cpu, cuda:0, cuda:1]"}},
  {"device_syntax", "device: cuda:0}", "device: gpu0}", {"t.yaml:11:47:", "nodes[0].workers[0].device", "'gpu0'", "cuda:N"}},
  {"device_listed_twice", "[cpu, cuda:0, cuda:1]", "[cpu, cuda:0, cuda:0]", {"t.yaml:9:28:", "nodes[0].devices[2]", "'cuda:0'", "twice"}},
  {"model_file_missing", "path: MODEL", "path: no-such-model.gguf", {"t.yaml:4:43:", "models.target.path", "'no-such-model.gguf'", "No such file"}, StatusCode::kNotFound},
  {"model_path_is_folder", "path: MODEL", "path: .", {"t.yaml:4:43:", "models.target.path", "'.'", "not a regular file"}, StatusCode::kNotFound},
  {"max_model_len_zero", "tensor_parallel_size: 1,", "tensor_parallel_size: 1, max_model_len: 0,", {"t.yaml:4:52:", "models.target.max_model_len", "'0'"}},
  {"dtype_unknown", "tensor_parallel_size: 1,", "tensor_parallel_size: 1, dtype: bf16,", {"t.yaml:4:44:", "models.target.dtype", "'bf16'", "auto, float32, float, bfloat16, float16, half"}},
  {"dtype_not_a_string", "tensor_parallel_size: 1,", "tensor_parallel_size: 1, dtype: [float32],", {"t.yaml:4:44:", "models.target.dtype", "expected a string"}},
  {"port_too_large", "http_port: 8000", "http_port: 70000", {"t.yaml:2:54:", "head.http_port", "'70000'", "1..65535"}},
  {"port_zero", "actor_port: 7420", "actor_port: 0", {"t.yaml:2:37:", "head.actor_port", "'0'", "1..65535"}},
  {"ports_equal", "http_port: 8000", "http_port: 7420", {"t.yaml:2:54:", "head.http_port", "'7420'", "head.actor_port"}},
  {"host_with_scheme", "head: {host: 127.0.0.1", "head: {host: http://x", {"t.yaml:2:14:", "head.host", "'http://x'"}},
  {"draft_worker_without_speculative", "  speculative: {method: ngram, num_speculative_tokens: 4, prompt_lookup_min: 1, prompt_lookup_max: 5}", "  # no speculation", {"t.yaml:12:16:", "nodes[0].workers[1].role", "models.speculative"}},
  {"unknown_role", "role: draft_worker", "role: drafter", {"t.yaml:12:16:", "nodes[0].workers[1].role", "'drafter'"}},
  {"worker_runs_wrong_model", "{role: draft_worker, device: cpu}", "{role: draft_worker, model: target, device: cpu}", {"t.yaml:12:37:", "nodes[0].workers[1].model", "'target'", "models.speculative"}},
  {"rank_on_draft_worker", "{role: draft_worker, device: cpu}", "{role: draft_worker, rank: 0, device: cpu}", {"t.yaml:12:36:", "nodes[0].workers[1].rank", "'0'", "target_shard"}},
  {"replica_without_shards", "{role: draft_worker, device: cpu}", "{role: draft_worker, replica: 3, device: cpu}", {"t.yaml:12:39:", "nodes[0].workers[1].replica", "'3'", "no target_shard"}},
  {"node_name_with_space", "name: node0", "name: \"node 0\"", {"t.yaml:7:11:", "nodes[0].name", "'node 0'"}},
  {"max_replicas_zero", "max_replicas: 1", "max_replicas: 0", {"t.yaml:14:44:", "autoscale.max_replicas", "'0'"}},
  {"target_ongoing_zero", "warm_pool: 0}", "warm_pool: 0, target_ongoing_requests: 0}", {"t.yaml:14:86:", "autoscale.target_ongoing_requests", "'0'", "(0, 1e9]"}},
  {"kv_usage_over_one", "warm_pool: 0}", "warm_pool: 0, target_kv_cache_usage: 1.5}", {"t.yaml:14:84:", "autoscale.target_kv_cache_usage", "'1.5'", "(0, 1]"}},
  {"look_back_zero", "warm_pool: 0}", "warm_pool: 0, look_back_period_s: 0}", {"t.yaml:14:81:", "autoscale.look_back_period_s", "'0'"}},
  {"negative_slo", "warm_pool: 0}", "warm_pool: 0, ttft_slo_ms: -1}", {"t.yaml:14:74:", "autoscale.ttft_slo_ms", "'-1'"}},
  {"slo_not_a_number", "warm_pool: 0}", "warm_pool: 0, ttft_slo_ms: fast}", {"t.yaml:14:74:", "autoscale.ttft_slo_ms", "'fast'"}},
  {"min_over_declared", "min_replicas: 0, max_replicas: 1", "min_replicas: 2, max_replicas: 3", {"t.yaml:14:27:", "autoscale.min_replicas", "'2'", "autoscale.warm_pool '0'", "need 2 replicas", "declare only 1 replica"}},
  {"min_plus_pool_over_declared", "min_replicas: 0, max_replicas: 1, warm_pool: 0", "min_replicas: 1, max_replicas: 1, warm_pool: 1", {"t.yaml:14:58:", "autoscale.warm_pool", "autoscale.min_replicas '1'", "autoscale.warm_pool '1'", "need 2 replicas", "declare only 1 replica"}},
  // With the autoscaler off (min == max, no pool) too: a floor above the declared replicas was taken.
  {"min_over_declared_autoscaler_off", "min_replicas: 0, max_replicas: 1", "min_replicas: 5, max_replicas: 5", {"t.yaml:14:27:", "autoscale.min_replicas", "'5'", "need 5 replicas", "declare only 1 replica"}},
  // 64-bit sums: max_replicas + warm_pool overflowed int32 and named the wrong problem.
  {"warm_pool_int32_max", "min_replicas: 0, max_replicas: 1, warm_pool: 0", "min_replicas: 1, max_replicas: 2, warm_pool: 2147483647", {"t.yaml:14:58:", "autoscale.warm_pool", "'2147483647'", "need 2147483648 replicas"}},
  // One range per field whatever the value (-3 said ">= 0", 0 then said "(0, 1e9]"), durations bounded.
  {"target_ongoing_negative", "warm_pool: 0}", "warm_pool: 0, target_ongoing_requests: -3}", {"t.yaml:14:86:", "autoscale.target_ongoing_requests", "'-3'", "(0, 1e9]"}},
  {"upscale_delay_huge", "warm_pool: 0}", "warm_pool: 0, upscale_delay_s: 1e300}", {"t.yaml:14:78:", "autoscale.upscale_delay_s", "'1e300'", "[0, 1e9] seconds"}},
  {"grace_huge", "warm_pool: 0}", "warm_pool: 0, new_replica_grace_s: 1e300}", {"t.yaml:14:82:", "autoscale.new_replica_grace_s", "'1e300'", "[0, 1e9] seconds"}},
  {"backoff_zero", "warm_pool: 0}", "warm_pool: 0, start_backoff_s: 0}", {"t.yaml:14:78:", "autoscale.start_backoff_s", "'0'", "(0, 1e9] seconds"}},
  {"backoff_max_below_backoff", "warm_pool: 0}", "warm_pool: 0, start_backoff_s: 5, start_backoff_max_s: 2}", {"t.yaml:14:", "autoscale.start_backoff_max_s", "'2'", "less than start_backoff_s '5'"}},
};
// clang-format on

class BadTopology : public ::testing::TestWithParam<BadCase> {};

TEST_P(BadTopology, IsRejectedWithLocationPathAndValue) {
  const BadCase& c = GetParam();
  auto t = parse(replace_once(base_yaml(), c.from, c.to));
  ASSERT_FALSE(t.ok()) << c.name << " was accepted";
  const std::string msg = t.status().message();
  EXPECT_EQ(t.status().code(), c.code) << msg;
  for (const std::string& w : c.want) EXPECT_NE(msg.find(w), std::string::npos) << "want '" << w << "' in:\n" << msg;
}

INSTANTIATE_TEST_SUITE_P(Cases, BadTopology, ::testing::ValuesIn(kBadCases),
                         [](const ::testing::TestParamInfo<BadCase>& i) { return std::string(i.param.name); });

// vLLM's dtype names (core/dtype.h), with its aliases; unset is auto.
TEST(Topology, TargetDtypeTakesVllmNames) {
  auto unset = parse(base_yaml());
  ASSERT_TRUE(unset.ok()) << unset.status().to_string();
  EXPECT_EQ(unset->models.target.dtype, ComputeDtype::kAuto);
  const std::pair<const char*, ComputeDtype> cases[] = {{"auto", ComputeDtype::kAuto},
                                                        {"float32", ComputeDtype::kFloat32},
                                                        {"float", ComputeDtype::kFloat32},
                                                        {"bfloat16", ComputeDtype::kBFloat16},
                                                        {"float16", ComputeDtype::kFloat16},
                                                        {"half", ComputeDtype::kFloat16}};
  for (const auto& [name, want] : cases) {
    auto t = parse(replace_once(base_yaml(), "tensor_parallel_size: 1,", std::string("tensor_parallel_size: 1, dtype: ") + name + ","));
    ASSERT_TRUE(t.ok()) << name << ": " << t.status().to_string();
    EXPECT_EQ(t->models.target.dtype, want) << name;
    EXPECT_EQ(t->where("models.target.dtype"), "t.yaml:4:44") << name;
  }
}

TEST(Topology, PrefixCachingCanBeTurnedOff) {
  auto t = parse(replace_once(base_yaml(), "kv_cache_bytes: 1GiB}", "kv_cache_bytes: 1GiB, enable_prefix_caching: false}"));
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  EXPECT_FALSE(t->scheduler.enable_prefix_caching);
}

TEST(Topology, RunningRebalanceCanBeTurnedOff) {
  auto t = parse(replace_once(base_yaml(), "kv_cache_bytes: 1GiB}", "kv_cache_bytes: 1GiB, rebalance_running: false}"));
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  EXPECT_FALSE(t->scheduler.rebalance_running);
}

TEST(Topology, ReportsEveryErrorNotOnlyTheFirst) {
  std::string y = replace_once(base_yaml(), "actor_port: 7420", "actor_port: abc");
  y = replace_once(y, "block_size: 16", "block_size: 0");
  y = replace_once(y, "warm_pool: 0", "warm_pool: -2");
  auto t = parse(y);
  ASSERT_FALSE(t.ok());
  const std::string msg = t.status().message();
  EXPECT_NE(msg.find("t.yaml:2:37: head.actor_port"), std::string::npos) << msg;
  EXPECT_NE(msg.find("t.yaml:13:73: scheduler.block_size"), std::string::npos) << msg;
  EXPECT_NE(msg.find("t.yaml:14:58: autoscale.warm_pool"), std::string::npos) << msg;
  EXPECT_EQ(std::count(msg.begin(), msg.end(), '\n'), 2) << msg;
}

TEST(Topology, EmptyOrNonMappingDocumentIsRejected) {
  auto empty = parse_topology("", "e.yaml");
  ASSERT_FALSE(empty.ok());
  EXPECT_NE(empty.status().message().find("e.yaml:1:1"), std::string::npos);
  auto list = parse_topology("- a\n- b\n", "l.yaml");
  ASSERT_FALSE(list.ok());
  EXPECT_NE(list.status().message().find("l.yaml:1:1: (top level): expected a mapping"), std::string::npos)
      << list.status().message();
  auto no_nodes = parse_topology("models: {target: {path: " + testing::default_model_path() + "}}\n", "n.yaml");
  ASSERT_FALSE(no_nodes.ok());
  EXPECT_NE(no_nodes.status().message().find("n.yaml:1:1: nodes: missing required field"), std::string::npos)
      << no_nodes.status().message();
}

// Two node entries on one machine cannot both claim all of cuda:0; on two machines they can.
// A second YAML document (two topologies pasted into one file) was silently dropped.
TEST(Topology, ASecondYamlDocumentIsRejected) {
  auto two = parse_topology(base_yaml() + "---\n" + base_yaml(), "two.yaml", model_dir());
  ASSERT_FALSE(two.ok());
  EXPECT_NE(two.status().message().find("two.yaml:"), std::string::npos) << two.status().message();
  EXPECT_NE(two.status().message().find("a second YAML document"), std::string::npos) << two.status().message();
  // A leading "---" (one document) and a trailing "..." are fine.
  EXPECT_TRUE(parse("---\n" + base_yaml() + "...\n").ok());
}

TEST(Topology, GpuConflictIsPerMachineNotPerNodeEntry) {
  const std::string two_nodes = R"(head: {host: 0.0.0.0}
models: {target: {path: MODEL}}
nodes:
  - name: a
    host: 127.0.0.1
    devices: [cuda:0]
    workers: [{role: target_shard, device: cuda:0}]
  - name: b
    host: HOST_B
    devices: [cuda:0]
    workers: [{role: target_shard, replica: 1, device: cuda:0}]
)";
  auto same = parse(replace_once(two_nodes, "HOST_B", "localhost"));
  ASSERT_FALSE(same.ok());
  EXPECT_NE(same.status().message().find("t.yaml:11:56: nodes[1].workers[0].device: 'cuda:0' on host 'localhost' is shared "
                                         "by nodes[0].workers[0] (node 'a') '0.9' (default) + nodes[1].workers[0] (node 'b')"),
            std::string::npos)
      << same.status().message();

  auto other = parse(replace_once(two_nodes, "HOST_B", "10.1.2.3"));
  ASSERT_TRUE(other.ok()) << other.status().to_string();
  EXPECT_EQ(other->replica_ids(), (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(other->autoscale.max_replicas, 2);  // default: the declared replicas
  // Both non-loopback hosts are allowed and recorded.
  ASSERT_EQ(other->notes.size(), 2u);
  EXPECT_NE(other->notes[0].find("t.yaml:1:14: head.host: '0.0.0.0' is not loopback"), std::string::npos) << other->notes[0];
  EXPECT_NE(other->notes[1].find("t.yaml:9:11: nodes[1].host: '10.1.2.3'"), std::string::npos) << other->notes[1];

  auto same_name = parse(replace_once(replace_once(two_nodes, "HOST_B", "10.1.2.3"), "name: b", "name: a"));
  ASSERT_FALSE(same_name.ok());
  EXPECT_NE(same_name.status().message().find("t.yaml:8:11: nodes[1].name: 'a' is already the name of nodes[0]"),
            std::string::npos)
      << same_name.status().message();
}

TEST(Topology, MaxReplicasOutOfReachIsANoteNotAnError) {
  // 1 declared replica, max 2 (no pool): min 0 fits, the top of the range cannot.
  auto t = parse(replace_once(base_yaml(), "max_replicas: 1", "max_replicas: 2"));
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  ASSERT_EQ(t->notes.size(), 1u);
  EXPECT_NE(t->notes[0].find("t.yaml:14:44: autoscale.max_replicas '2' + autoscale.warm_pool '0' want 2 replicas but the "
                             "nodes declare 1: at most 1 can be ready"),
            std::string::npos)
      << t->notes[0];
  // A pool as large as the declared replicas is full only while none is ready (it read "up to 0
  // ready the pool stays full").
  auto pool = parse(replace_once(base_yaml(), "warm_pool: 0", "warm_pool: 1"));
  ASSERT_TRUE(pool.ok()) << pool.status().to_string();
  ASSERT_EQ(pool->notes.size(), 1u);
  EXPECT_NE(pool->notes[0].find("want 2 replicas but the nodes declare 1: the pool is full only while no replica is ready"),
            std::string::npos)
      << pool->notes[0];
  // With room for some ready replicas, it says how many.
  auto three = parse(replace_once(replace_once(replace_once(base_yaml(), "warm_pool: 0", "warm_pool: 1"), "max_replicas: 1",
                                               "max_replicas: 3"),
                                  "      - {role: draft_worker, device: cpu}\n",
                                  "      - {role: target_shard, replica: 1, device: cuda:1}\n"
                                  "      - {role: target_shard, replica: 2, device: cpu}\n"));
  ASSERT_TRUE(three.ok()) << three.status().to_string();
  ASSERT_EQ(three->notes.size(), 1u);
  EXPECT_NE(three->notes[0].find("the nodes declare 3: with up to 2 ready the pool stays full"), std::string::npos)
      << three->notes[0];
}

TEST(Topology, MoreDeclaredReplicasThanMaxReplicasIsRejected) {
  const std::string y = R"(models: {target: {path: MODEL}}
nodes:
  - {name: a, devices: [cpu], workers: [{role: target_shard, device: cpu}, {role: target_shard, replica: 1, device: cpu}]}
autoscale: {max_replicas: 1}
)";
  auto t = parse(y);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("t.yaml:4:27: autoscale.max_replicas: '1' is less than the 2 replicas"), std::string::npos)
      << t.status().message();
  // min == max and no pool: the autoscaler is off, which the message says (a user wrote
  // {min_replicas: 1, max_replicas: 1} and did not know why it was refused).
  EXPECT_NE(t.status().message().find("the autoscaler is off and every declared replica serves"), std::string::npos)
      << t.status().message();
}

TEST(Topology, OutOfReachNoteNamesADerivedMaxReplicasAsTheDefault) {
  // warm_pool 3 with 3 declared replicas and no max_replicas: the derived default (max(1, 3 - 3,
  // 1) = 1) is named as such, at the autoscale section's line.
  const std::string y = R"(models: {target: {path: MODEL}}
nodes:
  - {name: a, devices: [cpu], workers: [{role: target_shard, device: cpu}, {role: target_shard, replica: 1, device: cpu}, {role: target_shard, replica: 2, device: cpu}]}
autoscale: {min_replicas: 0, warm_pool: 3}
)";
  auto t = parse(y);
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  ASSERT_EQ(t->notes.size(), 1u);
  EXPECT_NE(t->notes[0].find("t.yaml:4:"), std::string::npos) << t->notes[0];
  EXPECT_NE(t->notes[0].find("(the default: max(min_replicas, declared replicas - warm_pool, 1))"), std::string::npos)
      << t->notes[0];
}

TEST(Topology, TensorParallelShardsAcrossGpusAndDefaults) {
  const std::string y = R"(models:
  target: {path: MODEL, tensor_parallel_size: 2}
nodes:
  - name: gpu-box
    devices: [cuda:0, cuda:1, cuda:2, cuda:3]
    workers:
      - {role: target_shard, rank: 1, device: cuda:1}
      - {role: target_shard, rank: 0, device: cuda:0}
      - {role: target_shard, replica: 1, rank: 0, device: cuda:2}
      - {role: target_shard, replica: 1, rank: 1, device: cuda:3}
)";
  auto t = parse(y);
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  EXPECT_EQ(t->replica_ids(), (std::vector<int32_t>{0, 1}));
  EXPECT_FALSE(t->models.speculative.has_value());
  EXPECT_EQ(t->head.host, "127.0.0.1");
  EXPECT_EQ(t->head.actor_port, 7420);
  EXPECT_EQ(t->head.http_port, 8000);
  EXPECT_EQ(t->cluster.name, "specserve");
  EXPECT_EQ(t->scheduler.block_size, 16);
  EXPECT_EQ(t->autoscale.min_replicas, 1);
  EXPECT_EQ(t->autoscale.max_replicas, 2);
  EXPECT_EQ(t->nodes[0].host, "127.0.0.1");

  // Without ranks, a tp=2 shard cannot say which half it holds.
  auto no_rank = parse(replace_once(y, "rank: 1, device: cuda:1", "device: cuda:1"));
  ASSERT_FALSE(no_rank.ok());
  EXPECT_NE(no_rank.status().message().find("t.yaml:7:9: nodes[0].workers[0].rank: missing required field"), std::string::npos)
      << no_rank.status().message();

  // A prefill worker ships whole KV blocks; a tp=2 decode replica keeps them split: refused.
  auto prefill = parse(replace_once(y, "cuda:2, cuda:3]", "cuda:2, cuda:3, cuda:4]") +
                       "      - {role: prefill_worker, replica: 1, device: cuda:4}\n");
  ASSERT_FALSE(prefill.ok());
  EXPECT_NE(prefill.status().message().find("nodes[0].workers[4].role"), std::string::npos) << prefill.status().message();
  EXPECT_NE(prefill.status().message().find("needs models.target.tensor_parallel_size 1 (it is '2')"), std::string::npos)
      << prefill.status().message();
}

TEST(Topology, ABadTensorParallelSizeIsOneErrorNotAlsoTheRanks) {
  const std::string y = R"(models:
  target: {path: MODEL, tensor_parallel_size: two}
nodes:
  - name: n
    workers:
      - {role: target_shard, rank: 0}
      - {role: target_shard, rank: 1}
)";
  auto t = parse(y);
  ASSERT_FALSE(t.ok());
  const std::string m = t.status().message();
  EXPECT_NE(m.find("models.target.tensor_parallel_size"), std::string::npos) << m;
  EXPECT_NE(m.find("'two'"), std::string::npos) << m;
  EXPECT_EQ(m.find("rank"), std::string::npos) << "a second, misleading error about the ranks: " << m;
}

// ---------------------------------------------------------------- example files

TEST(Topology, ExampleFilesParseAndUseTheDefaultModel) {
  // The README's test command fetches the model first; without it this fails, never skips.
  ASSERT_TRUE(fs::exists(std::string(SPECSERVE_SOURCE_DIR) + "/models/SmolLM2-135M-Instruct.Q4_1.gguf"))
      << "default model missing: run scripts/test.sh (it fetches the model)";
  const std::string model =
      fs::path(std::string(SPECSERVE_SOURCE_DIR) + "/models/SmolLM2-135M-Instruct.Q4_1.gguf").lexically_normal().string();
  for (const char* name : {"cluster-local.yaml", "cluster-two-nodes.yaml", "cluster-disagg.yaml", "cluster-tensor-parallel.yaml"}) {
    SCOPED_TRACE(name);
    auto t = load_topology_file(std::string(SPECSERVE_SOURCE_DIR) + "/examples/" + name);
    ASSERT_TRUE(t.ok()) << t.status().to_string();
    EXPECT_EQ(t->models.target.path, model);  // relative to the YAML file, made absolute
    ASSERT_TRUE(t->models.speculative.has_value());
    EXPECT_EQ(t->models.speculative->method, SpeculativeMethod::kNgram);
    EXPECT_EQ(t->models.speculative->num_speculative_tokens, 4);
    EXPECT_EQ(t->head.host, "127.0.0.1");
    EXPECT_TRUE(t->notes.empty());
    EXPECT_EQ(t->cluster.token_file.front(), '/');
  }
  auto local = load_topology_file(std::string(SPECSERVE_SOURCE_DIR) + "/examples/cluster-local.yaml");
  ASSERT_TRUE(local.ok());
  ASSERT_EQ(local->nodes.size(), 1u);
  ASSERT_EQ(local->nodes[0].workers.size(), 2u);
  EXPECT_EQ(local->nodes[0].workers[0].role, WorkerRole::kTargetShard);
  EXPECT_EQ(local->nodes[0].workers[1].role, WorkerRole::kDraftWorker);
  EXPECT_EQ(local->replica_ids(), (std::vector<int32_t>{0}));
  auto two = load_topology_file(std::string(SPECSERVE_SOURCE_DIR) + "/examples/cluster-two-nodes.yaml");
  ASSERT_TRUE(two.ok());
  ASSERT_EQ(two->nodes.size(), 2u);
  EXPECT_EQ(two->replica_ids(), (std::vector<int32_t>{0, 1, 2}));
  EXPECT_EQ(two->autoscale.warm_pool, 1);
}

TEST(Topology, MissingFileIsNotFound) {
  auto t = load_topology_file("/nonexistent/cluster.yaml");
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::kNotFound);
  EXPECT_NE(t.status().message().find("/nonexistent/cluster.yaml"), std::string::npos);
}

// `client` and `status` read only the head's endpoint and the token file: a topology whose model
// is missing on this host (or whose nodes ask for a device this host lacks) still gives them,
// while load_topology_file refuses it; errors in those two sections are still named.
TEST(Topology, EndpointReadsClusterAndHeadOnly) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / ("topology_endpoint_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "t.yaml").string();
  std::ofstream(path) << "cluster: { name: t, token_file: tok }\n"
                      << "head: { host: 127.0.0.1, actor_port: 17999 }\n"
                      << "models:\n  target: { path: /nonexistent/model.gguf }\n"
                      << "nodes:\n  - { name: n0, host: 127.0.0.1, devices: [cpu], workers: [{ role: target_shard, replica: 0, device: cuda:7 }] }\n";
  auto full = load_topology_file(path);
  ASSERT_FALSE(full.ok());
  EXPECT_NE(full.status().message().find("/nonexistent/model.gguf"), std::string::npos) << full.status().message();
  auto e = load_topology_endpoint(path);
  ASSERT_TRUE(e.ok()) << e.status().message();
  EXPECT_EQ(e->head.host, "127.0.0.1");
  EXPECT_EQ(e->head.actor_port, 17999);
  EXPECT_EQ(e->cluster.token_file, (dir / "tok").string()) << "relative to the file's folder, as load_topology_file";
  std::ofstream(path) << "head: { actor_port: 99999 }\nmodels: {}\n";
  e = load_topology_endpoint(path);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("head.actor_port"), std::string::npos) << e.status().message();
  std::ofstream(path) << "head: { actor_port: 17999 }\nfrobnicate: 1\n";
  e = load_topology_endpoint(path);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("frobnicate"), std::string::npos) << e.status().message();
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace specserve
