#include "spec/ngram_proposer.h"

#include <algorithm>

namespace specserve {

std::vector<int32_t> NgramProposer::lookup(std::span<const int32_t> tokens, int32_t min_n, int32_t max_n, int32_t k,
                                           int32_t* matched) {
  if (matched) *matched = 0;
  const int64_t len = static_cast<int64_t>(tokens.size());
  for (int32_t n = std::min<int64_t>(max_n, len - 1); n >= min_n; --n) {
    const int32_t* tail = tokens.data() + len - n;
    // Most recent match first: recent context predicts best.
    for (int64_t start = len - n - 1; start >= 0; --start) {
      if (std::equal(tail, tail + n, tokens.data() + start)) {
        const int64_t from = start + n;
        const int64_t take = std::min<int64_t>(k, len - from);
        if (matched) *matched = n;
        return std::vector<int32_t>(tokens.begin() + from, tokens.begin() + from + take);
      }
    }
  }
  return {};
}

DraftTree ngram_draft(std::span<const int32_t> tokens, int32_t min_n, int32_t max_n, int32_t k, const SequenceOutputs& history,
                      bool search_history) {
  DraftTree d;
  d.source = DraftSource::kPromptLookup;
  int32_t own_n = 0, history_n = 0;
  d.tokens = NgramProposer::lookup(tokens, min_n, max_n, k, &own_n);
  // NOTE: the longer match wins; a tie goes to the sequence's own text (the stronger guide).
  // A 1- or 2-token match of its own loses to any earlier output's (those need 3 or more).
  if (!search_history) return d;
  std::vector<int32_t> earlier = history.lookup(tokens, k, &history_n);
  if (history_n > own_n) {
    d.tokens = std::move(earlier);
    d.source = DraftSource::kCachedRequests;
  }
  return d;
}

NgramProposer::NgramProposer(int32_t prompt_lookup_min, int32_t prompt_lookup_max, int32_t lookup_cached_requests)
    : min_n_(prompt_lookup_min), max_n_(prompt_lookup_max), outputs_(lookup_cached_requests, prompt_lookup_min, prompt_lookup_max) {}

Status NgramProposer::propose(const std::vector<DraftRequest>& requests, std::vector<DraftTree>* out) {
  out->resize(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    const DraftRequest& r = requests[i];
    (*out)[i] = ngram_draft(r.tokens, min_n_, max_n_, r.num_tokens, outputs_, history_may_draft(r));
    outputs_.observe(r.seq_id, r.tokens, r.prompt_len);
  }
  return Status();
}

void NgramProposer::release(int64_t seq_id) { outputs_.release(seq_id); }

}  // namespace specserve
