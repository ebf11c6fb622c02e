// specserve server: reading and checking the fields of a JSON request body, for the OpenAI API
// (server/openai_api.cpp), the tokenizer endpoints and the body reader. Every
// error is an ApiError naming the field (OpenAI's `param`) and the value as sent, shortened.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "server/openai_api.h"

namespace specserve::api_fields {

/// An ApiError of HTTP `status` (400 unless given) for field `param` ("" for the whole body),
/// with OpenAI's `code` ("" for none).
ApiError bad(const std::string& param, const std::string& message, int status = 400, const std::string& code = "");
/// `v` as JSON for a message: at most 80 bytes (longer ends in "..."), containers past depth 8
/// as [...] / {...}, without serialising all of a large value.
std::string shown(const nlohmann::json& v);
/// JSON type name for messages: "null", "boolean", "integer", "number", "string", "array", "object".
const char* type_name(const nlohmann::json& v);
/// 400 "FIELD: expected EXPECTED, got TYPE VALUE".
ApiError wrong_type(const std::string& field, const nlohmann::json& v, const char* expected);
/// Optional boolean body[f] into *out (absent or null: unchanged).
std::optional<ApiError> read_bool(const nlohmann::json& body, const char* f, bool* out);
/// Optional integer body[f] in [lo, hi] into *out (absent or null: unchanged; *given set when
/// read). A whole double (5.0) is the integer; a whole double of magnitude >= 9e15 (an integer
/// past 64 bits is one by then) is out of range, shown as in `written` (path -> text as sent,
/// from parse_request_body) when there; an unsigned value past INT64_MAX is never wrapped.
/// Precondition: lo and hi within +-9e15 (every field here is 32-bit).
std::optional<ApiError> read_int(const nlohmann::json& body, const char* f, int64_t lo, int64_t hi, int64_t* out, bool* given = nullptr,
                                 const std::map<std::string, std::string>* written = nullptr);
/// The token id `t`, found at JSON path `at` ("prompt[2]", "tokens[0]"), into *out: an integer,
/// or a whole number written as a float (5.0), in [0, limit). Errors: not a whole number ->
/// param AT, "AT: expected a token id (an integer), got TYPE VALUE"; outside [0, limit) ->
/// param `param`, "AT = VALUE: not a token id" + `why` (e.g. " of this model (vocabulary
/// 49152)"), VALUE as sent for a float (from `number_text`, parse_request_body's, which keeps
/// the first 256; a whole number past 64 bits is a double by then). Precondition:
/// 0 < limit <= 2^31.
std::optional<ApiError> read_token_id(const nlohmann::json& t, const std::string& at, const std::string& param, int64_t limit,
                                      const std::string& why, const std::map<std::string, std::string>& number_text,
                                      int32_t* out);
/// Optional number body[f] in [lo, hi] into *out as a float (absent or null: unchanged).
std::optional<ApiError> read_number(const nlohmann::json& body, const char* f, double lo, double hi, float* out);
/// True when every lead byte of `s` is followed by all its continuation bytes (the structure of
/// UTF-8; overlong forms, surrogates and code points past U+10FFFF are not looked for).
bool valid_utf8(const std::string& s);

}  // namespace specserve::api_fields
