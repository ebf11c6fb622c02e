#include "server/tokenize_api.h"

#include <initializer_list>
#include <vector>

#include "server/api_fields.h"
#include "server/request_body.h"

namespace specserve {

using json = nlohmann::json;

namespace {

// Parses `text` as a JSON object whose fields are all in `known` and whose "model" (when given)
// is the served one. `number_text` (optional): numbers as sent (parse_request_body).
std::optional<ApiError> read_body(const std::string& text, const ServedModel& model,
                                  std::initializer_list<const char*> known, json* body,
                                  std::map<std::string, std::string>* number_text = nullptr) {
  if (auto e = parse_request_body(text, body, number_text)) return e;
  if (!body->is_object()) return api_fields::wrong_type("body", *body, "a JSON object");
  for (auto it = body->begin(); it != body->end(); ++it) {
    bool ok = false;
    for (const char* k : known) ok = ok || it.key() == k;
    if (!ok) {
      ApiError e = api_fields::bad(it.key(), "Unrecognized request argument supplied: " + it.key());
      e.code = "unknown_parameter";
      return e;
    }
  }
  if (auto it = body->find("model"); it != body->end() && !it->is_null()) {
    if (!it->is_string()) return api_fields::wrong_type("model", *it, "a string");
    const std::string m = it->get<std::string>();
    bool ok = m == model.name;
    for (const auto& a : model.aliases) ok = ok || m == a;
    if (!ok) {
      ApiError e = api_fields::bad("model", "The model `" + m + "` does not exist (this server serves `" + model.name + "`)");
      e.http_status = 404;
      e.code = "model_not_found";
      return e;
    }
  }
  return std::nullopt;
}

}  // namespace

std::optional<ApiError> tokenize_response(const std::string& text, const ServedModel& model, json* out) {
  json body;
  if (auto e = read_body(text, model,
                         {"model", "prompt", "messages", "add_special_tokens", "add_generation_prompt", "return_token_strs"},
                         &body)) {
    return e;
  }
  const bool has_prompt = body.contains("prompt") && !body["prompt"].is_null();
  const bool has_messages = body.contains("messages") && !body["messages"].is_null();
  if (has_prompt == has_messages) return api_fields::bad("prompt", "give exactly one of prompt and messages");
  if (has_prompt && body.contains("add_generation_prompt")) {
    return api_fields::bad("add_generation_prompt", "add_generation_prompt: only with messages");
  }
  bool add_special = true, add_generation_prompt = true, token_strs = false;
  if (auto e = api_fields::read_bool(body, "add_special_tokens", &add_special)) return e;
  if (auto e = api_fields::read_bool(body, "add_generation_prompt", &add_generation_prompt)) return e;
  if (auto e = api_fields::read_bool(body, "return_token_strs", &token_strs)) return e;
  const PromptCodec& tok = model.text;
  std::vector<int32_t> ids;
  if (has_prompt) {
    if (!body["prompt"].is_string()) return api_fields::wrong_type("prompt", body["prompt"], "a string");
    ids = tok.encode(body["prompt"].get<std::string>(), add_special);
  } else {
    std::vector<ChatTurn> turns;
    if (auto e = api_read_messages(body, &turns)) return e;
    auto rendered = tok.render_chat(turns, add_generation_prompt);
    if (!rendered.ok()) return api_fields::bad("messages", rendered.status().message());
    ids = tok.encode(*rendered, add_special);
  }
  json strs = nullptr;
  if (token_strs) {
    strs = json::array();
    for (int32_t id : ids) strs.push_back(tok.token_text(id));
  }
  *out = json{{"count", ids.size()},
              {"max_model_len", model.max_model_len > 0 ? json(model.max_model_len) : json(nullptr)},
              {"tokens", ids},
              {"token_strs", std::move(strs)}};
  return std::nullopt;
}

std::optional<ApiError> detokenize_response(const std::string& text, const ServedModel& model, json* out) {
  json body;
  std::map<std::string, std::string> number_text;
  if (auto e = read_body(text, model, {"model", "tokens"}, &body, &number_text)) return e;
  auto it = body.find("tokens");
  if (it == body.end() || it->is_null()) return api_fields::bad("tokens", "tokens: required");
  if (!it->is_array()) return api_fields::wrong_type("tokens", *it, "an array of token ids");
  const int32_t vocab = model.text.vocab_size();
  std::vector<int32_t> ids;
  ids.reserve(it->size());
  const std::string why = " of this model (vocabulary " + std::to_string(vocab) + ")";
  for (size_t i = 0; i < it->size(); ++i) {
    const std::string where = "tokens[" + std::to_string(i) + "]";
    int32_t id = 0;
    if (auto e = api_fields::read_token_id((*it)[i], where, where, vocab, why, number_text, &id)) return e;
    ids.push_back(id);
  }
  *out = json{{"prompt", model.text.decode(ids)}};
  return std::nullopt;
}

}  // namespace specserve
