#include "tools/cli/spec_options.h"

#include <cstdio>
#include <set>

#include <nlohmann/json.hpp>

#include "actors/proposer_factory.h"

namespace specserve::cli {

void add_spec_options(CLI::App& sub, SpecArgs* a) {
  sub.add_option("--speculative-model", a->speculative_model, "Draft model GGUF (method draft_model)");
  sub.add_option("--num-speculative-tokens", a->num_speculative_tokens, "Draft tokens per step (k)")->check(CLI::Range(0, 64));
  sub.add_option("--speculative-config", a->speculative_config,
                 R"(JSON, vLLM keys: {"method": "ngram"|"draft_model"|"layer_skip", "model": PATH, )"
                 R"("num_speculative_tokens": K, "prompt_lookup_min": 5, "prompt_lookup_max": 5, )"
                 R"("disable_by_batch_size": N, "max_model_len": N, "draft_tensor_parallel_size": 1, "num_layers": N, )"
                 R"("adaptive_k": true, "typical_acceptance": false (lossy: Medusa's), "posterior_threshold": 0.09, )"
                 R"("posterior_alpha": 0.3})");
}

Expected<std::optional<SpeculativeSpec>> parse_spec_args(const SpecArgs& a, EngineOptions* eo) {
  std::string method, model = a.speculative_model;
  int k = a.num_speculative_tokens;
  // vLLM's defaults: both 5 when neither is given; one given sets the other.
  int lookup_min = -1, lookup_max = -1, num_layers = -1;
  if (!a.speculative_config.empty()) {
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(a.speculative_config);
    } catch (const nlohmann::json::parse_error& e) {
      return invalid_argument(std::string("--speculative-config: malformed JSON: ") + e.what());
    }
    if (!j.is_object()) return invalid_argument("--speculative-config: must be a JSON object");
    static const std::set<std::string> kKeys = {"method", "model", "num_speculative_tokens", "prompt_lookup_min",
                                                "prompt_lookup_max", "disable_by_batch_size", "max_model_len",
                                                "draft_tensor_parallel_size", "num_layers", "adaptive_k",
                                                "typical_acceptance", "posterior_threshold", "posterior_alpha"};
    for (auto it = j.begin(); it != j.end(); ++it) {
      if (!kKeys.count(it.key())) return invalid_argument("--speculative-config: unknown key '" + it.key() + "'");
    }
    auto get_int = [&](const char* key, int* dst) -> Status {
      if (!j.contains(key)) return Status();
      if (!j[key].is_number_integer()) return invalid_argument(std::string("--speculative-config: ") + key + " must be an integer, got " + j[key].dump());
      const int64_t v = j[key].get<int64_t>();
      if (v < -1000000 || v > 1000000) return invalid_argument(std::string("--speculative-config: ") + key + " = " + j[key].dump() + " is out of range");
      *dst = static_cast<int>(v);
      return Status();
    };
    if (j.contains("method")) {
      if (!j["method"].is_string()) return invalid_argument("--speculative-config: method must be a string, got " + j["method"].dump());
      method = j["method"].get<std::string>();
    }
    if (j.contains("model")) {
      if (!j["model"].is_string()) return invalid_argument("--speculative-config: model must be a string, got " + j["model"].dump());
      model = j["model"].get<std::string>();
    }
    SPECSERVE_RETURN_IF_ERROR(get_int("num_speculative_tokens", &k));
    SPECSERVE_RETURN_IF_ERROR(get_int("prompt_lookup_min", &lookup_min));
    SPECSERVE_RETURN_IF_ERROR(get_int("prompt_lookup_max", &lookup_max));
    SPECSERVE_RETURN_IF_ERROR(get_int("num_layers", &num_layers));
    if (j.contains("adaptive_k")) {
      if (!j["adaptive_k"].is_boolean()) return invalid_argument("--speculative-config: adaptive_k must be true or false, got " + j["adaptive_k"].dump());
      eo->adaptive_k = j["adaptive_k"].get<bool>();
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
      (std::string(key) == "posterior_threshold" ? eo->posterior_threshold : eo->posterior_alpha) = j[key].get<float>();
    }
    if (!(eo->posterior_threshold > 0 && eo->posterior_threshold <= 1) || !(eo->posterior_alpha >= 0 && eo->posterior_alpha <= 1)) {
      return invalid_argument("--speculative-config: posterior_threshold = " + std::to_string(eo->posterior_threshold) +
                              " must be in (0, 1] and posterior_alpha = " + std::to_string(eo->posterior_alpha) + " in [0, 1]");
    }
    int dbs = 0, mml = eo->max_model_len, tp = 1;
    SPECSERVE_RETURN_IF_ERROR(get_int("disable_by_batch_size", &dbs));
    SPECSERVE_RETURN_IF_ERROR(get_int("max_model_len", &mml));
    SPECSERVE_RETURN_IF_ERROR(get_int("draft_tensor_parallel_size", &tp));
    if (tp != 1) return invalid_argument("--speculative-config: draft_tensor_parallel_size = " + std::to_string(tp) + ": only 1 is supported");
    if (dbs < 0) return invalid_argument("--speculative-config: disable_by_batch_size = " + std::to_string(dbs) + " must be >= 0");
    eo->disable_by_batch_size = dbs;
    eo->max_model_len = mml;
  }
  if (method.empty()) method = model.empty() ? (k > 0 ? "ngram" : "") : "draft_model";
  if (method.empty()) return std::optional<SpeculativeSpec>();
  if (k == 0) return invalid_argument("speculative method " + method + " needs num_speculative_tokens (--num-speculative-tokens K, 1..64)");
  if (k < 1 || k > 64) return invalid_argument("num_speculative_tokens = " + std::to_string(k) + ": must be in 1..64 when speculating");
  if (method != "ngram" && (lookup_min != -1 || lookup_max != -1)) {
    return invalid_argument("--speculative-config: prompt_lookup_min/max apply to method ngram only, not " + method);
  }
  if (method != "layer_skip" && num_layers != -1) {
    return invalid_argument("--speculative-config: num_layers applies to method layer_skip only, not " + method);
  }
  if ((method == "ngram" || method == "layer_skip") && !model.empty()) {
    return invalid_argument("speculative method " + method + " takes no model (got '" + model + "')");
  }
  eo->num_speculative_tokens = k;
  SpeculativeSpec spec;
  spec.num_speculative_tokens = k;
  spec.model = model;
  spec.adaptive_k = eo->adaptive_k;
  spec.typical_acceptance = eo->typical_acceptance;
  spec.posterior_threshold = eo->posterior_threshold;
  spec.posterior_alpha = eo->posterior_alpha;
  if (method == "ngram") {
    spec.method = SpeculativeMethod::kNgram;
    if (lookup_min == -1 && lookup_max == -1) lookup_min = lookup_max = 5;
    else if (lookup_min == -1) lookup_min = lookup_max;
    else if (lookup_max == -1) lookup_max = lookup_min;
    if (lookup_min < 1 || lookup_max < lookup_min) {
      return invalid_argument("prompt_lookup_min = " + std::to_string(lookup_min) + ", prompt_lookup_max = " +
                              std::to_string(lookup_max) + ": need 1 <= min <= max");
    }
    spec.prompt_lookup_min = lookup_min;
    spec.prompt_lookup_max = lookup_max;
  } else if (method == "layer_skip") {
    spec.method = SpeculativeMethod::kLayerSkip;
    if (num_layers != -1) spec.num_layers = num_layers;  // range checked against the model by build_proposer
  } else if (method == "draft_model") {
    spec.method = SpeculativeMethod::kDraftModel;
    if (model.empty()) {
      return invalid_argument("speculative method draft_model needs a model: --speculative-model PATH or \"model\" in --speculative-config");
    }
  } else {
    return invalid_argument("--speculative-config: method '" + method + "' is not one of ngram, draft_model, layer_skip");
  }
  return std::optional<SpeculativeSpec>(spec);
}

Expected<std::unique_ptr<Proposer>> make_proposer(const SpecArgs& a, LoadedModel& target, Backend& backend,
                                                 EngineOptions* eo) {
  auto spec = parse_spec_args(a, eo);
  if (!spec.ok()) return spec.status();
  if (!spec->has_value()) return std::unique_ptr<Proposer>();
  ProposerBuildOptions bo;
  bo.max_model_len = eo->max_model_len;
  auto p = build_proposer(**spec, target, backend, bo);
  if (!p.ok()) {
    const char* flag = (*spec)->method == SpeculativeMethod::kDraftModel ? "--speculative-model: " : "--speculative-config: ";
    return Status(p.status().code(), flag + p.status().message());
  }
  return p;
}

void print_spec_stats(const SpecStats& s, const std::string& method, const EngineStats& totals) {
  std::fprintf(stderr, "--- speculative (%s): drafts %lld | draft tokens %lld | accepted %lld | acceptance rate %.3f | mean acceptance length %.2f\n",
               method.c_str(), static_cast<long long>(s.num_drafts), static_cast<long long>(s.num_draft_tokens),
               static_cast<long long>(s.num_accepted_tokens), s.acceptance_rate(), s.mean_acceptance_length());
  std::fprintf(stderr, "--- accepted per position:");
  for (size_t i = 0; i < s.accepted_per_pos.size(); ++i) std::fprintf(stderr, " %lld", static_cast<long long>(s.accepted_per_pos[i]));
  std::fprintf(stderr, "\n--- time drafting %.3f s | verifying (target forward) %.3f s\n", totals.draft_seconds, totals.forward_seconds);
}

}  // namespace specserve::cli
