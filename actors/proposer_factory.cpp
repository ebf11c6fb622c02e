#include "actors/proposer_factory.h"

#include <algorithm>
#include <climits>

#include "spec/model_drafter.h"
#include "spec/ngram_proposer.h"

namespace specserve {
namespace {

// A draft-model proposer that owns its model.
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

void set_sparse(DrafterOptions* o, const ProposerBuildOptions& b) {
  if (b.sparse_keep_mass > 0) {
    o->sparse_keep_mass = b.sparse_keep_mass;
    o->sparse_max_entries = b.sparse_max_entries;
  }
}

}  // namespace

Expected<std::unique_ptr<Proposer>> build_proposer(const SpeculativeSpec& spec, LoadedModel& target, Backend& backend,
                                                   const ProposerBuildOptions& b) {
  switch (spec.method) {
    case SpeculativeMethod::kNgram:
      return std::unique_ptr<Proposer>(new NgramProposer(spec.prompt_lookup_min, spec.prompt_lookup_max));
    case SpeculativeMethod::kLayerSkip: {
      const int64_t total = target.model->config().num_layers;
      const int64_t n = spec.num_layers ? *spec.num_layers : total / 2;
      if (n < 1 || n >= total) {
        return invalid_argument("num_layers = " + std::to_string(n) + ": must be in 1.." +
                                std::to_string(total - 1) + " for layer_skip");
      }
      DrafterOptions o;
      o.name = "layer_skip";
      o.num_layers = n;
      o.max_model_len = b.max_model_len;
      set_sparse(&o, b);
      auto d = ModelDrafter::create(*target.model, o);
      if (!d.ok()) return d.status();
      return std::unique_ptr<Proposer>(std::move(*d));
    }
    case SpeculativeMethod::kDraftModel: {
      if (spec.model.empty()) return invalid_argument("model: method draft_model needs a draft model path");
      auto draft = load_model(spec.model, backend);
      if (!draft.ok()) return draft.status();
      std::vector<std::string> tt, dt;
      for (int32_t i = 0; i < target.tokenizer->vocab_size(); ++i) tt.push_back(target.tokenizer->token_text(i));
      for (int32_t i = 0; i < draft->tokenizer->vocab_size(); ++i) dt.push_back(draft->tokenizer->token_text(i));
      SPECSERVE_RETURN_IF_ERROR(check_draft_vocab(tt, dt));
      DrafterOptions o;
      o.name = "draft_model";
      o.max_model_len = std::min<int32_t>(b.max_model_len > 0 ? b.max_model_len : INT32_MAX,
                                          static_cast<int32_t>(draft->model->config().context_length));
      o.target_vocab_size = static_cast<int32_t>(target.model->config().vocab_size);
      set_sparse(&o, b);
      auto d = ModelDrafter::create(*draft->model, o);
      if (!d.ok()) return d.status();
      return std::unique_ptr<Proposer>(new OwningDrafter(std::move(*draft), std::move(*d)));
    }
    case SpeculativeMethod::kMedusa:
    case SpeculativeMethod::kEagle:
      break;
  }
  return unsupported(std::string("method = ") + speculative_method_name(spec.method) +
                       ": not available yet (ngram, draft_model, layer_skip are)");
}

}  // namespace specserve
