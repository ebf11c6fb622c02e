// tokenize_prompt (actors/prompt.h) on the real default model's GGUF: the one tokenization the
// head and the HTTP front end share. Errors name the field; chat messages go through the
// model's chat template with its special tokens parsed.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "actors/prompt.h"
#include "model/chat_template.h"
#include "tests/test_util.h"

namespace specserve {
namespace {

class TokenizePrompt : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    gguf_ = &specserve::testing::default_gguf();
    tok_ = &specserve::testing::default_tokenizer();
  }
  static const GgufFile* gguf_;
  static const Tokenizer* tok_;
};
const GgufFile* TokenizePrompt::gguf_ = nullptr;
const Tokenizer* TokenizePrompt::tok_ = nullptr;

TEST_F(TokenizePrompt, ChatMessagesUseTheTemplateWithSpecialTokens) {
  GenerateRequest r;
  r.messages = {{"system", "You are terse."}, {"user", "What is 2+2?"}};
  auto ids = tokenize_prompt(*gguf_, *tok_, r);
  ASSERT_TRUE(ids.ok()) << ids.status().to_string();
  auto text = apply_chat_template(*gguf_, {{"system", "You are terse."}, {"user", "What is 2+2?"}}, true);
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(*ids, tok_->encode(*text, true, true));
  // The template's markers are single control tokens, and the generation prompt is there.
  const int32_t im_start = tok_->find_token("<|im_start|>");
  ASSERT_GE(im_start, 0);
  EXPECT_EQ(std::count(ids->begin(), ids->end(), im_start), 3) << "system, user, and the assistant's generation prompt";
  const std::string decoded = tok_->decode(*ids, true);
  EXPECT_TRUE(decoded.ends_with("<|im_start|>assistant\n")) << decoded;
}

// As vLLM's and llama.cpp's completion endpoints do: a raw ChatML prompt sent to
// /v1/completions is the chat prompt (a fresh-user try found "<|im_start|>" read as 7 text
// tokens, and the model answering the wrong question).
TEST_F(TokenizePrompt, PlainPromptParsesSpecialTokensAsVllmAndLlamaCppDo) {
  GenerateRequest r;
  r.prompt = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n";
  auto ids = tokenize_prompt(*gguf_, *tok_, r);
  ASSERT_TRUE(ids.ok()) << ids.status().to_string();
  EXPECT_EQ(*ids, tok_->encode(r.prompt, true, true));
  EXPECT_NE(*ids, tok_->encode(r.prompt, true, false));
  EXPECT_EQ(std::count(ids->begin(), ids->end(), tok_->find_token("<|im_start|>")), 2);
  EXPECT_EQ(std::count(ids->begin(), ids->end(), tok_->find_token("<|im_end|>")), 1);
}

TEST_F(TokenizePrompt, TokenIdsAreUsedAsGiven) {
  GenerateRequest r;
  r.prompt_token_ids = {1, 2, tok_->vocab_size() - 1};
  auto ids = tokenize_prompt(*gguf_, *tok_, r);
  ASSERT_TRUE(ids.ok()) << ids.status().to_string();
  EXPECT_EQ(*ids, r.prompt_token_ids);
}

TEST_F(TokenizePrompt, ErrorsNameTheField) {
  GenerateRequest two;
  two.prompt = "text";
  two.messages = {{"user", "hi"}};
  auto e = tokenize_prompt(*gguf_, *tok_, two);
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(e.status().message(), "request: give exactly one of prompt, messages, prompt_token_ids (got 2)");

  auto none = tokenize_prompt(*gguf_, *tok_, GenerateRequest{});
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("(got 0)"), std::string::npos) << none.status().message();

  GenerateRequest oov;
  oov.prompt_token_ids = {1, tok_->vocab_size()};
  auto o = tokenize_prompt(*gguf_, *tok_, oov);
  ASSERT_FALSE(o.ok());
  EXPECT_EQ(o.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(o.status().message(), "prompt_token_ids: token id " + std::to_string(tok_->vocab_size()) +
                                      " is outside the vocabulary (size " + std::to_string(tok_->vocab_size()) + ")");
  GenerateRequest neg;
  neg.prompt_token_ids = {-1};
  EXPECT_FALSE(tokenize_prompt(*gguf_, *tok_, neg).ok());

  GenerateRequest huge;
  huge.prompt = std::string((size_t{16} << 20) + 1, 'a');
  auto h = tokenize_prompt(*gguf_, *tok_, huge);
  ASSERT_FALSE(h.ok());
  EXPECT_EQ(h.status().code(), StatusCode::kOutOfRange);
  EXPECT_NE(h.status().message().find("more than any context holds"), std::string::npos) << h.status().message();
}

}  // namespace
}  // namespace specserve
