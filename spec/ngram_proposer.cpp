#include "spec/ngram_proposer.h"

#include <algorithm>

namespace specserve {

std::vector<int32_t> NgramProposer::lookup(std::span<const int32_t> tokens, int32_t min_n, int32_t max_n, int32_t k) {
  const int64_t len = static_cast<int64_t>(tokens.size());
  for (int32_t n = std::min<int64_t>(max_n, len - 1); n >= min_n; --n) {
    const int32_t* tail = tokens.data() + len - n;
    // Most recent match first: recent context predicts best.
    for (int64_t start = len - n - 1; start >= 0; --start) {
      if (std::equal(tail, tail + n, tokens.data() + start)) {
        const int64_t from = start + n;
        const int64_t take = std::min<int64_t>(k, len - from);
        return std::vector<int32_t>(tokens.begin() + from, tokens.begin() + from + take);
      }
    }
  }
  return {};
}

DraftTree ngram_draft(std::span<const int32_t> tokens, int32_t min_n, int32_t max_n, int32_t k, const SequenceOutputs& history) {
  DraftTree d;
  d.source = DraftSource::kPromptLookup;
  d.tokens = NgramProposer::lookup(tokens, min_n, max_n, k);
  if (d.tokens.empty()) {
    d.tokens = history.lookup(tokens, k);
    if (!d.tokens.empty()) d.source = DraftSource::kCachedRequests;
  }
  return d;
}

NgramProposer::NgramProposer(int32_t prompt_lookup_min, int32_t prompt_lookup_max, int32_t lookup_cached_requests)
    : min_n_(prompt_lookup_min), max_n_(prompt_lookup_max), outputs_(lookup_cached_requests, prompt_lookup_min, prompt_lookup_max) {}

Status NgramProposer::propose(const std::vector<DraftRequest>& requests, std::vector<DraftTree>* out) {
  out->resize(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    const DraftRequest& r = requests[i];
    (*out)[i] = ngram_draft(r.tokens, min_n_, max_n_, r.num_tokens, outputs_);
    outputs_.observe(r.seq_id, r.tokens, r.prompt_len);
  }
  return Status();
}

void NgramProposer::release(int64_t seq_id) { outputs_.release(seq_id); }

}  // namespace specserve
