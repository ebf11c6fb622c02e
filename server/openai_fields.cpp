// specserve server: which request fields the OpenAI routes know — OpenAI's, and vLLM's that
// clients written for vLLM send — and which of them this server refuses at a value it does not
// honour (parse_openai_request, openai_api.cpp).
#include "server/openai_fields.h"

#include <string>
#include <utility>
#include <vector>

#include "server/api_fields.h"

namespace specserve::openai_fields {

using json = nlohmann::json;
using api_fields::bad;
using api_fields::shown;
using api_fields::wrong_type;

namespace {

// Fields of vLLM's requests (and OpenAI's service_tier / reasoning_effort) that clients written
// for vLLM send, often at their defaults: accepted when absent, null or that default (what this
// server does anyway), refused as not honoured otherwise (check_unsupported). An entry whose
// value is the string "*" takes any string: request_id, service_tier and reasoning_effort
// change nothing here (one tier; a model without reasoning).
const std::vector<std::pair<std::string, json>>& default_only_fields(ApiKind kind) {
  static const std::vector<std::pair<std::string, json>> common = {
      {"skip_special_tokens", true}, {"spaces_between_special_tokens", true}, {"use_beam_search", false},
      {"length_penalty", 1.0}, {"truncate_prompt_tokens", nullptr}, {"prompt_logprobs", nullptr},
      {"guided_json", nullptr}, {"guided_regex", nullptr}, {"guided_choice", nullptr}, {"guided_grammar", nullptr},
      {"return_tokens_as_token_ids", false}, {"request_id", "*"}, {"service_tier", "*"}};
  static const std::vector<std::pair<std::string, json>>& completion = common;
  static const std::vector<std::pair<std::string, json>> chat = [] {
    auto v = common;
    v.insert(v.end(), {{"continue_final_message", false},
                       {"echo", false}, {"chat_template", nullptr}, {"chat_template_kwargs", json::object()},
                       {"documents", nullptr}, {"reasoning_effort", "*"}});
    return v;
  }();
  return kind == ApiKind::kChat ? chat : completion;
}

}  // namespace

const std::set<std::string>& known_fields(ApiKind kind) {
  static const std::set<std::string> common = {
      "model", "max_tokens", "temperature", "top_p", "n", "stream", "stream_options", "stop", "presence_penalty",
      "frequency_penalty", "seed", "user", "logit_bias", "logprobs",
      // vLLM's extensions
      "top_k", "min_p", "repetition_penalty", "ignore_eos", "stop_token_ids", "include_stop_str_in_output", "priority",
      "min_tokens"};
  static const std::set<std::string> completion = [] {
    std::set<std::string> s = common;
    s.insert({"prompt", "echo", "suffix", "best_of", "add_special_tokens"});
    for (const auto& [f, v] : default_only_fields(ApiKind::kCompletion)) s.insert(f);
    return s;
  }();
  static const std::set<std::string> chat = [] {
    std::set<std::string> s = common;
    s.insert({"messages", "max_completion_tokens", "top_logprobs", "tools", "tool_choice", "functions", "function_call",
              "response_format", "parallel_tool_calls", "store", "metadata", "best_of", "add_special_tokens",
              "add_generation_prompt"});
    for (const auto& [f, v] : default_only_fields(ApiKind::kChat)) s.insert(f);
    return s;
  }();
  return kind == ApiKind::kChat ? chat : completion;
}

// Known fields this server cannot honour, when given a non-default value.
std::optional<ApiError> check_unsupported(const json& body, ApiKind kind, int32_t n) {
  // `why` follows the field name: ": reason" or " = value: reason".
  auto unsupported = [](const std::string& f, const std::string& why) {
    return bad(f, f + (why.rfind("= ", 0) == 0 ? " " : ": ") + why, 400, "unsupported_parameter");
  };
  if (auto it = body.find("logit_bias"); it != body.end() && !it->is_null() && !(it->is_object() && it->empty())) {
    return unsupported("logit_bias", "not supported by this server");
  }
  for (const auto& [f, def] : default_only_fields(kind)) {
    auto it = body.find(f);
    if (it == body.end() || it->is_null()) continue;
    if (def == "*") {
      if (!it->is_string()) return wrong_type(f, *it, "a string");
      continue;
    }
    if (def.is_boolean() && !it->is_boolean()) return wrong_type(f, *it, "a boolean");
    if (def.is_number() && !it->is_number()) return wrong_type(f, *it, "a number");
    if (*it != def) return unsupported(f, "= " + shown(*it) + ": only " + def.dump() + " (vLLM's default) is supported by this server");
  }
  if (auto it = body.find("best_of"); it != body.end() && !it->is_null()) {
    if (!it->is_number_integer()) return wrong_type("best_of", *it, "an integer");
    // vLLM: best_of >= n; this server returns n choices and samples no extra ones.
    if (it->get<int64_t>() != n) return unsupported("best_of", "= " + shown(*it) + ": only best_of = n (" + std::to_string(n) + ") is supported");
  }
  if (kind == ApiKind::kCompletion) {
    if (auto it = body.find("suffix"); it != body.end() && !it->is_null() && !(it->is_string() && it->get<std::string>().empty())) {
      return unsupported("suffix", "not supported by this server (no fill-in-the-middle)");
    }
  } else {
    for (const char* f : {"tools", "functions"}) {
      if (auto it = body.find(f); it != body.end() && !it->is_null() && !(it->is_array() && it->empty())) {
        return unsupported(f, "tool calling is not supported by this server");
      }
    }
    for (const char* f : {"tool_choice", "function_call"}) {
      if (auto it = body.find(f); it != body.end() && !it->is_null() && !(it->is_string() && it->get<std::string>() == "none")) {
        return unsupported(f, "tool calling is not supported by this server");
      }
    }
    if (auto it = body.find("response_format"); it != body.end() && !it->is_null()) {
      if (!it->is_object() || it->value("type", json()) != "text") {
        return unsupported("response_format", "= " + shown(*it) + ": only {\"type\": \"text\"} is supported");
      }
    }
  }
  return std::nullopt;
}

}  // namespace specserve::openai_fields
