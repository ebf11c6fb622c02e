// specserve actors: builds the proposer a `models.speculative` entry (or the equivalent CLI
// flags) asks for, on a worker that has the target loaded.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "actors/gpu_memory_plan.h"
#include "config/topology.h"
#include "core/status.h"
#include "model/backend.h"
#include "model/model_loader.h"
#include "spec/proposer.h"

namespace specserve {

struct ProposerBuildOptions {
  int32_t max_model_len = 0;      ///< 0: the model's context length
  /// > 0: draft_model / layer_skip sample drafts from a truncated q (this much mass, at most
  /// `sparse_max_entries` ids) so that q travels sparse between processes and speculative
  /// sampling stays exactly lossless. 0: dense q (in-process).
  double sparse_keep_mass = 0;
  int32_t sparse_max_entries = 0;
  /// Set on a GPU (EngineKvPlanner::draft_planner): draft_model, layer_skip and eagle call it
  /// once their weights are loaded, before allocating their KV, which then has block_size-token
  /// blocks and the count it returns (eagle: plus blocks for one step's tree rows past a
  /// sequence's tokens, topk x (depth - 1) or 64; one layer's K and V). Unset: their defaults
  /// (16-token blocks, 4 sequences of max_model_len).
  DraftKvPlanner plan_kv;
  int32_t block_size = 16;              ///< the engine's block_size; used with plan_kv
  int32_t max_num_batched_tokens = 2048;  ///< rows of the draft's activations; used with plan_kv
};

/// One problem check_speculative_files() found: `field` is the SpeculativeSpec key it is about
/// ("model", "speculative_token_tree", "num_layers", "draft_vocab_size"), `status` the error
/// (kInvalidArgument, or the GGUF reader's kNotFound / kCorruptData), its message naming the
/// file, key and value (for num_layers and draft_vocab_size it starts "<key> = <value>: ").
struct SpeculativeFileProblem {
  std::string field;
  Status status;
};

/// What build_proposer() would refuse from the files alone, checked without loading any weight
/// (`up --dry-run`, `serve` before it listens), every problem found: for medusa / eagle a
/// speculative_token_tree that does not parse (spec/token_tree.h parse_token_tree), a head file
/// at spec.model that does not open as GGUF, is not a head of that method or was trained on
/// another target than `target_file` (spec/head_common.h check_head_identity); for draft_model a
/// spec.model that does not open or is not a model load_model() accepts (check_model_file);
/// against the target's configuration, layer_skip's num_layers outside 1..layers-1 and a medusa /
/// eagle draft_vocab_size above the vocabulary. ngram has no files: an empty result. `target_file`: the opened target GGUF,
/// or nullptr when it could not be opened (then the fingerprint is not compared).
std::vector<SpeculativeFileProblem> check_speculative_files(const SpeculativeSpec& spec, const GgufFile* target_file);

/// ngram -> NgramProposer(prompt_lookup_min, prompt_lookup_max); layer_skip -> the first
/// num_layers (default half) layers of `target`; draft_model -> loads spec.model onto `backend`
/// and checks its vocabulary against the target's; medusa / eagle -> loads the head file
/// spec.model onto the target's backend, checked against the target (sizes, fingerprint), with
/// spec.speculative_token_tree (default: Medusa's mc_sim_7b_63 for medusa, the dynamic EAGLE-2
/// tree with eagle_topk / eagle_depth for eagle) and spec.draft_vocab_size (default 8192 when the
/// vocabulary has more than 16384 ids, else all); spec.draft_p_min for every method but ngram
/// (DrafterOptions / MedusaOptions / EagleOptions::draft_p_min). With spec.lookup_first (not ngram)
/// the proposer is wrapped in a LookupFirstProposer (spec/lookup_first_proposer.h: prompt lookup
/// with prompt_lookup_min / max first, the method where it finds nothing). Errors name the field and value: num_layers out
/// of range, a draft model that cannot be loaded or whose vocabulary differs, a malformed tree, a
/// head file that does not fit the target; those of options.plan_kv (kResourceExhausted).
Expected<std::unique_ptr<Proposer>> build_proposer(const SpeculativeSpec& spec, LoadedModel& target, Backend& backend,
                                                   const ProposerBuildOptions& options);

}  // namespace specserve
