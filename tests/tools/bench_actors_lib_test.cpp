// `specserve bench-actors`'s pure parts: the spread of a set of values, the per-path summary
// against the direct Engine, a concurrency level's JSON, the Spec-Bench task of a category and
// the `models.speculative` YAML (parsed back by the topology parser the benchmark uses).
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "config/topology.h"
#include "tests/test_util.h"
#include "tools/cli/bench_actors_lib.h"

namespace specserve::cli::bench_actors {
namespace {

TEST(BenchActorsSpread, EvenCountMeanMedianSampleStdev) {
  const Spread s = spread({4, 1, 3, 2});
  EXPECT_DOUBLE_EQ(s.mean, 2.5);
  EXPECT_DOUBLE_EQ(s.median, 2.5);  // the mean of the middle two
  EXPECT_DOUBLE_EQ(s.min, 1);
  EXPECT_DOUBLE_EQ(s.max, 4);
  EXPECT_NEAR(s.stdev, std::sqrt(5.0 / 3.0), 1e-12);  // n - 1 in the denominator
}

TEST(BenchActorsSpread, OddCountAndEmpty) {
  const Spread s = spread({3, 10, 2});
  EXPECT_DOUBLE_EQ(s.median, 3);
  const Spread one = spread({7});
  EXPECT_DOUBLE_EQ(one.stdev, 0);
  EXPECT_DOUBLE_EQ(one.median, 7);
  const Spread none = spread({});
  EXPECT_DOUBLE_EQ(none.mean, 0);
  EXPECT_DOUBLE_EQ(none.max, 0);
}

Sample sample(double seconds, double ttft_s, int64_t tokens, int64_t steps, double forward_s) {
  Sample s;
  s.seconds = seconds;
  s.ttft_s = ttft_s;
  s.tokens = tokens;
  s.steps = steps;
  s.forward_s = forward_s;
  return s;
}

TEST(BenchActorsSummarize, OverheadAgainstTheDirectEngineOfTheSameUnit) {
  std::vector<Unit> units(2);
  units[0].quiet = true;
  units[0].s["direct"] = sample(1.0, 0.1, 10, 10, 0.8);
  units[0].s["actor"] = sample(1.1, 0.1, 10, 10, 0.8);
  units[1].quiet = false;
  units[1].s["direct"] = sample(2.0, 0.2, 10, 10, 1.6);
  units[1].s["actor"] = sample(3.0, 0.2, 10, 10, 1.6);
  const json all = summarize(units, {"direct", "actor"}, /*quiet_only=*/false);
  EXPECT_EQ(all["actor"]["units"].get<int>(), 2);
  EXPECT_NEAR(all["actor"]["overhead_vs_direct"]["mean"].get<double>(), (0.1 + 0.5) / 2, 1e-12);
  EXPECT_NEAR(all["actor"]["overhead_vs_direct"]["max"].get<double>(), 0.5, 1e-12);
  EXPECT_NEAR(all["direct"]["overhead_vs_direct"]["mean"].get<double>(), 0.0, 1e-12);
  // (3.0 + 1.1) s over 20 steps and 20 tokens.
  EXPECT_NEAR(all["actor"]["ms_per_step"].get<double>(), 4.1 / 20 * 1e3, 1e-9);
  EXPECT_NEAR(all["actor"]["tokens_per_step"].get<double>(), 1.0, 1e-12);
  // Wall time outside forward passes and drafting: 4.1 - 2.4 s over 20 steps.
  EXPECT_NEAR(all["actor"]["outside_engine_ms_per_step"].get<double>(), (4.1 - 2.4) / 20 * 1e3, 1e-9);
  // Decode phase: the first step (decode_steps_offset 1) and the time to first token left out.
  EXPECT_NEAR(all["actor"]["ms_per_decode_step"].get<double>(), (1.0 + 2.8) / 18 * 1e3, 1e-9);

  const json quiet = summarize(units, {"direct", "actor"}, /*quiet_only=*/true);
  EXPECT_EQ(quiet["actor"]["units"].get<int>(), 1);
  EXPECT_NEAR(quiet["actor"]["overhead_vs_direct"]["median"].get<double>(), 0.1, 1e-12);
  EXPECT_NEAR(quiet["actor"]["overhead_us_per_step"]["median"].get<double>(), 0.1 / 10 * 1e6, 1e-6);

  units[1].quiet = false;
  units[0].quiet = false;
  const json none = summarize(units, {"direct", "actor"}, /*quiet_only=*/true);
  EXPECT_EQ(none["actor"]["units"].get<int>(), 0);
  EXPECT_FALSE(none["actor"].contains("ms_per_step"));
}

TEST(BenchActorsLevelResult, ThroughputAndTtftPercentiles) {
  LevelResult r;
  r.clients = 2;
  r.requests = 3;
  r.tokens = 60;
  r.seconds = 2.0;
  r.ttft = {0.3, 0.1, 0.2};
  const json j = r.to_json();
  EXPECT_DOUBLE_EQ(j["tokens_per_s"].get<double>(), 30.0);
  EXPECT_DOUBLE_EQ(j["p50_ttft_s"].get<double>(), 0.2);
  EXPECT_DOUBLE_EQ(j["max_ttft_s"].get<double>(), 0.3);
  EXPECT_NEAR(j["mean_ttft_s"].get<double>(), 0.2, 1e-12);
  LevelResult empty;
  EXPECT_DOUBLE_EQ(empty.to_json()["tokens_per_s"].get<double>(), 0.0);
  EXPECT_DOUBLE_EQ(empty.to_json()["p50_ttft_s"].get<double>(), 0.0);
}

TEST(BenchActorsTaskOf, SpecBenchTasksKeepTheirNameTheRestIsMtBench) {
  for (const char* t : {"translation", "summarization", "qa", "math_reasoning", "rag"}) EXPECT_EQ(task_of(t), t);
  EXPECT_EQ(task_of("writing"), "mt_bench");
  EXPECT_EQ(task_of("coding"), "mt_bench");
  EXPECT_EQ(task_of(""), "mt_bench");
}

// n-gram, k = 4, lookup 1..5 (the benchmark's default configuration).
SpeculativeSpec ngram_k4() {
  SpeculativeSpec s;
  s.method = SpeculativeMethod::kNgram;
  s.num_speculative_tokens = 4;
  s.prompt_lookup_min = 1;
  s.prompt_lookup_max = 5;
  return s;
}

TEST(BenchActorsSpecName, NamesMethodKLookupAndFixedK) {
  SpeculativeSpec s = ngram_k4();
  EXPECT_EQ(spec_name(s), "ngram k=4 lookup 1..5");
  s.adaptive_k = false;
  EXPECT_EQ(spec_name(s), "ngram k=4 lookup 1..5 fixed k");
  s.method = SpeculativeMethod::kEagle;
  s.adaptive_k = true;
  EXPECT_EQ(spec_name(s), "eagle k=4");
}

TEST(BenchActorsSpeculativeYaml, WritesOnlyWhatIsSet) {
  EXPECT_EQ(speculative_yaml(std::nullopt), "");
  SpeculativeSpec s;
  s.method = SpeculativeMethod::kEagle;
  s.num_speculative_tokens = 8;
  s.model = "/m/eagle.gguf";
  s.eagle_topk = 4;
  s.eagle_depth = 5;
  s.adaptive_k = false;
  EXPECT_EQ(speculative_yaml(s),
            "  speculative: { method: eagle, num_speculative_tokens: 8, model: \"/m/eagle.gguf\", eagle_topk: 4, "
            "eagle_depth: 5, adaptive_k: false }\n");
}

TEST(BenchActorsSpeculativeYaml, NgramParsesBackToTheSameSpec) {
  SpeculativeSpec s = ngram_k4();
  s.disable_by_batch_size = 8;
  // The shape of the benchmark's cluster.yaml (bench_actors_runs.cpp write_topology).
  const std::string yaml = "cluster: { name: t, token_file: /tmp/specserve-test-token }\n"
                           "head: { host: 127.0.0.1, actor_port: 7420, http_port: 8000 }\n"
                           "models:\n  target: { path: \"" + testing::default_model_path() + "\", max_model_len: 4096 }\n" +
                           speculative_yaml(s) +
                           "nodes:\n  - { name: n0, host: 127.0.0.1, devices: [cpu], "
                           "workers: [ { role: target_shard, replica: 0, rank: 0, device: cpu } ] }\n"
                           "scheduler: { max_num_seqs: 64, max_num_batched_tokens: 2048, kv_cache_bytes: 2GiB }\n";
  auto t = parse_topology(yaml, "t.yaml");
  ASSERT_TRUE(t.ok()) << t.status().to_string() << "\n" << yaml;
  ASSERT_TRUE(t->models.speculative.has_value());
  const SpeculativeSpec& p = *t->models.speculative;
  EXPECT_EQ(p.method, SpeculativeMethod::kNgram);
  EXPECT_EQ(p.num_speculative_tokens, 4);
  EXPECT_EQ(p.prompt_lookup_min, 1);
  EXPECT_EQ(p.prompt_lookup_max, 5);
  ASSERT_TRUE(p.disable_by_batch_size.has_value());
  EXPECT_EQ(*p.disable_by_batch_size, 8);
  EXPECT_TRUE(p.adaptive_k);
}

TEST(BenchActorsSpeculativeYaml, LookupFirstParsesBackToTheSameSpec) {
  // Prompt lookup first with a model-based method (spec/lookup_first_proposer.h): the bounds
  // must reach the cluster's YAML, or the benchmark would run the method alone.
  SpeculativeSpec s;
  s.method = SpeculativeMethod::kLayerSkip;
  s.num_speculative_tokens = 3;
  s.lookup_first = true;
  s.prompt_lookup_min = 2;
  s.prompt_lookup_max = 4;
  const std::string yaml = "models:\n  target: { path: \"" + testing::default_model_path() + "\" }\n" + speculative_yaml(s) +
                           "nodes:\n  - { name: n0, devices: [cpu], workers: [ { role: target_shard, device: cpu } ] }\n";
  auto t = parse_topology(yaml, "t.yaml");
  ASSERT_TRUE(t.ok()) << t.status().to_string() << "\n" << yaml;
  const SpeculativeSpec& p = *t->models.speculative;
  EXPECT_EQ(p.method, SpeculativeMethod::kLayerSkip);
  EXPECT_TRUE(p.lookup_first);
  EXPECT_EQ(p.prompt_lookup_min, 2);
  EXPECT_EQ(p.prompt_lookup_max, 4);
  EXPECT_EQ(spec_name(s), "layer_skip k=3 lookup first 2..4");
  s.lookup_first = false;
  EXPECT_EQ(speculative_yaml(s).find("prompt_lookup"), std::string::npos) << "layer_skip alone writes no lookup bounds";
}

}  // namespace
}  // namespace specserve::cli::bench_actors
