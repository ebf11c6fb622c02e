// vLLM's /tokenize and /detokenize bodies (server/tokenize_api.h) on the default model's
// tokenizer and chat template: with the defaults the ids are what generation sees; every bad
// field is named with its value.
#include "server/tokenize_api.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "actors/prompt.h"
#include "model/gguf.h"
#include "model/tokenizer.h"
#include "tests/test_util.h"

namespace specserve {
namespace {

using json = nlohmann::json;

ServedModel served(int32_t max_model_len = 2048) {
  ServedModel m;
  m.name = "smollm";
  m.aliases = {"/models/smollm.gguf"};
  m.max_model_len = max_model_len;
  m.text = PromptCodec(specserve::testing::default_gguf(), specserve::testing::default_tokenizer());
  return m;
}

json tokenize_ok(const std::string& body, int32_t max_model_len = 2048) {
  json out;
  auto e = tokenize_response(body, served(max_model_len), &out);
  EXPECT_FALSE(e) << body << ": " << e->message;
  return out;
}

TEST(TokenizeApi, PromptGivesTheIdsACompletionSees) {
  const Tokenizer& tok = specserve::testing::default_tokenizer();
  json r = tokenize_ok(R"({"model": "smollm", "prompt": "Hello world, <|im_start|>user"})");
  GenerateRequest g;
  g.prompt = "Hello world, <|im_start|>user";
  auto want = tokenize_prompt(specserve::testing::default_gguf(), tok, g);
  ASSERT_TRUE(want.ok());
  EXPECT_EQ(r["tokens"].get<std::vector<int32_t>>(), *want);
  EXPECT_EQ(r["count"], want->size());
  EXPECT_EQ(r["max_model_len"], 2048);
  EXPECT_TRUE(r["token_strs"].is_null());
  // The special token's text is one id.
  const int32_t im_start = tok.encode("<|im_start|>", false, true).at(0);
  EXPECT_NE(std::find(want->begin(), want->end(), im_start), want->end());

  r = tokenize_ok(R"({"prompt": "Hello world", "return_token_strs": true, "add_special_tokens": false})", 0);
  const auto ids = r["tokens"].get<std::vector<int32_t>>();
  EXPECT_EQ(ids, tok.encode("Hello world", false, true));
  ASSERT_EQ(r["token_strs"].size(), ids.size());
  for (size_t i = 0; i < ids.size(); ++i) EXPECT_EQ(r["token_strs"][i], tok.token_text(ids[i]));
  EXPECT_TRUE(r["max_model_len"].is_null()) << "0: not known yet";
  EXPECT_EQ(tokenize_ok(R"({"prompt": ""})")["count"], 0);
}

TEST(TokenizeApi, MessagesGiveTheIdsAChatCompletionSees) {
  const std::string msgs = R"([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}])";
  const json r = tokenize_ok(R"({"messages": )" + msgs + "}");
  GenerateRequest g;
  g.messages = {{"system", "Be brief."}, {"user", "Hi!"}};
  auto want = tokenize_prompt(specserve::testing::default_gguf(), specserve::testing::default_tokenizer(), g);
  ASSERT_TRUE(want.ok());
  EXPECT_EQ(r["tokens"].get<std::vector<int32_t>>(), *want);
  // Without the generation prompt: a strict prefix (the assistant header is left off).
  const auto bare = tokenize_ok(R"({"messages": )" + msgs + R"(, "add_generation_prompt": false})")["tokens"].get<std::vector<int32_t>>();
  ASSERT_LT(bare.size(), want->size());
  EXPECT_TRUE(std::equal(bare.begin(), bare.end(), want->begin()));
}

TEST(TokenizeApi, BadBodiesNameTheFieldAndValue) {
  struct Case {
    const char* body;
    int status;
    const char* param;
    const char* says;
  };
  const Case cases[] = {
      {R"({"prompt": "a", "messages": [{"role": "user", "content": "b"}]})", 400, "prompt", "exactly one of prompt and messages"},
      {R"({})", 400, "prompt", "exactly one of prompt and messages"},
      {R"({"prompt": 5})", 400, "prompt", "prompt: expected a string, got integer 5"},
      {R"({"prompt": [1, 2]})", 400, "prompt", "expected a string, got array"},
      {R"({"prompt": "a", "temperature": 1})", 400, "temperature", "Unrecognized request argument supplied: temperature"},
      {R"({"prompt": "a", "model": "gpt-4"})", 404, "model", "The model `gpt-4` does not exist"},
      {R"({"prompt": "a", "add_generation_prompt": true})", 400, "add_generation_prompt", "only with messages"},
      {R"({"prompt": "a", "add_special_tokens": "yes"})", 400, "add_special_tokens", "expected a boolean, got string"},
      {R"({"messages": [{"role": "robot", "content": "b"}]})", 400, "messages[0].role", "\"robot\""},
      {R"({"messages": []})", 400, "messages", "at least one message"},
      {R"({"prompt": "a",)", 400, "", "malformed JSON"},
      {R"([1])", 400, "body", "a JSON object"},
  };
  for (const Case& c : cases) {
    json out;
    auto e = tokenize_response(c.body, served(), &out);
    ASSERT_TRUE(e) << c.body;
    EXPECT_EQ(e->http_status, c.status) << c.body;
    EXPECT_EQ(e->param, c.param) << c.body;
    EXPECT_NE(e->message.find(c.says), std::string::npos) << c.body << ": " << e->message;
  }
}

// A model without a chat template: messages get the template's error, "messages: " once.
TEST(TokenizeApi, MissingChatTemplateIsNamedOnce) {
  auto head = GgufFile::open(std::string(SPECSERVE_SOURCE_DIR) + "/models/heads/medusa-smollm2-135m.gguf");
  ASSERT_TRUE(head.ok()) << head.status().to_string();
  ServedModel m = served();
  m.text = PromptCodec(*head, specserve::testing::default_tokenizer());
  json out;
  auto e = tokenize_response(R"({"messages": [{"role": "user", "content": "Hi"}]})", m, &out);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->http_status, 400);
  EXPECT_EQ(e->param, "messages");
  EXPECT_EQ(e->message, "messages: " + head->path() + ": no tokenizer.chat_template in the GGUF metadata");
}

TEST(TokenizeApi, DetokenizeRoundTripsAndNamesABadId) {
  const Tokenizer& tok = specserve::testing::default_tokenizer();
  const std::vector<int32_t> ids = tok.encode("<|im_start|>user\nHello world, how are you?", false, true);
  json out;
  auto e = detokenize_response(json{{"model", "/models/smollm.gguf"}, {"tokens", ids}}.dump(), served(), &out);
  ASSERT_FALSE(e) << e->message;
  EXPECT_EQ(out["prompt"], "<|im_start|>user\nHello world, how are you?");
  ASSERT_FALSE(detokenize_response(R"({"tokens": []})", served(), &out));
  EXPECT_EQ(out["prompt"], "");
  // A whole number written as a float is that id (as every integer field of the API takes it).
  json whole, plain;
  ASSERT_FALSE(detokenize_response(R"({"tokens": [28.0, 30]})", served(), &whole));
  ASSERT_FALSE(detokenize_response(R"({"tokens": [28, 30]})", served(), &plain));
  EXPECT_EQ(whole["prompt"], plain["prompt"]);

  const std::string vocab = std::to_string(tok.vocab_size());
  struct Case {
    std::string body, param, says;
  };
  const Case cases[] = {
      {R"({})", "tokens", "tokens: required"},
      {R"({"tokens": "1 2"})", "tokens", "expected an array of token ids"},
      {R"({"tokens": [1, -1]})", "tokens[1]", "tokens[1] = -1: not a token id of this model (vocabulary " + vocab + ")"},
      {R"({"tokens": [)" + vocab + "]}", "tokens[0]", "tokens[0] = " + vocab + ": not a token id"},
      {R"({"tokens": [18446744073709551615]})", "tokens[0]", "18446744073709551615: not a token id"},
      {R"({"tokens": [1.5]})", "tokens[0]", "expected a token id (an integer), got number 1.5"},
      {R"({"tokens": [5, 18446744073709551616]})", "tokens[1]", "tokens[1] = 18446744073709551616: not a token id of this model"},
      {R"({"tokens": [1], "prompt": "x"})", "prompt", "Unrecognized request argument supplied: prompt"},
  };
  for (const Case& c : cases) {
    auto err = detokenize_response(c.body, served(), &out);
    ASSERT_TRUE(err) << c.body;
    EXPECT_EQ(err->http_status, 400) << c.body;
    EXPECT_EQ(err->param, c.param) << c.body;
    EXPECT_NE(err->message.find(c.says), std::string::npos) << c.body << ": " << err->message;
  }
}

}  // namespace
}  // namespace specserve
