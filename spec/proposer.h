// specserve spec: the proposer interface — who guesses the next tokens.
//
// A proposer returns, per sequence, a draft tree (a chain is a tree with one child per node)
// of up to k tokens, and, when the sequence samples (temperature > 0), the draft distribution q
// each token was drawn from, which lossless speculative sampling needs.
// Proposers keep whatever per-sequence state they need (a draft model's KV cache) keyed by
// sequence id and re-synchronise it from the token list each call: the engine never tells a
// proposer what was rejected; it sees it in the next call's tokens.
#pragma once

#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "model/sampling.h"

namespace specserve {

/// What the engine asks a proposer for, for one sequence.
struct DraftRequest {
  int64_t seq_id = 0;
  std::span<const int32_t> tokens;  ///< every known token: prompt + output (the last one is not yet in the target's KV)
  int32_t prompt_len = 0;           ///< tokens[0, prompt_len) is the prompt
  int32_t num_tokens = 0;           ///< k: at most this many draft tokens
  const SamplingParams* sampling = nullptr;  ///< the sequence's sampling options
  /// Only for a proposer whose needs_hidden() is true (else empty): the target's final-norm
  /// hidden states ([n, hidden_size] floats, row i = position hidden_begin + i of `tokens`) of
  /// the positions the target computed since this sequence's previous propose() — prefill rows,
  /// then each step the last known token and the accepted path. Position p's hidden state is
  /// the target's feature at token p (its logits predict token p + 1); positions <
  /// tokens.size() - 1 are known by now. hidden_begin == 0 means the sequence starts afresh (new,
  /// or recomputed after preemption): drop what was kept for it. The span is valid during the call.
  int32_t hidden_begin = 0;
  std::span<const float> hidden;
  int32_t hidden_size = 0;
};

/// Who drafted a DraftTree, for the acceptance counters by source (EngineStats::by_source,
/// /metrics specserve:spec_decode_*_by_source): kModel, the configured method's own drafting
/// (a draft model, layer skip, Medusa or EAGLE heads); kPromptLookup, an n-gram match in the
/// sequence's own prompt and output (the `ngram` method, or prompt lookup first in front of a
/// model method); kCachedRequests, a match in earlier requests' outputs (lookup_cached_requests).
enum class DraftSource : uint8_t { kModel = 0, kPromptLookup = 1, kCachedRequests = 2 };
inline constexpr int kNumDraftSources = 3;
/// "model", "prompt_lookup", "cached_requests" (the `source` label of /metrics).
inline const char* draft_source_name(DraftSource source) {
  switch (source) {
    case DraftSource::kModel: return "model";
    case DraftSource::kPromptLookup: return "prompt_lookup";
    case DraftSource::kCachedRequests: return "cached_requests";
  }
  return "?";
}

/// A proposer's answer for one sequence. tokens.size() <= k (may be empty: no guess); for a
/// tree, k is the node budget. The engine ignores (with a warning) a draft that breaks these
/// rules (spec/tree_verify.h validate_draft_tree).
struct DraftTree {
  std::vector<int32_t> tokens;
  /// One parent per token (-1: child of the last known token; else an earlier index,
  /// parents[i] < i). Empty: a chain. Siblings are verified in their order here (greedy takes the
  /// first one equal to the target's argmax), so put the likelier ones first.
  std::vector<int32_t> parents;
  /// When the request samples: q for each token, dense [vocab] (the distribution the token was
  /// drawn from). Empty for greedy requests and for deterministic proposers (q is one-hot).
  /// For a tree, each node's token must be drawn from its q independently of its earlier
  /// siblings (SpecInfer's i.i.d. case; q may be the same for all of them); a proposer that picks
  /// siblings deterministically (top-k) sends no probs: they are then verified without
  /// replacement. Either way sampling stays lossless (spec/tree_verify.h).
  std::vector<std::vector<float>> probs;
  DraftSource source = DraftSource::kModel;  ///< who drafted it (counters only)
};

/// draft_p_min (EagleOptions, MedusaOptions, DrafterOptions): must be in [0, 1] (NaN refused).
/// Errors: kInvalidArgument "draft_p_min = V: must be in [0, 1]".
inline Status check_draft_p_min(float p_min) {
  if (p_min >= 0 && p_min <= 1) return Status();
  return invalid_argument("draft_p_min = " + std::to_string(p_min) + ": must be in [0, 1]");
}

/// The least path log-probability a draft token may have: log(p_min), or -inf when p_min is 0
/// (no limit). A proposer compares the running sum of its tokens' log-probabilities with it.
inline float min_path_logprob(float p_min) { return p_min > 0 ? std::log(p_min) : -INFINITY; }

/// Guesses tokens. Not thread-safe: the engine calls it from one thread.
class Proposer {
 public:
  virtual ~Proposer() = default;
  /// "ngram", "draft_model", "layer_skip", ...
  virtual std::string name() const = 0;
  /// Fills (*out)[i] for requests[i]. A failure degrades the step to plain decoding for these
  /// sequences; it never fails a request.
  virtual Status propose(const std::vector<DraftRequest>& requests, std::vector<DraftTree>* out) = 0;
  /// True when propose() needs DraftRequest::hidden (Medusa, EAGLE: heads on the target's
  /// hidden states); the engine then asks the target for them (ForwardBatch::return_hidden).
  virtual bool needs_hidden() const { return false; }
  /// Only with needs_hidden(): true when the proposer wants the hidden state of every position
  /// the target computed, also where the engine would not ask it for drafts. The engine then
  /// also calls propose() with DraftRequest::num_tokens == 0 (a hand-over only; the answer
  /// should be empty drafts, anything else is ignored):
  ///  - on each decode step the sequence is scheduled without a draft budget (the last tokens
  ///    before max_tokens or max_model_len, a token budget with no room) while it holds rows not
  ///    yet handed over (hidden_begin + n == tokens.size() - 1, as in any call);
  ///  - once after the sequence finished by a stop token, a stop string or its length (not after
  ///    an abort, an error or a preemption), with the rows of its last step: tokens then holds
  ///    the final output, and hidden covers every position whose token is in it and whose row
  ///    the target computed, so hidden_begin + n is tokens.size() - 1 (the last token came from
  ///    a plain decode row: never computed) or tokens.size() (a stop token, not part of the
  ///    output, followed the last token; or the last token was an accepted draft). release()
  ///    follows that call.
  /// Default false: Medusa and EAGLE are asked only when they may draft, as before.
  /// NOTE: opt-in so that proposers which assume num_tokens >= 1 are untouched; `specserve
  /// dump-hidden` (tools/cli/dump_hidden_lib.cpp) records every computed position this way.
  virtual bool needs_every_hidden_row() const { return false; }
  /// True when drafts may branch (a tree); false: every draft is a chain.
  virtual bool drafts_trees() const { return false; }
  /// The deepest draft this proposer gives a sequence allowed `k` draft tokens: k for a chain;
  /// for a tree, its depth within k nodes (SpecStats::accepted_per_pos has one meaningful entry
  /// per depth, the rest stay 0).
  virtual int32_t max_draft_depth(int32_t k) const { return k; }
  /// The sequence finished: drop its state.
  virtual void release(int64_t seq_id) { (void)seq_id; }
};

}  // namespace specserve
