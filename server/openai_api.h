// specserve server: the OpenAI API's request and response shapes — parsing and validating
// /v1/completions and /v1/chat/completions bodies into GenerateRequests, and building the
// JSON responses (whole and streamed).
//
// Follows the OpenAI API reference (platform.openai.com/docs/api-reference: "Completions",
// "Chat", "Streaming") and vLLM's extensions (top_k, min_p, repetition_penalty, ignore_eos,
// stop_token_ids, include_stop_str_in_output, priority). Errors use OpenAI's shape
//   {"error": {"message": ..., "type": "invalid_request_error", "param": FIELD, "code": ...}}
// with 400 (bad field; code context_length_exceeded for a prompt longer than the context, as
// vLLM and OpenAI answer), 404 (unknown model).
// Pure: no sockets, no actors (the tokenizer and chat template are read-only).
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "actors/messages.h"
#include "actors/prompt.h"

namespace specserve {

/// An error the API returns: HTTP status and OpenAI's error object.
struct ApiError {
  int http_status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  ///< the offending field ("" = none)
  std::string code;   ///< e.g. "model_not_found", "unsupported_parameter" ("" = none)
  /// {"error": {"message", "type", "param", "code"}} (null for empty param / code).
  nlohmann::json to_json() const;
};

/// The model this server serves (read-only after start-up).
struct ServedModel {
  std::string name;                  ///< the `model` requests name (--served-model-name)
  std::vector<std::string> aliases;  ///< also accepted (e.g. the GGUF path)
  int32_t max_model_len = 0;         ///< tokens; 0 = not known yet (the scheduler checks)
  int64_t created = 0;               ///< unix seconds, for /v1/models
  /// The tokenizer and chat template: loaded in a started server (HttpServer::start refuses
  /// one that is not); not loaded, parse_openai_request answers 500.
  PromptCodec text;
};

/// Limits the API enforces beyond the model's.
struct ApiLimits {
  int32_t max_n = 16;           ///< n (choices per prompt), 1..max_n
  int32_t max_prompts = 64;     ///< prompts in one /v1/completions list
  int32_t max_choices = 128;    ///< prompts x n
  int32_t max_stop = 16;        ///< stop strings
  int32_t max_stop_bytes = 512; ///< bytes per stop string
};

enum class ApiKind { kCompletion, kChat };

/// One prompt of a request, tokenized (chat: the rendered conversation).
struct ParsedPrompt {
  std::string text;             ///< the prompt text (completions' echo); chat: ""
  std::vector<int32_t> tokens;  ///< what the model sees
  int32_t max_tokens = 16;      ///< resolved against the context (see parse_openai_request)
};

/// A validated request.
struct ParsedRequest {
  ApiKind kind = ApiKind::kCompletion;
  std::vector<ParsedPrompt> prompts;  ///< chat: exactly one
  int32_t n = 1;
  bool stream = false;
  bool include_usage = false;  ///< stream_options.include_usage
  /// stream_options.continuous_usage_stats with include_usage (vLLM's): every chunk carries the
  /// usage so far, not null.
  bool continuous_usage = false;
  bool echo = false;           ///< completions only
  bool logprobs = false;       ///< return logprobs (completions: logprobs != null; chat: logprobs: true)
  int32_t top_logprobs = 0;    ///< 0..20 alternatives per token
  GenerateRequest base;        ///< sampling, stop, priority ... (prompt fields unset)

  /// The GenerateRequest for choice `choice` of prompt `prompt`: prompt token ids, its
  /// max_tokens, and the seed + choice when a seed was given (so the n choices differ but
  /// stay reproducible; vLLM does the same).
  GenerateRequest request_for(size_t prompt, int32_t choice) const;
};

/// Parses and validates a request body. `kind` selects the endpoint's fields. Returns the
/// error to send (status, message naming the field and value) or nullopt with *out filled.
/// Unknown fields are refused (400, code "unknown_parameter") like OpenAI does; known fields
/// this server cannot honour (logit_bias, suffix, tools, best_of > n, response_format other
/// than text, ...) too (400, code "unsupported_parameter"). max_tokens defaults to 16
/// (completions, OpenAI's default) or to the room left in the context (chat); the prompt must
/// leave at least one token of room and prompt + max_tokens must fit (else 400, code
/// "context_length_exceeded").
std::optional<ApiError> parse_openai_request(const std::string& body, ApiKind kind, const ServedModel& model,
                                             const ApiLimits& limits, ParsedRequest* out);

/// What one choice produced so far (accumulated from StreamChunks).
struct ChoiceOutput {
  std::string text;
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  int32_t top_n = 0;
  std::vector<int32_t> top_ids;     ///< [tokens.size() * top_n]
  std::vector<float> top_values;
  std::string finish_reason;        ///< "" while running
  int32_t stop_token = -1;          ///< StreamChunk::stop_token
  std::string stop_string;          ///< StreamChunk::stop_string
  int32_t prompt_tokens = 0;
  int32_t completion_tokens = 0;
  /// vLLM's stop_reason: the stop_token_ids id (a number) or the stop string that ended the
  /// choice; null for EOS, a length limit or while running.
  nlohmann::json stop_reason() const;
  /// Appends a chunk's tokens, logprobs and text (finish reason and counts when set).
  void add(const StreamChunk& c);
};

/// The logprobs object of a choice for `tokens` [begin, end) of `c`, or null when the request
/// did not ask for logprobs. Completions: {tokens, token_logprobs, top_logprobs, text_offset}
/// with offsets (in characters, not bytes) starting at `text_offset0`, each top_logprobs entry an object of the top
/// `logprobs` tokens plus the sampled one (OpenAI's "up to logprobs + 1"; logprobs = 0: the
/// sampled token alone); chat: {content: [{token, logprob, bytes,
/// top_logprobs: [{token, logprob, bytes}]}]}. Token strings are the token's UTF-8 text, or
/// "bytes:\xNN..." when it is not valid UTF-8 on its own (vLLM's convention).
nlohmann::json logprobs_json(const ParsedRequest& req, const PromptCodec& tok, const ChoiceOutput& c, size_t begin,
                             size_t end, size_t text_offset0);

/// The token's text for logprobs (see logprobs_json).
std::string logprob_token_string(const PromptCodec& tok, int32_t id);

/// Maps the engine's finish reason to the API's ("stop", "length"; "abort" stays "abort").
std::string api_finish_reason(const std::string& engine_reason);

/// A non-streamed response for `choices` [prompt * n + j]. `id` e.g. "cmpl-..." / "chatcmpl-...".
nlohmann::json completion_response(const ParsedRequest& req, const ServedModel& model, const std::string& id,
                                   int64_t created, const std::vector<ChoiceOutput>& choices);

/// The usage object for `choices` (prompt tokens counted once per prompt).
nlohmann::json usage_json(const ParsedRequest& req, const std::vector<ChoiceOutput>& choices);

// ---- shared with the tokenizer endpoints (the field readers are server/api_fields.h)

/// body["messages"] as chat's messages (roles system / developer / user / assistant, string or
/// text-part contents); an error naming messages[i] and its field otherwise.
std::optional<ApiError> api_read_messages(const nlohmann::json& body, std::vector<ChatTurn>* out);

/// Serialises JSON for the wire: invalid UTF-8 is replaced (U+FFFD), never thrown on.
std::string dump_json(const nlohmann::json& j);

}  // namespace specserve
