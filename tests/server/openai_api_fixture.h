// The OpenAI API tests' fixture (tests/server/openai_api_test.cpp, openai_fields_test.cpp):
// requests parsed against the default model's tokenizer and chat template.
#pragma once

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "actors/prompt.h"
#include "model/gguf.h"
#include "model/tokenizer.h"
#include "server/openai_api.h"
#include "tests/test_util.h"

namespace specserve::openai_testing {

using json = nlohmann::json;

class OpenAiApi : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    gguf_ = &specserve::testing::default_gguf();
    tok_ = &specserve::testing::default_tokenizer();
  }
  ServedModel model(int32_t max_model_len = 2048) const {
    ServedModel m;
    m.name = "smollm";
    m.aliases = {"/models/smollm.gguf"};
    m.max_model_len = max_model_len;
    m.text = PromptCodec(*gguf_, *tok_);
    return m;
  }
  // Parses `body` for `kind`; returns the error (nullopt when it parsed).
  std::optional<ApiError> parse(const std::string& body, ApiKind kind, ParsedRequest* out = nullptr,
                                int32_t max_model_len = 2048) const {
    ParsedRequest r;
    auto e = parse_openai_request(body, kind, model(max_model_len), ApiLimits{}, &r);
    if (out) *out = r;
    return e;
  }
  static inline const GgufFile* gguf_ = nullptr;
  static inline const Tokenizer* tok_ = nullptr;
};

}  // namespace specserve::openai_testing
