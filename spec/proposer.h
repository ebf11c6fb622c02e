// specserve spec: the proposer interface — who guesses the next tokens.
//
// A proposer returns, per sequence, a draft tree (a chain is a tree with one child per node)
// of up to k tokens, and, when the sequence samples (temperature > 0), the draft distribution q
// each token was drawn from, which lossless speculative sampling needs.
// Proposers keep whatever per-sequence state they need (a draft model's KV cache) keyed by
// sequence id and re-synchronise it from the token list each call: the engine never tells a
// proposer what was rejected; it sees it in the next call's tokens.
#pragma once

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
};

/// A proposer's answer for one sequence. tokens.size() <= k (may be empty: no guess).
struct DraftTree {
  std::vector<int32_t> tokens;
  /// One parent per token (-1: child of the last known token). Empty: a chain.
  std::vector<int32_t> parents;
  /// When the request samples: q for each token, dense [vocab] (the distribution the token was
  /// drawn from). Empty for greedy requests and for deterministic proposers (q is one-hot).
  std::vector<std::vector<float>> probs;
};

/// Guesses tokens. Not thread-safe: the engine calls it from one thread.
class Proposer {
 public:
  virtual ~Proposer() = default;
  /// "ngram", "draft_model", "layer_skip", ...
  virtual std::string name() const = 0;
  /// Fills (*out)[i] for requests[i]. A failure degrades the step to plain decoding for these
  /// sequences; it never fails a request.
  virtual Status propose(const std::vector<DraftRequest>& requests, std::vector<DraftTree>* out) = 0;
  /// The sequence finished: drop its state.
  virtual void release(int64_t seq_id) { (void)seq_id; }
};

}  // namespace specserve
