// specserve spec: the outputs of earlier requests, searched by the n-gram lookup besides the
// sequence's own text (`lookup_cached_requests`; the longer match drafts, spec/ngram_proposer.h).
//
// The idea is SuffixDecoding's (Oliaro et al. 2024, "SuffixDecoding: A Model-Free Approach to
// Speeding Up Large Language Model Inference"; vLLM's `suffix` method): a serving engine's
// outputs repeat each other's phrasing, so the continuation that followed an n-gram in an
// earlier output is a free draft for a later request. This is the simple form: an index from
// each n-gram (max(prompt_lookup_min, kMinN)..min(prompt_lookup_max, kMaxN) tokens) of the last
// `max_requests` finished outputs to its most recent occurrence; the tokens that followed are the
// draft. No suffix tree, no frequency scores.
// NOTE: at least kMinN = 3 tokens must match: another request's text is a weaker guide than the
// sequence's own (on Spec-Bench outputs, a 2-token match from earlier outputs predicted the next
// token about half the time, a 3-token one about three times in four). So a 1- or 2-token match
// of the sequence's own loses to any match here; drafts from here were accepted about twice as
// often as own-text ones in bench/results/lookup_longer_match_b1_2026-12-05.md.
//
// Memory: at most max_requests outputs of at most kMaxTokensPerRequest tokens each, and an index
// entry (~60 bytes) per (position, n): about 0.25 MB for an output of 1,000 tokens with n 3..5.
// Entries of evicted outputs are dropped when the index is rebuilt (when it holds twice the live
// entries). Verification keeps the output exact whatever is drafted.
// Thread-safety: none (one proposer, one engine thread).
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

namespace specserve {

class LookupHistory {
 public:
  /// Tokens kept per output (its first ones).
  static constexpr int32_t kMaxTokensPerRequest = 4096;
  /// The n-gram lengths indexed are clamped to [kMinN, kMaxN] (see the file comment).
  static constexpr int32_t kMinN = 3;
  static constexpr int32_t kMaxN = 8;

  /// max_requests >= 1; 1 <= min_n <= max_n (checked by the caller's config validation); the
  /// lengths used are max(min_n, kMinN) .. max(that, min(max_n, kMaxN)).
  LookupHistory(int32_t max_requests, int32_t min_n, int32_t max_n);

  /// Adds a finished request's output (tokens after its prompt); the oldest output goes when
  /// there are more than max_requests. An output shorter than min_n + 1 tokens adds nothing.
  void add(std::span<const int32_t> output);

  /// For n from max_n down to min_n: the most recent earlier output holding the last n tokens of
  /// `context` followed by at least one token gives up to k of the tokens that followed. Empty:
  /// no match (or k < 1). `matched`, when given, gets that n (0: no match).
  std::vector<int32_t> lookup(std::span<const int32_t> context, int32_t k, int32_t* matched = nullptr) const;

  int32_t num_requests() const { return static_cast<int32_t>(ring_.size()); }
  size_t index_size() const { return index_.size(); }

 private:
  struct Output {
    uint64_t serial;
    std::vector<int32_t> tokens;
    size_t num_entries = 0;  ///< index entries it made
  };
  struct Where {
    uint64_t serial;  ///< which output
    int32_t end;      ///< the n-gram ends here (exclusive); the continuation starts here
    int32_t n;        ///< its length (a key collision between lengths is caught by it)
  };
  static uint64_t key(std::span<const int32_t> ngram);
  void index_output(Output& o);
  const Output* find(uint64_t serial) const;

  int32_t max_requests_, min_n_, max_n_;
  std::deque<Output> ring_;  // oldest first; serials consecutive
  uint64_t next_serial_ = 0;
  size_t live_entries_ = 0;  // index entries the outputs in ring_ would make
  std::unordered_map<uint64_t, Where> index_;
};

/// A proposer's side of a LookupHistory: each sequence's output as last seen in propose(), added
/// to the history when the sequence is released. Off (does nothing) without a history.
class SequenceOutputs {
 public:
  SequenceOutputs() = default;
  /// max_requests 0: off.
  SequenceOutputs(int32_t max_requests, int32_t min_n, int32_t max_n);
  bool enabled() const { return history_ != nullptr; }
  /// Records tokens[prompt_len:] for seq_id (its first LookupHistory::kMaxTokensPerRequest
  /// tokens; appended since the last call, or taken afresh when the output got shorter).
  void observe(int64_t seq_id, std::span<const int32_t> tokens, int32_t prompt_len);
  /// Adds seq_id's last output to the history and forgets it. The engine also releases a
  /// preempted or aborted sequence: its partial output is added then (the full one again when a
  /// preempted sequence finishes; the later copy wins). The tokens of its last step, never seen
  /// by propose(), are not in it.
  void release(int64_t seq_id);
  /// LookupHistory::lookup, empty (matched 0) when off.
  std::vector<int32_t> lookup(std::span<const int32_t> context, int32_t k, int32_t* matched = nullptr) const;
  const LookupHistory* history() const { return history_.get(); }

 private:
  std::unique_ptr<LookupHistory> history_;
  std::unordered_map<int64_t, std::vector<int32_t>> last_;
};

}  // namespace specserve
