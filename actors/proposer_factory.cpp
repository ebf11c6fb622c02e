#include "actors/proposer_factory.h"

#include <algorithm>
#include <climits>
#include <optional>

#include "core/logging.h"
#include "model/model_fingerprint.h"
#include "spec/eagle_proposer.h"
#include "spec/head_common.h"
#include "spec/lookup_first_proposer.h"
#include "spec/medusa_proposer.h"
#include "spec/model_drafter.h"
#include "spec/ngram_proposer.h"
#include "spec/token_tree.h"

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

// The draft's KV pool from the memory plan (a GPU), for a drafter running `num_layers` layers of
// `model`. Without a planner: the drafter's defaults.
Status plan_drafter_kv(DrafterOptions* o, const ModelConfig& model, int64_t num_layers, const ProposerBuildOptions& b) {
  if (!b.plan_kv) return Status();
  o->block_size = b.block_size;
  auto n = b.plan_kv(kv_block_bytes(num_layers, model.kv_dim(), b.block_size),
                     forward_activation_bytes(model, b.max_num_batched_tokens));
  if (!n.ok()) return n.status();
  o->num_kv_blocks = *n;
  return Status();
}

// The draft's maximum length: the target's (options.max_model_len; 0: the model's), capped by
// the speculative entry's own max_model_len (vLLM's draft limit) when set.
int32_t draft_max_model_len(const SpeculativeSpec& spec, const ProposerBuildOptions& b) {
  if (!spec.max_model_len) return b.max_model_len;
  return b.max_model_len > 0 ? std::min(b.max_model_len, *spec.max_model_len) : *spec.max_model_len;
}

void set_sparse(DrafterOptions* o, const ProposerBuildOptions& b) {
  if (b.sparse_keep_mass > 0) {
    o->sparse_keep_mass = b.sparse_keep_mass;
    o->sparse_max_entries = b.sparse_max_entries;
  }
}

// Medusa / EAGLE heads: they run on the target's backend, on its hidden states, with its
// embedding and output head (spec/medusa_proposer.h, spec/eagle_proposer.h).
Expected<std::unique_ptr<Proposer>> build_head_proposer(const SpeculativeSpec& spec, LoadedModel& target,
                                                        const ProposerBuildOptions& b) {
  const bool medusa = spec.method == SpeculativeMethod::kMedusa;
  const std::string method = medusa ? "medusa" : "eagle";
  if (spec.model.empty()) return invalid_argument("model: method " + method + " needs its head file's path");
  // NOTE: by default a large vocabulary is drafted over its first 8192 ids only (a prefix of the
  // output head; spec/head_common.h load_output_head_rows): on SmolLM2 (49152 ids) they hold 89%
  // of the target's greedy tokens, drafting costs ~1/6 of the full head's, and acceptance on
  // Spec-Bench did not drop (bench/results/heads_generate_*.md); verification keeps the output
  // exact whatever the draft vocabulary. draft_vocab_size: 0 scores every id.
  const int64_t vocab = target.model->config().vocab_size;
  const int64_t draft_vocab = spec.draft_vocab_size ? *spec.draft_vocab_size : (vocab > 16384 ? 8192 : 0);
  std::optional<TokenTree> tree;
  if (!spec.speculative_token_tree.empty()) {
    auto t = parse_token_tree(spec.speculative_token_tree, "speculative_token_tree");
    if (!t.ok()) return t.status();
    tree = std::move(*t);
    // NOTE: num_speculative_tokens bounds the nodes drafted per step (vLLM's meaning of k for a
    // tree); a longer tree is cut to its first k nodes every step, which the user should know.
    if (tree->num_nodes() > spec.num_speculative_tokens) {
      get_logger("spec")->warn("{}: speculative_token_tree has {} nodes; each step drafts only its first {} "
                               "(num_speculative_tokens): {} node(s) never used",
                               method, tree->num_nodes(), spec.num_speculative_tokens,
                               tree->num_nodes() - spec.num_speculative_tokens);
    }
  }
  if (medusa) {
    MedusaOptions o;
    // Medusa's default tree, mc_sim_7b_63, trimmed to num_speculative_tokens nodes.
    o.tree_paths = tree ? tree->paths : medusa_mc_sim_7b_63();
    if (!tree) o.tree_name = "Medusa's default tree mc_sim_7b_63";
    o.draft_vocab_size = draft_vocab;
    if (spec.draft_p_min) o.draft_p_min = *spec.draft_p_min;
    // Only the speculative entry's own limit: the target's max_model_len already ends sequences.
    if (spec.max_model_len) o.max_model_len = *spec.max_model_len;
    auto m = MedusaProposer::load(spec.model, *target.model, *target.file, o);
    if (!m.ok()) return m.status();
    return std::unique_ptr<Proposer>(std::move(*m));
  }
  EagleOptions o;
  o.max_model_len = draft_max_model_len(spec, b);
  if (b.plan_kv) {
    o.block_size = b.block_size;
    o.plan_kv = b.plan_kv;
  }
  if (tree) {
    o.mode = EagleOptions::Mode::kStatic;
    o.tree_paths = tree->paths;
  }
  if (spec.eagle_topk) o.topk = *spec.eagle_topk;
  if (spec.eagle_depth) o.depth = *spec.eagle_depth;
  if (spec.draft_p_min) o.draft_p_min = *spec.draft_p_min;
  o.draft_vocab_size = draft_vocab;
  auto e = EagleProposer::load(spec.model, *target.model, *target.file, o);
  if (!e.ok()) return e.status();
  return std::unique_ptr<Proposer>(std::move(*e));
}

}  // namespace

std::vector<SpeculativeFileProblem> check_speculative_files(const SpeculativeSpec& spec, const GgufFile* target_file) {
  std::vector<SpeculativeFileProblem> problems;
  const bool head = spec.method == SpeculativeMethod::kMedusa || spec.method == SpeculativeMethod::kEagle;
  if (head && !spec.speculative_token_tree.empty()) {
    auto t = parse_token_tree(spec.speculative_token_tree, "speculative_token_tree");
    if (!t.ok()) problems.push_back({"speculative_token_tree", t.status()});
  }
  // Ranges that depend on the target, checked here too so that `up --dry-run` and `serve`
  // refuse them before anything starts (the proposer's build says the same, later).
  if (target_file) {
    if (auto cfg = ModelConfig::from_gguf(*target_file); cfg.ok()) {
      const int64_t layers = cfg->num_layers;
      if (spec.method == SpeculativeMethod::kLayerSkip && spec.num_layers && (*spec.num_layers < 1 || *spec.num_layers >= layers)) {
        problems.push_back({"num_layers", invalid_argument("num_layers = " + std::to_string(*spec.num_layers) + ": must be in 1.." +
                                                           std::to_string(layers - 1) + " for layer_skip (the target has " +
                                                           std::to_string(layers) + " layers)")});
      }
      if (head && spec.draft_vocab_size && *spec.draft_vocab_size > cfg->vocab_size) {
        problems.push_back({"draft_vocab_size", invalid_argument("draft_vocab_size = " + std::to_string(*spec.draft_vocab_size) +
                                                                 ": must be in 1.." + std::to_string(cfg->vocab_size) +
                                                                 " (the target's vocabulary; 0: all of it)")});
      }
    }
  }
  if ((head || spec.method == SpeculativeMethod::kDraftModel) && !spec.model.empty()) {
    auto f = GgufFile::open(spec.model);
    if (!f.ok()) {
      problems.push_back({"model", f.status()});
    } else if (head) {
      if (target_file) {
        Status st = check_head_identity(*f, speculative_method_name(spec.method), model_fingerprint(*target_file));
        if (!st.ok()) problems.push_back({"model", st});
      } else if (Status st = HeadFileChecker(*f, speculative_method_name(spec.method)).check_architecture(); !st.ok()) {
        problems.push_back({"model", st});
      }
    } else if (Status st = check_model_file(*f); !st.ok()) {
      problems.push_back({"model", st});
    }
  }
  return problems;
}

namespace {

// The method's own proposer (build_proposer without lookup_first).
Expected<std::unique_ptr<Proposer>> build_method_proposer(const SpeculativeSpec& spec, LoadedModel& target,
                                                          Backend& backend, const ProposerBuildOptions& b) {
  switch (spec.method) {
    case SpeculativeMethod::kNgram:
      return std::unique_ptr<Proposer>(new NgramProposer(spec.prompt_lookup_min, spec.prompt_lookup_max, spec.lookup_cached_requests));
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
      o.max_model_len = draft_max_model_len(spec, b);
      if (spec.draft_p_min) o.draft_p_min = *spec.draft_p_min;
      set_sparse(&o, b);
      SPECSERVE_RETURN_IF_ERROR(plan_drafter_kv(&o, target.model->config(), n, b));
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
      const int32_t draft_len = draft_max_model_len(spec, b);
      o.max_model_len = std::min<int32_t>(draft_len > 0 ? draft_len : INT32_MAX,
                                          static_cast<int32_t>(draft->model->config().context_length));
      o.target_vocab_size = static_cast<int32_t>(target.model->config().vocab_size);
      if (spec.draft_p_min) o.draft_p_min = *spec.draft_p_min;
      set_sparse(&o, b);
      SPECSERVE_RETURN_IF_ERROR(plan_drafter_kv(&o, draft->model->config(), draft->model->config().num_layers, b));
      auto d = ModelDrafter::create(*draft->model, o);
      if (!d.ok()) return d.status();
      return std::unique_ptr<Proposer>(new OwningDrafter(std::move(*draft), std::move(*d)));
    }
    case SpeculativeMethod::kMedusa:
    case SpeculativeMethod::kEagle:
      return build_head_proposer(spec, target, b);
  }
  return unsupported(std::string("method = ") + speculative_method_name(spec.method) + ": unknown");
}

}  // namespace

Expected<std::unique_ptr<Proposer>> build_proposer(const SpeculativeSpec& spec, LoadedModel& target, Backend& backend,
                                                   const ProposerBuildOptions& b) {
  auto p = build_method_proposer(spec, target, backend, b);
  if (!p.ok() || !spec.lookup_first || spec.method == SpeculativeMethod::kNgram) return p;
  return std::unique_ptr<Proposer>(
      new LookupFirstProposer(std::move(*p), spec.prompt_lookup_min, spec.prompt_lookup_max, spec.lookup_cached_requests));
}

}  // namespace specserve
