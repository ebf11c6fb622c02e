// specserve spec: prompt lookup first, then a model-based proposer — a hybrid proposer.
//
// Each step, for each sequence, the n-gram prompt lookup (spec/ngram_proposer.h) is tried
// first: when the sequence's last n tokens (n from prompt_lookup_max down to
// prompt_lookup_min) occurred earlier in prompt + output, the tokens that followed that
// occurrence are the draft (a chain), and the inner proposer (EAGLE, Medusa, a draft model,
// layer skip) is not run for that sequence this step. Otherwise the inner proposer drafts as
// it would alone. The retrieval-first rule is SAM-Decoding's (Hu et al. 2024, "SAM Decoding:
// Speculative Decoding via Suffix Automaton", §3.3: use the retrieved draft when the match is
// long enough, else the auxiliary drafter); here the "long enough" threshold is
// prompt_lookup_min. Copy-heavy text (summaries, retrieval-augmented answers, code edits) then
// gets long free drafts, and the rest gets the head's guesses.
//
// The n-gram chain is as deep as the inner proposer's draft could be for the request's k
// (Proposer::max_draft_depth): a chain of k tokens where the inner proposer drafts chains, the
// tree's depth where it drafts trees — so a step verifies no more rows than the inner
// proposer's own drafts would need.
//
// Hidden states (inner proposers whose needs_hidden() is true): the inner proposer must see,
// in each call, the rows since its own previous call (spec/proposer.h DraftRequest::hidden).
// The rows handed over on steps that drafted by lookup are therefore kept here, per sequence,
// and handed to the inner proposer with the next call it gets (its catch-up then covers
// several positions in one pass); a sequence whose rows go straight to the inner proposer keeps
// nothing here. At most kMaxKeptRows rows are kept per sequence: a sequence past that asks the
// inner proposer this step even when the lookup matched (bounded memory: a row is hidden_size
// floats).
//
// The speculative max_model_len (the draft's limit) stops the inner proposer's drafts, not the
// lookup's: the lookup keeps no draft context (as method ngram, which ignores it).
//
// With lookup_cached_requests > 0 the lookup also searches earlier requests' outputs
// (spec/lookup_history.h; the longer match of the two drafts, spec/ngram_proposer.h ngram_draft);
// such a draft counts as a lookup draft.
//
// Sampling stays lossless: lookup drafts are deterministic (no probs: q one-hot), the inner
// proposer's carry their own q; the engine verifies each sequence's draft by its own rule.
// Thread-safety: none (the engine calls a proposer from one thread).
#pragma once

#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "spec/lookup_history.h"
#include "spec/proposer.h"

namespace specserve {

class LookupFirstProposer final : public Proposer {
 public:
  /// Rows of hidden states kept per sequence between inner calls before the inner proposer is
  /// asked anyway (see the file comment).
  /// NOTE: 512 rows are 1.1 MiB at SmolLM2's hidden size 576 (16 MiB at 8192) per sequence, and
  /// a catch-up pass of 512 rows costs the head about what a 512-token prefill chunk costs it;
  /// lookup streaks that long are rare outside verbatim copying, where the lookup resumes the
  /// step after.
  static constexpr int32_t kMaxKeptRows = 512;

  /// `inner`: the model-based proposer (not null). 1 <= prompt_lookup_min <= prompt_lookup_max
  /// (checked by the caller's config validation). lookup_cached_requests > 0: the outputs of
  /// that many earlier finished requests are searched too (spec/lookup_history.h) before the
  /// inner proposer is asked.
  LookupFirstProposer(std::unique_ptr<Proposer> inner, int32_t prompt_lookup_min, int32_t prompt_lookup_max,
                      int32_t lookup_cached_requests = 0);

  /// "<inner>+ngram", e.g. "eagle+ngram".
  std::string name() const override;
  /// Lookup first; the other requests go to the inner proposer in one call. An inner failure
  /// fails the call (the engine then decodes these sequences plainly this step) and leaves the
  /// kept rows as they were before it. Each seq_id at most once per call (aborts otherwise).
  /// NOTE: the engine's disable_by_goodput times the whole call: lookup steps (almost free)
  /// lower its per-sequence drafting cost estimate, which is what a mix of the two costs.
  Status propose(const std::vector<DraftRequest>& requests, std::vector<DraftTree>* out) override;
  bool needs_hidden() const override { return inner_->needs_hidden(); }
  bool needs_every_hidden_row() const override { return inner_->needs_every_hidden_row(); }
  bool drafts_trees() const override { return inner_->drafts_trees(); }
  int32_t max_draft_depth(int32_t k) const override { return inner_->max_draft_depth(k); }
  void release(int64_t seq_id) override;

  /// Sequence-steps with k >= 1 drafted by the lookup / handed to the inner proposer (which may
  /// still draft nothing) since construction, counting successful calls only (`generate` prints
  /// them).
  int64_t num_lookup_drafts() const { return num_lookup_; }
  int64_t num_inner_drafts() const { return num_inner_; }
  const Proposer& inner() const { return *inner_; }

 private:
  /// Hidden rows handed over since the inner proposer's last call for a sequence.
  struct Kept {
    int32_t begin = 0;        ///< position of the first kept row
    std::vector<float> rows;  ///< [n, hidden_size]
  };

  std::unique_ptr<Proposer> inner_;
  int32_t min_n_, max_n_;
  SequenceOutputs outputs_;
  std::unordered_map<int64_t, Kept> kept_;
  int64_t num_lookup_ = 0, num_inner_ = 0;
};

}  // namespace specserve
