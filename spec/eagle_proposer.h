// specserve spec: the EAGLE proposer (Li et al. 2024, "EAGLE: Speculative Sampling Requires
// Rethinking Feature Uncertainty"; dynamic trees from "EAGLE-2: Faster Inference of Language
// Models with Dynamic Draft Trees"; github.com/SafeAILab/EAGLE).
//
// A one-decoder-layer draft head that drafts at the feature level. With f(p) the target's
// final-norm hidden state at position p (spec/proposer.h DraftRequest::hidden) and e(t) the
// target's token embedding:
//   x(p)   = fc(concat(e(token p), f(p-1)))                       [d]
//   x     += attn(x)          (no input norm: EAGLE-1 drops it; RoPE at position p, the
//                              target's pairing; causal over the feature sequence)
//   f^(p)  = x + mlp(ffn_norm(x))                                 (SwiGLU; no final norm)
//   logits = output_head(f^(p))   — the target's own head; it guesses token p + 1.
// For a sequence of n known tokens the target's features are known for positions < n-1: the
// head's KV (its own paged cache, like the target's, one layer) holds the "confirmed" entries at
// positions 1 .. n-1 (token p with the target's f(p-1)); the entry at n-1 gives f^(n-1), whose
// logits guess token n. Deeper draft tokens feed the head its own predicted features.
//
// Catch-up: each propose() appends the entries for positions the head has not seen, from the
// features handed over since the previous call (DraftRequest::hidden, hidden_begin ==
// 0: start afresh). Draft entries (tree nodes) are written after the confirmed ones and dropped
// by the next call. A sequence whose early features never arrive (hidden_begin > 0 on a
// sequence the head does not know: a prefix-cache hit in the target) starts its feature
// sequence at hidden_begin: the head then attends to a shorter context; drafting still works.
//
// Draft shapes (EagleOptions::mode):
//  - kDynamic (EAGLE-2): level 1 = the top `topk` tokens of f^(n-1); then, `depth` - 1 times,
//    the `topk` best nodes of the newest level (by cumulative log-probability, the product of the
//    draft probabilities along the path) are run through the head in one tree-attention pass
//    and each gets its `topk` best children; finally every candidate is reranked by its
//    cumulative log-probability and the best k (the request's num_tokens) are kept. A child
//    never scores above its parent (ties go to the earlier node), so the kept set is
//    prefix-closed.
//  - kStatic: a fixed tree of ranks (vLLM's speculative_token_tree), trimmed to k nodes; node
//    (c_1, ..., c_j) takes the c_j-th best token of the head at its parent.
//  - kChain: the head's best token, k times (the static chain).
// Every level of every sequence runs in one head call (all sequences batched); tree nodes attend
// to the confirmed entries and their own ancestors only (AttentionSeq::parents).
//
// Sampling requests: tokens are picked deterministically (top ranks), so DraftTree::probs stays
// empty and the engine's multi-candidate rejection sampling treats siblings as drawn without
// replacement (q one-hot; spec/tree_verify.h): lossless.
//
// File: GGUF, contract section D — general.architecture "eagle"; eagle.hidden_size,
// eagle.head_count, eagle.head_count_kv, eagle.feed_forward_length, eagle.vocab_size (u32),
// eagle.rope.freq_base, eagle.layer_norm_rms_epsilon (f32), eagle.target_fingerprint (16 hex
// digits); tensors eagle.fc.weight [2d, d] (input = concat(embedding, feature)), eagle.fc.bias
// [d], blk.0.attn_{q,k,v,output}.weight, blk.0.ffn_norm.weight, blk.0.ffn_{gate,up,down}.weight.
// RoPE: the target's RopeParams (pairing, scaling) with the head's head_dim and freq_base.
// Thread-safety: none (the engine calls a proposer from one thread).
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kv/block_pool.h"
#include "model/gguf.h"
#include "model/transformer.h"
#include "spec/head_common.h"
#include "spec/proposer.h"

namespace specserve {

struct EagleOptions {
  enum class Mode { kDynamic, kStatic, kChain };
  Mode mode = Mode::kDynamic;
  /// kDynamic: children per expanded node and expanded nodes per level (EAGLE-2's top_k), 1..64.
  /// NOTE: a level's head pass reads every weight once whatever its rows (memory-bound on a
  /// CPU), so a wider level costs little; the target's verification pays per node.
  int32_t topk = 4;
  /// kDynamic: the deepest level drafted (tokens after the last known one), 1..64 (EAGLE-2's
  /// `depth` + 1). The head runs `depth` times per step, the catch-up pass included; deeper
  /// levels were rarely accepted with the committed SmolLM2 head (bench/results/heads_*).
  int32_t depth = 4;
  /// kStatic: the tree as paths (spec/token_tree.h's TokenTree::paths), each prefix before it.
  std::vector<std::vector<int32_t>> tree_paths;
  /// > 0: the head scores only token ids 0 .. draft_vocab_size-1 (a prefix of the target's output
  /// head, spec/head_common.h load_output_head_rows): each level's head pass costs that fraction
  /// of the full vocabulary's; candidates' log-probabilities are normalised over that set.
  int64_t draft_vocab_size = 0;
  /// In [0, 1]; > 0: a draft node is proposed (and expanded) only when its path probability —
  /// the product of the head's probabilities (softmax over the scored vocabulary) of the
  /// tokens from the last known one down to it, the head's own estimate of the chance that
  /// the target accepts it — is at least this; a step may then draft fewer than k tokens, or
  /// none (plain decoding). Every mode. llama.cpp's --draft-p-min stops a chain at the first
  /// token whose OWN probability is below p_min; here the product is compared (the tree's
  /// criterion, EAGLE-2's node score), so the same value drafts no more than llama.cpp's.
  /// Pruning never changes the output: every proposed token is still verified.
  float draft_p_min = 0;
  int32_t block_size = 16;
  int64_t num_kv_blocks = 0;   ///< 0: enough for 4 sequences of max_model_len
  int32_t max_model_len = 0;   ///< tokens; 0: the target's context length. Drafts never reach past it (none for longer sequences)
  /// Set (on a GPU, actors/gpu_memory_plan.h): called once the head's weights are on the device
  /// and before its KV is allocated, with the bytes of one of its KV blocks (K and V of its one
  /// layer, block_size fp32 slots) and of its activations (0: the head's scratch is a few rows of
  /// hidden size, small beside the target's); returns num_kv_blocks. Its error fails load().
  std::function<Expected<int64_t>(int64_t block_bytes, int64_t activation_bytes)> plan_kv;
};

class EagleProposer final : public Proposer {
 public:
  /// Opens and validates the head file at `path` against `target` (hidden size, vocabulary size,
  /// head_dim even, fingerprint = model_fingerprint of `target_file`, the GGUF `target` was loaded
  /// from), loads it onto target.backend() and allocates its KV. `target`, its backend and
  /// `target_file` must outlive the proposer.
  /// Errors: those of GgufFile::open; kInvalidArgument naming the file, the key or tensor and its
  /// value (wrong architecture, missing or out-of-range key, sizes unlike the target's, another
  /// model's fingerprint, extra tensors), or the option and its value (topk, depth, tree paths);
  /// kCorruptData for a tensor of the wrong shape or type; kResourceExhausted for the KV.
  static Expected<std::unique_ptr<EagleProposer>> load(const std::string& path, Transformer& target,
                                                       const GgufFile& target_file, EagleOptions options = {});
  ~EagleProposer() override;

  std::string name() const override { return "eagle"; }
  bool needs_hidden() const override { return true; }
  bool drafts_trees() const override;
  /// Dynamic: min(depth, k); static: the tree trimmed to k nodes; chain: k.
  int32_t max_draft_depth(int32_t k) const override;
  /// Catches up on the handed-over features, then drafts (see the file comment). A sequence
  /// without the feature of position n-2, with fewer than 2 tokens or without KV room gets no
  /// draft. Errors: kInvalidArgument when hidden_size is not the target's; the backend's.
  Status propose(const std::vector<DraftRequest>& requests, std::vector<DraftTree>* out) override;
  void release(int64_t seq_id) override;

  /// Test hook (teacher forcing, as in training): row j is token tokens[j] at position
  /// first_position + j with input feature features[j] (the target's feature of the position
  /// before); causal over these rows alone, no state kept. Returns the predicted features
  /// [n, d] and their logits [n, draft vocab]. Errors: kInvalidArgument for mismatched sizes, a
  /// token outside the vocabulary, first_position < 1.
  Status teacher_forced(std::span<const int32_t> tokens, std::span<const float> features, int32_t first_position,
                        std::vector<float>* predicted, std::vector<float>* logits);
  /// KV blocks held by sequences now (for tests of release / rollback).
  int32_t num_used_blocks() const { return pool_->num_blocks() - pool_->num_free(); }

 private:
  struct SeqState;
  struct Row;
  struct Layer {
    std::unique_ptr<Weight> fc_w, fc_b, wq, wk, wv, wo, ffn_norm, w_gate, w_up, w_down;
  };
  EagleProposer(Transformer& t, EagleOptions o);
  Buffer& scratch(int idx, int64_t bytes);
  /// One head pass over `rows` (grouped by sequence, see Row): writes each row's K/V at its
  /// slot, attends as `attn` says, returns the predicted features [rows, d] and the logits of
  /// the rows flagged `want_logits` ([count, vocab], in row order).
  void run(const std::vector<Row>& rows, const std::vector<AttentionSeq>& attn, int64_t num_q_rows,
           const std::vector<int32_t>& q_row_of, std::vector<float>* features, std::vector<float>* logits);

  Transformer& target_;
  EagleOptions opts_;
  std::unique_ptr<GgufFile> file_;
  Layer L_;
  std::unique_ptr<Weight> draft_head_;  ///< the output head's first draft_vocab_size rows, when set
  const Weight* head_ = nullptr;        ///< what scores the drafts: draft_head_ or the target's
  int64_t d_ = 0, vocab_ = 0, num_heads_ = 0, num_kv_heads_ = 0, head_dim_ = 0, ffn_ = 0;
  float eps_ = 1e-5f;
  RopeParams rope_;
  StaticTree tree_;
  std::unique_ptr<KvStorage> kv_;
  std::unique_ptr<BlockPool> pool_;
  std::map<int64_t, std::unique_ptr<SeqState>> seqs_;
  std::vector<std::unique_ptr<Buffer>> scratch_;
};

}  // namespace specserve
