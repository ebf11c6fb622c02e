// specserve server: reading an HTTP request body as JSON so that an error says where. Every
// endpoint's body goes through parse_request_body (server/openai_api.cpp, server/tokenize_api.cpp).
#pragma once

#include <map>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "server/openai_api.h"

namespace specserve {

/// Parses `text` (RFC 8259 JSON, as nlohmann::json::parse reads it: same duplicate-key, depth and
/// number rules; core/json_reader.h's read_json) into *out. Errors (400, ApiError::param = the path of the value being read,
/// "temperature" or "messages[0].content", "" outside any field):
///  - a number beyond a double: "FIELD = 1e400: the number is beyond the range of a double (byte
///    N of the request body)";
///  - anything else: "malformed JSON in the request body (in FIELD): <nlohmann's message with line
///    and column, at most 300 bytes>".
/// `number_text` (optional): path ("seed", "stop_token_ids[0]") -> the text as written of each
/// number that parsed as a double, the first 256 (so an error can show what the client sent:
/// 18446744073709551616, not 1.8446744073709552e19).
std::optional<ApiError> parse_request_body(const std::string& text, nlohmann::json* out,
                                           std::map<std::string, std::string>* number_text = nullptr);

}  // namespace specserve
