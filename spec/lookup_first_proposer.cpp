#include "spec/lookup_first_proposer.h"

#include <algorithm>

#include "core/status.h"
#include "spec/ngram_proposer.h"

namespace specserve {

LookupFirstProposer::LookupFirstProposer(std::unique_ptr<Proposer> inner, int32_t prompt_lookup_min,
                                         int32_t prompt_lookup_max)
    : inner_(std::move(inner)), min_n_(prompt_lookup_min), max_n_(prompt_lookup_max) {
  SPECSERVE_CHECK(inner_ != nullptr, "LookupFirstProposer needs an inner proposer");
  SPECSERVE_CHECK(min_n_ >= 1 && min_n_ <= max_n_, "prompt_lookup_min/max out of order");
}

std::string LookupFirstProposer::name() const { return inner_->name() + "+ngram"; }

Status LookupFirstProposer::propose(const std::vector<DraftRequest>& requests, std::vector<DraftTree>* out) {
  out->assign(requests.size(), DraftTree{});
  // What this call appended to kept_, to undo when it fails: the engine then hands the same
  // rows over again with the next call (spec/engine_step.cpp).
  struct Touched {
    int64_t seq_id;
    size_t old_size;  ///< rows' floats before this call; SIZE_MAX: the entry was (re)started here
  };
  std::vector<Touched> touched;
  std::vector<DraftRequest> inner_reqs;
  std::vector<size_t> inner_of;  // inner_reqs[j] answers requests[inner_of[j]]
  for (size_t i = 0; i < requests.size(); ++i) {
    const DraftRequest& r = requests[i];
    Kept* kept = nullptr;
    if (r.hidden_size > 0) {
      const size_t d = static_cast<size_t>(r.hidden_size);
      auto it = kept_.find(r.seq_id);
      const bool restart = it == kept_.end() || r.hidden_begin == 0 ||
                           it->second.begin + static_cast<int32_t>(it->second.rows.size() / d) != r.hidden_begin;
      if (restart) {
        // New, recomputed (hidden_begin 0), or a gap (never expected): the inner proposer gets
        // what the engine sends from here on, and sorts out the rest itself.
        kept = &kept_[r.seq_id];
        kept->begin = r.hidden_begin;
        kept->rows.clear();
        touched.push_back({r.seq_id, SIZE_MAX});
      } else {
        kept = &it->second;
        touched.push_back({r.seq_id, kept->rows.size()});
      }
      kept->rows.insert(kept->rows.end(), r.hidden.begin(), r.hidden.end());
    }
    if (r.num_tokens > 0 && (!kept || kept->rows.size() / static_cast<size_t>(r.hidden_size) <= kMaxKeptRows)) {
      const int32_t depth = std::clamp(inner_->max_draft_depth(r.num_tokens), 1, r.num_tokens);
      std::vector<int32_t> chain = NgramProposer::lookup(r.tokens, min_n_, max_n_, depth);
      if (!chain.empty()) {
        (*out)[i].tokens = std::move(chain);
        ++num_lookup_;
        continue;
      }
    }
    DraftRequest ir = r;
    if (kept) {
      ir.hidden_begin = kept->begin;
      ir.hidden = std::span<const float>(kept->rows);
    }
    inner_reqs.push_back(ir);
    inner_of.push_back(i);
  }
  if (!inner_reqs.empty()) {
    std::vector<DraftTree> inner_out;
    Status st = inner_->propose(inner_reqs, &inner_out);
    if (st.ok() && inner_out.size() != inner_reqs.size()) {
      st = internal_error(inner_->name() + " returned " + std::to_string(inner_out.size()) + " drafts for " +
                          std::to_string(inner_reqs.size()) + " sequences");
    }
    if (!st.ok()) {
      for (const Touched& t : touched) {
        if (t.old_size == SIZE_MAX) {
          kept_.erase(t.seq_id);
        } else {
          kept_.at(t.seq_id).rows.resize(t.old_size);
        }
      }
      return st;
    }
    for (size_t j = 0; j < inner_reqs.size(); ++j) {
      const DraftRequest& ir = inner_reqs[j];
      (*out)[inner_of[j]] = std::move(inner_out[j]);
      if (ir.num_tokens > 0) ++num_inner_;
      if (ir.hidden_size > 0) {
        // Handed over: the inner proposer has them now.
        Kept& kept = kept_.at(ir.seq_id);
        kept.begin += static_cast<int32_t>(kept.rows.size() / static_cast<size_t>(ir.hidden_size));
        kept.rows.clear();
      }
    }
  }
  return Status();
}

void LookupFirstProposer::release(int64_t seq_id) {
  kept_.erase(seq_id);
  inner_->release(seq_id);
}

}  // namespace specserve
