// The OpenAI request fields vLLM's clients send (server/openai_fields.h) and the logprobs'
// text offsets: accepted at vLLM's defaults, honoured where the server does what they ask,
// offsets in characters.
#include <gtest/gtest.h>

#include "tests/server/openai_api_fixture.h"

namespace specserve {
namespace {

using json = nlohmann::json;
using openai_testing::OpenAiApi;

// What clients written for vLLM send (LangChain, lm-eval, vLLM's own benchmarks) at vLLM's
// defaults, or null, is accepted and changes nothing; so are OpenAI's service_tier and
// reasoning_effort and any request_id string.
TEST_F(OpenAiApi, VllmsOwnFieldsAtTheirDefaultsAreAccepted) {
  ParsedRequest plain, with;
  ASSERT_FALSE(parse(R"({"prompt": "Hello", "max_tokens": 4})", ApiKind::kCompletion, &plain));
  auto e = parse(R"({"prompt": "Hello", "max_tokens": 4, "skip_special_tokens": true, "spaces_between_special_tokens": true,
                     "use_beam_search": false, "length_penalty": 1, "truncate_prompt_tokens": null, "prompt_logprobs": null,
                     "guided_json": null, "guided_regex": null, "guided_choice": null, "guided_grammar": null,
                     "return_tokens_as_token_ids": false, "add_special_tokens": true, "request_id": "abc-1",
                     "service_tier": "auto", "best_of": 1})",
                 ApiKind::kCompletion, &with);
  ASSERT_FALSE(e) << e->message;
  EXPECT_EQ(with.prompts[0].tokens, plain.prompts[0].tokens);
  ASSERT_FALSE(parse(R"({"messages": [{"role": "user", "content": "Hi"}]})", ApiKind::kChat, &plain));
  e = parse(R"({"messages": [{"role": "user", "content": "Hi"}], "add_generation_prompt": true, "continue_final_message": false,
                "echo": false, "chat_template": null, "chat_template_kwargs": {}, "documents": null, "add_special_tokens": false,
                "reasoning_effort": "low", "skip_special_tokens": true, "best_of": null})",
            ApiKind::kChat, &with);
  ASSERT_FALSE(e) << e->message;
  EXPECT_EQ(with.prompts[0].tokens, plain.prompts[0].tokens);
  // add_generation_prompt and add_special_tokens are honoured: without the generation prompt
  // the chat ends with the user's turn (the template's own rendering, encoded).
  ASSERT_FALSE(parse(R"({"messages": [{"role": "user", "content": "Hi"}], "add_generation_prompt": false})", ApiKind::kChat, &with));
  auto rendered = PromptCodec(*gguf_, *tok_).render_chat({{"user", "Hi"}}, false);
  ASSERT_TRUE(rendered.ok());
  EXPECT_EQ(with.prompts[0].tokens, PromptCodec(*gguf_, *tok_).encode(*rendered, true));
  EXPECT_LT(with.prompts[0].tokens.size(), plain.prompts[0].tokens.size());
  ASSERT_FALSE(parse(R"({"prompt": "Hello", "add_special_tokens": false})", ApiKind::kCompletion, &with));
  EXPECT_EQ(with.prompts[0].tokens, PromptCodec(*gguf_, *tok_).encode("Hello", false));
}

// text_offset counts characters of the choice's text (OpenAI's and vLLM's), not bytes: "日本語"
// is 3 characters of 9 bytes, and a character split over two tokens counts in the first.
// A vLLM field of the wrong type is a type error, not "only the default is supported".
TEST_F(OpenAiApi, VllmFieldsOfTheWrongTypeAreTypeErrors) {
  auto e = parse(R"({"prompt": "x", "skip_special_tokens": "yes"})", ApiKind::kCompletion);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->param, "skip_special_tokens");
  EXPECT_NE(e->message.find("expected a boolean"), std::string::npos) << e->message;
  e = parse(R"({"prompt": "x", "length_penalty": "1"})", ApiKind::kCompletion);
  ASSERT_TRUE(e);
  EXPECT_NE(e->message.find("expected a number"), std::string::npos) << e->message;
}

TEST_F(OpenAiApi, CompletionTextOffsetsCountCharactersNotBytes) {
  const std::string text = "日本語の文abc";
  const std::vector<int32_t> ids = tok_->encode(text, false, false);
  ASSERT_GE(ids.size(), 3u);
  ParsedRequest r;
  ASSERT_FALSE(parse(R"({"prompt": "Hi", "max_tokens": 16, "logprobs": 0})", ApiKind::kCompletion, &r));
  ChoiceOutput c;
  StreamChunk chunk;
  chunk.tokens = ids;
  chunk.logprobs.assign(ids.size(), -1.0f);
  chunk.text = text;
  chunk.finish_reason = "length";
  c.add(chunk);
  const json lp = logprobs_json(r, PromptCodec(*gguf_, *tok_), c, 0, c.tokens.size(), 0);
  ASSERT_EQ(lp["text_offset"].size(), ids.size());
  // Each offset is the number of characters of the text before its token's bytes.
  size_t bytes = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    size_t chars = 0;
    for (size_t b = 0; b < bytes; ++b) chars += (static_cast<unsigned char>(text[b]) & 0xC0) != 0x80;
    EXPECT_EQ(lp["text_offset"][i].get<size_t>(), chars) << "token " << i;
    bytes += tok_->token_to_piece(ids[i], false).size();
  }
  EXPECT_EQ(bytes, text.size());
  // The last token ("c" or "abc"'s tail) starts within the 8 characters, never at a byte index.
  EXPECT_LE(lp["text_offset"].back().get<size_t>(), 7u);
}

}  // namespace
}  // namespace specserve
