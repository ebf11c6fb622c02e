#include "server/openai_api.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "actors/prompt.h"
#include "server/api_fields.h"
#include "server/openai_fields.h"
#include "server/request_body.h"

namespace specserve {

using json = nlohmann::json;

json ApiError::to_json() const {
  json e;
  e["message"] = message;
  e["type"] = type;
  e["param"] = param.empty() ? json(nullptr) : json(param);
  e["code"] = code.empty() ? json(nullptr) : json(code);
  return json{{"error", e}};
}

std::string dump_json(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

namespace {

using openai_fields::check_unsupported;
using openai_fields::known_fields;
using api_fields::bad;
using api_fields::read_bool;
using api_fields::read_int;
using api_fields::read_number;
using api_fields::read_token_id;
using api_fields::shown;
using api_fields::type_name;
using api_fields::valid_utf8;
using api_fields::wrong_type;

std::optional<ApiError> read_messages(const json& body, std::vector<ChatTurn>* out) {
  auto it = body.find("messages");
  if (it == body.end() || it->is_null()) return bad("messages", "messages: required");
  if (!it->is_array()) return wrong_type("messages", *it, "an array of messages");
  if (it->empty()) return bad("messages", "messages: must hold at least one message");
  for (size_t i = 0; i < it->size(); ++i) {
    const json& m = (*it)[i];
    const std::string where = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) return wrong_type(where, m, "an object");
    auto r = m.find("role");
    if (r == m.end() || !r->is_string()) return bad(where + ".role", where + ".role: required, a string");
    std::string role = r->get<std::string>();
    if (role == "developer") role = "system";  // OpenAI's newer name for the system role
    if (role != "system" && role != "user" && role != "assistant") {
      return bad(where + ".role", where + ".role = \"" + r->get<std::string>() + "\": must be system, developer, user or assistant");
    }
    for (auto f = m.begin(); f != m.end(); ++f) {
      if (f.key() == "role" || f.key() == "content" || f.key() == "name") continue;
      // Fields that OpenAI's and vLLM's responses carry and clients replay in a history
      // (assistant messages: "tool_calls": [], "refusal": null, ...): accepted when null or
      // empty; with a value they would ask for what is not served (tools, audio).
      // NOTE: any of them was refused, null or not, so a replayed history failed with 400.
      static const char* const kEmptyAllowed[] = {"tool_calls", "function_call", "refusal",           "audio",
                                                  "annotations", "reasoning_content", "reasoning"};
      const bool known = std::find(std::begin(kEmptyAllowed), std::end(kEmptyAllowed), f.key()) != std::end(kEmptyAllowed);
      const bool empty = f->is_null() || ((f->is_array() || f->is_object() || f->is_string()) && f->empty());
      if (known && empty) continue;
      return bad(where + "." + f.key(), where + "." + f.key() + (known ? ": supported only when null or empty" : ": not supported in a message"),
                 400, "unsupported_parameter");
    }
    auto c = m.find("content");
    std::string content;
    if ((c == m.end() || c->is_null()) && role == "assistant") {
      // OpenAI: an assistant message's content may be null (with tool calls); vLLM renders it as "".
    } else if (c == m.end() || c->is_null()) {
      return bad(where + ".content", where + ".content: required");
    } else if (c->is_string()) {
      content = c->get<std::string>();
    } else if (c->is_array()) {
      for (size_t k = 0; k < c->size(); ++k) {
        const json& part = (*c)[k];
        const std::string pw = where + ".content[" + std::to_string(k) + "]";
        if (!part.is_object() || part.value("type", json()) != "text" || !part.contains("text") || !part["text"].is_string()) {
          return bad(pw, pw + ": only {\"type\": \"text\", \"text\": ...} parts are supported", 400, "unsupported_parameter");
        }
        if (k > 0) content += "\n";  // vLLM joins text parts with a newline
        content += part["text"].get<std::string>();
      }
    } else {
      return wrong_type(where + ".content", *c, "a string or an array of text parts");
    }
    out->push_back({role, std::move(content)});
  }
  return std::nullopt;
}

// Completions' prompt: a string, a list of strings, a list of token ids, or a list of lists.
// `number_text`: parse_request_body's numbers as sent, for the message about an id past 64 bits.
// `vocab`: the model's vocabulary size (ids at or past it are refused here, naming prompt[i][j]).
std::optional<ApiError> read_prompts(const json& body, const ApiLimits& limits, const std::map<std::string, std::string>& number_text,
                                     int64_t vocab, std::vector<GenerateRequest>* out, std::vector<std::string>* texts) {
  auto it = body.find("prompt");
  if (it == body.end() || it->is_null()) return bad("prompt", "prompt: required");
  const json& p = *it;
  auto one_ids = [&](const json& a, const std::string& where) -> std::optional<ApiError> {
    GenerateRequest r;
    for (size_t i = 0; i < a.size(); ++i) {
      // Checked against the vocabulary here, as stop_token_ids are, so the error names the id's
      // place (tokenize_prompt's check names prompt_token_ids[j], a field the client never sent).
      int32_t id = 0;
      const std::string why = vocab <= INT32_MAX ? " of this model (vocabulary " + std::to_string(vocab) + ")" : "";
      if (auto e = read_token_id(a[i], where + "[" + std::to_string(i) + "]", where, vocab, why, number_text, &id)) {
        return e;
      }
      r.prompt_token_ids.push_back(id);
    }
    if (r.prompt_token_ids.empty()) return bad(where, where + ": an empty list of token ids");
    out->push_back(std::move(r));
    texts->push_back("");
    return std::nullopt;
  };
  if (p.is_string()) {
    GenerateRequest r;
    r.prompt = p.get<std::string>();
    if (r.prompt.empty()) return bad("prompt", "prompt: an empty string (give text or token ids)");
    texts->push_back(r.prompt);
    out->push_back(std::move(r));
    return std::nullopt;
  }
  if (!p.is_array()) return wrong_type("prompt", p, "a string, a list of strings or a list of token ids");
  if (p.empty()) return bad("prompt", "prompt: an empty list");
  if (p[0].is_number()) return one_ids(p, "prompt");
  if (static_cast<int64_t>(p.size()) > limits.max_prompts) {
    return bad("prompt", "prompt: " + std::to_string(p.size()) + " prompts: at most " + std::to_string(limits.max_prompts) + " in one request");
  }
  for (size_t i = 0; i < p.size(); ++i) {
    const std::string where = "prompt[" + std::to_string(i) + "]";
    if (p[i].is_string()) {
      GenerateRequest r;
      r.prompt = p[i].get<std::string>();
      if (r.prompt.empty()) return bad(where, where + ": an empty string (give text or token ids)");
      texts->push_back(r.prompt);
      out->push_back(std::move(r));
    } else if (p[i].is_array()) {
      if (auto e = one_ids(p[i], where)) return e;
    } else {
      return wrong_type(where, p[i], "a string or a list of token ids");
    }
  }
  return std::nullopt;
}

}  // namespace

// read_messages, for the tokenizer endpoints (server/tokenize_api.cpp).
std::optional<ApiError> api_read_messages(const json& body, std::vector<ChatTurn>* out) { return read_messages(body, out); }

std::optional<ApiError> parse_openai_request(const std::string& body_text, ApiKind kind, const ServedModel& model,
                                             const ApiLimits& limits, ParsedRequest* out) {
  json body;
  std::map<std::string, std::string> number_text;
  if (auto e = parse_request_body(body_text, &body, &number_text)) return e;
  if (!body.is_object()) return bad("", std::string("the request body must be a JSON object, got ") + type_name(body));
  const auto& known = known_fields(kind);
  for (auto it = body.begin(); it != body.end(); ++it) {
    if (!known.count(it.key())) {
      return bad(it.key(), "Unrecognized request argument supplied: " + it.key(), 400, "unknown_parameter");
    }
  }
  ParsedRequest r;
  r.kind = kind;
  // model: optional here (one model is served); when given it must be ours.
  if (auto it = body.find("model"); it != body.end() && !it->is_null()) {
    if (!it->is_string()) return wrong_type("model", *it, "a string");
    const std::string m = it->get<std::string>();
    bool ok = m == model.name;
    for (const auto& a : model.aliases) ok = ok || m == a;
    if (!ok) return bad("model", "The model `" + m + "` does not exist (this server serves `" + model.name + "`)", 404, "model_not_found");
  }
  int64_t v = 0;
  if (auto e = read_int(body, "n", 1, limits.max_n, &v, nullptr, &number_text)) return e;
  if (body.contains("n") && !body["n"].is_null()) r.n = static_cast<int32_t>(v);
  if (auto e = check_unsupported(body, kind, r.n)) return e;
  if (auto e = read_bool(body, "stream", &r.stream)) return e;
  if (auto it = body.find("stream_options"); it != body.end() && !it->is_null()) {
    if (!it->is_object()) return wrong_type("stream_options", *it, "an object");
    if (!r.stream) return bad("stream_options", "stream_options: only allowed with stream: true");
    for (auto f = it->begin(); f != it->end(); ++f) {
      if (f.key() != "include_usage" && f.key() != "continuous_usage_stats") {
        return bad("stream_options." + f.key(), "Unrecognized request argument supplied: stream_options." + f.key(), 400, "unknown_parameter");
      }
    }
    if (auto e = read_bool(*it, "include_usage", &r.include_usage)) return bad("stream_options.include_usage", e->message);
    bool continuous = false;
    if (auto e = read_bool(*it, "continuous_usage_stats", &continuous)) return bad("stream_options.continuous_usage_stats", e->message);
    r.continuous_usage = continuous && r.include_usage;
  }
  GenerateRequest& g = r.base;
  SamplingParams& s = g.sampling;
  if (auto e = read_number(body, "temperature", 0.0, 100.0, &s.temperature)) return e;
  // (0, 1] in both messages: read_number says "[0, 1]" for any value outside, 0 is refused apart.
  if (auto it = body.find("top_p"); it != body.end() && it->is_number() && !(it->get<double>() >= 0.0 && it->get<double>() <= 1.0)) {
    return bad("top_p", "top_p = " + shown(*it) + ": must be in (0, 1]");
  }
  if (auto e = read_number(body, "top_p", 0.0, 1.0, &s.top_p)) return e;
  if (body.contains("top_p") && !body["top_p"].is_null() && !(s.top_p > 0.0f)) return bad("top_p", "top_p = 0: must be in (0, 1]");
  if (auto e = read_number(body, "min_p", 0.0, 1.0, &s.min_p)) return e;
  if (auto e = read_number(body, "presence_penalty", -2.0, 2.0, &s.presence_penalty)) return e;
  if (auto e = read_number(body, "frequency_penalty", -2.0, 2.0, &s.frequency_penalty)) return e;
  if (auto e = read_number(body, "repetition_penalty", 1e-6, 100.0, &s.repetition_penalty)) return e;
  if (auto e = read_int(body, "top_k", -1, INT32_MAX, &v, nullptr, &number_text)) return e;
  if (body.contains("top_k") && !body["top_k"].is_null()) s.top_k = static_cast<int32_t>(v == 0 ? -1 : v);
  // seed: any integer in [-2^63, 2^64 - 1] (vLLM's seeds are Python ints), a negative one as its
  // two's complement. NOTE: an integer beyond that range parses as a double: refused naming the
  // text the client sent (it was reported as "expected an integer, got number 1.8446744073709552e+19").
  if (auto it = body.find("seed"); it != body.end() && !it->is_null()) {
    if (it->is_number_unsigned()) {
      s.seed = it->get<uint64_t>();
    } else if (it->is_number_integer()) {
      s.seed = static_cast<uint64_t>(it->get<int64_t>());
    } else if (it->is_number_float()) {
      const double d = it->get<double>();
      if (!(std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9e15)) {  // 5.0 passes, as for every integer field
        const auto text = number_text.find("seed");
        std::string written = text != number_text.end() ? text->second : shown(*it);
        if (written.size() > 80) written = written.substr(0, 77) + "...";
        return bad("seed", "seed = " + written +
                               ": must be an integer in [-9223372036854775808, 18446744073709551615]");
      }
      s.seed = static_cast<uint64_t>(static_cast<int64_t>(d));
    } else {
      return wrong_type("seed", *it, "an integer");
    }
    s.has_seed = true;
  }
  if (auto e = read_bool(body, "ignore_eos", &s.ignore_eos)) return e;
  if (auto e = read_int(body, "min_tokens", 0, INT32_MAX, &v, nullptr, &number_text)) return e;
  if (body.contains("min_tokens") && !body["min_tokens"].is_null()) s.min_tokens = static_cast<int32_t>(v);
  if (auto e = read_bool(body, "include_stop_str_in_output", &g.include_stop_str)) return e;
  if (auto e = read_int(body, "priority", INT32_MIN, INT32_MAX, &v, nullptr, &number_text)) return e;
  if (body.contains("priority") && !body["priority"].is_null()) g.priority = static_cast<int32_t>(v);
  if (auto it = body.find("stop_token_ids"); it != body.end() && !it->is_null()) {
    if (!it->is_array()) return wrong_type("stop_token_ids", *it, "an array of token ids");
    const int32_t vocab = model.text.loaded() ? model.text.vocab_size() : INT32_MAX;
    for (size_t i = 0; i < it->size(); ++i) {
      const std::string where = "stop_token_ids[" + std::to_string(i) + "]";
      int32_t id = 0;
      if (auto e = read_token_id((*it)[i], where, where, vocab, " of this model (vocabulary " + std::to_string(vocab) + ")", number_text, &id)) {
        return e;
      }
      s.stop_token_ids.push_back(id);
    }
  }
  if (auto it = body.find("stop"); it != body.end() && !it->is_null()) {
    std::vector<std::string> stops;
    if (it->is_string()) {
      stops.push_back(it->get<std::string>());
    } else if (it->is_array()) {
      for (size_t i = 0; i < it->size(); ++i) {
        if (!(*it)[i].is_string()) return wrong_type("stop[" + std::to_string(i) + "]", (*it)[i], "a string");
        stops.push_back((*it)[i].get<std::string>());
      }
    } else {
      return wrong_type("stop", *it, "a string or an array of strings");
    }
    if (static_cast<int32_t>(stops.size()) > limits.max_stop) {
      return bad("stop", "stop: " + std::to_string(stops.size()) + " strings: at most " + std::to_string(limits.max_stop));
    }
    for (const auto& st : stops) {
      if (st.empty()) return bad("stop", "stop: an empty stop string never matches");
      if (static_cast<int32_t>(st.size()) > limits.max_stop_bytes) {
        return bad("stop", "stop: a stop string of " + std::to_string(st.size()) + " bytes: at most " + std::to_string(limits.max_stop_bytes));
      }
    }
    g.stop = std::move(stops);
  }
  // logprobs: completions take an integer (how many alternatives), chat a boolean plus
  // top_logprobs.
  if (kind == ApiKind::kCompletion) {
    bool given = false;
    if (auto e = read_int(body, "logprobs", 0, 20, &v, &given, &number_text)) return e;
    if (given) {
      r.logprobs = true;
      r.top_logprobs = static_cast<int32_t>(v);
    }
    if (auto e = read_bool(body, "echo", &r.echo)) return e;
    if (r.echo && r.logprobs) {
      return bad("echo", "echo with logprobs: logprobs of prompt tokens are not supported by this server", 400, "unsupported_parameter");
    }
  } else {
    if (auto e = read_bool(body, "logprobs", &r.logprobs)) return e;
    bool given = false;
    if (auto e = read_int(body, "top_logprobs", 0, 20, &v, &given, &number_text)) return e;
    if (given) {
      if (!r.logprobs && v > 0) return bad("top_logprobs", "top_logprobs: requires logprobs: true");
      r.top_logprobs = static_cast<int32_t>(v);
    }
  }
  s.logprobs = r.top_logprobs;
  if (Status st = s.validate(); !st.ok()) return bad("", st.message());
  // max_tokens (max_completion_tokens is the chat API's newer name; both: the latter wins).
  bool max_given = false;
  int64_t max_tokens = 16;
  if (auto e = read_int(body, "max_tokens", 1, INT32_MAX, &max_tokens, &max_given, &number_text)) return e;
  if (kind == ApiKind::kChat) {
    if (auto e = read_int(body, "max_completion_tokens", 1, INT32_MAX, &max_tokens, &max_given, &number_text)) return e;
  }
  // The prompts, tokenized here so that their length is checked against the context.
  std::vector<GenerateRequest> prompts;
  std::vector<std::string> texts;
  const char* prompt_field = kind == ApiKind::kChat ? "messages" : "prompt";
  if (kind == ApiKind::kChat) {
    GenerateRequest c;
    if (auto e = read_messages(body, &c.messages)) return e;
    prompts.push_back(std::move(c));
    texts.push_back("");
  } else {
    const int64_t vocab = model.text.loaded() ? model.text.vocab_size() : int64_t{INT32_MAX} + 1;
    if (auto e = read_prompts(body, limits, number_text, vocab, &prompts, &texts)) return e;
  }
  if (static_cast<int64_t>(prompts.size()) * r.n > limits.max_choices) {
    return bad("n", "n = " + std::to_string(r.n) + " with " + std::to_string(prompts.size()) + " prompts: at most " +
                        std::to_string(limits.max_choices) + " choices in one request");
  }
  // vLLM's add_special_tokens (the model's BOS rule; default true here for both kinds, where
  // vLLM's chat default is false: the same ids for models that add no BOS, e.g. SmolLM2) and
  // add_generation_prompt (chat; default true).
  PromptOptions how;
  if (auto e = read_bool(body, "add_special_tokens", &how.add_special)) return e;
  if (kind == ApiKind::kChat) {
    if (auto e = read_bool(body, "add_generation_prompt", &how.add_generation_prompt)) return e;
  }
  for (size_t i = 0; i < prompts.size(); ++i) {
    ParsedPrompt pp;
    pp.text = texts[i];
    if (!model.text.loaded()) return bad("", "the server has no tokenizer", 500, "internal_error");
    auto toks = model.text.tokenize(prompts[i], how);
    if (!toks.ok()) {
      // A prompt too long to tokenize is the context-length error of vLLM / OpenAI: a 400.
      const bool size = toks.status().code() == StatusCode::kOutOfRange;
      return bad(prompt_field, toks.status().message(), 400, size ? "context_length_exceeded" : "");
    }
    pp.tokens = std::move(*toks);
    // echo of a prompt given as token ids: its text (it echoed nothing, as vLLM echoes the prompt).
    if (r.echo && pp.text.empty()) pp.text = model.text.decode(pp.tokens);
    const int64_t len = static_cast<int64_t>(pp.tokens.size());
    if (model.max_model_len > 0) {
      const int64_t room = model.max_model_len - len;
      if (room < 1) {
        return bad(prompt_field, "This model's maximum context length is " + std::to_string(model.max_model_len) +
                                     " tokens; the " + prompt_field + (kind == ApiKind::kChat ? " have " : " has ") + std::to_string(len) + " tokens (" +
                                     prompt_field + (prompts.size() > 1 ? "[" + std::to_string(i) + "]" : "") +
                                     "), leaving no room for a completion",
                   400, "context_length_exceeded");
      }
      if (max_given && max_tokens > room) {
        const char* f = body.contains("max_completion_tokens") && !body["max_completion_tokens"].is_null() ? "max_completion_tokens" : "max_tokens";
        return bad(f, "This model's maximum context length is " + std::to_string(model.max_model_len) + " tokens. However, you requested " +
                          std::to_string(len + max_tokens) + " tokens (" + std::to_string(len) + " in the " + prompt_field + ", " +
                          std::to_string(max_tokens) + " in the completion). Please reduce the length of the " + prompt_field +
                          " or " + f + ".",
                   400, "context_length_exceeded");
      }
      pp.max_tokens = static_cast<int32_t>(max_given ? max_tokens : kind == ApiKind::kChat ? room : std::min<int64_t>(16, room));
    } else {
      pp.max_tokens = static_cast<int32_t>(max_given ? max_tokens : kind == ApiKind::kChat ? 4096 : 16);
    }
    if (s.min_tokens > pp.max_tokens) {
      return bad("min_tokens", "min_tokens = " + std::to_string(s.min_tokens) + ": must be <= max_tokens = " + std::to_string(pp.max_tokens) +
                                   (max_given ? "" : " (the default for this " + std::string(prompt_field) + ")"));
    }
    r.prompts.push_back(std::move(pp));
  }
  *out = std::move(r);
  return std::nullopt;
}

GenerateRequest ParsedRequest::request_for(size_t prompt, int32_t choice) const {
  GenerateRequest g = base;
  g.prompt.clear();
  g.messages.clear();
  g.prompt_token_ids = prompts[prompt].tokens;
  g.max_tokens = prompts[prompt].max_tokens;
  if (g.sampling.has_seed) g.sampling.seed += static_cast<uint64_t>(choice);
  return g;
}

void ChoiceOutput::add(const StreamChunk& c) {
  text += c.text;
  tokens.insert(tokens.end(), c.tokens.begin(), c.tokens.end());
  logprobs.insert(logprobs.end(), c.logprobs.begin(), c.logprobs.end());
  if (c.top_n > 0) top_n = c.top_n;
  top_ids.insert(top_ids.end(), c.top_logprob_ids.begin(), c.top_logprob_ids.end());
  top_values.insert(top_values.end(), c.top_logprob_values.begin(), c.top_logprob_values.end());
  if (!c.finish_reason.empty()) {
    finish_reason = c.finish_reason;
    stop_token = c.stop_token;
    stop_string = c.stop_string;
    prompt_tokens = c.prompt_tokens;
    completion_tokens = c.completion_tokens;
  }
}

json ChoiceOutput::stop_reason() const {
  if (finish_reason != "stop") return nullptr;
  if (!stop_string.empty()) return stop_string;
  if (stop_token >= 0) return stop_token;
  return nullptr;
}

std::string logprob_token_string(const PromptCodec& tok, int32_t id) {
  std::string piece = tok.token_piece(id);
  if (valid_utf8(piece)) return piece;
  static const char* hex = "0123456789abcdef";
  std::string s = "bytes:";
  for (unsigned char ch : piece) {
    s += "\\x";
    s += hex[ch >> 4];
    s += hex[ch & 15];
  }
  return s;
}

namespace {

json bytes_of(const PromptCodec& tok, int32_t id) {
  json b = json::array();
  for (unsigned char ch : tok.token_piece(id)) b.push_back(static_cast<int>(ch));
  return b;
}

}  // namespace

json logprobs_json(const ParsedRequest& req, const PromptCodec& tok, const ChoiceOutput& c, size_t begin, size_t end,
                   size_t text_offset0) {
  if (!req.logprobs) return nullptr;
  end = std::min(end, c.tokens.size());
  const size_t n = static_cast<size_t>(c.top_n);
  auto top_at = [&](size_t i, size_t k, int32_t* id, float* lp) {
    const size_t j = i * n + k;
    if (n == 0 || j >= c.top_ids.size() || j >= c.top_values.size()) return false;
    *id = c.top_ids[j];
    *lp = c.top_values[j];
    return true;
  };
  if (req.kind == ApiKind::kChat) {
    json content = json::array();
    for (size_t i = begin; i < end; ++i) {
      json e;
      e["token"] = logprob_token_string(tok, c.tokens[i]);
      e["logprob"] = i < c.logprobs.size() ? c.logprobs[i] : 0.0f;
      e["bytes"] = bytes_of(tok, c.tokens[i]);
      json tops = json::array();
      for (size_t k = 0; k < static_cast<size_t>(req.top_logprobs); ++k) {
        int32_t id;
        float lp;
        if (!top_at(i, k, &id, &lp)) break;
        tops.push_back({{"token", logprob_token_string(tok, id)}, {"logprob", lp}, {"bytes", bytes_of(tok, id)}});
      }
      e["top_logprobs"] = tops;
      content.push_back(e);
    }
    return json{{"content", content}};
  }
  json tokens = json::array(), token_logprobs = json::array(), top = json::array(), offsets = json::array();
  // Offsets in characters of the choice's text (OpenAI's and vLLM's: a Python str index), not
  // bytes: a token counts the characters that start in it (bytes that are not UTF-8
  // continuation bytes), so a character split over two tokens counts once, in the first.
  auto chars = [&](int32_t id) {
    size_t n = 0;
    for (unsigned char ch : tok.token_piece(id)) n += (ch & 0xC0) != 0x80;
    return n;
  };
  size_t offset = text_offset0;
  for (size_t i = 0; i < begin && i < c.tokens.size(); ++i) offset += chars(c.tokens[i]);
  for (size_t i = begin; i < end; ++i) {
    tokens.push_back(logprob_token_string(tok, c.tokens[i]));
    token_logprobs.push_back(i < c.logprobs.size() ? c.logprobs[i] : 0.0f);
    // The sampled token and the top `logprobs` alternatives: up to logprobs + 1 entries (the
    // legacy completions API returns the sampled token's logprob always; vLLM does the same).
    // NOTE: with logprobs = 0 each entry was null; it is now {sampled token: its logprob}.
    json t = json::object();
    for (size_t k = 0; k < static_cast<size_t>(req.top_logprobs); ++k) {
      int32_t id;
      float lp;
      if (!top_at(i, k, &id, &lp)) break;
      const std::string s = logprob_token_string(tok, id);
      if (!t.contains(s)) t[s] = lp;
    }
    if (!t.contains(tokens.back().get_ref<const std::string&>())) t[tokens.back().get<std::string>()] = token_logprobs.back();
    top.push_back(std::move(t));
    offsets.push_back(offset);
    offset += chars(c.tokens[i]);
  }
  return json{{"tokens", tokens}, {"token_logprobs", token_logprobs}, {"top_logprobs", top}, {"text_offset", offsets}};
}

std::string api_finish_reason(const std::string& r) {
  if (r == "timeout") return "length";
  return r;
}

json usage_json(const ParsedRequest& req, const std::vector<ChoiceOutput>& choices) {
  int64_t prompt = 0, completion = 0;
  for (size_t p = 0; p < req.prompts.size(); ++p) prompt += static_cast<int64_t>(req.prompts[p].tokens.size());
  for (const auto& c : choices) completion += static_cast<int64_t>(c.tokens.size());
  return json{{"prompt_tokens", prompt}, {"completion_tokens", completion}, {"total_tokens", prompt + completion}};
}

json completion_response(const ParsedRequest& req, const ServedModel& model, const std::string& id, int64_t created,
                         const std::vector<ChoiceOutput>& choices) {
  json out;
  out["id"] = id;
  out["object"] = req.kind == ApiKind::kChat ? "chat.completion" : "text_completion";
  out["created"] = created;
  out["model"] = model.name;
  json cs = json::array();
  for (size_t i = 0; i < choices.size(); ++i) {
    const ChoiceOutput& c = choices[i];
    const size_t prompt = i / static_cast<size_t>(req.n);
    json ch;
    ch["index"] = i;
    if (req.kind == ApiKind::kChat) {
      ch["message"] = {{"role", "assistant"}, {"content", c.text}};
    } else {
      ch["text"] = req.echo ? req.prompts[prompt].text + c.text : c.text;
    }
    ch["logprobs"] = model.text.loaded() ? logprobs_json(req, model.text, c, 0, c.tokens.size(), 0) : json(nullptr);
    ch["finish_reason"] = api_finish_reason(c.finish_reason);
    ch["stop_reason"] = c.stop_reason();
    cs.push_back(ch);
  }
  out["choices"] = cs;
  out["usage"] = usage_json(req, choices);
  out["system_fingerprint"] = nullptr;
  return out;
}

}  // namespace specserve
