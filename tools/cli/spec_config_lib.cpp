// See spec_config_lib.h.
#include "tools/cli/spec_config_lib.h"

#include <algorithm>
#include <cmath>
#include <exception>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <string>

#include <nlohmann/json.hpp>

#include "core/json_reader.h"

namespace specserve::cli {

Expected<std::optional<SpeculativeSpec>> parse_spec_args(const SpecArgs& a, EngineOptions* eo) {
  std::string method, model = a.speculative_model;
  // -1: not given. The flag and the JSON key must agree when both are given (vLLM refuses too).
  int k = a.num_speculative_tokens, k_json = -1;
  const char* k_source = "--num-speculative-tokens";
  bool k_given = k >= 0;
  // vLLM's defaults: both 5 when neither is given; one given sets the other.
  int lookup_min = -1, lookup_max = -1, num_layers = -1, eagle_topk = -1, eagle_depth = -1, draft_vocab = -1, cached = -1;
  std::string token_tree;
  bool has_token_tree = false;
  std::optional<int32_t> draft_max_len;
  std::optional<float> draft_p_min;
  std::string draft_p_min_text;  // as written, for messages
  if (!a.speculative_config.empty()) {
    nlohmann::json j;
    // A number beyond a double (1e400) used to escape to main as "specserve: error:
    // [json.exception.out_of_range.406] ..." with exit status 1, and then named no key.
    std::map<std::string, std::string> written;  // path (a top-level key here) -> a double's text as given
    if (std::optional<JsonReadError> e = read_json(a.speculative_config, &j, &written)) {
      return invalid_argument("--speculative-config: " + e->describe("the value"));
    }
    if (!j.is_object()) return invalid_argument(std::string("--speculative-config: must be a JSON object, got ") + j.type_name());
    static const std::set<std::string> kKeys = {"method", "model", "num_speculative_tokens", "prompt_lookup_min",
                                                "prompt_lookup_max", "disable_by_batch_size", "max_model_len",
                                                "draft_tensor_parallel_size", "num_layers", "adaptive_k", "disable_by_goodput",
                                                "speculative_token_tree", "eagle_topk", "eagle_depth", "draft_vocab_size", "draft_p_min",
                                                "typical_acceptance", "posterior_threshold", "posterior_alpha",
                                                "lookup_cached_requests"};
    for (auto it = j.begin(); it != j.end(); ++it) {
      if (!kKeys.count(it.key())) return invalid_argument("--speculative-config: unknown key '" + it.key() + "'");
    }
    // A key given as null is not given (vLLM: None is the field's default; YAML's null here too).
    for (auto it = j.begin(); it != j.end();) it = it->is_null() ? j.erase(it) : std::next(it);
    // NOTE: -1 means "not given" in the variables below, so a key given as -1 (or as 2^64 - 1,
    // which get<int64_t> wrapped to -1) was silently taken as absent: no key here takes a
    // negative value, so a negative one is refused with the key and the value as written.
    auto get_int = [&](const char* key, int* dst, int64_t min = 0) -> Status {
      if (!j.contains(key)) return Status();
      if (j[key].is_number_float() && std::isfinite(j[key].get<double>()) && j[key].get<double>() == std::floor(j[key].get<double>()) &&
          std::fabs(j[key].get<double>()) >= 9e18) {
        // A whole number past 64 bits (a double by now): out of range, as written.
        const auto w = written.find(key);
        return invalid_argument(std::string("--speculative-config: ") + key + " = " + (w != written.end() ? w->second : j[key].dump()) +
                                " is out of range");
      }
      // A whole number written as a float (3.0) is that integer, as vLLM's pydantic config takes
      // it; 3.5 is refused. Messages show the value as written (1e7, -0.0).
      std::string shown = j[key].dump();
      if (j[key].is_number_float() && std::isfinite(j[key].get<double>()) && j[key].get<double>() == std::floor(j[key].get<double>())) {
        if (const auto w = written.find(key); w != written.end()) shown = w->second;
        j[key] = static_cast<int64_t>(j[key].get<double>());
      }
      if (!j[key].is_number_integer()) return invalid_argument(std::string("--speculative-config: ") + key + " must be an integer, got " + j[key].dump());
      if (j[key].is_number_unsigned() ? j[key].get<uint64_t>() > 1000000 : j[key].get<int64_t>() > 1000000) {
        return invalid_argument(std::string("--speculative-config: ") + key + " = " + shown + " is out of range (at most 1000000)");
      }
      const int64_t v = j[key].get<int64_t>();
      if (v < min) return invalid_argument(std::string("--speculative-config: ") + key + " = " + shown + ": must be >= " + std::to_string(min));
      *dst = static_cast<int>(v);
      return Status();
    };
    if (j.contains("method")) {
      if (!j["method"].is_string()) return invalid_argument("--speculative-config: method must be a string, got " + j["method"].dump());
      method = j["method"].get<std::string>();
      // An empty method (an unset variable in a script) is not "no method" (it fell back to n-gram).
      if (method.empty()) return invalid_argument("--speculative-config: method is empty: one of ngram, draft_model, layer_skip, medusa, eagle");
    }
    if (j.contains("model")) {
      if (!j["model"].is_string()) return invalid_argument("--speculative-config: model must be a string, got " + j["model"].dump());
      model = j["model"].get<std::string>();
      // An empty "model" (an unset variable in a script) is not "no model": without a method it
      // used to fall back to n-gram lookup silently.
      if (model.empty()) return invalid_argument("--speculative-config: model is an empty path");
      // NOTE: both given and different used to take the JSON's silently (a benchmark of the wrong
      // draft); refused as vLLM-style num_speculative_tokens is. The same file written two ways
      // (./d.gguf and d.gguf, relative and absolute, a link) is the same file.
      auto same_file = [](const std::string& x, const std::string& y) {
        namespace fs = std::filesystem;
        std::error_code ec;
        if (fs::path(x).lexically_normal() == fs::path(y).lexically_normal()) return true;
        const bool eq = fs::equivalent(x, y, ec);
        return !ec && eq;
      };
      if (!a.speculative_model.empty() && !same_file(a.speculative_model, model)) {
        return invalid_argument("--speculative-model " + a.speculative_model + " and --speculative-config model = " + model +
                                " disagree: give one of them (or the same path in both)");
      }
    }
    SPECSERVE_RETURN_IF_ERROR(get_int("num_speculative_tokens", &k_json));
    if (j.contains("num_speculative_tokens")) {
      if (k_given && k != k_json) {
        return invalid_argument("--num-speculative-tokens " + std::to_string(k) + " and --speculative-config num_speculative_tokens = " +
                                std::to_string(k_json) + " disagree: give one of them (or the same value in both)");
      }
      k = k_json;
      k_given = true;
      k_source = "--speculative-config: num_speculative_tokens";
    }
    SPECSERVE_RETURN_IF_ERROR(get_int("prompt_lookup_min", &lookup_min, 1));
    SPECSERVE_RETURN_IF_ERROR(get_int("prompt_lookup_max", &lookup_max, 1));
    SPECSERVE_RETURN_IF_ERROR(get_int("num_layers", &num_layers));
    SPECSERVE_RETURN_IF_ERROR(get_int("eagle_topk", &eagle_topk));
    SPECSERVE_RETURN_IF_ERROR(get_int("eagle_depth", &eagle_depth));
    SPECSERVE_RETURN_IF_ERROR(get_int("draft_vocab_size", &draft_vocab));
    SPECSERVE_RETURN_IF_ERROR(get_int("lookup_cached_requests", &cached));
    if (j.contains("speculative_token_tree")) {
      if (!j["speculative_token_tree"].is_string()) {
        return invalid_argument("--speculative-config: speculative_token_tree must be a string such as \"[(0,), (0, 0)]\", got " +
                                j["speculative_token_tree"].dump());
      }
      token_tree = j["speculative_token_tree"].get<std::string>();
      has_token_tree = true;
    }
    if (j.contains("adaptive_k")) {
      if (!j["adaptive_k"].is_boolean()) return invalid_argument("--speculative-config: adaptive_k must be true or false, got " + j["adaptive_k"].dump());
      eo->adaptive_k = j["adaptive_k"].get<bool>();
    }
    if (j.contains("disable_by_goodput")) {
      if (!j["disable_by_goodput"].is_boolean()) {
        return invalid_argument("--speculative-config: disable_by_goodput must be true or false, got " + j["disable_by_goodput"].dump());
      }
      eo->disable_by_goodput = j["disable_by_goodput"].get<bool>();
    }
    if (j.contains("typical_acceptance")) {
      if (!j["typical_acceptance"].is_boolean()) {
        return invalid_argument("--speculative-config: typical_acceptance must be true or false, got " + j["typical_acceptance"].dump());
      }
      eo->typical_acceptance = j["typical_acceptance"].get<bool>();
    }
    for (const char* key : {"posterior_threshold", "posterior_alpha"}) {
      if (!j.contains(key)) continue;
      if (!j[key].is_number()) return invalid_argument(std::string("--speculative-config: ") + key + " must be a number, got " + j[key].dump());
      const bool threshold = std::string(key) == "posterior_threshold";
      const double d = j[key].get<double>();
      // threshold in (0, 1], alpha in [0, 1] (Medusa's typical acceptance, engine.h), checked on
      // the float the engine will hold (a threshold of 1e-50 would become 0).
      const float v = d >= 0 && d <= 1 ? static_cast<float>(d) : -1.0f;
      if (threshold && d > 0 && v == 0) {
        return invalid_argument(std::string("--speculative-config: ") + key + " = " + j[key].dump() +
                                " is 0 as a 32-bit float (the engine's type); must be in (0, 1]");
      }
      if (threshold ? !(v > 0 && v <= 1) : !(v >= 0 && v <= 1)) {
        return invalid_argument(std::string("--speculative-config: ") + key + " = " + j[key].dump() + " must be in " +
                                (threshold ? "(0, 1]" : "[0, 1]"));
      }
      (threshold ? eo->posterior_threshold : eo->posterior_alpha) = v;
    }
    if (j.contains("draft_p_min")) {
      const nlohmann::json& v = j["draft_p_min"];
      if (!v.is_number()) return invalid_argument("--speculative-config: draft_p_min must be a number, got " + v.dump());
      const double d = v.get<double>();
      if (!(d >= 0 && d <= 1)) return invalid_argument("--speculative-config: draft_p_min = " + v.dump() + ": must be in [0, 1]");
      draft_p_min = static_cast<float>(d);
      draft_p_min_text = v.dump();
    }
    int dbs = 0, mml = -1, tp = 1;
    // >= 1 as under models.speculative (0 used to be taken here as "never", which leaving the key
    // out already says).
    SPECSERVE_RETURN_IF_ERROR(get_int("disable_by_batch_size", &dbs, 1));
    SPECSERVE_RETURN_IF_ERROR(get_int("max_model_len", &mml, 1));
    SPECSERVE_RETURN_IF_ERROR(get_int("draft_tensor_parallel_size", &tp));
    if (tp != 1) return invalid_argument("--speculative-config: draft_tensor_parallel_size = " + std::to_string(tp) + ": only 1 is supported");
    if (dbs < 0) return invalid_argument("--speculative-config: disable_by_batch_size = " + std::to_string(dbs) + " must be >= 0");
    eo->disable_by_batch_size = dbs;
    // NOTE: as in vLLM, max_model_len here is the draft's limit, not the target's (--max-model-len):
    // it used to cap the target's context, a surprise to anyone coming from vLLM.
    if (j.contains("max_model_len")) {
      if (mml < 1) return invalid_argument("--speculative-config: max_model_len = " + std::to_string(mml) + ": must be >= 1 (the draft's maximum length in tokens)");
      draft_max_len = mml;
    }
  }
  if (method.empty()) method = model.empty() ? (k > 0 ? "ngram" : "") : "draft_model";
  if (method.empty()) {
    // Keys without a method, model or k (`{"disable_by_goodput": true}`) used to be dropped
    // silently: plain decoding ran. num_speculative_tokens 0 given (flag or key) still means off.
    if (!a.speculative_config.empty() && !k_given) {
      nlohmann::json j;
      std::string keys;  // those given a value (null is not given)
      if (!read_json(a.speculative_config, &j) && j.is_object()) {
        for (auto it = j.begin(); it != j.end(); ++it) {
          if (!it->is_null()) keys += (keys.empty() ? "" : ", ") + it.key();
        }
      }
      if (!keys.empty()) {
        return invalid_argument("--speculative-config: " + keys +
                                " given without speculation: set method (and model, for model-based methods) or num_speculative_tokens");
      }
    }
    return std::optional<SpeculativeSpec>();
  }
  // An unknown method first: it is the mistake to fix, whatever else is missing.
  if (method != "ngram" && method != "draft_model" && method != "layer_skip" && method != "medusa" && method != "eagle") {
    // Shown as JSON: a NUL or an escape sequence in it must not cut or colour the message.
    return invalid_argument("--speculative-config: method " + nlohmann::json(method).dump() +
                            " is not one of ngram, draft_model, layer_skip, medusa, eagle");
  }
  if (!k_given) return invalid_argument("speculative method " + method + " needs num_speculative_tokens (--num-speculative-tokens K, 1..64)");
  if (k < 1 || k > 64) {
    return invalid_argument(std::string(k_source) + " = " + std::to_string(k) + ": must be in 1..64 when speculating (method " + method + ")");
  }
  if (method != "layer_skip" && num_layers != -1) {
    return invalid_argument("--speculative-config: num_layers applies to method layer_skip only, not " + method);
  }
  if (has_token_tree && method != "medusa" && method != "eagle") {
    return invalid_argument("--speculative-config: speculative_token_tree applies to methods medusa and eagle only, not " + method);
  }
  if (draft_vocab != -1 && method != "medusa" && method != "eagle") {
    return invalid_argument("--speculative-config: draft_vocab_size applies to methods medusa and eagle only, not " + method);
  }
  if (draft_p_min && method == "ngram") {
    return invalid_argument("--speculative-config: draft_p_min = " + draft_p_min_text +
                            " does not apply to method ngram (its drafts have no probabilities)");
  }
  if (draft_vocab < -1) return invalid_argument("--speculative-config: draft_vocab_size = " + std::to_string(draft_vocab) + ": must be >= 0 (0: the whole vocabulary)");
  for (auto [key, v] : {std::pair<const char*, int>{"eagle_topk", eagle_topk}, {"eagle_depth", eagle_depth}}) {
    if (v == -1) continue;
    if (method != "eagle") return invalid_argument(std::string("--speculative-config: ") + key + " applies to method eagle only, not " + method);
    if (v < 1 || v > 64) return invalid_argument(std::string("--speculative-config: ") + key + " = " + std::to_string(v) + ": must be in 1..64");
    if (has_token_tree) {
      return invalid_argument(std::string("--speculative-config: ") + key + " = " + std::to_string(v) +
                              " sets eagle's dynamic tree, but speculative_token_tree '" + token_tree + "' gives a static one");
    }
  }
  if ((method == "ngram" || method == "layer_skip") && !model.empty()) {
    return invalid_argument("speculative method " + method + " takes no model (got '" + model + "')");
  }
  eo->num_speculative_tokens = k;
  SpeculativeSpec spec;
  spec.num_speculative_tokens = k;
  spec.model = model;
  spec.adaptive_k = eo->adaptive_k;
  spec.disable_by_goodput = eo->disable_by_goodput;
  spec.max_model_len = draft_max_len;
  spec.typical_acceptance = eo->typical_acceptance;
  spec.posterior_threshold = eo->posterior_threshold;
  spec.posterior_alpha = eo->posterior_alpha;
  spec.draft_p_min = draft_p_min;
  // ngram: the lookup itself; a model-based method: the lookup first, the method where it finds
  // nothing (spec/lookup_first_proposer.h).
  spec.lookup_first = method != "ngram" && (lookup_min != -1 || lookup_max != -1);
  if (method == "ngram" || spec.lookup_first) {
    if (lookup_min == -1 && lookup_max == -1) lookup_min = lookup_max = 5;
    else if (lookup_min == -1) lookup_min = lookup_max;
    else if (lookup_max == -1) lookup_max = lookup_min;
    if (lookup_min < 1 || lookup_max < lookup_min) {
      return invalid_argument("--speculative-config: prompt_lookup_min = " + std::to_string(lookup_min) + ", prompt_lookup_max = " +
                              std::to_string(lookup_max) + ": need 1 <= min <= max");
    }
    spec.prompt_lookup_min = lookup_min;
    spec.prompt_lookup_max = lookup_max;
  }
  if (cached > 10000) {
    return invalid_argument("--speculative-config: lookup_cached_requests = " + std::to_string(cached) + ": must be in 0..10000");
  }
  if (cached > 0 && method != "ngram" && !spec.lookup_first) {
    return invalid_argument("--speculative-config: lookup_cached_requests = " + std::to_string(cached) +
                            " applies to method ngram or with prompt_lookup_min / prompt_lookup_max (prompt lookup first), not to " +
                            method + " alone");
  }
  if (cached > 0) spec.lookup_cached_requests = cached;
  if (method == "ngram") {
    spec.method = SpeculativeMethod::kNgram;
  } else if (method == "layer_skip") {
    spec.method = SpeculativeMethod::kLayerSkip;
    if (num_layers != -1) spec.num_layers = num_layers;  // range checked against the model by build_proposer
  } else if (method == "draft_model") {
    spec.method = SpeculativeMethod::kDraftModel;
    if (model.empty()) {
      return invalid_argument("speculative method draft_model needs a model: --speculative-model PATH or \"model\" in --speculative-config");
    }
  } else if (method == "medusa" || method == "eagle") {
    spec.method = method == "medusa" ? SpeculativeMethod::kMedusa : SpeculativeMethod::kEagle;
    if (model.empty()) {
      return invalid_argument("speculative method " + method + " needs its head file: \"model\": PATH in --speculative-config");
    }
    if (has_token_tree && token_tree.empty()) {
      return invalid_argument("--speculative-config: speculative_token_tree = \"\": give a tree such as \"[(0,), (0, 0)]\" or leave the key out");
    }
    spec.speculative_token_tree = token_tree;
    if (eagle_topk != -1) spec.eagle_topk = eagle_topk;
    if (eagle_depth != -1) spec.eagle_depth = eagle_depth;
    if (draft_vocab != -1) spec.draft_vocab_size = draft_vocab;
  } else {
    return invalid_argument("--speculative-config: method '" + method + "' is not one of ngram, draft_model, layer_skip, medusa, eagle");
  }
  return std::optional<SpeculativeSpec>(spec);
}

std::string with_field(const std::string& field, const std::string& message) {
  return message.rfind(field + ":", 0) == 0 || message.rfind(field + " = ", 0) == 0 ? message : field + ": " + message;
}

std::string proposer_error_prefix(const SpecArgs& a, const SpeculativeSpec& spec, const std::string& message) {
  // A message about the draft / head file starts with its path: name the flag that gave the path
  // (when both are given they name the same file: parse_spec_args refuses two).
  if (!spec.model.empty() && message.rfind(spec.model, 0) == 0) {
    return spec.model == a.speculative_model ? "--speculative-model " : "--speculative-config \"model\" ";
  }
  return "--speculative-config: ";
}

std::string accepted_per_position_line(const std::vector<int64_t>& accepted_per_pos, bool tree, int32_t max_depth) {
  std::string s = tree ? "accepted per tree depth:" : "accepted per position:";
  // Up to the proposer's deepest draft, chains too (an EAGLE chain of depth 1 printed k columns,
  // all but the first always 0).
  const size_t n = std::min(accepted_per_pos.size(), static_cast<size_t>(std::max(max_depth, 0)));
  for (size_t i = 0; i < n; ++i) {
    const std::string v = std::to_string(accepted_per_pos[i]);
    s += tree ? (i ? " | d" : " d") + std::to_string(i + 1) + " " + v : " " + v;
  }
  return s;
}

namespace {

// `text` as a double when all of it is one (std::stod's prefix parse would take "0.5x").
std::optional<double> whole_double(const std::string& text) {
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    return std::nullopt;
  }
  if (used == 0 || used != text.size()) return std::nullopt;
  return v;
}

}  // namespace

std::string gpu_memory_utilization_error(const std::string& flag, const std::string& text) {
  const std::optional<double> v = whole_double(text);
  if (!v) return flag + " = '" + text + "': not a number";
  if (!(*v > 0.0 && *v <= 1.0)) return flag + " = " + text + ": must be in (0, 1] (a fraction of the GPU's total memory)";
  return std::string();
}

std::string seconds_error(const std::string& flag, const std::string& text) {
  const std::optional<double> v = whole_double(text);
  if (!v) return flag + " = '" + text + "': not a number of seconds";
  if (!(*v >= 0.0 && *v <= 1e6)) return flag + " = " + text + ": must be a number of seconds in [0, 1e6]";
  return std::string();
}

}  // namespace specserve::cli
