// specserve spec: proposers that run a transformer autoregressively — a separate draft model
// (`draft_model`, Leviathan et al. 2023) or the target's own first N layers with its final
// norm and head (`layer_skip`, self-speculation as in LayerSkip, Elhoushi et al. 2024, and
// Draft & Verify, Zhang et al. 2023), which shares every weight with the target.
//
// Each sequence has its own paged KV in the drafter's cache. Before drafting, the drafter
// compares the tokens its KV holds with the sequence's tokens, truncates to the common prefix
// (this is how rejected drafts roll back), feeds the missing tokens in one batched pass, then
// drafts k tokens one pass per token, all sequences together.
//
// Automatic prefix caching (DrafterOptions::enable_prefix_caching) follows the engine's rules
// in the drafter's own pool: a sequence the drafter has no state for starts from the longest
// cached prefix of its known tokens (whole blocks before the last known token) and computes
// the rest in the catch-up pass, so a sequence whose target prefix was a hit is never left
// without draft KV; the drafter registers only blocks of confirmed tokens (never a block that
// holds draft tokens, which the next call may roll back).
#pragma once

#include <map>
#include <memory>
#include <random>

#include "kv/block_pool.h"
#include "model/transformer.h"
#include "spec/proposer.h"

namespace specserve {

struct DrafterOptions {
  std::string name = "draft_model";  ///< reported by name()
  int64_t num_layers = 0;            ///< 0: all layers of `model`; N: layer-skip draft of the first N
  int32_t block_size = 16;
  int64_t num_kv_blocks = 0;         ///< 0: 4 * max_model_len / block_size
  int32_t max_model_len = 0;         ///< 0: the draft model's context length
  int32_t target_vocab_size = 0;     ///< ids >= this are padding in the draft and never proposed
  /// Sparse draft distributions (spec/sparse_probs.h), for drafts that cross a process boundary.
  /// When either limit is set, each sampled draft token's q is cut with
  /// truncate_probs(q, sparse_keep_mass, sparse_max_entries) — the largest entries until they
  /// hold sparse_keep_mass of the mass or sparse_max_entries are kept, renormalised — BEFORE the
  /// draft token is drawn, and the token is drawn from that truncated q, which is also the q
  /// reported in DraftTree::probs. So the reported q is exactly the proposal distribution, and
  /// speculative sampling (Leviathan et al. 2023, Theorem 1: exact for any proposal q) stays
  /// lossless; only the acceptance rate can drop. Greedy requests are unaffected (no q).
  /// NOTE: truncating only the *reported* q after drawing from the full one would be lossy: a
  /// token drawn from outside the kept set would be verified against q = 0.
  double sparse_keep_mass = 1.0;     ///< in (0, 1]; 1: no mass limit
  int32_t sparse_max_entries = 0;    ///< >= 0; 0: no entry limit
  /// Prefix caching of the drafter's own KV (see the file comment); vLLM V1's default, on.
  bool enable_prefix_caching = true;
  /// In [0, 1]; > 0: drafting of a sequence stops before the first token whose path probability
  /// under the draft — the product of the draft's probabilities of the tokens drafted this step
  /// (greedy: the softmax of its logits; sampled: the q the token was drawn from) — is below
  /// this, so a step may draft fewer than k tokens or none. llama.cpp's --draft-p-min compares
  /// each token's own probability; the product used here (the trees' criterion) drafts no more.
  /// Sampled requests stay lossless: a kept token is reported with q restricted to the tokens
  /// that would have been kept there, renormalised (see the NOTE in model_drafter.cpp).
  float draft_p_min = 0;
};

class ModelDrafter final : public Proposer {
 public:
  /// `model` must outlive the drafter. Errors: KV allocation, num_layers out of range,
  /// sparse_keep_mass outside (0, 1], sparse_max_entries < 0 (kInvalidArgument naming the field).
  static Expected<std::unique_ptr<ModelDrafter>> create(Transformer& model, DrafterOptions options);
  ~ModelDrafter() override;

  std::string name() const override { return opts_.name; }
  Status propose(const std::vector<DraftRequest>& requests, std::vector<DraftTree>* out) override;
  void release(int64_t seq_id) override;
  /// The drafter's KV block pool (its prefix-cache counters included).
  const BlockPool& block_pool() const { return *pool_; }

 private:
  struct SeqState;
  ModelDrafter(Transformer& m, DrafterOptions o);

  Transformer& model_;
  DrafterOptions opts_;
  std::unique_ptr<KvStorage> kv_;
  std::unique_ptr<BlockPool> pool_;
  std::map<int64_t, std::unique_ptr<SeqState>> seqs_;
};

/// Checks that a draft vocabulary can serve a target: sizes within 128 padding rows of each
/// other and identical token texts over the shared range. Errors (kInvalidArgument) name both
/// sizes, or the first differing id and both texts.
Status check_draft_vocab(const std::vector<std::string>& target_tokens, const std::vector<std::string>& draft_tokens);

}  // namespace specserve
