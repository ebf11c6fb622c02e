// specserve server: the request fields of the OpenAI routes (see openai_fields.cpp).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>

#include "server/openai_api.h"

namespace specserve::openai_fields {

/// The fields `kind`'s requests accept; anything else is a 400 unknown_parameter (OpenAI's
/// behaviour). OpenAI's fields, vLLM's extensions this server honours, and vLLM's fields it
/// accepts only at their defaults (see check_unsupported).
const std::set<std::string>& known_fields(ApiKind kind);

/// The 400 unsupported_parameter for a known field at a value this server does not honour
/// (logit_bias, suffix, tools, best_of != n, response_format other than text, a vLLM field at
/// another value than its default, ...), naming the field and the value; nullopt when none. `n`:
/// the request's choices per prompt.
std::optional<ApiError> check_unsupported(const nlohmann::json& body, ApiKind kind, int32_t n);

}  // namespace specserve::openai_fields
