// The head's request actor: actors/request_actor.h.
#include "actors/request_actor.h"

#include <chrono>
#include <string>
#include <utility>
#include <vector>

#include "core/logging.h"

namespace specserve {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

void finish_request(RequestSelf self, StreamChunk last) {
  auto& s = self->state;
  if (s.finished) return;
  s.finished = true;
  last.request_id = s.id;
  last.prompt_tokens = static_cast<int32_t>(s.item.prompt.size());
  last.completion_tokens = static_cast<int32_t>(s.output.size());
  last.num_drafts = s.num_drafts;
  last.num_draft_tokens = s.num_draft_tokens;
  last.num_accepted_tokens = s.num_accepted_tokens;
  last.num_requeues = s.requeues;
  last.num_migrations = s.migrations;
  if (s.timed_out && last.finish_reason == "abort") last.finish_reason = "timeout";
  // The scheduler first: a client that reads status or /metrics once it has its answer finds
  // the request counted as finished (CAF keeps the order of one sender's messages to one
  // receiver, and the client's query leaves after this).
  // NOTE: the answer went first, and a status read right after it could miss the request.
  self->send(s.scheduler, done_atom::value, s.id);
  self->send(s.sink, std::move(last));
  self->quit();
}

// The request's WorkItem for its next attempt (attempt + 1, every token streamed so far as
// resume_output), counting the move in *counter; a request cancelled or timed out meanwhile
// finishes here ("abort") instead of running again.
caf::result<WorkItem> next_attempt(RequestSelf self, int32_t* counter) {
  auto& s = self->state;
  if (s.cancelled || s.timed_out) {
    StreamChunk c;
    c.finish_reason = "abort";
    finish_request(self, std::move(c));
    return caf::make_error(caf::sec::request_receiver_down);
  }
  ++*counter;
  ++s.item.attempt;
  return s.item;
}

}  // namespace

caf::behavior request_actor(RequestSelf self, int64_t id, std::string token, caf::actor scheduler, caf::actor sink,
                            WorkItem item, double timeout_s) {
  auto& s = self->state;
  s.id = id;
  s.token = std::move(token);
  s.scheduler = std::move(scheduler);
  s.sink = std::move(sink);
  s.item = std::move(item);
  s.item.request_actor = caf::actor_cast<caf::actor>(self);
  self->monitor(s.sink);
  self->monitor(s.scheduler);
  self->set_down_handler([self](caf::down_msg& m) {
    auto& s = self->state;
    if (m.source == s.scheduler.address()) {
      StreamChunk c;
      c.finish_reason = "error";
      c.error = "the head stopped before the request finished";
      finish_request(self, std::move(c));
      self->quit();
      return;
    }
    if (m.source == s.sink.address() && !s.finished) {
      // The client went away: nobody reads the stream; free the replica's slot.
      get_logger("actors")->info("request {}: client gone, cancelling", s.id);
      self->send(s.scheduler, CancelMsg{s.token, s.id});
    }
  });
  if (timeout_s > 0) {
    self->delayed_send(self, std::chrono::microseconds(static_cast<int64_t>(timeout_s * 1e6)), timeout_atom::value);
  }
  return {
      [self](ShardEvent& ev) {
        auto& s = self->state;
        if (s.finished || ev.attempt != s.item.attempt) return;  // a stale attempt (its replica died)
        if (s.attempt_with_token != ev.attempt && !ev.tokens.empty()) {
          // The first token of this attempt (after a move, the first the new replica made).
          s.attempt_with_token = ev.attempt;
          self->send(s.scheduler, first_tok_atom::value, s.id, seconds_since(s.submitted_at), !s.first_token_seen);
          s.first_token_seen = true;
        }
        s.output.insert(s.output.end(), ev.tokens.begin(), ev.tokens.end());
        s.item.resume_output.insert(s.item.resume_output.end(), ev.tokens.begin(), ev.tokens.end());
        s.num_drafts += ev.num_drafts;
        s.num_draft_tokens += ev.num_draft_tokens;
        s.num_accepted_tokens += ev.num_accepted_tokens;
        StreamChunk c;
        c.request_id = s.id;
        c.tokens = std::move(ev.tokens);
        c.logprobs = std::move(ev.logprobs);
        c.top_n = ev.top_n;
        c.top_logprob_ids = std::move(ev.top_logprob_ids);
        c.top_logprob_values = std::move(ev.top_logprob_values);
        c.text = std::move(ev.text);
        if (ev.finish_reason.empty()) {
          self->send(s.sink, std::move(c));
          return;
        }
        c.finish_reason = ev.finish_reason;
        c.error = ev.error;
        c.stop_token = ev.stop_token;
        c.stop_string = std::move(ev.stop_string);
        finish_request(self, std::move(c));
      },
      // Its replica died (requeue) or its sequence left a replica with its state (migrate: drain,
      // prefill hand-over): the next attempt continues from every token streamed so far.
      [self](requeue_atom) -> caf::result<WorkItem> {
        // A request whose replicas keep dying under it may be what kills them (a "poison"
        // request): after kMaxRequeues such failures it ends with an error instead of taking
        // down every replica in turn.
        // Only failures of attempts that streamed no token count (a replica lost for another
        // reason while this request made progress is not its fault); a cancelled or timed-out
        // request finishes as such (next_attempt).
        auto& s = self->state;
        s.failures_without_progress = s.attempt_with_token == s.item.attempt ? 0 : s.failures_without_progress + 1;
        if (!s.cancelled && !s.timed_out && s.failures_without_progress > kMaxRequeues) {
          get_logger("actors")->warn("request {}: its replica failed {} times in a row before it streamed a token; "
                                     "giving up", s.id, s.failures_without_progress);
          StreamChunk c;
          c.finish_reason = "error";
          c.error = "the replica running this request failed " + std::to_string(s.failures_without_progress) +
                    " times in a row before it streamed a token (it was re-queued " + std::to_string(s.requeues) +
                    " times); giving up so that it cannot take down every replica";
          finish_request(self, std::move(c));
          return caf::make_error(caf::sec::request_receiver_down);
        }
        return next_attempt(self, &s.requeues);
      },
      [self](migrate_atom, int32_t attempt) -> caf::result<WorkItem> {
        // A hand-over from an attempt that is no longer current (its replica was declared lost
        // meanwhile and the request re-queued) is refused: the request runs once.
        if (attempt != self->state.item.attempt) return caf::make_error(caf::sec::request_receiver_down);
        return next_attempt(self, &self->state.migrations);
      },
      [self](cancel_atom) { self->state.cancelled = true; },
      [self](timeout_atom) {
        auto& s = self->state;
        if (s.finished) return;
        s.timed_out = true;
        self->send(s.scheduler, CancelMsg{s.token, s.id});
      },
  };
}

}  // namespace specserve
