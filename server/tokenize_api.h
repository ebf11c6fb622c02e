// specserve server: vLLM's /tokenize and /detokenize bodies — parsing, validating and answering
// them with the served model's tokenizer and chat template.
//
// Follows vLLM's OpenAI-compatible server (vllm/entrypoints/openai/protocol.py:
// TokenizeCompletionRequest, TokenizeChatRequest, TokenizeResponse, DetokenizeRequest,
// DetokenizeResponse). Errors use the OpenAI error shape of server/openai_api.h (400 naming the
// field and value, 404 for another model, "unknown_parameter" for a field it does not take).
// Pure: no sockets, no actors (the tokenizer and chat template are read-only).
#pragma once

#include <nlohmann/json.hpp>

#include <optional>
#include <string>

#include "server/openai_api.h"

namespace specserve {

/// POST /tokenize. `body` is a JSON object, either
///   {"model"?, "prompt": STRING, "add_special_tokens"?: bool = true, "return_token_strs"?: bool = false}
///   {"model"?, "messages": [...], "add_generation_prompt"?: bool = true,
///    "add_special_tokens"?: bool = true, "return_token_strs"?: bool = false}
/// A prompt is tokenized as /v1/completions reads it (special-token text becomes its id); the
/// messages as /v1/chat/completions renders them (the GGUF's chat template). With the defaults,
/// the ids are exactly what generation sees.
/// NOTE: vLLM's default for messages is add_special_tokens = false; ours is true, the encoding
/// /v1/chat/completions uses (the same ids for a template that already starts with BOS, or a
/// vocabulary without add_bos, such as SmolLM2's).
/// On success *out = {"count": N, "max_model_len": M or null, "tokens": [ids], "token_strs":
/// [vocabulary texts] or null}. `model.max_model_len` 0 gives null.
std::optional<ApiError> tokenize_response(const std::string& body, const ServedModel& model, nlohmann::json* out);

/// POST /detokenize. `body`: {"model"?, "tokens": [ids]} (ids in [0, vocabulary)). On success
/// *out = {"prompt": TEXT}: the ids decoded with special tokens rendered as their text (vLLM's
/// tokenizer.decode default). Errors name tokens[i] and its value.
std::optional<ApiError> detokenize_response(const std::string& body, const ServedModel& model, nlohmann::json* out);

}  // namespace specserve
