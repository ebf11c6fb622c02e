// tokenize_prompt and PromptCodec (actors/prompt.h) on the real default model's GGUF: the one
// tokenization the head and the HTTP front end share. Errors name the field; chat messages go
// through the model's chat template with its special tokens parsed.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "actors/prompt.h"
#include "model/chat_template.h"
#include "model/gguf.h"
#include "model/tokenizer.h"
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
  EXPECT_EQ(o.status().message(), "prompt_token_ids[1]: token id " + std::to_string(tok_->vocab_size()) +
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

// The front end's view answers as the tokenizer and template it wraps, with special tokens
// parsed on encode and rendered on decode.
TEST_F(TokenizePrompt, PromptCodecIsTheTokenizerAndTemplateItWraps) {
  EXPECT_FALSE(PromptCodec().loaded());
  const PromptCodec codec(*gguf_, *tok_);
  ASSERT_TRUE(codec.loaded());
  EXPECT_EQ(codec.vocab_size(), tok_->vocab_size());
  const std::string text = "<|im_start|>user\nHello, world<|im_end|>";
  const std::vector<int32_t> ids = codec.encode(text, /*add_special=*/false);
  EXPECT_EQ(ids, tok_->encode(text, false, /*parse_special=*/true));
  EXPECT_NE(ids, tok_->encode(text, false, /*parse_special=*/false));  // special text became ids
  EXPECT_EQ(codec.decode(ids), text);
  for (int32_t id : ids) {
    EXPECT_EQ(codec.token_piece(id), tok_->token_to_piece(id, /*special=*/true));
    EXPECT_EQ(codec.token_text(id), tok_->token_text(id));
  }
  const std::vector<ChatTurn> turns = {{"system", "Be brief."}, {"user", "Hi"}};
  for (bool gen : {true, false}) {
    auto rendered = codec.render_chat(turns, gen);
    auto want = apply_chat_template(*gguf_, {{"system", "Be brief."}, {"user", "Hi"}}, gen);
    ASSERT_TRUE(rendered.ok() && want.ok());
    EXPECT_EQ(*rendered, *want);
  }
  GenerateRequest r;
  r.messages = turns;
  auto a = codec.tokenize(r), b = tokenize_prompt(*gguf_, *tok_, r);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(*a, *b);
}

// A GGUF without a chat template (a trained head file): messages are refused with the template's
// error, prefixed "messages: " once, by render_chat and by tokenize alike.
TEST_F(TokenizePrompt, MissingChatTemplateIsNamedOnce) {
  auto head = GgufFile::open(std::string(SPECSERVE_SOURCE_DIR) + "/models/heads/medusa-smollm2-135m.gguf");
  ASSERT_TRUE(head.ok()) << head.status().to_string();
  const PromptCodec codec(*head, *tok_);
  auto r = codec.render_chat({{"user", "Hi"}}, true);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(r.status().message(), "messages: " + head->path() + ": no tokenizer.chat_template in the GGUF metadata");
  GenerateRequest g;
  g.messages = {{"user", "Hi"}};
  auto t = codec.tokenize(g);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().message(), r.status().message());
}

}  // namespace
}  // namespace specserve
