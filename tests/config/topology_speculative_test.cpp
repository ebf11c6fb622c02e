// Topology YAML: models.speculative — vLLM's n-gram defaults, the typical-acceptance keys, draft
// workers per replica, and the head methods' (medusa, eagle) tree keys; every bad value rejected
// with its location, field path and value.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "config/topology.h"
#include "tests/test_util.h"

namespace specserve {
namespace {

// vLLM's n-gram defaults: both bounds 5 when neither is given; one given sets the other.
TEST(TopologyNgramDefaults, FollowVllm) {
  const std::string base = std::string(SPECSERVE_SOURCE_DIR) + "/examples/";
  auto make = [&](const std::string& spec) {
    return "models:\n  target: {path: " + std::string(SPECSERVE_SOURCE_DIR) +
           "/models/SmolLM2-135M-Instruct.Q4_1.gguf}\n  speculative: {method: ngram, num_speculative_tokens: 4" + spec +
           "}\nnodes:\n  - {name: n0, devices: [cpu], workers: [{role: target_shard, device: cpu}]}\n";
  };
  auto none = parse_topology(make(""), "t.yaml");
  ASSERT_TRUE(none.ok()) << none.status().to_string();
  EXPECT_EQ(none->models.speculative->prompt_lookup_min, 5);
  EXPECT_EQ(none->models.speculative->prompt_lookup_max, 5);
  auto only_min = parse_topology(make(", prompt_lookup_min: 7"), "t.yaml");
  ASSERT_TRUE(only_min.ok()) << only_min.status().to_string();
  EXPECT_EQ(only_min->models.speculative->prompt_lookup_max, 7);
  auto only_max = parse_topology(make(", prompt_lookup_max: 3"), "t.yaml");
  ASSERT_TRUE(only_max.ok()) << only_max.status().to_string();
  EXPECT_EQ(only_max->models.speculative->prompt_lookup_min, 3);
}

// prompt_lookup_min / max with a model-based method: the lookup runs first
// (spec/lookup_first_proposer.h); without them, or for ngram itself, it does not.
TEST(TopologyLookupFirst, SetByTheLookupBoundsOnAModelMethod) {
  auto make = [&](const std::string& spec) {
    return "models:\n  target: {path: " + std::string(SPECSERVE_SOURCE_DIR) +
           "/models/SmolLM2-135M-Instruct.Q4_1.gguf}\n  speculative: {" + spec +
           "}\nnodes:\n  - {name: n0, devices: [cpu], workers: [{role: target_shard, device: cpu}]}\n";
  };
  auto layer_skip = parse_topology(make("method: layer_skip, num_speculative_tokens: 3, prompt_lookup_min: 2, prompt_lookup_max: 4"), "t.yaml");
  ASSERT_TRUE(layer_skip.ok()) << layer_skip.status().to_string();
  EXPECT_TRUE(layer_skip->models.speculative->lookup_first);
  EXPECT_EQ(layer_skip->models.speculative->prompt_lookup_min, 2);
  EXPECT_EQ(layer_skip->models.speculative->prompt_lookup_max, 4);
  auto only_min = parse_topology(make("method: layer_skip, num_speculative_tokens: 3, prompt_lookup_min: 3"), "t.yaml");
  ASSERT_TRUE(only_min.ok()) << only_min.status().to_string();
  EXPECT_TRUE(only_min->models.speculative->lookup_first);
  EXPECT_EQ(only_min->models.speculative->prompt_lookup_max, 3);
  auto hist = parse_topology(make("method: layer_skip, num_speculative_tokens: 3, prompt_lookup_min: 2, lookup_cached_requests: 50"), "t.yaml");
  ASSERT_TRUE(hist.ok()) << hist.status().to_string();
  EXPECT_EQ(hist->models.speculative->lookup_cached_requests, 50);
  auto alone = parse_topology(make("method: layer_skip, num_speculative_tokens: 3, lookup_cached_requests: 50"), "t.yaml");
  ASSERT_FALSE(alone.ok());
  EXPECT_NE(alone.status().message().find("models.speculative.lookup_cached_requests"), std::string::npos) << alone.status().to_string();
  auto too_many = parse_topology(make("method: ngram, num_speculative_tokens: 4, lookup_cached_requests: 10001"), "t.yaml");
  ASSERT_FALSE(too_many.ok());
  EXPECT_NE(too_many.status().message().find("'10001'"), std::string::npos) << too_many.status().to_string();
  for (const char* spec : {"method: layer_skip, num_speculative_tokens: 3", "method: ngram, num_speculative_tokens: 4, prompt_lookup_min: 1"}) {
    auto t = parse_topology(make(spec), "t.yaml");
    ASSERT_TRUE(t.ok()) << t.status().to_string();
    EXPECT_FALSE(t->models.speculative->lookup_first) << spec;
  }
}

// models.speculative.max_model_len is the draft's limit (vLLM's meaning); the target keeps its own.
TEST(TopologySpeculativeMaxModelLen, IsTheDraftsLimit) {
  auto make = [&](const std::string& spec) {
    return "models:\n  target: {path: " + std::string(SPECSERVE_SOURCE_DIR) +
           "/models/SmolLM2-135M-Instruct.Q4_1.gguf, max_model_len: 2048}\n  speculative: {method: ngram, num_speculative_tokens: 4" +
           spec + "}\nnodes:\n  - {name: n0, devices: [cpu], workers: [{role: target_shard, device: cpu}]}\n";
  };
  auto t = parse_topology(make(", max_model_len: 512"), "t.yaml");
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  EXPECT_EQ(t->models.speculative->max_model_len, 512);
  EXPECT_EQ(t->models.target.max_model_len, 2048);
  auto none = parse_topology(make(""), "t.yaml");
  ASSERT_TRUE(none.ok()) << none.status().to_string();
  EXPECT_FALSE(none->models.speculative->max_model_len.has_value());
  auto zero = parse_topology(make(", max_model_len: 0"), "t.yaml");
  ASSERT_FALSE(zero.ok());
  EXPECT_NE(zero.status().message().find("models.speculative.max_model_len"), std::string::npos) << zero.status().message();
}

// Medusa's typical acceptance (lossy, off by default) and its two parameters, range-checked.
TEST(TopologyTypicalAcceptance, ParsesAndChecksRanges) {
  auto make = [&](const std::string& spec) {
    return "models:\n  target: {path: " + std::string(SPECSERVE_SOURCE_DIR) +
           "/models/SmolLM2-135M-Instruct.Q4_1.gguf}\n  speculative: {method: ngram, num_speculative_tokens: 4" + spec +
           "}\nnodes:\n  - {name: n0, devices: [cpu], workers: [{role: target_shard, device: cpu}]}\n";
  };
  auto def = parse_topology(make(""), "t.yaml");
  ASSERT_TRUE(def.ok()) << def.status().to_string();
  EXPECT_FALSE(def->models.speculative->typical_acceptance);
  EXPECT_FLOAT_EQ(def->models.speculative->posterior_threshold, 0.09f);
  EXPECT_FLOAT_EQ(def->models.speculative->posterior_alpha, 0.3f);
  auto on = parse_topology(make(", typical_acceptance: true, posterior_threshold: 0.2, posterior_alpha: 0.1"), "t.yaml");
  ASSERT_TRUE(on.ok()) << on.status().to_string();
  EXPECT_TRUE(on->models.speculative->typical_acceptance);
  EXPECT_FLOAT_EQ(on->models.speculative->posterior_threshold, 0.2f);
  EXPECT_FLOAT_EQ(on->models.speculative->posterior_alpha, 0.1f);
  auto zero = parse_topology(make(", posterior_threshold: 0"), "t.yaml");
  ASSERT_FALSE(zero.ok());
  EXPECT_NE(zero.status().message().find("models.speculative.posterior_threshold: '0' must be in (0, 1]"), std::string::npos)
      << zero.status().message();
  auto big = parse_topology(make(", posterior_alpha: 1.5"), "t.yaml");
  ASSERT_FALSE(big.ok());
  EXPECT_NE(big.status().message().find("models.speculative.posterior_alpha: '1.5' must be in [0, 1]"), std::string::npos)
      << big.status().message();
  auto tiny = parse_topology(make(", posterior_threshold: 1e-50"), "t.yaml");  // > 0 as a double, 0 as a float
  ASSERT_FALSE(tiny.ok());
  EXPECT_NE(tiny.status().message().find("models.speculative.posterior_threshold: '1e-50' is 0 as a 32-bit float"), std::string::npos)
      << tiny.status().message();
}

TEST(TopologyDraftWorkers, NeedASpeculativeMethodAndOnePerReplica) {
  const std::string model = std::string(SPECSERVE_SOURCE_DIR) + "/models/SmolLM2-135M-Instruct.Q4_1.gguf";
  auto make = [&](const std::string& spec, const std::string& workers) {
    return "models:\n  target: {path: " + model + "}\n" + spec + "nodes:\n  - name: n0\n    devices: [cpu]\n    workers:\n" + workers;
  };
  const std::string shard = "      - {role: target_shard, device: cpu}\n";
  const std::string draft = "      - {role: draft_worker, device: cpu}\n";
  const std::string ngram = "  speculative: {method: ngram, num_speculative_tokens: 4}\n";
  auto ok = parse_topology(make(ngram, shard + draft), "t.yaml");
  EXPECT_TRUE(ok.ok()) << ok.status().to_string();
  auto no_method = parse_topology(make("", shard + draft), "t.yaml");
  ASSERT_FALSE(no_method.ok());
  EXPECT_NE(no_method.status().message().find("t.yaml:8:16: nodes[0].workers[1].role: 'draft_worker' needs models.speculative"),
            std::string::npos)
      << no_method.status().message();
  auto two = parse_topology(make(ngram, shard + draft + draft), "t.yaml");
  ASSERT_FALSE(two.ok());
  EXPECT_NE(two.status().message().find("nodes[0].workers[2].role: replica '0' already has a draft_worker: nodes[0].workers[1]"),
            std::string::npos)
      << two.status().message();
  // Medusa and EAGLE need the target's hidden states: never on a draft worker.
  for (const char* method : {"medusa", "eagle"}) {
    const std::string heads = "  speculative: {method: " + std::string(method) + ", model: " + model + ", num_speculative_tokens: 4}\n";
    auto local = parse_topology(make(heads, shard), "t.yaml");
    EXPECT_TRUE(local.ok()) << method << ": " << local.status().to_string();
    auto remote = parse_topology(make(heads, shard + draft), "t.yaml");
    ASSERT_FALSE(remote.ok()) << method;
    EXPECT_NE(remote.status().message().find("nodes[0].workers[1].role: a draft_worker cannot run models.speculative.method '" +
                                             std::string(method) + "': it drafts from the target's hidden states"),
              std::string::npos)
        << remote.status().message();
  }
  // One prefill worker per replica too (the scheduler hands a replica's new prompts to one).
  const std::string prefill = "      - {role: prefill_worker, device: cpu}\n";
  auto one_prefill = parse_topology(make(ngram, shard + prefill), "t.yaml");
  EXPECT_TRUE(one_prefill.ok()) << one_prefill.status().to_string();
  auto two_prefill = parse_topology(make(ngram, shard + prefill + prefill), "t.yaml");
  ASSERT_FALSE(two_prefill.ok());
  EXPECT_NE(two_prefill.status().message().find(
                "nodes[0].workers[2].role: replica '0' already has a prefill_worker: nodes[0].workers[1]"),
            std::string::npos)
      << two_prefill.status().message();
}

}  // namespace
}  // namespace specserve

namespace specserve {
namespace {

// models.speculative for the head methods (medusa, eagle): the tree keys, their method checks,
// and no draft_worker (the heads need the target's hidden states in-process).
TEST(TopologyHeadMethods, TreeKeysAndNoDraftWorker) {
  const std::string model = std::string(SPECSERVE_SOURCE_DIR) + "/models/SmolLM2-135M-Instruct.Q4_1.gguf";
  // Any existing file stands for a head file here: the parser checks that the path is readable.
  auto make = [&](const std::string& spec, bool draft_worker = false) {
    return "models:\n  target: {path: " + model + "}\n  speculative: {" + spec + "}\nnodes:\n  - name: n0\n    devices: [cpu]\n" +
           "    workers:\n      - {role: target_shard, device: cpu}\n" +
           (draft_worker ? "      - {role: draft_worker, device: cpu}\n" : "");
  };
  const std::string head = "model: " + model + ", num_speculative_tokens: 8";
  auto medusa = parse_topology(make("method: medusa, " + head + ", speculative_token_tree: \"[(0,), (0, 0), (1,)]\""), "t.yaml");
  ASSERT_TRUE(medusa.ok()) << medusa.status().to_string();
  EXPECT_EQ(medusa->models.speculative->method, SpeculativeMethod::kMedusa);
  EXPECT_EQ(medusa->models.speculative->model, model);
  EXPECT_EQ(medusa->models.speculative->speculative_token_tree, "[(0,), (0, 0), (1,)]");
  EXPECT_FALSE(medusa->models.speculative->eagle_topk.has_value());
  auto eagle = parse_topology(make("method: eagle, " + head + ", eagle_topk: 5, eagle_depth: 7"), "t.yaml");
  ASSERT_TRUE(eagle.ok()) << eagle.status().to_string();
  EXPECT_EQ(eagle->models.speculative->method, SpeculativeMethod::kEagle);
  EXPECT_EQ(eagle->models.speculative->eagle_topk, 5);
  EXPECT_EQ(eagle->models.speculative->eagle_depth, 7);
  EXPECT_FALSE(eagle->models.speculative->draft_vocab_size.has_value());
  EXPECT_FALSE(eagle->models.speculative->draft_p_min.has_value());
  EXPECT_FALSE(eagle->models.speculative->disable_by_goodput);
  // An underflow (strtod's ERANGE with a finite result) is the number it reads as.
  auto tiny = parse_topology(make("method: eagle, " + head + ", draft_p_min: 1e-400"), "t.yaml");
  ASSERT_TRUE(tiny.ok()) << tiny.status().to_string();
  EXPECT_EQ(tiny->models.speculative->draft_p_min, 0.0f);
  auto gp = parse_topology(make("method: eagle, " + head + ", disable_by_goodput: true"), "t.yaml");
  ASSERT_TRUE(gp.ok()) << gp.status().to_string();
  EXPECT_TRUE(gp->models.speculative->disable_by_goodput);
  auto pmin = parse_topology(make("method: eagle, " + head + ", draft_p_min: 0.3"), "t.yaml");
  ASSERT_TRUE(pmin.ok()) << pmin.status().to_string();
  EXPECT_EQ(pmin->models.speculative->draft_p_min, 0.3f);
  auto vocab = parse_topology(make("method: eagle, " + head + ", draft_vocab_size: 8192"), "t.yaml");
  ASSERT_TRUE(vocab.ok()) << vocab.status().to_string();
  EXPECT_EQ(vocab->models.speculative->draft_vocab_size, 8192);
  EXPECT_TRUE(eagle->models.speculative->speculative_token_tree.empty());
  auto eagle_tree = parse_topology(make("method: eagle, " + head + ", speculative_token_tree: \"[(0,), (0, 0)]\""), "t.yaml");
  ASSERT_TRUE(eagle_tree.ok()) << eagle_tree.status().to_string();

  struct Bad {
    std::string spec;
    bool draft_worker;
    std::vector<std::string> want;
  };
  const Bad bad[] = {
      {"method: ngram, num_speculative_tokens: 4, eagle_topk: 4", false,
       {"t.yaml:3:", "models.speculative.eagle_topk", "'eagle'", "'ngram'", "'4'"}},
      {"method: medusa, " + head + ", eagle_depth: 3", false, {"t.yaml:3:", "models.speculative.eagle_depth", "'medusa'", "'3'"}},
      {"method: eagle, " + head + ", eagle_topk: 0", false, {"t.yaml:3:", "models.speculative.eagle_topk", "'0'", "1..64"}},
      {"method: eagle, " + head + ", eagle_depth: 65", false, {"t.yaml:3:", "models.speculative.eagle_depth", "'65'", "1..64"}},
      {"method: eagle, " + head + ", speculative_token_tree: \"[(0,)]\", eagle_topk: 4", false,
       {"t.yaml:3:", "models.speculative.eagle_topk", "static", "'[(0,)]'"}},
      {"method: draft_model, " + head + ", speculative_token_tree: \"[(0,)]\"", false,
       {"t.yaml:3:", "models.speculative.speculative_token_tree", "'draft_model'", "'[(0,)]'"}},
      {"method: medusa, " + head + ", speculative_token_tree: \"\"", false, {"t.yaml:3:", "models.speculative.speculative_token_tree", "empty"}},
      {"method: medusa, " + head + ", speculative_token_tree: [0, 1]", false,
       {"t.yaml:3:", "models.speculative.speculative_token_tree", "[0, 1]"}},
      {"method: medusa, num_speculative_tokens: 8", false, {"t.yaml:3:", "models.speculative.model", "missing required field", "'medusa'"}},
      {"method: eagle, " + head + ", draft_p_min: 1.5", false, {"t.yaml:3:", "models.speculative.draft_p_min", "'1.5'", "[0, 1]"}},
      {"method: eagle, " + head + ", draft_p_min: -1", false, {"t.yaml:3:", "models.speculative.draft_p_min", "'-1'", "[0, 1]"}},
      {"method: ngram, num_speculative_tokens: 4, draft_p_min: 0.5", false, {"t.yaml:3:", "models.speculative.draft_p_min", "'ngram'", "'0.5'"}},
      // Bug: a quoted value (a string in YAML) was read as the number.
      {"method: eagle, " + head + ", draft_p_min: \"0.5\"", false,
       {"t.yaml:3:", "models.speculative.draft_p_min", "expected a number, got the quoted string \"0.5\""}},
      {"method: eagle, " + head + ", eagle_topk: '4'", false,
       {"t.yaml:3:", "models.speculative.eagle_topk", "expected an integer, got the quoted string \"4\""}},
      {"method: eagle, " + head + ", draft_p_min: !!str 0.5", false,
       {"t.yaml:3:", "models.speculative.draft_p_min", "expected a number, got the string \"0.5\" (tagged !!str"}},
      {"method: eagle, " + head + ", eagle_topk: 99999999999999999999", false,
       {"t.yaml:3:", "models.speculative.eagle_topk", "'99999999999999999999' is out of range"}},
      {"method: eagle, " + head + ", draft_p_min: 1e400", false,
       {"t.yaml:3:", "models.speculative.draft_p_min", "'1e400' is beyond the range of a double"}},
      {"method: eagle, " + head + ", disable_by_goodput: 1", false, {"t.yaml:3:", "models.speculative.disable_by_goodput", "'1'"}},
      {"method: eagle, " + head + ", adaptive_k: \"true\"", false,
       {"t.yaml:3:", "models.speculative.adaptive_k", "expected true or false, got the quoted string \"true\""}},
      {"method: ngram, num_speculative_tokens: 4, draft_vocab_size: 8192", false,
       {"t.yaml:3:", "models.speculative.draft_vocab_size", "'ngram'", "'8192'"}},
      {"method: eagle, " + head + ", draft_vocab_size: -1", false, {"t.yaml:3:", "models.speculative.draft_vocab_size", "'-1'"}},
      {"method: eagle, " + head, true, {"t.yaml:9:16:", "nodes[0].workers[1].role", "a draft_worker", "'eagle'", "hidden states"}},
      {"method: medusa, " + head, true, {"t.yaml:9:16:", "nodes[0].workers[1].role", "'medusa'", "hidden states"}},
  };
  for (const Bad& b : bad) {
    auto t = parse_topology(make(b.spec, b.draft_worker), "t.yaml");
    ASSERT_FALSE(t.ok()) << b.spec;
    EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument) << t.status().to_string();
    for (const auto& w : b.want) EXPECT_NE(t.status().message().find(w), std::string::npos) << "'" << w << "' in " << t.status().message();
  }
}

// describe_speculative: the one line `up --dry-run` prints, `serve` logs at start-up and
// `specserve status` shows.
TEST(TopologyDescribeSpeculative, ShowsTheLookupBoundsAndTheHistory) {
  auto make = [&](const std::string& spec) {
    return "models:\n  target: {path: " + std::string(SPECSERVE_SOURCE_DIR) +
           "/models/SmolLM2-135M-Instruct.Q4_1.gguf}\n  speculative: {" + spec +
           "}\nnodes:\n  - {name: n0, devices: [cpu], workers: [{role: target_shard, device: cpu}]}\n";
  };
  auto t = parse_topology(make("method: ngram, num_speculative_tokens: 4, prompt_lookup_min: 1, prompt_lookup_max: 5, "
                               "lookup_cached_requests: 100"),
                          "t.yaml");
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  EXPECT_EQ(describe_speculative(*t), "ngram, num_speculative_tokens 4, prompt_lookup 1..5, lookup_cached_requests 100");
  auto l = parse_topology(make("method: layer_skip, num_speculative_tokens: 3, prompt_lookup_max: 4, draft_p_min: 0.25"), "t.yaml");
  ASSERT_TRUE(l.ok()) << l.status().to_string();
  EXPECT_EQ(describe_speculative(*l), "layer_skip, num_speculative_tokens 3, draft_p_min 0.25, prompt lookup first 4..4");
  t->models.speculative.reset();
  EXPECT_EQ(describe_speculative(*t), "none (plain decoding)");
}

}  // namespace
}  // namespace specserve
