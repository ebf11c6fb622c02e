// `specserve up --dry-run`'s checks and plan (cluster/up_plan.h): a valid CPU topology passes and
// is described worker by worker; a device this machine lacks, a model file that is not GGUF, a
// target of an unsupported architecture or that is a head file, a head of the wrong method or
// trained on another target, and a speculative_token_tree that does not parse are refused naming
// the file position, the field path and the value — every one of them, not only the first.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "cluster/up_plan.h"
#include "model/model_config.h"
#include "config/topology.h"
#include "model/gguf_writer.h"
#include "model/synthetic_model.h"
#include "tests/test_util.h"

namespace specserve {
namespace {

namespace fs = std::filesystem;

std::string head_path(const char* method) {
  return std::string(SPECSERVE_SOURCE_DIR) + "/models/heads/" + method + "-smollm2-135m.gguf";
}

Expected<Topology> parse(const std::string& model, const std::string& device,
                         const std::string& speculative = "{method: ngram, num_speculative_tokens: 3}",
                         bool with_draft_worker = false) {
  // Two workers sharing one GPU must split it (their fractions sum to at most 1).
  const std::string dev = device + (device == "cpu" ? "" : ", gpu_memory_utilization: 0.4");
  const std::string yaml =
      "cluster: {name: plan}\n"
      "models:\n"
      "  target: {path: " + model + ", max_model_len: 512}\n"
      "  speculative: " + speculative + "\n"
      "nodes:\n"
      "  - name: n0\n"
      "    devices: [" + device + "]\n"
      "    workers:\n"
      "      - {role: target_shard, replica: 0, device: " + dev + "}\n"
      "      - {role: target_shard, replica: 1, device: " + dev + "}\n"
      + std::string(with_draft_worker ? "      - {role: draft_worker, replica: 0, device: cpu}\n" : "") +
      "  - {name: far, host: 10.0.0.9, devices: [cuda:5], workers: [{role: target_shard, replica: 2, device: cuda:5}]}\n"
      "head: {host: 10.0.0.1}\n";  // an address the remote node 'far' can reach (last: the lines above keep their numbers)
  return parse_topology(yaml, "plan.yaml", "");
}

std::string joined(const std::vector<Status>& problems) {
  std::string s;
  for (const Status& st : problems) s += st.message() + "\n";
  return s;
}

// The problem whose message names `field`; fails the test when there is none.
std::string problem_about(const std::vector<Status>& problems, const std::string& field) {
  for (const Status& st : problems)
    if (st.message().find(field) != std::string::npos) return st.message();
  ADD_FAILURE() << "no problem names " << field << " in:\n" << joined(problems);
  return "";
}

TEST(UpPlan, ValidCpuTopologyIsDescribed) {
  auto t = parse(testing::default_model_path(), "cpu", "{method: ngram, num_speculative_tokens: 3}", /*with_draft_worker=*/true);
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  // The remote node's cuda:5 is not checked here: its own `specserve node` checks it.
  EXPECT_TRUE(check_up_plan(*t).empty()) << joined(check_up_plan(*t));
  const std::string plan = describe_up_plan(*t);
  for (const char* want : {"cluster 'plan'", "max_model_len 512", "speculative: ngram, num_speculative_tokens 3",
                           "node 'n0' on 127.0.0.1 (started here)", "target_shard: replica 1, rank 0, device cpu",
                           "draft_worker: replica 0, device cpu", "node 'far' on 10.0.0.9 (remote", "autoscale: off"}) {
    EXPECT_NE(plan.find(want), std::string::npos) << "'" << want << "' not in:\n" << plan;
  }
  // A rank means nothing for a draft worker: the plan does not print one for it.
  const size_t dw = plan.find("draft_worker:");
  ASSERT_NE(dw, std::string::npos);
  EXPECT_EQ(plan.substr(dw, plan.find('\n', dw) - dw).find("rank"), std::string::npos) << plan;
  // draft_p_min, when set, is shown as it took effect.
  auto p = parse(testing::default_model_path(), "cpu", "{method: layer_skip, num_speculative_tokens: 3, draft_p_min: 0.35}");
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  const std::string with_pmin = describe_up_plan(*p);
  EXPECT_NE(with_pmin.find("speculative: layer_skip, num_speculative_tokens 3, draft_p_min 0.35"), std::string::npos) << with_pmin;
}

// A node on another host cannot join a head that listens on loopback: a problem of the plan
// (exit 2), not a note. NOTE: only a note said so, and `up` waited for that node for good.
TEST(UpPlan, ARemoteNodeOfALoopbackHeadIsRefused) {
  const std::string yaml =
      "cluster: {name: plan}\n"
      "head: {host: 127.0.0.1}\n"
      "models:\n"
      "  target: {path: " + testing::default_model_path() + "}\n"
      "nodes:\n"
      "  - {name: n0, devices: [cpu], workers: [{role: target_shard, replica: 0, device: cpu}]}\n"
      "  - {name: far, host: 10.1.2.3, devices: [cpu], workers: [{role: target_shard, replica: 1, device: cpu}]}\n";
  auto t = parse_topology(yaml, "plan.yaml", "");
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  const std::string m = problem_about(check_up_plan(*t), "nodes[1].host");
  EXPECT_NE(m.find("plan.yaml:7:"), std::string::npos) << m;
  EXPECT_NE(m.find("nodes[1].host = 10.1.2.3"), std::string::npos) << m;
  EXPECT_NE(m.find("cannot reach head.host 127.0.0.1, which is loopback"), std::string::npos) << m;
}

TEST(UpPlan, MissingGpuIsNamedWithItsField) {
  auto t = parse(testing::default_model_path(), "cuda:63");
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  const std::vector<Status> problems = check_up_plan(*t);
  ASSERT_FALSE(problems.empty());
  const std::string m = problem_about(problems, "nodes[0].workers[0].device");
  EXPECT_NE(m.find("plan.yaml:9:"), std::string::npos) << m;
  EXPECT_NE(m.find("cuda:63"), std::string::npos) << m;
  // The second worker on the same missing GPU is its own problem, not hidden behind the first.
  problem_about(problems, "nodes[0].workers[1].device");
}

TEST(UpPlan, ModelFileThatIsNotGgufIsRefused) {
  const fs::path bad = fs::temp_directory_path() / ("up_plan_test_" + std::to_string(::getpid()) + ".gguf");
  std::ofstream(bad) << "this is not a GGUF file, only text that a user pointed at by mistake\n";
  auto t = parse(bad.string(), "cpu");
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  const std::vector<Status> problems = check_up_plan(*t);
  fs::remove(bad);
  const std::string m = problem_about(problems, "models.target.path");
  EXPECT_NE(m.find(bad.string()), std::string::npos) << m;
}

// Ranges that depend on the target are --dry-run's too (a trial found them refused only by the
// workers, after `up` had started the cluster): layer_skip's num_layers must leave the target a
// layer, a head's draft_vocab_size must fit the vocabulary; each named with its line and value.
TEST(UpPlan, TargetDependentSpeculativeRangesAreRefused) {
  for (int layers : {30, 1000, 0}) {
    auto t = parse(testing::default_model_path(), "cpu",
                   "{method: layer_skip, num_speculative_tokens: 3, num_layers: " + std::to_string(layers) + "}");
    if (layers == 0) {  // the parser's own range (1..)
      EXPECT_FALSE(t.ok());
      continue;
    }
    ASSERT_TRUE(t.ok()) << t.status().to_string();
    const std::string m = problem_about(check_up_plan(*t), "models.speculative.num_layers");
    EXPECT_NE(m.find("plan.yaml:4:"), std::string::npos) << m;
    EXPECT_NE(m.find("num_layers = " + std::to_string(layers) + ": must be in 1..29"), std::string::npos) << m;
  }
  auto ok = parse(testing::default_model_path(), "cpu", "{method: layer_skip, num_speculative_tokens: 3, num_layers: 29}");
  ASSERT_TRUE(ok.ok());
  EXPECT_TRUE(check_up_plan(*ok).empty()) << joined(check_up_plan(*ok));
  auto big = parse(testing::default_model_path(), "cpu",
                   "{method: eagle, model: " + head_path("eagle") + ", num_speculative_tokens: 3, draft_vocab_size: 100000}");
  ASSERT_TRUE(big.ok()) << big.status().to_string();
  const std::string m = problem_about(check_up_plan(*big), "models.speculative.draft_vocab_size");
  EXPECT_NE(m.find("draft_vocab_size = 100000: must be in 1..49152"), std::string::npos) << m;
  auto fits = parse(testing::default_model_path(), "cpu",
                    "{method: eagle, model: " + head_path("eagle") + ", num_speculative_tokens: 3, draft_vocab_size: 49152}");
  ASSERT_TRUE(fits.ok());
  EXPECT_TRUE(check_up_plan(*fits).empty()) << joined(check_up_plan(*fits));
}

// cluster.token_file naming a directory (or a file others can read) is said by --dry-run too,
// naming the field, not only once `up` starts; a missing one is fine (`up` creates it).
TEST(UpPlan, TokenFileThatUpWouldRefuseIsNamed) {
  auto t = parse(testing::default_model_path(), "cpu");
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  const fs::path dir = fs::temp_directory_path() / ("up_plan_test_token_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  t->cluster.token_file = dir.string();
  std::string m = problem_about(check_up_plan(*t), "cluster.token_file");
  EXPECT_NE(m.find("cluster.token_file = " + dir.string() + ": is a directory"), std::string::npos) << m;
  t->cluster.token_file = (dir / "token").string();
  std::ofstream(dir / "token") << "secret\n";
  fs::permissions(dir / "token", fs::perms::owner_read | fs::perms::owner_write | fs::perms::others_read);
  m = problem_about(check_up_plan(*t), "cluster.token_file");
  EXPECT_NE(m.find("readable by group or others"), std::string::npos) << m;
  t->cluster.token_file = (dir / "missing").string();
  EXPECT_TRUE(check_up_plan(*t).empty()) << joined(check_up_plan(*t));
  t->cluster.token_file = (dir / "new" / "folders" / "token").string();  // `up` creates the folders
  EXPECT_TRUE(check_up_plan(*t).empty()) << joined(check_up_plan(*t));
  // Missing where `up` could not create it (a fresh user's dry run passed this one).
  t->cluster.token_file = "/proc/nonexistent/token";
  m = problem_about(check_up_plan(*t), "cluster.token_file");
  EXPECT_NE(m.find("cluster.token_file = /proc/nonexistent/token: cannot be created: /proc is in /proc or /sys"), std::string::npos) << m;
  t->cluster.token_file = (dir / "token" / "sub" / "t").string();  // below a file
  m = problem_about(check_up_plan(*t), "cluster.token_file");
  EXPECT_NE(m.find("is not a folder"), std::string::npos) << m;
  fs::remove_all(dir);
}

TEST(UpPlan, KvCacheThatCannotHoldOneSequenceIsRefused) {
  auto t = parse(testing::default_model_path(), "cpu");  // max_model_len 512: 32 blocks of 16 tokens
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  const ModelConfig cfg = ModelConfig::from_gguf(GgufFile::open(testing::default_model_path()).value()).value();
  const int64_t per_block = 2 * cfg.num_layers * cfg.kv_dim() * 4 * 16;
  t->scheduler.kv_cache_bytes = 31 * per_block;
  const std::string m = problem_about(check_up_plan(*t), "scheduler.kv_cache_bytes");
  for (const std::string& w : {std::to_string(31 * per_block), std::string("holds 31 KV blocks"), std::string("max_model_len 512"),
                               "at least " + std::to_string(32 * per_block), std::string("at most 496")}) {
    EXPECT_NE(m.find(w), std::string::npos) << "'" << w << "' in " << m;
  }
  // One more block holds it.
  t->scheduler.kv_cache_bytes = 32 * per_block;
  EXPECT_TRUE(check_up_plan(*t).empty()) << joined(check_up_plan(*t));
}

// Each CPU target shard on this host allocates its own pool: two pools that each fit the memory
// but not together are refused (a trial's 2 x 15 GiB on a 23.5 GiB machine passed --dry-run).
TEST(UpPlan, KvPoolsOfThisHostsShardsMustFitItsMemoryTogether) {
  auto t = parse(testing::default_model_path(), "cpu");  // replicas 0 and 1 on this host, 2 on another
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  const int64_t memory = static_cast<int64_t>(::sysconf(_SC_PHYS_PAGES)) * ::sysconf(_SC_PAGE_SIZE);
  ASSERT_GT(memory, 0);
  t->scheduler.kv_cache_bytes = memory / 10 * 6;
  const std::string m = problem_about(check_up_plan(*t), "scheduler.kv_cache_bytes");
  EXPECT_NE(m.find("for each of the 2 CPU target shards and prefill workers on this host"), std::string::npos) << m;
  EXPECT_NE(m.find("more than this machine's memory"), std::string::npos) << m;
  t->scheduler.kv_cache_bytes = memory / 10 * 4;
  for (const Status& st : check_up_plan(*t)) EXPECT_EQ(st.message().find("CPU target shards"), std::string::npos) << st.message();
}

TEST(UpPlan, MaxModelLenPastTheModelsContextIsRefused) {
  auto t = parse(testing::default_model_path(), "cpu");
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  t->models.target.max_model_len = 100000;
  const std::string m = problem_about(check_up_plan(*t), "models.target.max_model_len");
  EXPECT_NE(m.find("100000"), std::string::npos) << m;
  EXPECT_NE(m.find("context length 8192"), std::string::npos) << m;
}

TEST(UpPlan, TargetOfAnUnsupportedArchitectureIsRefused) {
  const fs::path f = fs::temp_directory_path() / ("up_plan_gemma_" + std::to_string(::getpid()) + ".gguf");
  GgufWriter w;
  w.add_string("general.architecture", "gemma3");
  ASSERT_TRUE(w.write_file(f.string()).ok());
  auto t = parse(f.string(), "cpu");
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  const std::vector<Status> problems = check_up_plan(*t);
  fs::remove(f);
  const std::string m = problem_about(problems, "models.target.path");
  EXPECT_NE(m.find("gemma3"), std::string::npos) << m;
  EXPECT_NE(m.find("not supported"), std::string::npos) << m;
}

TEST(UpPlan, HeadFileAsTargetIsRefused) {
  if (!fs::exists(head_path("medusa"))) GTEST_SKIP() << "no " << head_path("medusa");
  auto t = parse(head_path("medusa"), "cpu");
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  const std::string m = problem_about(check_up_plan(*t), "models.target.path");
  EXPECT_NE(m.find("medusa head"), std::string::npos) << m;
  EXPECT_NE(m.find("--speculative-config"), std::string::npos) << m;
}

TEST(UpPlan, HeadsAreCheckedAgainstTheirMethodAndTarget) {
  if (!fs::exists(head_path("medusa")) || !fs::exists(head_path("eagle"))) GTEST_SKIP() << "no head files under models/heads";
  const std::string model = testing::default_model_path();
  // The real heads, trained on the real target: sound.
  for (const char* m : {"medusa", "eagle"}) {
    auto t = parse(model, "cpu", std::string("{method: ") + m + ", model: " + head_path(m) + ", num_speculative_tokens: 4}");
    ASSERT_TRUE(t.ok()) << t.status().to_string();
    EXPECT_TRUE(check_up_plan(*t).empty()) << joined(check_up_plan(*t));
  }
  // An EAGLE head under method medusa: its general.architecture is named with the value.
  {
    auto t = parse(model, "cpu", "{method: medusa, model: " + head_path("eagle") + ", num_speculative_tokens: 4}");
    ASSERT_TRUE(t.ok()) << t.status().to_string();
    const std::string m = problem_about(check_up_plan(*t), "models.speculative.model");
    EXPECT_NE(m.find(head_path("eagle")), std::string::npos) << m;
    EXPECT_NE(m.find("general.architecture = 'eagle'"), std::string::npos) << m;
    EXPECT_NE(m.find("expected 'medusa'"), std::string::npos) << m;
  }
  // The real Medusa head on a synthetic target it was not trained on: the fingerprints differ.
  const fs::path other = fs::temp_directory_path() / ("up_plan_target_" + std::to_string(::getpid()) + ".gguf");
  ASSERT_TRUE(write_synthetic_llama(SyntheticModelSpec{}, other.string()).ok());
  auto t = parse(other.string(), "cpu", "{method: medusa, model: " + head_path("medusa") + ", num_speculative_tokens: 4}");
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  const std::vector<Status> problems = check_up_plan(*t);
  fs::remove(other);
  const std::string m = problem_about(problems, "models.speculative.model");
  EXPECT_NE(m.find("medusa.target_fingerprint"), std::string::npos) << m;
  EXPECT_NE(m.find("another model"), std::string::npos) << m;
}

TEST(UpPlan, EveryProblemIsReportedNotOnlyTheFirst) {
  if (!fs::exists(head_path("eagle"))) GTEST_SKIP() << "no " << head_path("eagle");
  // A missing GPU, a head of the wrong method and a tree that does not parse: three problems.
  auto t = parse(testing::default_model_path(), "cuda:63",
                 "{method: medusa, model: " + head_path("eagle") +
                     ", num_speculative_tokens: 4, speculative_token_tree: \"[(0,), (0, 0\"}");
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  const std::vector<Status> problems = check_up_plan(*t);
  problem_about(problems, "nodes[0].workers[0].device");
  problem_about(problems, "models.speculative.model");
  const std::string tree = problem_about(problems, "models.speculative.speculative_token_tree");
  EXPECT_NE(tree.find("plan.yaml:4:"), std::string::npos) << tree;
  EXPECT_NE(tree.find("[(0,), (0, 0"), std::string::npos) << tree;
}

}  // namespace
}  // namespace specserve
