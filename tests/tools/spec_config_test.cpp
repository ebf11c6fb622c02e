// The --speculative-config / --speculative-model / --num-speculative-tokens parser
// (tools/cli/spec_config_lib.h): the head methods' keys (medusa, eagle, speculative_token_tree,
// eagle_topk, eagle_depth) and that every error names the key and the value.
#include "tools/cli/spec_config_lib.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <numeric>

#include "actors/proposer_factory.h"
#include "tests/spec/spec_test_util.h"

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
  EXPECT_FALSE((*e)->draft_p_min.has_value());
  auto pm = parse(R"({"method": "eagle", "model": "e", "num_speculative_tokens": 4, "draft_p_min": 0.25})");
  ASSERT_TRUE(pm.ok()) << pm.status().to_string();
  EXPECT_EQ((*pm)->draft_p_min, 0.25f);
  auto pl = parse(R"({"method": "layer_skip", "num_speculative_tokens": 3, "draft_p_min": 1})");
  ASSERT_TRUE(pl.ok()) << pl.status().to_string();
  EXPECT_EQ((*pl)->draft_p_min, 1.0f);
  auto v = parse(R"({"method": "medusa", "model": "m", "num_speculative_tokens": 4, "draft_vocab_size": 8192})");
  ASSERT_TRUE(v.ok()) << v.status().to_string();
  EXPECT_EQ((*v)->draft_vocab_size, 8192);

  // num_speculative_tokens 0 alone still means plain decoding (no error).
  auto off = parse(R"({"num_speculative_tokens": 0})");
  ASSERT_TRUE(off.ok()) << off.status().to_string();
  EXPECT_FALSE(off->has_value());
  auto empty = parse("{}");
  ASSERT_TRUE(empty.ok()) << empty.status().to_string();
  EXPECT_FALSE(empty->has_value());
  EngineOptions geo;
  auto g = parse(R"({"method": "ngram", "num_speculative_tokens": 4, "disable_by_goodput": true})", &geo);
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  EXPECT_TRUE((*g)->disable_by_goodput);
  EXPECT_TRUE(geo.disable_by_goodput);
  EXPECT_FALSE((*v)->disable_by_goodput);

  auto es = parse(R"({"method": "eagle", "model": "e", "num_speculative_tokens": 4, "speculative_token_tree": "[(0,), (0, 0)]"})");
  ASSERT_TRUE(es.ok()) << es.status().to_string();
  EXPECT_FALSE((*es)->eagle_topk.has_value());
}

TEST(SpecConfig, NullIsNotGiven) {
  // vLLM's speculative_config takes None as "use the default"; so does a YAML null here.
  auto n = parse(R"({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": null, "prompt_lookup_max": 4,
                     "draft_p_min": null, "lookup_cached_requests": null, "model": null, "adaptive_k": null})");
  ASSERT_TRUE(n.ok()) << n.status().to_string();
  ASSERT_TRUE(n->has_value());
  EXPECT_EQ((*n)->prompt_lookup_min, 4) << "the other bound's value, as when it is left out";
  EXPECT_EQ((*n)->prompt_lookup_max, 4);
  EXPECT_FALSE((*n)->draft_p_min.has_value());
  EXPECT_EQ((*n)->lookup_cached_requests, 0);
  auto e = parse(R"({"method": "eagle", "model": "e", "num_speculative_tokens": 4, "prompt_lookup_min": null, "prompt_lookup_max": null})");
  ASSERT_TRUE(e.ok()) << e.status().to_string();
  EXPECT_FALSE((*e)->lookup_first) << "null bounds are not given: no lookup in front of the method";
  // A null that leaves a required key missing is refused as if the key were left out.
  auto m = parse(R"({"method": "eagle", "model": null, "num_speculative_tokens": 4})");
  auto missing = parse(R"({"method": "eagle", "num_speculative_tokens": 4})");
  ASSERT_FALSE(m.ok());
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(m.status().message(), missing.status().message());
  auto null_only = parse(R"({"method": null})");
  ASSERT_TRUE(null_only.ok()) << null_only.status().to_string();
  EXPECT_FALSE(null_only->has_value()) << "like {}";
}

TEST(SpecConfig, WholeNumbersWrittenAsFloatsAreIntegers) {
  // vLLM's pydantic config takes 3.0 for an integer field; 3.5 stays an error.
  auto n = parse(R"({"method": "ngram", "num_speculative_tokens": 3.0, "prompt_lookup_max": 4e0, "lookup_cached_requests": 2.0})");
  ASSERT_TRUE(n.ok()) << n.status().to_string();
  ASSERT_TRUE(n->has_value());
  EXPECT_EQ((*n)->num_speculative_tokens, 3);
  EXPECT_EQ((*n)->prompt_lookup_max, 4);
  EXPECT_EQ((*n)->lookup_cached_requests, 2);
  auto half = parse(R"({"method": "ngram", "num_speculative_tokens": 3.5})");
  ASSERT_FALSE(half.ok());
  EXPECT_EQ(half.status().message(), "--speculative-config: num_speculative_tokens must be an integer, got 3.5");
  auto neg = parse(R"({"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": -2.0})");
  ASSERT_FALSE(neg.ok());
  EXPECT_NE(neg.status().message().find("prompt_lookup_min = -2.0: must be >= 1"), std::string::npos) << neg.status().message();
  auto big = parse(R"({"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 1e7})");
  ASSERT_FALSE(big.ok());
  EXPECT_EQ(big.status().message(), "--speculative-config: prompt_lookup_max = 1e7 is out of range (at most 1000000)");
}

// prompt_lookup_min / max with a model-based method: the lookup first, the method where it finds
// nothing (spec/lookup_first_proposer.h); vLLM's n-gram defaults for the bounds.
TEST(SpecConfig, PromptLookupWithAModelMethodRunsTheLookupFirst) {
  auto e = parse(R"({"method": "eagle", "model": "e", "num_speculative_tokens": 8, "prompt_lookup_min": 2, "prompt_lookup_max": 4})");
  ASSERT_TRUE(e.ok()) << e.status().to_string();
  EXPECT_EQ((*e)->method, SpeculativeMethod::kEagle);
  EXPECT_TRUE((*e)->lookup_first);
  EXPECT_EQ((*e)->prompt_lookup_min, 2);
  EXPECT_EQ((*e)->prompt_lookup_max, 4);
  auto only_max = parse(R"({"method": "draft_model", "model": "d", "num_speculative_tokens": 4, "prompt_lookup_max": 3})");
  ASSERT_TRUE(only_max.ok()) << only_max.status().to_string();
  EXPECT_TRUE((*only_max)->lookup_first);
  EXPECT_EQ((*only_max)->prompt_lookup_min, 3);
  for (const char* json : {R"({"method": "eagle", "model": "e", "num_speculative_tokens": 8})",
                           R"({"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 5})"}) {
    auto p = parse(json);
    ASSERT_TRUE(p.ok()) << p.status().to_string();
    EXPECT_FALSE((*p)->lookup_first) << json;
  }
  auto hist = parse(R"({"method": "eagle", "model": "e", "num_speculative_tokens": 2, "prompt_lookup_min": 2, "lookup_cached_requests": 100})");
  ASSERT_TRUE(hist.ok()) << hist.status().to_string();
  EXPECT_EQ((*hist)->lookup_cached_requests, 100);
  auto ngram_hist = parse(R"({"method": "ngram", "num_speculative_tokens": 4, "lookup_cached_requests": 7})");
  ASSERT_TRUE(ngram_hist.ok()) << ngram_hist.status().to_string();
  EXPECT_EQ((*ngram_hist)->lookup_cached_requests, 7);
  auto too_many = parse(R"({"method": "ngram", "num_speculative_tokens": 4, "lookup_cached_requests": 10001})");
  ASSERT_FALSE(too_many.ok());
  EXPECT_NE(too_many.status().message().find("lookup_cached_requests = 10001: must be in 0..10000"), std::string::npos)
      << too_many.status().to_string();
  auto negative = parse(R"({"method": "ngram", "num_speculative_tokens": 4, "lookup_cached_requests": -3})");
  ASSERT_FALSE(negative.ok());
  EXPECT_NE(negative.status().message().find("lookup_cached_requests = -3"), std::string::npos) << negative.status().to_string();
  auto alone = parse(R"({"method": "eagle", "model": "e", "num_speculative_tokens": 2, "lookup_cached_requests": 100})");
  ASSERT_FALSE(alone.ok());
  EXPECT_NE(alone.status().message().find("lookup_cached_requests = 100 applies to method ngram or with prompt_lookup_min"), std::string::npos)
      << alone.status().to_string();
  auto bad = parse(R"({"method": "medusa", "model": "m", "num_speculative_tokens": 4, "prompt_lookup_min": 4, "prompt_lookup_max": 2})");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("prompt_lookup_min = 4, prompt_lookup_max = 2"), std::string::npos) << bad.status().to_string();
}

TEST(SpecConfig, ErrorsNameTheKeyAndValue) {
  struct Case {
    const char* json;
    std::vector<std::string> want;
  };
  const Case cases[] = {
      {R"({"method": "medusa", "num_speculative_tokens": 4})", {"medusa", "model"}},
      // An empty path (an unset variable) is not "no model": it used to fall back to n-gram.
      {R"({"model": "", "num_speculative_tokens": 2})", {"model is an empty path"}},
      {R"({"method": "draft_model", "model": "", "num_speculative_tokens": 2})", {"model is an empty path"}},
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
      {R"({"method": "eagle3", "model": "e", "num_speculative_tokens": 4})", {"method \"eagle3\"", "medusa, eagle"}},
      {R"({"method": "ngram", "num_speculative_tokens": 4, "draft_vocab_size": 100})", {"draft_vocab_size", "medusa and eagle", "ngram"}},
      {R"({"method": "eagle", "model": "e", "num_speculative_tokens": 4, "draft_vocab_size": -5})", {"draft_vocab_size = -5"}},
      {R"({"method": "eagle", "model": "e", "num_speculative_tokens": 4, "eagle_top_k": 4})", {"unknown key 'eagle_top_k'"}},
      {R"({"method": "ngram", "num_speculative_tokens": 4, "disable_by_goodput": 1})", {"disable_by_goodput must be true or false, got 1"}},
      // Bug (a fresh user's try): keys without a method, model or k were dropped silently.
      {R"({"disable_by_goodput": true})", {"disable_by_goodput given without speculation"}},
      {R"({"draft_p_min": 0.5})", {"draft_p_min given without speculation"}},
      {R"({"draft_p_min": 0.5, "adaptive_k": false})", {"adaptive_k, draft_p_min given without speculation"}},
      {R"({"method": "", "num_speculative_tokens": 4})", {"method is empty"}},
      // ... a whole number past 64 bits was "must be an integer, got 1.8446744073709552e+19".
      {R"({"method": "ngram", "num_speculative_tokens": 18446744073709551616})", {"num_speculative_tokens = 18446744073709551616 is out of range"}},
      {R"({"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": -99999999999999999999})",
       {"prompt_lookup_min = -99999999999999999999 is out of range"}},
      // ... and a NUL in a method cut the message short.
      {R"({"method": "ngr\u0000am", "num_speculative_tokens": 4})", {"method \"ngr\\u0000am\" is not one of"}},
      {R"({"method": "eagle", "model": "e", "num_speculative_tokens": 4, "draft_p_min": 1.5})", {"draft_p_min = 1.5", "[0, 1]"}},
      {R"({"method": "eagle", "model": "e", "num_speculative_tokens": 4, "draft_p_min": -0.1})", {"draft_p_min = -0.1", "[0, 1]"}},
      {R"({"method": "eagle", "model": "e", "num_speculative_tokens": 4, "draft_p_min": "0.5"})", {"draft_p_min", "number", "\"0.5\""}},
      {R"({"method": "ngram", "num_speculative_tokens": 4, "draft_p_min": 0.5})", {"draft_p_min = 0.5 does not apply", "ngram"}},
      // Bug: -1 is the parser's "not given", so these were silently taken as absent (the defaults
      // ran), and 2^64 - 1 wrapped to -1 the same way.
      {R"({"method": "eagle", "model": "e", "num_speculative_tokens": 4, "draft_vocab_size": -1})", {"draft_vocab_size = -1", ">= 0"}},
      {R"({"method": "eagle", "model": "e", "num_speculative_tokens": 4, "eagle_topk": -1})", {"eagle_topk = -1"}},
      {R"({"method": "eagle", "model": "e", "num_speculative_tokens": 4, "eagle_depth": 18446744073709551615})",
       {"eagle_depth = 18446744073709551615", "out of range"}},
      {R"({"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": -1})", {"prompt_lookup_min = -1"}},
      {R"({"method": "eagle", "model": "e", "num_speculative_tokens": 4, "prompt_lookup_min": 0})", {"--speculative-config: prompt_lookup_min = 0: must be >= 1"}},
      {R"({"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 2147483647})", {"prompt_lookup_max = 2147483647 is out of range (at most 1000000)"}},
      {R"({"method": "eagle", "model": "e", "num_speculative_tokens": 4, "prompt_lookup_max": -1})", {"prompt_lookup_max = -1"}},
      {R"({"method": "layer_skip", "num_speculative_tokens": 4, "num_layers": -1})", {"num_layers = -1"}},
      {R"({"method": "ngram", "num_speculative_tokens": 4, "max_model_len": -1})", {"max_model_len = -1", ">= 1"}},
      // 0 was taken as "never" here while models.speculative refused it.
      {R"({"method": "ngram", "num_speculative_tokens": 4, "disable_by_batch_size": 0})", {"disable_by_batch_size = 0: must be >= 1"}},
      // Bug: a number beyond a double escaped the parser (exit 1, "[json.exception.out_of_range.406]").
      // ... and then named no key: the key, the value as written and where it was.
      {R"({"method": "medusa", "model": "m", "num_speculative_tokens": 4, "posterior_alpha": 1e400})",
       {"--speculative-config: posterior_alpha = 1e400: the number is beyond the range of a double"}},
      {R"({"method": "eagle", "model": "e", "draft_p_min": -1e400})", {"draft_p_min = -1e400", "byte 55 of the value"}},
      {R"({"method": "eagle", "model": "e", "draft_p_min": tru})", {"--speculative-config: malformed JSON in the value (in draft_p_min): ", "column"}},
      {R"({"method": "eagle", "model": "e",)", {"--speculative-config: malformed JSON in the value: "}},
      // Only the bad one is named, with the value as written (not std::to_string's 0.000000).
      {R"({"method": "medusa", "model": "m", "num_speculative_tokens": 4, "posterior_threshold": 0, "posterior_alpha": 0.3})",
       {"posterior_threshold = 0 must be in (0, 1]"}},
      {R"({"method": "medusa", "model": "m", "num_speculative_tokens": 4, "posterior_alpha": 1.5})", {"posterior_alpha = 1.5 must be in [0, 1]"}},
      {R"({"method": "medusa", "model": "m", "num_speculative_tokens": 4, "posterior_threshold": 1e-50})", {"posterior_threshold = 1e-50 is 0 as a 32-bit float"}},
  };
  for (const Case& c : cases) {
    auto r = parse(c.json);
    ASSERT_FALSE(r.ok()) << c.json;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << c.json;
    for (const auto& w : c.want) EXPECT_NE(r.status().message().find(w), std::string::npos) << "'" << w << "' in " << r.status().message();
  }
}

Expected<std::optional<SpeculativeSpec>> parse_with_flag(int k_flag, const std::string& json, EngineOptions* eo = nullptr) {
  SpecArgs a;
  a.num_speculative_tokens = k_flag;
  a.speculative_config = json;
  EngineOptions local;
  return parse_spec_args(a, eo ? eo : &local);
}

TEST(SpecConfig, FlagAndJsonModelMustAgree) {
  // --speculative-model X with {"model": Y} used Y silently; refused naming both, like k.
  SpecArgs a;
  a.speculative_model = "/models/x.gguf";
  a.speculative_config = R"({"method": "draft_model", "model": "/models/y.gguf", "num_speculative_tokens": 3})";
  EngineOptions eo;
  auto r = parse_spec_args(a, &eo);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  for (const char* w : {"--speculative-model /models/x.gguf", "model = /models/y.gguf", "disagree"}) {
    EXPECT_NE(r.status().message().find(w), std::string::npos) << "'" << w << "' in " << r.status().message();
  }
  // The same path (written the same or another way) is fine, as is either one alone.
  for (auto [flag, json] : {std::pair<const char*, const char*>{"/models/x.gguf", R"({"model": "/models/x.gguf", "num_speculative_tokens": 3})"},
                            {"/models/./x.gguf", R"({"model": "/models/x.gguf", "num_speculative_tokens": 3})"},
                            {"/models/x.gguf", R"({"method": "draft_model", "num_speculative_tokens": 3})"},
                            {"", R"({"model": "/models/x.gguf", "num_speculative_tokens": 3})"}}) {
    a.speculative_model = flag;
    a.speculative_config = json;
    auto ok = parse_spec_args(a, &eo);
    ASSERT_TRUE(ok.ok()) << flag << " " << json << ": " << ok.status().to_string();
    ASSERT_TRUE(ok->has_value());
    EXPECT_EQ((*ok)->method, SpeculativeMethod::kDraftModel) << json;
  }
  // A relative and an absolute path of one existing file are one file.
  const std::string abs = std::filesystem::absolute(SPECSERVE_SOURCE_DIR "/README.md").string();
  a.speculative_model = std::filesystem::relative(abs).string();
  a.speculative_config = R"({"model": ")" + abs + R"(", "num_speculative_tokens": 3})";
  auto same = parse_spec_args(a, &eo);
  EXPECT_TRUE(same.ok()) << a.speculative_model << " vs " << abs << ": " << same.status().to_string();
}

TEST(SpecConfig, WithFieldNamesTheFieldOnce) {
  EXPECT_EQ(with_field("speculative_token_tree", "speculative_token_tree: expected ','"), "speculative_token_tree: expected ','");
  EXPECT_EQ(with_field("model", "/x.gguf: not found"), "model: /x.gguf: not found");
}

TEST(SpecConfig, FlagAndJsonKMustAgree) {
  // vLLM refuses a --num-speculative-tokens that differs from the JSON's; both values are named.
  auto r = parse_with_flag(3, R"({"method": "ngram", "num_speculative_tokens": 5})");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  for (const char* w : {"--num-speculative-tokens 3", "num_speculative_tokens = 5", "disagree"}) {
    EXPECT_NE(r.status().message().find(w), std::string::npos) << "'" << w << "' in " << r.status().message();
  }
  // The same value twice is fine; the flag alone or the key alone too.
  for (auto [flag, json] : {std::pair<int, const char*>{4, R"({"method": "ngram", "num_speculative_tokens": 4})"},
                            {4, R"({"method": "ngram"})"},
                            {-1, R"({"method": "ngram", "num_speculative_tokens": 4})"}}) {
    auto ok = parse_with_flag(flag, json);
    ASSERT_TRUE(ok.ok()) << json << ": " << ok.status().to_string();
    EXPECT_EQ((*ok)->num_speculative_tokens, 4) << json;
  }
}

TEST(SpecConfig, ZeroSpeculativeTokensEchoesTheValueAndItsSource) {
  auto j = parse(R"({"method": "medusa", "model": "m", "num_speculative_tokens": 0})");
  ASSERT_FALSE(j.ok());
  EXPECT_NE(j.status().message().find("--speculative-config: num_speculative_tokens = 0"), std::string::npos) << j.status().message();
  EXPECT_NE(j.status().message().find("1..64"), std::string::npos) << j.status().message();
  auto f = parse_with_flag(0, R"({"method": "ngram"})");
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.status().message().find("--num-speculative-tokens = 0"), std::string::npos) << f.status().message();
  // Not given at all: says that it is needed (there is no value to echo).
  auto n = parse(R"({"method": "ngram"})");
  ASSERT_FALSE(n.ok());
  EXPECT_NE(n.status().message().find("needs num_speculative_tokens"), std::string::npos) << n.status().message();
  // An unknown method is named before the missing k.
  auto u = parse(R"({"method": "foo"})");
  ASSERT_FALSE(u.ok());
  EXPECT_NE(u.status().message().find("method \"foo\" is not one of"), std::string::npos) << u.status().message();
}

TEST(SpecConfig, MaxModelLenIsTheDraftsNotTheTargets) {
  // vLLM: speculative_config.max_model_len limits the draft; the target keeps --max-model-len.
  EngineOptions eo;
  eo.max_model_len = 1024;
  auto r = parse(R"({"method": "draft_model", "model": "d", "num_speculative_tokens": 4, "max_model_len": 256})", &eo);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(eo.max_model_len, 1024);
  EXPECT_EQ((*r)->max_model_len, 256);
  auto none = parse(R"({"method": "ngram", "num_speculative_tokens": 4})", &eo);
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE((*none)->max_model_len.has_value());
  auto bad = parse(R"({"method": "ngram", "num_speculative_tokens": 4, "max_model_len": 0})");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("max_model_len = 0"), std::string::npos) << bad.status().message();
}

TEST(SpecConfig, DraftMaxModelLenStopsTheDraftNotTheTarget) {
  // The parsed entry's max_model_len reaches the drafter built for it (actors/proposer_factory):
  // a sequence near the draft's limit gets a shorter draft, one past it none, while the target's
  // own limit (ProposerBuildOptions::max_model_len, --max-model-len) stays 0 (the model's).
  const std::string path = spec_testing::temp_path("spec_config_draft_len");
  ASSERT_TRUE(write_synthetic_llama(SyntheticModelSpec{}, path).ok());
  auto loaded = load_model(path, spec_testing::backend(), /*quiet=*/true);
  ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
  LoadedModel& target = *loaded;
  std::remove(path.c_str());  // mapped: the data stays until the test ends
  EngineOptions eo;
  auto spec = parse(R"({"method": "layer_skip", "num_layers": 1, "num_speculative_tokens": 4, "max_model_len": 12})", &eo);
  ASSERT_TRUE(spec.ok()) << spec.status().to_string();
  EXPECT_EQ(eo.max_model_len, 0);
  ProposerBuildOptions bo;
  auto p = build_proposer(**spec, target, spec_testing::backend(), bo);
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  SamplingParams greedy;
  greedy.temperature = 0;
  auto draft_len = [&](int32_t n) {
    std::vector<int32_t> tokens(static_cast<size_t>(n));
    std::iota(tokens.begin(), tokens.end(), 1);
    DraftRequest r;
    r.seq_id = n;
    r.tokens = tokens;
    r.prompt_len = n;
    r.num_tokens = 4;
    r.sampling = &greedy;
    std::vector<DraftTree> out;
    EXPECT_TRUE((*p)->propose({r}, &out).ok());
    (*p)->release(n);
    return out.empty() ? -1 : static_cast<int32_t>(out[0].tokens.size());
  };
  EXPECT_EQ(draft_len(6), 4);   // far from the draft's 12
  EXPECT_EQ(draft_len(10), 2);  // 10 + 2 = 12
  EXPECT_EQ(draft_len(12), 0);  // at the draft's limit: plain decoding
}

TEST(SpecConfig, ProposerErrorsNameTheFlagThatGaveTheFile) {
  SpeculativeSpec spec;
  spec.model = "/h/medusa.gguf";
  SpecArgs json;  // the path came from --speculative-config's "model"
  json.speculative_config = R"({"method": "medusa", "model": "/h/medusa.gguf"})";
  const std::string about_file = "/h/medusa.gguf: general.architecture = 'eagle': expected 'medusa'";
  EXPECT_EQ(proposer_error_prefix(json, spec, about_file), "--speculative-config \"model\" ");
  SpecArgs flag;  // the path came from --speculative-model
  flag.speculative_model = "/h/medusa.gguf";
  EXPECT_EQ(proposer_error_prefix(flag, spec, about_file), "--speculative-model ");
  // An error about something else (a tree, num_layers) is the JSON's.
  EXPECT_EQ(proposer_error_prefix(flag, spec, "speculative_token_tree: ..."), "--speculative-config: ");
}

TEST(SpecConfig, AcceptedPerPositionLineHasOneColumnPerTreeDepth) {
  const std::vector<int64_t> per_pos = {9, 5, 2, 0, 0, 0, 0, 0};  // k = 8, a tree of depth 3
  EXPECT_EQ(accepted_per_position_line(per_pos, /*tree=*/true, 3), "accepted per tree depth: d1 9 | d2 5 | d3 2");
  EXPECT_EQ(accepted_per_position_line({4, 3, 1}, /*tree=*/false, 3), "accepted per position: 4 3 1");
  // A chain no deeper than 1 (EAGLE chain of depth 1 asked for k 8): one column, not 8.
  EXPECT_EQ(accepted_per_position_line({11, 0, 0, 0, 0, 0, 0, 0}, /*tree=*/false, 1), "accepted per position: 11");
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

// Bug: --drain-timeout took -5 and nan ("draining in-flight requests (up to nan s)"; a NaN cast
// to milliseconds is undefined behaviour).
TEST(SpecConfig, SecondsAreFiniteAndNotNegative) {
  const std::string f = "--drain-timeout";
  for (const char* ok : {"0", "60", "0.5", "1e6"}) EXPECT_EQ(seconds_error(f, ok), "") << ok;
  for (const char* bad : {"-5", "-0.1", "nan", "inf", "1e7"}) {
    const std::string e = seconds_error(f, bad);
    EXPECT_NE(e.find(f + " = " + bad), std::string::npos) << e;
    EXPECT_NE(e.find("[0, 1e6]"), std::string::npos) << e;
  }
  for (const char* bad : {"abc", "", "5s"}) {
    const std::string e = seconds_error(f, bad);
    EXPECT_NE(e.find("'" + std::string(bad) + "': not a number"), std::string::npos) << e;
  }
}

}  // namespace
}  // namespace specserve::cli
