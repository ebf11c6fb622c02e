#include "tools/cli/spec_options.h"

#include <cstdio>
#include <set>

#include <nlohmann/json.hpp>

#include "spec/model_drafter.h"
#include "spec/ngram_proposer.h"

namespace specserve::cli {

namespace {

// A draft model proposer that owns its model.
class OwningDrafter final : public Proposer {
 public:
  OwningDrafter(LoadedModel m, std::unique_ptr<ModelDrafter> d) : model_(std::move(m)), drafter_(std::move(d)) {}
  std::string name() const override { return drafter_->name(); }
  Status propose(const std::vector<DraftRequest>& r, std::vector<DraftTree>* out) override { return drafter_->propose(r, out); }
  void release(int64_t id) override { drafter_->release(id); }

 private:
  LoadedModel model_;
  std::unique_ptr<ModelDrafter> drafter_;
};

Expected<std::unique_ptr<Proposer>> make_draft_model_proposer(const std::string& path, LoadedModel& target, Backend& backend,
                                                             int32_t max_model_len) {
  auto draft = load_model(path, backend);
  if (!draft.ok()) return Status(draft.status().code(), "--speculative-model: " + draft.status().message());
  std::vector<std::string> tt, dt;
  for (int32_t i = 0; i < target.tokenizer->vocab_size(); ++i) tt.push_back(target.tokenizer->token_text(i));
  for (int32_t i = 0; i < draft->tokenizer->vocab_size(); ++i) dt.push_back(draft->tokenizer->token_text(i));
  SPECSERVE_RETURN_IF_ERROR(check_draft_vocab(tt, dt));
  DrafterOptions o;
  o.name = "draft_model";
  o.max_model_len = std::min<int32_t>(max_model_len > 0 ? max_model_len : INT32_MAX,
                                      static_cast<int32_t>(draft->model->config().context_length));
  o.target_vocab_size = static_cast<int32_t>(target.model->config().vocab_size);
  auto d = ModelDrafter::create(*draft->model, o);
  if (!d.ok()) return d.status();
  return std::unique_ptr<Proposer>(new OwningDrafter(std::move(*draft), std::move(*d)));
}

}  // namespace

void add_spec_options(CLI::App& sub, SpecArgs* a) {
  sub.add_option("--speculative-model", a->speculative_model, "Draft model GGUF (method draft_model)");
  sub.add_option("--num-speculative-tokens", a->num_speculative_tokens, "Draft tokens per step (k)")->check(CLI::Range(0, 64));
  sub.add_option("--speculative-config", a->speculative_config,
                 R"(JSON, vLLM keys: {"method": "ngram"|"draft_model"|"layer_skip", "model": PATH, )"
                 R"("num_speculative_tokens": K, "prompt_lookup_min": 5, "prompt_lookup_max": 5, )"
                 R"("disable_by_batch_size": N, "max_model_len": N, "draft_tensor_parallel_size": 1, "num_layers": N, )"
                 R"("adaptive_k": true})");
}

Expected<std::unique_ptr<Proposer>> make_proposer(const SpecArgs& a, LoadedModel& target, Backend& backend,
                                                 EngineOptions* eo) {
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
                                                "draft_tensor_parallel_size", "num_layers", "adaptive_k"};
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
  if (method.empty()) return std::unique_ptr<Proposer>();
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
  if (method == "ngram") {
    if (lookup_min == -1 && lookup_max == -1) lookup_min = lookup_max = 5;
    else if (lookup_min == -1) lookup_min = lookup_max;
    else if (lookup_max == -1) lookup_max = lookup_min;
    if (lookup_min < 1 || lookup_max < lookup_min) {
      return invalid_argument("prompt_lookup_min = " + std::to_string(lookup_min) + ", prompt_lookup_max = " +
                              std::to_string(lookup_max) + ": need 1 <= min <= max");
    }
    return std::unique_ptr<Proposer>(new NgramProposer(lookup_min, lookup_max));
  }
  if (method == "layer_skip") {
    const int64_t total = target.model->config().num_layers;
    if (num_layers == -1) num_layers = static_cast<int>(total / 2);
    if (num_layers < 1 || num_layers >= total) {
      return invalid_argument("--speculative-config: num_layers = " + std::to_string(num_layers) + ": must be in 1.." +
                              std::to_string(total - 1) + " for layer_skip");
    }
    DrafterOptions o;
    o.name = "layer_skip";
    o.num_layers = num_layers;
    o.max_model_len = eo->max_model_len;
    auto d = ModelDrafter::create(*target.model, o);
    if (!d.ok()) return d.status();
    return std::unique_ptr<Proposer>(std::move(*d));
  }
  if (method == "draft_model") {
    if (model.empty()) {
      return invalid_argument("speculative method draft_model needs a model: --speculative-model PATH or \"model\" in --speculative-config");
    }
    return make_draft_model_proposer(model, target, backend, eo->max_model_len);
  }
  return invalid_argument("--speculative-config: method '" + method + "' is not one of ngram, draft_model, layer_skip");
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
