// specserve spec: n-gram prompt-lookup proposer (Saxena 2023, "prompt lookup decoding"; vLLM's
// `ngram` method).
//
// For n from prompt_lookup_max down to prompt_lookup_min, find the most recent earlier
// occurrence of the sequence's last n tokens in prompt + output and propose the (up to k)
// tokens that followed it. No model; q is one-hot (deterministic proposer). With
// lookup_cached_requests > 0 the outputs of that many earlier finished requests are searched too
// (spec/lookup_history.h), and the longer of the two matches drafts (ngram_draft).
#pragma once

#include <memory>
#include <unordered_map>
#include <vector>

#include "spec/lookup_history.h"
#include "spec/proposer.h"

namespace specserve {

/// The n-gram draft of one sequence (NgramProposer and spec/lookup_first_proposer.h): up to k
/// tokens that followed the most recent earlier occurrence of the sequence's last n tokens in
/// its own text (NgramProposer::lookup, source kPromptLookup) or in earlier requests' outputs
/// (`history.lookup`, source kCachedRequests), whichever matched more tokens (the own text on a
/// tie; with prompt_lookup_max <= 2 any earlier output's match, 3+ tokens, beats the own text's).
/// Empty tokens: no match anywhere, or k < 1. `search_history` false: the own text only (see
/// history_may_draft).
DraftTree ngram_draft(std::span<const int32_t> tokens, int32_t min_n, int32_t max_n, int32_t k, const SequenceOutputs& history,
                      bool search_history);

/// Whether earlier requests' outputs may draft for `r`: not for a seeded sampled sequence
/// (temperature > 0 with a seed). Verification keeps every output's distribution whatever is
/// drafted, but the sampler's draws follow the drafts, so drafts from other requests' outputs
/// made a seeded request's text depend on what other clients generated before it (the same
/// request gave another text each time). Drafts from its own text depend on nothing else; its
/// output still follows how many tokens each step lets it draft (the step's token budget,
/// disable_by_batch_size, disable_by_goodput, KV pressure), so a seeded request repeats exactly
/// when it runs alone or under the same load. Greedy output does not depend on the drafts at all.
inline bool history_may_draft(const DraftRequest& r) {
  return r.sampling == nullptr || !r.sampling->has_seed || r.sampling->is_greedy();
}

class NgramProposer final : public Proposer {
 public:
  /// 1 <= prompt_lookup_min <= prompt_lookup_max (checked by the caller's config validation);
  /// lookup_cached_requests >= 0 (0: the sequence's own text only).
  NgramProposer(int32_t prompt_lookup_min, int32_t prompt_lookup_max, int32_t lookup_cached_requests = 0);
  std::string name() const override { return "ngram"; }
  Status propose(const std::vector<DraftRequest>& requests, std::vector<DraftTree>* out) override;
  /// With lookup_cached_requests: the sequence's output (as of its last propose()) joins the
  /// searched outputs.
  void release(int64_t seq_id) override;

  /// The lookup for one token list (exposed for tests): up to k tokens, possibly none.
  /// `matched`, when given, gets the n that matched (0: none).
  static std::vector<int32_t> lookup(std::span<const int32_t> tokens, int32_t min_n, int32_t max_n, int32_t k,
                                     int32_t* matched = nullptr);

 private:
  int32_t min_n_, max_n_;
  SequenceOutputs outputs_;
};

}  // namespace specserve
