#include "actors/remote_proposer.h"

#include "actors/messages.h"

namespace specserve {

RemoteProposer::RemoteProposer(caf::actor_system& sys, caf::actor draft, std::string token, std::string method,
                               int32_t vocab_size, std::chrono::milliseconds timeout)
    : sys_(sys), draft_(std::move(draft)), token_(std::move(token)), method_(std::move(method)),
      vocab_size_(vocab_size), timeout_(timeout) {}

RemoteProposer::~RemoteProposer() { flush_releases(); }

void RemoteProposer::release(int64_t seq_id) {
  sent_.erase(seq_id);
  pending_release_.push_back(seq_id);
  if (pending_release_.size() >= 16) flush_releases();
}

void RemoteProposer::flush_releases() {
  if (pending_release_.empty() || !draft_) return;
  caf::anon_send(draft_, ReleaseMsg{token_, std::move(pending_release_)});
  pending_release_.clear();
}

Status RemoteProposer::propose(const std::vector<DraftRequest>& requests, std::vector<DraftTree>* out) {
  if (!draft_) return unavailable("no draft worker");
  flush_releases();
  // NOTE: a fresh scoped actor per call: CAF 0.17 still delivers a request's timeout message
  // after its reply, and a long-lived receiver would collect one stale message per step.
  caf::scoped_actor self{sys_};
  ProposeMsg msg;
  msg.token = token_;
  for (const DraftRequest& r : requests) {
    DraftSeq s;
    s.seq_id = r.seq_id;
    s.prompt_len = r.prompt_len;
    auto it = sent_.find(r.seq_id);
    s.offset = (it != sent_.end() && it->second <= static_cast<int32_t>(r.tokens.size())) ? it->second : 0;
    s.new_tokens.assign(r.tokens.begin() + s.offset, r.tokens.end());
    s.num_tokens = r.num_tokens;
    if (r.sampling) s.sampling = *r.sampling;
    msg.seqs.push_back(std::move(s));
  }
  ProposeReply reply;
  std::string err;
  // NOTE: a request's blocking receive waits for its answer or its timeout only, so a draft
  // worker that died (kill -9) stalled every sequence of the shard for the whole timeout (3 s)
  // before the shard went on without drafts. The worker is monitored instead, and its reply (a
  // handler's result goes back to the sender) or its death ends the wait, whichever comes first.
  self->monitor(draft_);
  self->send(draft_, std::move(msg));
  self->receive([&](ProposeReply& r) { reply = std::move(r); },
                [&](caf::error& e) { err = sys_.render(e); },
                [&](caf::down_msg& d) { err = "the draft worker is gone (" + sys_.render(d.reason) + ")"; },
                caf::after(timeout_) >> [&] { err = sys_.render(caf::make_error(caf::sec::request_timeout)); });
  // NOTE: a monitor stays attached to the worker (or its proxy) after its observer is gone: one
  // per step piled up for the worker's lifetime without this.
  self->demonitor(draft_);
  if (!err.empty()) {
    sent_.clear();  // the worker may have lost them (restarted): start over
    return unavailable("draft worker: " + err);
  }
  if (!reply.error.empty()) return unavailable("draft worker: " + reply.error);
  if (reply.seqs.size() != requests.size()) {
    return internal_error("draft worker answered " + std::to_string(reply.seqs.size()) + " drafts for " +
                          std::to_string(requests.size()) + " sequences");
  }
  out->assign(requests.size(), DraftTree{});
  for (size_t i = 0; i < requests.size(); ++i) {
    DraftReplySeq& r = reply.seqs[i];
    const int64_t id = requests[i].seq_id;
    if (r.resync) {
      sent_.erase(id);
      continue;  // no draft this step; the next call sends every token
    }
    sent_[id] = static_cast<int32_t>(requests[i].tokens.size());
    DraftTree& d = (*out)[i];
    d.tokens = std::move(r.tokens);
    d.parents = std::move(r.parents);
    // A value this build does not know (a newer worker) counts as the model's.
    d.source = r.source >= 0 && r.source < kNumDraftSources ? static_cast<DraftSource>(r.source) : DraftSource::kModel;
    if (!r.prob_ids.empty()) {
      if (r.prob_ids.size() != d.tokens.size() || r.prob_values.size() != d.tokens.size()) {
        return internal_error("draft worker: probabilities for " + std::to_string(r.prob_ids.size()) + " of " +
                              std::to_string(d.tokens.size()) + " draft tokens");
      }
      for (size_t t = 0; t < d.tokens.size(); ++t) {
        std::vector<float> q(static_cast<size_t>(vocab_size_), 0.0f);
        const auto& ids = r.prob_ids[t];
        const auto& vals = r.prob_values[t];
        if (ids.size() != vals.size()) return internal_error("draft worker: sparse q with mismatched ids and values");
        for (size_t j = 0; j < ids.size(); ++j) {
          if (ids[j] < 0 || ids[j] >= vocab_size_) {
            return internal_error("draft worker: q names token " + std::to_string(ids[j]) + " outside the vocabulary");
          }
          q[static_cast<size_t>(ids[j])] = vals[j];
        }
        d.probs.push_back(std::move(q));
      }
    }
  }
  return Status();
}

Status ProposerSlot::propose(const std::vector<DraftRequest>& requests, std::vector<DraftTree>* out) {
  if (!inner_) {
    out->assign(requests.size(), DraftTree{});
    return Status();
  }
  return inner_->propose(requests, out);
}

}  // namespace specserve
