// specserve spec: n-gram prompt-lookup proposer (Saxena 2023, "prompt lookup decoding"; vLLM's
// `ngram` method).
//
// For n from prompt_lookup_max down to prompt_lookup_min, find the most recent earlier
// occurrence of the sequence's last n tokens in prompt + output and propose the (up to k)
// tokens that followed it. No model, no state; q is one-hot (deterministic proposer).
#pragma once

#include "spec/proposer.h"

namespace specserve {

class NgramProposer final : public Proposer {
 public:
  /// 1 <= prompt_lookup_min <= prompt_lookup_max (checked by the caller's config validation).
  NgramProposer(int32_t prompt_lookup_min, int32_t prompt_lookup_max) : min_n_(prompt_lookup_min), max_n_(prompt_lookup_max) {}
  std::string name() const override { return "ngram"; }
  Status propose(const std::vector<DraftRequest>& requests, std::vector<DraftTree>* out) override;

  /// The lookup for one token list (exposed for tests): up to k tokens, possibly none.
  static std::vector<int32_t> lookup(std::span<const int32_t> tokens, int32_t min_n, int32_t max_n, int32_t k);

 private:
  int32_t min_n_, max_n_;
};

}  // namespace specserve
