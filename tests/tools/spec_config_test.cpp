// The --speculative-config / --speculative-model / --num-speculative-tokens parser
// (tools/cli/spec_config_lib.h): the head methods' keys (medusa, eagle, speculative_token_tree,
// eagle_topk, eagle_depth) and that every error names the key and the value.
#include "tools/cli/spec_config_lib.h"

#include <gtest/gtest.h>

namespace specserve::cli {
namespace {

Expected<std::optional<SpeculativeSpec>> parse(const std::string& json, EngineOptions* eo = nullptr) {
  SpecArgs a;
  a.speculative_config = json;
  EngineOptions local;
  return parse_spec_args(a, eo ? eo : &local);
}

TEST(SpecConfig, MedusaAndEagleWithTheirKeys) {
  EngineOptions eo;
  auto m = parse(R"({"method": "medusa", "model": "/h/medusa.gguf", "num_speculative_tokens": 16})", &eo);
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  ASSERT_TRUE(m->has_value());
  EXPECT_EQ((*m)->method, SpeculativeMethod::kMedusa);
  EXPECT_EQ((*m)->model, "/h/medusa.gguf");
  EXPECT_EQ((*m)->num_speculative_tokens, 16);
  EXPECT_TRUE((*m)->speculative_token_tree.empty());
  EXPECT_EQ(eo.num_speculative_tokens, 16);

  auto t = parse(R"({"method": "medusa", "model": "m", "num_speculative_tokens": 3, "speculative_token_tree": "[(0,), (0, 0), (1,)]"})");
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  EXPECT_EQ((*t)->speculative_token_tree, "[(0,), (0, 0), (1,)]");

  auto e = parse(R"({"method": "eagle", "model": "e", "num_speculative_tokens": 24, "eagle_topk": 6, "eagle_depth": 5})");
  ASSERT_TRUE(e.ok()) << e.status().to_string();
  EXPECT_EQ((*e)->method, SpeculativeMethod::kEagle);
  EXPECT_EQ((*e)->eagle_topk, 6);
  EXPECT_EQ((*e)->eagle_depth, 5);
  EXPECT_FALSE((*e)->draft_vocab_size.has_value());
  auto v = parse(R"({"method": "medusa", "model": "m", "num_speculative_tokens": 4, "draft_vocab_size": 8192})");
  ASSERT_TRUE(v.ok()) << v.status().to_string();
  EXPECT_EQ((*v)->draft_vocab_size, 8192);

  auto es = parse(R"({"method": "eagle", "model": "e", "num_speculative_tokens": 4, "speculative_token_tree": "[(0,), (0, 0)]"})");
  ASSERT_TRUE(es.ok()) << es.status().to_string();
  EXPECT_FALSE((*es)->eagle_topk.has_value());
}

TEST(SpecConfig, ErrorsNameTheKeyAndValue) {
  struct Case {
    const char* json;
    std::vector<std::string> want;
  };
  const Case cases[] = {
      {R"({"method": "medusa", "num_speculative_tokens": 4})", {"medusa", "model"}},
      {R"({"method": "eagle", "num_speculative_tokens": 4})", {"eagle", "model"}},
      {R"({"method": "medusa", "model": "m"})", {"num_speculative_tokens"}},
      {R"({"method": "eagle", "model": "e", "num_speculative_tokens": 4, "eagle_topk": 0})", {"eagle_topk = 0", "1..64"}},
      {R"({"method": "eagle", "model": "e", "num_speculative_tokens": 4, "eagle_depth": 99})", {"eagle_depth = 99", "1..64"}},
      {R"({"method": "eagle", "model": "e", "num_speculative_tokens": 4, "eagle_topk": "4"})", {"eagle_topk", "integer", "\"4\""}},
      {R"({"method": "medusa", "model": "m", "num_speculative_tokens": 4, "eagle_topk": 4})", {"eagle_topk", "eagle only", "medusa"}},
      {R"({"method": "ngram", "num_speculative_tokens": 4, "eagle_depth": 4})", {"eagle_depth", "eagle only", "ngram"}},
      {R"({"method": "draft_model", "model": "d", "num_speculative_tokens": 4, "speculative_token_tree": "[(0,)]"})",
       {"speculative_token_tree", "medusa and eagle", "draft_model"}},
      {R"({"method": "medusa", "model": "m", "num_speculative_tokens": 4, "speculative_token_tree": [[0]]})",
       {"speculative_token_tree", "string", "[[0]]"}},
      {R"({"method": "medusa", "model": "m", "num_speculative_tokens": 4, "speculative_token_tree": ""})",
       {"speculative_token_tree", "\"\""}},
      {R"({"method": "eagle", "model": "e", "num_speculative_tokens": 4, "speculative_token_tree": "[(0,)]", "eagle_depth": 3})",
       {"eagle_depth = 3", "static", "[(0,)]"}},
      {R"({"method": "eagle3", "model": "e", "num_speculative_tokens": 4})", {"method 'eagle3'", "medusa, eagle"}},
      {R"({"method": "ngram", "num_speculative_tokens": 4, "draft_vocab_size": 100})", {"draft_vocab_size", "medusa and eagle", "ngram"}},
      {R"({"method": "eagle", "model": "e", "num_speculative_tokens": 4, "draft_vocab_size": -5})", {"draft_vocab_size = -5"}},
      {R"({"method": "eagle", "model": "e", "num_speculative_tokens": 4, "eagle_top_k": 4})", {"unknown key 'eagle_top_k'"}},
  };
  for (const Case& c : cases) {
    auto r = parse(c.json);
    ASSERT_FALSE(r.ok()) << c.json;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << c.json;
    for (const auto& w : c.want) EXPECT_NE(r.status().message().find(w), std::string::npos) << "'" << w << "' in " << r.status().message();
  }
}

TEST(SpecConfig, GpuMemoryUtilizationIsAFractionInZeroToOne) {
  const std::string f = "--gpu-memory-utilization";
  for (const char* ok : {"0.9", "1", "0.05", "1e-3"}) EXPECT_EQ(gpu_memory_utilization_error(f, ok), "") << ok;
  for (const char* bad : {"0", "-0.1", "1.5", "nan", "inf"}) {
    const std::string e = gpu_memory_utilization_error(f, bad);
    EXPECT_NE(e.find(f + " = " + bad), std::string::npos) << e;
    EXPECT_NE(e.find("(0, 1]"), std::string::npos) << e;
  }
  for (const char* bad : {"abc", "", "0.5x", "60%"}) {
    const std::string e = gpu_memory_utilization_error(f, bad);
    EXPECT_NE(e.find("'" + std::string(bad) + "': not a number"), std::string::npos) << e;
  }
}

}  // namespace
}  // namespace specserve::cli
