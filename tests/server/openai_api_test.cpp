// The OpenAI request parser and response shapes (server/openai_api.h) on the default model's
// tokenizer and chat template: every field's type and range check names the field, and the
// responses have OpenAI's shape.
#include "server/openai_api.h"

#include <gtest/gtest.h>

#include <memory>

#include "actors/prompt.h"
#include "model/gguf.h"
#include "model/tokenizer.h"
#include "tests/server/openai_api_fixture.h"
#include "tests/test_util.h"

namespace specserve {
namespace {

using json = nlohmann::json;
using openai_testing::OpenAiApi;


TEST_F(OpenAiApi, CompletionFieldsMapToTheGenerateRequest) {
  ParsedRequest r;
  auto e = parse(R"({"model": "smollm", "prompt": "Hello", "max_tokens": 7, "temperature": 0.5, "top_p": 0.9,
                     "top_k": 40, "min_p": 0.05, "seed": 11, "stop": ["\n\n", "END"], "n": 3,
                     "presence_penalty": 0.5, "frequency_penalty": -0.5, "logprobs": 2, "user": "u"})",
                 ApiKind::kCompletion, &r);
  ASSERT_FALSE(e) << e->message;
  ASSERT_EQ(r.prompts.size(), 1u);
  EXPECT_EQ(r.prompts[0].tokens, tok_->encode("Hello", true, false));
  EXPECT_EQ(r.prompts[0].max_tokens, 7);
  EXPECT_EQ(r.n, 3);
  EXPECT_TRUE(r.logprobs);
  EXPECT_EQ(r.top_logprobs, 2);
  const GenerateRequest g2 = r.request_for(0, 2);
  EXPECT_EQ(g2.prompt_token_ids, r.prompts[0].tokens);
  EXPECT_TRUE(g2.prompt.empty());
  EXPECT_EQ(g2.max_tokens, 7);
  EXPECT_FLOAT_EQ(g2.sampling.temperature, 0.5f);
  EXPECT_FLOAT_EQ(g2.sampling.top_p, 0.9f);
  EXPECT_EQ(g2.sampling.top_k, 40);
  EXPECT_FLOAT_EQ(g2.sampling.min_p, 0.05f);
  EXPECT_TRUE(g2.sampling.has_seed);
  EXPECT_EQ(g2.sampling.seed, 13u);  // seed + choice index: n choices differ, reproducibly
  EXPECT_EQ(g2.sampling.logprobs, 2);
  EXPECT_FLOAT_EQ(g2.sampling.presence_penalty, 0.5f);
  EXPECT_FLOAT_EQ(g2.sampling.frequency_penalty, -0.5f);
  EXPECT_EQ(g2.stop, (std::vector<std::string>{"\n\n", "END"}));
}

TEST_F(OpenAiApi, PromptListsAndTokenIds) {
  ParsedRequest r;
  ASSERT_FALSE(parse(R"({"prompt": ["a", "b c", [1, 2, 3]]})", ApiKind::kCompletion, &r));
  ASSERT_EQ(r.prompts.size(), 3u);
  EXPECT_EQ(r.prompts[1].text, "b c");
  EXPECT_EQ(r.prompts[2].tokens, (std::vector<int32_t>{1, 2, 3}));
  ASSERT_FALSE(parse(R"({"prompt": [5, 6]})", ApiKind::kCompletion, &r));
  ASSERT_EQ(r.prompts.size(), 1u);
  EXPECT_EQ(r.prompts[0].tokens, (std::vector<int32_t>{5, 6}));
  EXPECT_EQ(r.prompts[0].max_tokens, 16);  // OpenAI's default for completions
  // Bug: echo of a prompt given as token ids echoed nothing; it is the prompt's text.
  const std::vector<int32_t> ids = tok_->encode("The capital of France is", /*add_special=*/false, /*parse_special=*/false);
  ASSERT_FALSE(parse(json{{"prompt", json::array({ids, json::array({ids[0]})})}, {"echo", true}}.dump(), ApiKind::kCompletion, &r));
  ASSERT_EQ(r.prompts.size(), 2u);
  EXPECT_EQ(r.prompts[0].text, "The capital of France is");
  EXPECT_EQ(r.prompts[1].text, tok_->decode({ids[0]}, true));
  std::vector<ChoiceOutput> choices(2);
  choices[0].text = " Paris";
  EXPECT_EQ(completion_response(r, model(), "cmpl-1", 0, choices)["choices"][0]["text"], "The capital of France is Paris");
}

TEST_F(OpenAiApi, ChatUsesTheChatTemplateAndDefaultsToTheRoomLeft) {
  ParsedRequest r;
  auto e = parse(R"({"messages": [{"role": "system", "content": "Be brief."},
                                  {"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
                     "logprobs": true, "top_logprobs": 3})",
                 ApiKind::kChat, &r, 512);
  ASSERT_FALSE(e) << e->message;
  GenerateRequest g;
  g.messages = {{"system", "Be brief."}, {"user", "Hi"}};
  auto want = tokenize_prompt(*gguf_, *tok_, g);
  ASSERT_TRUE(want.ok());
  EXPECT_EQ(r.prompts[0].tokens, *want);
  EXPECT_EQ(r.prompts[0].max_tokens, 512 - static_cast<int32_t>(want->size()));
  EXPECT_TRUE(r.logprobs);
  EXPECT_EQ(r.top_logprobs, 3);
  ASSERT_FALSE(parse(R"({"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 9})", ApiKind::kChat, &r));
  EXPECT_EQ(r.prompts[0].max_tokens, 9);
  // Several text parts are one text joined with newlines, as vLLM joins them.
  ASSERT_FALSE(parse(R"({"messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}, {"type": "text", "text": "there"}]}]})",
                     ApiKind::kChat, &r));
  g.messages = {{"user", "Hi\nthere"}};
  auto parts = tokenize_prompt(*gguf_, *tok_, g);
  ASSERT_TRUE(parts.ok());
  EXPECT_EQ(r.prompts[0].tokens, *parts);
}

// A history replayed from an OpenAI or vLLM response: assistant messages carry "tool_calls": [],
// "refusal": null and the like, and content null. Accepted when null or empty (the same prompt as
// without them); with a value they are refused naming the field. NOTE: every one was a 400.
TEST_F(OpenAiApi, ReplayedAssistantMessagesWithEmptyOpenAiFieldsAreAccepted) {
  ParsedRequest plain, replayed;
  ASSERT_FALSE(parse(R"({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hello!"},
                                     {"role": "user", "content": "bye"}]})",
                     ApiKind::kChat, &plain));
  auto e = parse(R"({"messages": [{"role": "user", "content": "hi"},
                                  {"role": "assistant", "content": "Hello!", "tool_calls": [], "refusal": null,
                                   "function_call": null, "audio": null, "annotations": [], "reasoning_content": null},
                                  {"role": "user", "content": "bye"}]})",
                 ApiKind::kChat, &replayed);
  ASSERT_FALSE(e) << e->message;
  EXPECT_EQ(replayed.prompts[0].tokens, plain.prompts[0].tokens);
  // An assistant message whose content is null renders as empty content (vLLM's).
  ParsedRequest empty, null_content;
  ASSERT_FALSE(parse(R"({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": ""},
                                     {"role": "user", "content": "bye"}]})",
                     ApiKind::kChat, &empty));
  e = parse(R"({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": null, "tool_calls": null},
                             {"role": "user", "content": "bye"}]})",
            ApiKind::kChat, &null_content);
  ASSERT_FALSE(e) << e->message;
  EXPECT_EQ(null_content.prompts[0].tokens, empty.prompts[0].tokens);
  // With a value: refused, naming the field.
  ParsedRequest r;
  e = parse(R"({"messages": [{"role": "user", "content": "hi"},
                             {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function"}]}]})",
            ApiKind::kChat, &r);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->http_status, 400);
  EXPECT_EQ(e->param, "messages[1].tool_calls");
  EXPECT_NE(e->message.find("only when null or empty"), std::string::npos) << e->message;
  e = parse(R"({"messages": [{"role": "user", "content": null}]})", ApiKind::kChat, &r);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->param, "messages[0].content");
  e = parse(R"({"messages": [{"role": "user", "content": "x", "foo": null}]})", ApiKind::kChat, &r);
  ASSERT_TRUE(e);
  EXPECT_NE(e->message.find("messages[0].foo: not supported in a message"), std::string::npos) << e->message;
}

struct BadCase {
  const char* body;
  ApiKind kind;
  int status;
  const char* param;
  const char* in_message;
};

TEST_F(OpenAiApi, BadRequestsNameTheFieldWithTheRightStatus) {
  const std::string long_prompt(3000, 'x');
  const BadCase cases[] = {
      {R"({"prompt": "x",)", ApiKind::kCompletion, 400, "", "malformed JSON"},
      {R"([1, 2])", ApiKind::kCompletion, 400, "", "must be a JSON object"},
      {R"({"prompt": "x", "model": "gpt-4"})", ApiKind::kCompletion, 404, "model", "gpt-4"},
      {R"({"prompt": "x", "max_tokens": 0})", ApiKind::kCompletion, 400, "max_tokens", "max_tokens = 0"},
      {R"({"prompt": "x", "max_tokens": "5"})", ApiKind::kCompletion, 400, "max_tokens", "expected an integer, got string"},
      {R"({"prompt": "x", "max_tokens": 1.5})", ApiKind::kCompletion, 400, "max_tokens", "expected an integer"},
      {R"({"prompt": "x", "temperature": -1})", ApiKind::kCompletion, 400, "temperature", "temperature"},
      {R"({"prompt": "x", "temperature": "hot"})", ApiKind::kCompletion, 400, "temperature", "expected a number"},
      {R"({"prompt": "x", "top_p": 0})", ApiKind::kCompletion, 400, "top_p", "top_p"},
      {R"({"prompt": "x", "presence_penalty": 3})", ApiKind::kCompletion, 400, "presence_penalty", "[-2, 2]"},
      {R"({"prompt": "x", "n": 17})", ApiKind::kCompletion, 400, "n", "n = 17"},
      {R"({"prompt": "x", "n": 0})", ApiKind::kCompletion, 400, "n", "n = 0"},
      {R"({"prompt": "x", "stop": 5})", ApiKind::kCompletion, 400, "stop", "a string or an array"},
      {R"({"prompt": "x", "stop": [""]})", ApiKind::kCompletion, 400, "stop", "empty stop string"},
      {R"({"prompt": "x", "logprobs": 21})", ApiKind::kCompletion, 400, "logprobs", "[0, 20]"},
      {R"({"prompt": "x", "stream": "yes"})", ApiKind::kCompletion, 400, "stream", "expected a boolean"},
      {R"({"prompt": "x", "stream_options": {"include_usage": true}})", ApiKind::kCompletion, 400, "stream_options", "stream: true"},
      {R"({"prompt": "x", "logit_bias": {"1": 5}})", ApiKind::kCompletion, 400, "logit_bias", "not supported"},
      {R"({"prompt": "x", "suffix": "y"})", ApiKind::kCompletion, 400, "suffix", "not supported"},
      {R"({"prompt": "x", "best_of": 3})", ApiKind::kCompletion, 400, "best_of", "best_of = 3: only"},
      {R"({"prompt": ""})", ApiKind::kCompletion, 400, "prompt", "prompt: an empty string"},
      {R"({"prompt": ["a", ""]})", ApiKind::kCompletion, 400, "prompt[1]", "prompt[1]: an empty string"},
      {R"({"prompt": "x", "frobnicate": 1})", ApiKind::kCompletion, 400, "frobnicate", "Unrecognized request argument"},
      {R"({"prompt": "x", "echo": true, "logprobs": 1})", ApiKind::kCompletion, 400, "echo", "prompt tokens"},
      {R"({"prompt": "x", "seed": "1"})", ApiKind::kCompletion, 400, "seed", "expected an integer"},
      {R"({"prompt": [1, -2]})", ApiKind::kCompletion, 400, "prompt", "not a token id"},
      {R"({"prompt": 5})", ApiKind::kCompletion, 400, "prompt", "expected a string"},
      {R"({"max_tokens": 5})", ApiKind::kCompletion, 400, "prompt", "required"},
      {R"({"prompt": [99999999]})", ApiKind::kCompletion, 400, "prompt", "prompt[0] = 99999999: not a token id of this model (vocabulary"},
      // (the id's place: it said "prompt_token_ids[1]: ...", a field the client never sent)
      {R"({"prompt": [[1, 2], [3, 99999]]})", ApiKind::kCompletion, 400, "prompt[1]", "prompt[1][1] = 99999: not a token id of this model"},
      {R"({"prompt": "x", "stop_token_ids": [999999]})", ApiKind::kCompletion, 400, "stop_token_ids[0]", "not a token id"},
      {R"({"prompt": "x", "stop_token_ids": [1, 18446744073709551616]})", ApiKind::kCompletion, 400, "stop_token_ids[1]",
       "stop_token_ids[1] = 18446744073709551616: not a token id"},
      {R"({"prompt": "x", "stop_token_ids": [1, "2"]})", ApiKind::kCompletion, 400, "stop_token_ids[1]",
       "stop_token_ids[1]: expected a token id (an integer), got string \"2\""},
      // Past 64 bits an id is a double by the time it is read: shown as sent, first or not.
      {R"({"prompt": [1, 18446744073709551616]})", ApiKind::kCompletion, 400, "prompt", "prompt[1] = 18446744073709551616: not a token id"},
      {R"({"prompt": [18446744073709551616]})", ApiKind::kCompletion, 400, "prompt", "prompt[0] = 18446744073709551616: not a token id"},
      {R"({"prompt": [[1], [2, 1e30]]})", ApiKind::kCompletion, 400, "prompt[1]", "prompt[1][1] = 1e30: not a token id"},
      {R"({"prompt": [1, 2.5]})", ApiKind::kCompletion, 400, "prompt[1]", "prompt[1]: expected a token id (an integer), got number 2.5"},
      {R"({"messages": []})", ApiKind::kChat, 400, "messages", "at least one"},
      {R"({"messages": "hi"})", ApiKind::kChat, 400, "messages", "expected an array"},
      {R"({"messages": [{"role": "wizard", "content": "x"}]})", ApiKind::kChat, 400, "messages[0].role", "wizard"},
      {R"({"messages": [{"role": "user"}]})", ApiKind::kChat, 400, "messages[0].content", "required"},
      {R"({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]})", ApiKind::kChat, 400,
       "messages[0].content[0]", "only"},
      {R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]})", ApiKind::kChat, 400, "tools",
       "tool calling"},
      {R"({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2})", ApiKind::kChat, 400, "top_logprobs",
       "logprobs: true"},
      {R"({"messages": [{"role": "user", "content": "x"}], "echo": true})", ApiKind::kChat, 400, "echo",
       "echo = true: only false (vLLM's default) is supported"},
      // vLLM's own fields, at another value than their default: not honoured, said so.
      {R"({"prompt": "x", "skip_special_tokens": false})", ApiKind::kCompletion, 400, "skip_special_tokens",
       "skip_special_tokens = false: only true"},
      {R"({"prompt": "x", "guided_json": {"type": "object"}})", ApiKind::kCompletion, 400, "guided_json", "only null"},
      {R"({"prompt": "x", "use_beam_search": true})", ApiKind::kCompletion, 400, "use_beam_search", "only false"},
      {R"({"prompt": "x", "request_id": 7})", ApiKind::kCompletion, 400, "request_id", "expected a string"},
      {R"({"messages": [{"role": "user", "content": "x"}], "add_generation_prompt": 0})", ApiKind::kChat, 400,
       "add_generation_prompt", "expected a boolean"},
      {R"({"prompt": "x", "add_special_tokens": "yes"})", ApiKind::kCompletion, 400, "add_special_tokens", "expected a boolean"},
      {R"({"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": {"enable_thinking": true}})", ApiKind::kChat,
       400, "chat_template_kwargs", "only {}"},
      {R"({"messages": [{"role": "user", "content": "x"}], "best_of": 2})", ApiKind::kChat, 400, "best_of", "only best_of = n (1)"},
      {R"({"prompt": "x", "n": 3, "best_of": 1})", ApiKind::kCompletion, 400, "best_of", "only best_of = n (3)"},
      {R"({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_object"}})", ApiKind::kChat, 400,
       "response_format", "text"},
      {R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": 5000})", ApiKind::kChat, 400, "max_tokens",
       "maximum context length is 2048"},
  };
  for (const BadCase& c : cases) {
    SCOPED_TRACE(c.body);
    auto e = parse(c.body, c.kind);
    ASSERT_TRUE(e.has_value());
    EXPECT_EQ(e->http_status, c.status) << e->message;
    EXPECT_EQ(e->param, c.param) << e->message;
    EXPECT_NE(e->message.find(c.in_message), std::string::npos) << e->message;
    const json j = e->to_json();
    EXPECT_EQ(j["error"]["message"], e->message);
    EXPECT_EQ(j["error"]["type"], e->type);
  }
  // A prompt longer than the context: 400 context_length_exceeded (vLLM's and OpenAI's answer;
  // it was a 413, which clients read as a body-size error), naming the field.
  auto e = parse(json{{"prompt", long_prompt}}.dump(), ApiKind::kCompletion, nullptr, 64);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->http_status, 400);
  EXPECT_EQ(e->code, "context_length_exceeded");
  EXPECT_EQ(e->param, "prompt");
  EXPECT_NE(e->message.find("maximum context length is 64"), std::string::npos) << e->message;
}

// Bug: the error message for a wrongly typed field dumped the value with json::dump, which
// recurses per nesting level: 100000 nested arrays overflowed the stack and killed the server.
// Bug: a number beyond a double (1e999) threw out_of_range past the parser's catch: a 500.
TEST_F(OpenAiApi, HostileJsonIsA400) {
  const std::string deep = std::string(200000, '[') + std::string(200000, ']');
  for (const char* field : {"max_tokens", "model", "stop", "n", "response_format"}) {
    auto e = parse(std::string(R"({"messages": [{"role": "user", "content": "x"}], ")") + field + "\": " + deep + "}",
                   ApiKind::kChat);
    ASSERT_TRUE(e) << field;
    EXPECT_EQ(e->http_status, 400) << field;
    EXPECT_EQ(e->param, std::string(field) == "stop" ? "stop[0]" : field);
    EXPECT_LE(e->message.size(), 200u) << e->message;
  }
  auto e = parse(R"({"prompt": [[[)" + deep + "]]]}", ApiKind::kCompletion);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->http_status, 400);
  // A huge value is shown shortened, without serialising all of it.
  e = parse(R"({"prompt": "x", "max_tokens": ")" + std::string(10 << 20, 'a') + "\"}", ApiKind::kCompletion);
  ASSERT_TRUE(e);
  EXPECT_LE(e->message.size(), 200u);
  for (const char* body : {R"({"prompt": "x", "temperature": 1e999})", R"({"prompt": "x", "max_tokens": -1e400})"}) {
    e = parse(body, ApiKind::kCompletion);
    ASSERT_TRUE(e) << body;
    EXPECT_EQ(e->http_status, 400) << body;
  }
}

// Bug: a number beyond a double ({"temperature": 1e400}) was reported as "malformed JSON in the
// request body: ... number overflow parsing '1e400'", naming no field; a syntax error inside a
// field's value did not say which field either.
TEST_F(OpenAiApi, JsonErrorsNameTheFieldTheyAreIn) {
  struct Case {
    const char* body;
    ApiKind kind;
    const char* param;
    const char* in_message;
  };
  const Case cases[] = {
      {R"({"prompt": "hi", "temperature": 1e400})", ApiKind::kCompletion, "temperature",
       "temperature = 1e400: the number is beyond the range of a double (byte 37 of the request body)"},
      {R"({"prompt": "x", "max_tokens": -1e400})", ApiKind::kCompletion, "max_tokens", "max_tokens = -1e400: the number is beyond"},
      {R"({"messages": [{"role": "user", "content": "x"}, {"role": "user", "content": 1e999}]})", ApiKind::kChat,
       "messages[1].content", "messages[1].content = 1e999: the number is beyond"},
      {R"({"prompt": [[1, 2], [3, 1e999]]})", ApiKind::kCompletion, "prompt[1][1]", "prompt[1][1] = 1e999"},
      {R"(1e400)", ApiKind::kCompletion, "", "the request body = 1e400: the number is beyond"},
      {R"({"prompt": "x", "temperature": tru})", ApiKind::kCompletion, "temperature",
       "malformed JSON in the request body (in temperature): [json.exception.parse_error.101] parse error at line 1, column 35"},
      {R"({"prompt": "x", "stop": ["a", ]})", ApiKind::kCompletion, "stop[1]", "malformed JSON in the request body (in stop[1])"},
      // Bug: a number followed by what cannot follow it (a hex literal) named no field.
      {R"({"prompt": "x", "max_tokens": 0x10})", ApiKind::kCompletion, "max_tokens", "malformed JSON in the request body (in max_tokens)"},
      {R"({"prompt": [1, 2x]})", ApiKind::kCompletion, "prompt[1]", "malformed JSON in the request body (in prompt[1])"},
      {R"({"prompt": [3, 1.]})", ApiKind::kCompletion, "prompt[1]", "malformed JSON in the request body (in prompt[1])"},
      {R"({"prompt": "x", "max_tokens": 5 "n": 1})", ApiKind::kCompletion, "", "malformed JSON in the request body: "},
      {R"({"prompt": "x",)", ApiKind::kCompletion, "", "malformed JSON in the request body: "},
      {R"({"prompt": "x"} x)", ApiKind::kCompletion, "", "malformed JSON in the request body: "},
      {"", ApiKind::kCompletion, "", "malformed JSON in the request body: "},
      // Bug: a whole number past 64 bits parses as a double and was worded "expected an integer,
      // got number 1.8446744073709552e+19": now out of range, as sent.
      {R"({"prompt": "x", "max_tokens": 18446744073709551616})", ApiKind::kCompletion, "max_tokens",
       "max_tokens = 18446744073709551616: must be in [1, 2147483647]"},
      {R"({"prompt": "x", "top_k": 1e20})", ApiKind::kCompletion, "top_k", "top_k = 1e20: must be in [-1, 2147483647]"},
      {R"({"prompt": "x", "n": -99999999999999999999})", ApiKind::kCompletion, "n", "n = -99999999999999999999: must be in [1, "},
      {R"({"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 1E+30})", ApiKind::kChat,
       "max_completion_tokens", "max_completion_tokens = 1E+30: must be in [1, 2147483647]"},
      {R"({"prompt": "x", "max_tokens": 5.5})", ApiKind::kCompletion, "max_tokens", "expected an integer"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.body);
    auto e = parse(c.body, c.kind);
    ASSERT_TRUE(e.has_value());
    EXPECT_EQ(e->http_status, 400);
    EXPECT_EQ(e->param, c.param) << e->message;
    EXPECT_NE(e->message.find(c.in_message), std::string::npos) << e->message;
  }
  // A long number or key is shown shortened (a number's text as sent, too: any length is valid JSON).
  // (1.000...0 is the id 1; 2 and 300 zeros is a whole number out of range, shown as sent, cut.)
  auto s = parse(R"({"prompt": "x", "stop_token_ids": [2)" + std::string(300, '0') + "]}", ApiKind::kCompletion);
  ASSERT_TRUE(s);
  EXPECT_EQ(s->param, "stop_token_ids[0]");
  EXPECT_NE(s->message.find("= 2000000000"), std::string::npos) << s->message;
  EXPECT_LE(s->message.size(), 200u) << s->message.substr(0, 300);
  ASSERT_FALSE(parse(R"({"prompt": "x", "stop_token_ids": [1.)" + std::string(100000, '0') + "]}", ApiKind::kCompletion));
  auto e = parse(R"({"prompt": "x", "temperature": 1)" + std::string(5000, '0') + "}", ApiKind::kCompletion);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->param, "temperature");
  EXPECT_LE(e->message.size(), 200u) << e->message;
  e = parse("{\"" + std::string(5000, 'k') + "\": 1e999}", ApiKind::kCompletion);
  ASSERT_TRUE(e);
  EXPECT_LE(e->message.size(), 250u) << e->message;
  // nlohmann's message quotes the last token read: a 1 MiB string is not sent back whole.
  e = parse(R"({"prompt" ")" + std::string(1 << 20, 'a') + R"("})", ApiKind::kCompletion);
  ASSERT_TRUE(e);
  EXPECT_NE(e->message.find("malformed JSON in the request body (in prompt): "), std::string::npos) << e->message.substr(0, 200);
  EXPECT_LE(e->message.size(), 400u);
  // Duplicate keys: the last one wins, as with json::parse.
  ParsedRequest r;
  ASSERT_FALSE(parse(R"({"prompt": "x", "temperature": 5, "temperature": 0.5})", ApiKind::kCompletion, &r));
  EXPECT_FLOAT_EQ(r.base.sampling.temperature, 0.5f);
}

// A whole number written as a float is that token id, as the API's integer fields take it.
TEST_F(OpenAiApi, WholeNumberTokenIdsAreIds) {
  ParsedRequest r;
  ASSERT_FALSE(parse(R"({"prompt": [5.0, 6], "stop_token_ids": [2.0]})", ApiKind::kCompletion, &r));
  ASSERT_EQ(r.prompts.size(), 1u);
  EXPECT_EQ(r.prompts[0].tokens, (std::vector<int32_t>{5, 6}));
  EXPECT_EQ(r.base.sampling.stop_token_ids, (std::vector<int32_t>{2}));
}

// Bug: integers in [2^63, 2^64) were read through get<int64_t> and wrapped: top_k and priority
// of 2^64 - 1 were accepted as -1, and max_tokens = 2^63 was reported as -9223372036854775808.
TEST_F(OpenAiApi, HugeUnsignedIntegersAreOutOfRangeNotWrapped) {
  for (const char* field : {"top_k", "priority", "max_tokens", "n"}) {
    auto e = parse(std::string(R"({"prompt": "x", ")") + field + R"(": 18446744073709551615})", ApiKind::kCompletion);
    ASSERT_TRUE(e) << field;
    EXPECT_EQ(e->param, field);
    EXPECT_NE(e->message.find("18446744073709551615"), std::string::npos) << e->message;
  }
  // A token id of 2^64 - 1 was reported as "prompt[0] = -1".
  for (const char* body : {R"({"prompt": [18446744073709551615]})", R"({"prompt": [[5, 18446744073709551615]]})"}) {
    auto t = parse(body, ApiKind::kCompletion);
    ASSERT_TRUE(t) << body;
    EXPECT_EQ(t->http_status, 400);
    EXPECT_NE(t->message.find("= 18446744073709551615: not a token id"), std::string::npos) << t->message;
  }
  auto e = parse(R"({"prompt": "x", "max_tokens": 9223372036854775808})", ApiKind::kCompletion);
  ASSERT_TRUE(e);
  EXPECT_NE(e->message.find("9223372036854775808"), std::string::npos) << e->message;
  EXPECT_EQ(e->message.find("-9223372036854775808"), std::string::npos) << e->message;
  // Seeds take the whole 64-bit range, negative ones as their two's complement.
  ParsedRequest r;
  ASSERT_FALSE(parse(R"({"prompt": "x", "seed": 18446744073709551615})", ApiKind::kCompletion, &r));
  EXPECT_EQ(r.base.sampling.seed, UINT64_MAX);
  ASSERT_FALSE(parse(R"({"prompt": "x", "seed": 9223372036854775808})", ApiKind::kCompletion, &r));
  EXPECT_EQ(r.base.sampling.seed, uint64_t{1} << 63);
  ASSERT_FALSE(parse(R"({"prompt": "x", "seed": -1})", ApiKind::kCompletion, &r));
  EXPECT_EQ(r.base.sampling.seed, UINT64_MAX);
  ASSERT_FALSE(parse(R"({"prompt": "x", "seed": -9223372036854775808})", ApiKind::kCompletion, &r));
  EXPECT_EQ(r.base.sampling.seed, uint64_t{1} << 63);
  ASSERT_FALSE(parse(R"({"prompt": "x", "seed": 7.0})", ApiKind::kCompletion, &r));  // as every integer field
  EXPECT_EQ(r.base.sampling.seed, 7u);
  ASSERT_FALSE(parse(R"({"prompt": "x", "top_k": 40, "priority": -5})", ApiKind::kCompletion, &r));
  EXPECT_EQ(r.base.sampling.top_k, 40);
  EXPECT_EQ(r.base.priority, -5);
}

// Bug: a seed beyond [-2^63, 2^64 - 1] parses as a double and was refused as "seed: expected an
// integer, got number 1.8446744073709552e+19": not the value the client sent, and it is an
// integer. It is refused naming the text as written and the range.
TEST_F(OpenAiApi, SeedsOutsideTheSixtyFourBitRangeAreRefusedAsWritten) {
  const char* seeds[] = {"18446744073709551616", "-9223372036854775809", "1e30", "1.5", "99999999999999999999999999"};
  for (const char* seed : seeds) {
    for (ApiKind kind : {ApiKind::kCompletion, ApiKind::kChat}) {
      const std::string body = std::string(kind == ApiKind::kChat ? R"({"messages": [{"role": "user", "content": "x"}])"
                                                                  : R"({"prompt": "x")") +
                               ", \"seed\": " + seed + "}";
      SCOPED_TRACE(body);
      auto e = parse(body, kind);
      ASSERT_TRUE(e.has_value());
      EXPECT_EQ(e->http_status, 400);
      EXPECT_EQ(e->param, "seed");
      EXPECT_EQ(e->message, std::string("seed = ") + seed + ": must be an integer in [-9223372036854775808, 18446744073709551615]");
    }
  }
}

TEST_F(OpenAiApi, ResponsesHaveOpenAiShape) {
  ParsedRequest r;
  ASSERT_FALSE(parse(R"({"prompt": "Hi", "n": 2, "logprobs": 2, "max_tokens": 3})", ApiKind::kCompletion, &r));
  std::vector<ChoiceOutput> choices(2);
  for (int i = 0; i < 2; ++i) {
    StreamChunk c;
    c.tokens = {tok_->encode(" there", false, false)[0]};
    c.logprobs = {-0.5f};
    c.top_n = 2;
    c.top_logprob_ids = {c.tokens[0], 42};
    c.top_logprob_values = {-0.5f, -1.5f};
    c.text = " there";
    choices[i].add(c);
    StreamChunk last;
    last.finish_reason = "length";
    choices[i].add(last);
  }
  const json resp = completion_response(r, model(), "cmpl-1", 123, choices);
  EXPECT_EQ(resp["object"], "text_completion");
  EXPECT_EQ(resp["model"], "smollm");
  ASSERT_EQ(resp["choices"].size(), 2u);
  EXPECT_EQ(resp["choices"][1]["index"], 1);
  EXPECT_EQ(resp["choices"][0]["text"], " there");
  EXPECT_EQ(resp["choices"][0]["finish_reason"], "length");
  EXPECT_TRUE(resp["choices"][0]["stop_reason"].is_null()) << "a length finish has no stop_reason";
  const json& lp = resp["choices"][0]["logprobs"];
  ASSERT_EQ(lp["tokens"].size(), 1u);
  EXPECT_EQ(lp["tokens"][0], " there");
  EXPECT_FLOAT_EQ(lp["token_logprobs"][0].get<float>(), -0.5f);
  EXPECT_EQ(lp["top_logprobs"][0].size(), 2u);
  EXPECT_EQ(lp["text_offset"][0], 0);
  EXPECT_EQ(resp["usage"]["prompt_tokens"], r.prompts[0].tokens.size());
  EXPECT_EQ(resp["usage"]["completion_tokens"], 2);
  EXPECT_EQ(resp["usage"]["total_tokens"], r.prompts[0].tokens.size() + 2);

  ASSERT_FALSE(parse(R"({"messages": [{"role": "user", "content": "Hi"}], "logprobs": true, "top_logprobs": 1})",
                     ApiKind::kChat, &r));
  std::vector<ChoiceOutput> one(1);
  StreamChunk c;
  c.tokens = {tok_->encode("Hello", false, false)[0]};
  c.logprobs = {-0.25f};
  c.top_n = 1;
  c.top_logprob_ids = {c.tokens[0]};
  c.top_logprob_values = {-0.25f};
  c.text = "Hello";
  c.finish_reason = "stop";
  one[0].add(c);
  const json chat = completion_response(r, model(), "chatcmpl-1", 123, one);
  EXPECT_EQ(chat["object"], "chat.completion");
  EXPECT_EQ(chat["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(chat["choices"][0]["message"]["content"], "Hello");
  const json& content = chat["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(content.size(), 1u);
  EXPECT_EQ(content[0]["token"], "Hello");
  EXPECT_EQ(content[0]["bytes"], json::array({72, 101, 108, 108, 111}));
  EXPECT_EQ(content[0]["top_logprobs"].size(), 1u);
  EXPECT_TRUE(chat["choices"][0]["stop_reason"].is_null()) << "EOS: no stop_reason";
}

// vLLM's stop_reason beside finish_reason: the stop string, or the stop_token_ids id (a number).
TEST_F(OpenAiApi, StopReasonIsTheStopStringOrTheStopTokenId) {
  ParsedRequest r;
  ASSERT_FALSE(parse(R"({"prompt": "Hi", "n": 3, "max_tokens": 3, "stop": ["END"], "stop_token_ids": [7]})", ApiKind::kCompletion, &r));
  std::vector<ChoiceOutput> choices(3);
  StreamChunk by_string;
  by_string.finish_reason = "stop";
  by_string.stop_string = "END";
  choices[0].add(by_string);
  StreamChunk by_token;
  by_token.finish_reason = "stop";
  by_token.stop_token = 7;
  choices[1].add(by_token);
  StreamChunk aborted;
  aborted.finish_reason = "abort";
  aborted.stop_token = 7;  // only a "stop" finish has a stop_reason
  choices[2].add(aborted);
  const json resp = completion_response(r, model(), "cmpl-1", 1, choices);
  EXPECT_EQ(resp["choices"][0]["stop_reason"], "END");
  EXPECT_EQ(resp["choices"][1]["stop_reason"], 7);
  EXPECT_TRUE(resp["choices"][1]["stop_reason"].is_number_integer());
  EXPECT_TRUE(resp["choices"][2]["stop_reason"].is_null());
}

TEST_F(OpenAiApi, MinTokensIsReadAndCheckedAgainstMaxTokens) {
  ParsedRequest r;
  ASSERT_FALSE(parse(R"({"prompt": "Hi", "max_tokens": 9, "min_tokens": 9})", ApiKind::kCompletion, &r));
  EXPECT_EQ(r.request_for(0, 0).sampling.min_tokens, 9);
  ASSERT_FALSE(parse(R"({"prompt": "Hi", "min_tokens": null})", ApiKind::kCompletion, &r));
  EXPECT_EQ(r.request_for(0, 0).sampling.min_tokens, 0);
  ASSERT_FALSE(parse(R"({"messages": [{"role": "user", "content": "Hi"}], "min_tokens": 5.0})", ApiKind::kChat, &r));
  EXPECT_EQ(r.request_for(0, 0).sampling.min_tokens, 5);
  const BadCase cases[] = {
      {R"({"prompt": "x", "max_tokens": 4, "min_tokens": 5})", ApiKind::kCompletion, 400, "min_tokens", "min_tokens = 5: must be <= max_tokens = 4"},
      {R"({"prompt": "x", "min_tokens": 17})", ApiKind::kCompletion, 400, "min_tokens", "max_tokens = 16 (the default"},
      {R"({"prompt": "x", "min_tokens": -1})", ApiKind::kCompletion, 400, "min_tokens", "min_tokens"},
      {R"({"prompt": "x", "min_tokens": "3"})", ApiKind::kCompletion, 400, "min_tokens", "expected an integer"},
      {R"({"prompt": "x", "min_tokens": 2.5})", ApiKind::kCompletion, 400, "min_tokens", "expected an integer"},
  };
  for (const BadCase& c : cases) {
    auto e = parse(c.body, c.kind);
    ASSERT_TRUE(e) << c.body;
    EXPECT_EQ(e->http_status, c.status) << c.body;
    EXPECT_EQ(e->param, c.param) << c.body;
    EXPECT_NE(e->message.find(c.in_message), std::string::npos) << c.body << ": " << e->message;
  }
}

// Bug: /v1/completions with "logprobs": 0 returned top_logprobs as a list of nulls. The legacy
// API (and vLLM) return up to logprobs + 1 entries per token, the sampled token always among
// them: with 0, {sampled token: its logprob}.
TEST_F(OpenAiApi, CompletionTopLogprobsAlwaysHoldTheSampledToken) {
  const int32_t there = tok_->encode(" there", false, false)[0];
  const int32_t hello = tok_->encode("Hello", false, false)[0];
  for (int logprobs : {0, 1, 2}) {
    SCOPED_TRACE(logprobs);
    ParsedRequest r;
    ASSERT_FALSE(parse(R"({"prompt": "Hi", "max_tokens": 2, "logprobs": )" + std::to_string(logprobs) + "}", ApiKind::kCompletion, &r));
    ChoiceOutput c;
    StreamChunk chunk;
    chunk.tokens = {there, hello};
    chunk.logprobs = {-0.5f, -2.0f};
    chunk.text = " thereHello";
    chunk.top_n = logprobs;
    // Token 0 was the most likely; token 1 ("Hello") was not, token 42 was.
    for (int k = 0; k < logprobs; ++k) {
      chunk.top_logprob_ids.push_back(k == 0 ? there : 42 + k);
      chunk.top_logprob_values.push_back(k == 0 ? -0.5f : -1.0f - k);
    }
    for (int k = 0; k < logprobs; ++k) {
      chunk.top_logprob_ids.push_back(42 + k);
      chunk.top_logprob_values.push_back(-1.0f - k);
    }
    chunk.finish_reason = "length";
    c.add(chunk);
    const json lp = logprobs_json(r, PromptCodec(*gguf_, *tok_), c, 0, c.tokens.size(), 0);
    ASSERT_EQ(lp["tokens"], json::array({" there", "Hello"}));
    ASSERT_EQ(lp["top_logprobs"].size(), 2u);
    for (size_t i = 0; i < 2; ++i) {
      const json& t = lp["top_logprobs"][i];
      ASSERT_TRUE(t.is_object()) << lp.dump();
      const std::string sampled = lp["tokens"][i];
      ASSERT_TRUE(t.contains(sampled)) << t.dump();
      EXPECT_FLOAT_EQ(t[sampled].get<float>(), lp["token_logprobs"][i].get<float>());
    }
    // Token 0 is its own top-1: logprobs entries (at least 1). Token 1 is not in the top:
    // logprobs + 1 entries.
    EXPECT_EQ(lp["top_logprobs"][0].size(), static_cast<size_t>(std::max(logprobs, 1))) << lp.dump();
    EXPECT_EQ(lp["top_logprobs"][1].size(), static_cast<size_t>(logprobs + 1)) << lp.dump();
  }
}

TEST_F(OpenAiApi, TokenStringsThatAreNotUtf8UseBytesNotation) {
  // A byte-level token for a lone UTF-8 continuation byte.
  int32_t id = -1;
  for (int32_t i = 0; i < tok_->vocab_size() && id < 0; ++i) {
    const std::string p = tok_->token_to_piece(i, true);
    if (p.size() == 1 && static_cast<unsigned char>(p[0]) >= 0x80) id = i;
  }
  ASSERT_GE(id, 0);
  const std::string s = logprob_token_string(PromptCodec(*gguf_, *tok_), id);
  EXPECT_EQ(s.rfind("bytes:\\x", 0), 0u) << s;
  EXPECT_EQ(logprob_token_string(PromptCodec(*gguf_, *tok_), tok_->encode("Hello", false, false)[0]), "Hello");
  EXPECT_EQ(dump_json(json(std::string("\xff"))), "\"\xEF\xBF\xBD\"");  // replaced, never thrown
}

}  // namespace
}  // namespace specserve
