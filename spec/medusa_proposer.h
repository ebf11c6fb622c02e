// specserve spec: the Medusa proposer (Cai et al. 2024, "Medusa: Simple LLM Inference
// Acceleration Framework with Multiple Decoding Heads"; github.com/FasterDecoding/Medusa).
//
// K residual heads sit on the target's last final-norm hidden state h (the feature of the
// token before the last known one, spec/proposer.h DraftRequest::hidden):
//   h_i = h + SiLU(W_i h + b_i),  logits_i = output_head(h_i)      (i = 0 .. K-1)
// where output_head is the target's own (shared, Transformer::output_head()); head i guesses the
// token i + 1 places after the last known one (n = tokens.size(): h is at position n-2, whose own
// logits predicted token n-1, the last known token; head i predicts token n+i).
//
// The draft is a static tree (Medusa's "choices"): node (c_1, ..., c_j) at depth j takes the
// c_j-th best token of head j-1. The tree comes from the configuration (vLLM's
// `speculative_token_tree`; Medusa's default mc_sim_7b_63 otherwise) and is trimmed each step to
// the sequence's k nodes and to the K heads' depth. A chain-shaped tree gives a chain.
//
// Sampling requests: the tree's tokens are picked deterministically (top ranks), so the draft
// carries no q (DraftTree::probs stays empty) and the engine's multi-candidate rejection
// sampling treats each node's q as one-hot on its token — siblings drawn without replacement
// (spec/tree_verify.h). That is lossless: the emitted tokens follow the target's distribution
// whatever the heads guess; only the acceptance rate depends on the heads.
//
// File: GGUF, contract section D — general.architecture "medusa"; medusa.num_heads,
// medusa.hidden_size, medusa.vocab_size (u32), medusa.target_fingerprint (16 hex digits of
// model_fingerprint of the target GGUF); tensors medusa.{i}.weight (GGUF shape [d, d], F16 or
// F32) and medusa.{i}.bias ([d], F32) for i < num_heads, nothing else.
// Thread-safety: none (the engine calls a proposer from one thread).
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "model/gguf.h"
#include "model/transformer.h"
#include "spec/head_common.h"
#include "spec/proposer.h"

namespace specserve {

struct MedusaOptions {
  /// The static tree as paths (spec/token_tree.h's TokenTree::paths, each prefix before its
  /// path). Empty: a chain. At load, nodes deeper than the heads or with a rank >= the draft
  /// vocabulary are dropped (a warning says how many and why; none left: an error); per step the
  /// tree is trimmed to the request's k nodes.
  std::vector<std::vector<int32_t>> tree_paths;
  /// The tree's name in messages ("speculative_token_tree", or the default tree's name).
  std::string tree_name = "speculative_token_tree";
  /// Use only the first N heads (0: all of the file's).
  int32_t max_heads = 0;
  /// > 0: the heads score only token ids 0 .. draft_vocab_size-1 (a prefix of the target's
  /// output head; see load_output_head_rows): the head pass costs that fraction of the full
  /// vocabulary's. 0: the whole vocabulary.
  int64_t draft_vocab_size = 0;
  /// In [0, 1]; > 0: a tree node is drafted only when its path probability — the product of the
  /// heads' probabilities (softmax over the scored vocabulary) of the tokens from the last known
  /// one down to it, the heads' estimate of the chance that the target accepts it — is at least
  /// this; a node below it goes with its subtree, and a step may draft fewer than k tokens or none
  /// (plain decoding). As EagleOptions::draft_p_min; the output never changes.
  float draft_p_min = 0;
  /// > 0: the draft's maximum length (the speculative entry's max_model_len, vLLM's draft limit):
  /// a draft never reaches past it, so a sequence near it gets fewer nodes, then none (plain
  /// decoding). 0: no limit of its own. NOTE: the key was accepted for medusa and ignored.
  int32_t max_model_len = 0;
};

class MedusaProposer final : public Proposer {
 public:
  /// Opens and validates the head file at `path` against `target` (hidden size, vocabulary size,
  /// model_fingerprint of `target_file`, the GGUF `target` was loaded from), loads the heads onto
  /// target.backend(). `target`, its backend and `target_file` must outlive the proposer.
  /// Errors: kNotFound / kCorruptData from opening the GGUF; kInvalidArgument naming the file, the
  /// key or tensor and its value (wrong architecture, missing or out-of-range key, hidden or vocab
  /// size unlike the target's, fingerprint of another model, extra tensors) or the tree (a path
  /// whose prefix is missing); kCorruptData for a tensor of the wrong shape or type.
  static Expected<std::unique_ptr<MedusaProposer>> load(const std::string& path, Transformer& target,
                                                        const GgufFile& target_file, MedusaOptions options = {});

  std::string name() const override { return "medusa"; }
  bool needs_hidden() const override { return true; }
  bool drafts_trees() const override { return !tree_.is_chain(); }
  /// The depth of the tree trimmed to k nodes and the heads (as propose() trims it).
  int32_t max_draft_depth(int32_t k) const override { return trim_static_tree(tree_, k, num_heads()).max_depth(); }
  /// Needs, per request, the hidden state of position tokens.size() - 2: in this call's
  /// DraftRequest::hidden or kept from an earlier call. Without it (or with < 2 tokens) the
  /// sequence gets no draft. Errors: kInvalidArgument when hidden_size is not the target's.
  Status propose(const std::vector<DraftRequest>& requests, std::vector<DraftTree>* out) override;
  void release(int64_t seq_id) override { last_.erase(seq_id); }

  int32_t num_heads() const { return static_cast<int32_t>(heads_.size()); }
  /// The heads' logits for hidden states `hidden` [n, hidden_size]: `*logits` becomes
  /// [num_heads, n, draft_vocab] (head-major; draft_vocab = draft_vocab_size or the vocabulary). For tests and tools; propose() uses the same code.
  Status head_logits(std::span<const float> hidden, int32_t n, std::vector<float>* logits);

 private:
  struct Head {
    std::unique_ptr<Weight> w, b;
  };
  MedusaProposer(Transformer& t, MedusaOptions o) : target_(t), opts_(std::move(o)) {}
  Buffer& scratch(int idx, int64_t bytes);
  /// Runs heads 0..depth[r]-1 on row r of `hidden` [n, d]; logits [sum(depth), vocab] ordered by
  /// head, then row (rows of head i: those with depth > i, in order).
  void run_heads(const float* hidden, const std::vector<int32_t>& depth, std::vector<float>* logits);

  Transformer& target_;
  MedusaOptions opts_;
  std::unique_ptr<GgufFile> file_;
  std::vector<Head> heads_;
  std::unique_ptr<Weight> draft_head_;  ///< the output head's first draft_vocab_size rows, when set
  const Weight* head_ = nullptr;        ///< what scores the heads: draft_head_ or the target's
  StaticTree tree_;
  int64_t d_ = 0, vocab_ = 0;
  /// Per sequence: the last hidden state seen and its position.
  struct Last {
    int32_t pos = -1;
    std::vector<float> h;
  };
  std::map<int64_t, Last> last_;
  std::vector<std::unique_ptr<Buffer>> scratch_;
  int64_t ones_rows_ = 0;
};

}  // namespace specserve
