#include "spec/lookup_first_proposer.h"

#include <algorithm>
#include <unordered_set>

#include "core/status.h"
#include "spec/ngram_proposer.h"

namespace specserve {

LookupFirstProposer::LookupFirstProposer(std::unique_ptr<Proposer> inner, int32_t prompt_lookup_min,
                                         int32_t prompt_lookup_max, int32_t lookup_cached_requests)
    : inner_(std::move(inner)),
      min_n_(prompt_lookup_min),
      max_n_(prompt_lookup_max),
      outputs_(lookup_cached_requests, prompt_lookup_min, prompt_lookup_max) {
  SPECSERVE_CHECK(inner_ != nullptr, "LookupFirstProposer needs an inner proposer");
  SPECSERVE_CHECK(min_n_ >= 1 && min_n_ <= max_n_, "prompt_lookup_min/max out of order");
}

std::string LookupFirstProposer::name() const { return inner_->name() + "+ngram"; }

Status LookupFirstProposer::propose(const std::vector<DraftRequest>& requests, std::vector<DraftTree>* out) {
  out->assign(requests.size(), DraftTree{});
  // What this call changed in kept_, to undo when it fails: the engine then hands the same rows
  // over again with the next call (spec/engine_step.cpp).
  struct Undo {
    int64_t seq_id;
    size_t old_size;  ///< rows' floats before this call; SIZE_MAX: the entry was made by this call
  };
  std::vector<Undo> undo;
  std::vector<DraftRequest> inner_reqs;
  std::vector<size_t> inner_of;  // inner_reqs[j] answers requests[inner_of[j]]
  std::unordered_set<int64_t> seen;
  int64_t lookups = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
    const DraftRequest& r = requests[i];
    SPECSERVE_CHECK(seen.insert(r.seq_id).second, "seq " + std::to_string(r.seq_id) + " asked twice in one propose() call");
    const size_t d = static_cast<size_t>(std::max(r.hidden_size, 0));
    // The rows kept for this sequence continue with this request's, else they are dropped (a
    // restart from 0 after a preemption, or a gap the inner proposer sorts out itself). Not
    // undone when the call fails: the same rows sent again drop them alike.
    auto it = kept_.find(r.seq_id);
    if (it != kept_.end() && (d == 0 || r.hidden_begin == 0 ||
                              it->second.begin + static_cast<int32_t>(it->second.rows.size() / d) != r.hidden_begin)) {
      kept_.erase(it);
      it = kept_.end();
    }
    const size_t num_kept = (it == kept_.end() ? 0 : it->second.rows.size() / d) + (d ? r.hidden.size() / d : 0);
    DraftTree chain;
    if (r.num_tokens > 0 && num_kept <= static_cast<size_t>(kMaxKeptRows)) {
      const int32_t depth = std::clamp(inner_->max_draft_depth(r.num_tokens), 1, r.num_tokens);
      chain = ngram_draft(r.tokens, min_n_, max_n_, depth, outputs_, history_may_draft(r));
    }
    outputs_.observe(r.seq_id, r.tokens, r.prompt_len);
    if (!chain.tokens.empty()) {
      (*out)[i] = std::move(chain);
      ++lookups;
      if (d > 0) {  // kept for the inner proposer's next call
        if (it == kept_.end()) {
          it = kept_.emplace(r.seq_id, Kept{r.hidden_begin, {}}).first;
          undo.push_back({r.seq_id, SIZE_MAX});
        } else {
          undo.push_back({r.seq_id, it->second.rows.size()});
        }
        it->second.rows.insert(it->second.rows.end(), r.hidden.begin(), r.hidden.end());
      }
      continue;
    }
    DraftRequest ir = r;
    if (it != kept_.end()) {
      // Rows kept from lookup steps first, then this request's.
      undo.push_back({r.seq_id, it->second.rows.size()});
      it->second.rows.insert(it->second.rows.end(), r.hidden.begin(), r.hidden.end());
      ir.hidden_begin = it->second.begin;
      ir.hidden = std::span<const float>(it->second.rows);
    }
    inner_reqs.push_back(ir);
    inner_of.push_back(i);
  }
  Status st;
  std::vector<DraftTree> inner_out;
  if (!inner_reqs.empty()) {
    st = inner_->propose(inner_reqs, &inner_out);
    if (st.ok() && inner_out.size() != inner_reqs.size()) {
      st = internal_error(inner_->name() + " returned " + std::to_string(inner_out.size()) + " drafts for " +
                          std::to_string(inner_reqs.size()) + " sequences");
    }
  }
  if (!st.ok()) {
    for (const Undo& u : undo) {
      if (u.old_size == SIZE_MAX) {
        kept_.erase(u.seq_id);
      } else {
        kept_.at(u.seq_id).rows.resize(u.old_size);
      }
    }
    return st;
  }
  num_lookup_ += lookups;
  for (size_t j = 0; j < inner_reqs.size(); ++j) {
    (*out)[inner_of[j]] = std::move(inner_out[j]);
    if (inner_reqs[j].num_tokens > 0) ++num_inner_;
    kept_.erase(inner_reqs[j].seq_id);  // handed over: the inner proposer has them now
  }
  return Status();
}

void LookupFirstProposer::release(int64_t seq_id) {
  kept_.erase(seq_id);
  outputs_.release(seq_id);
  inner_->release(seq_id);
}

}  // namespace specserve
