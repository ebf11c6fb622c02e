// specserve actors: a Proposer whose drafts come from a draft-worker actor, possibly in another
// process or on another host.
//
// Each propose() is one request/response with a deadline; a failure or a timeout returns an
// error, which the engine turns into plain decoding for that step (DESIGN.md section 4). Token
// lists travel incrementally: the worker keeps each sequence's tokens, a call sends only the
// ones it lacks (and everything again when the worker asks to resync). Draft probabilities
// arrive sparse and are expanded to the dense q the verifier reads.
// Thread-safety: called from one thread (the target shard's).
#pragma once

#include <caf/all.hpp>

#include <chrono>
#include <map>
#include <memory>
#include <string>

#include "spec/proposer.h"

namespace specserve {

class RemoteProposer final : public Proposer {
 public:
  /// `method`: the name reported (the worker's method). `vocab_size`: the target's (dense q
  /// length). `timeout`: per call.
  RemoteProposer(caf::actor_system& sys, caf::actor draft, std::string token, std::string method, int32_t vocab_size,
                 std::chrono::milliseconds timeout);
  ~RemoteProposer() override;

  std::string name() const override { return method_; }
  Status propose(const std::vector<DraftRequest>& requests, std::vector<DraftTree>* out) override;
  void release(int64_t seq_id) override;
  /// Sequences whose state the worker should drop, sent with the next call (or now).
  void flush_releases();

 private:
  caf::actor_system& sys_;
  caf::actor draft_;
  std::string token_;
  std::string method_;
  int32_t vocab_size_;
  std::chrono::milliseconds timeout_;
  std::map<int64_t, int32_t> sent_;  ///< seq id -> tokens the worker holds
  std::vector<int64_t> pending_release_;
};

/// A proposer slot that can be filled later (a draft worker that becomes ready after the
/// shard): with nothing attached it proposes nothing (plain decoding, no error).
class ProposerSlot final : public Proposer {
 public:
  explicit ProposerSlot(std::string method) : method_(std::move(method)) {}
  void attach(std::unique_ptr<Proposer> p) { inner_ = std::move(p); }
  bool attached() const { return inner_ != nullptr; }
  std::string name() const override { return inner_ ? inner_->name() : method_; }
  Status propose(const std::vector<DraftRequest>& requests, std::vector<DraftTree>* out) override;
  void release(int64_t seq_id) override {
    if (inner_) inner_->release(seq_id);
  }
  bool needs_hidden() const override { return inner_ && inner_->needs_hidden(); }
  bool needs_every_hidden_row() const override { return inner_ && inner_->needs_every_hidden_row(); }

 private:
  std::string method_;
  std::unique_ptr<Proposer> inner_;
};

}  // namespace specserve
