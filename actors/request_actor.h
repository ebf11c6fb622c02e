// specserve actors: the head's request actor — one per request (actors/scheduler.h spawns it).
//
// It owns the request: its tokens so far, streaming to the client's sink (StreamChunk),
// cancellation (cancel_atom, or the sink going away: the client left), its deadline (finish
// reason "timeout"), and every next attempt after its replica died (requeue_atom; at most
// kMaxRequeues, then it ends with an error: a request that kills replicas must not kill all) or its
// sequence moved (migrate_atom: a drain, a prefill hand-over, a rebalance), which continues from
// every token streamed so far (WorkItem::resume_output). Events of an attempt that is no longer
// current are dropped. It tells the scheduler the first token of each attempt (first_tok_atom:
// TTFT samples, promotion timing) and that it finished (done_atom).
#pragma once

#include <caf/all.hpp>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "actors/messages.h"

namespace specserve {

/// Request actor -> scheduler (same process): (done_atom, request id): it finished (any reason).
using done_atom = caf::atom_constant<caf::atom("done")>;

/// Replica failures in a row, of attempts that streamed no token, that a request survives
/// (requeue_atom); at the next one it finishes with finish reason "error" and a message saying
/// so. An attempt that streamed a token resets the count; migrations (orderly) do not count.
inline constexpr int32_t kMaxRequeues = 3;

struct RequestState {
  int64_t id = 0;
  std::string token;
  caf::actor scheduler;
  caf::actor sink;
  WorkItem item;                 // prompt + params; resume_output grows with the stream
  std::vector<int32_t> output;   // every token streamed to the client
  int32_t requeues = 0;
  int32_t migrations = 0;
  bool timed_out = false;
  bool cancelled = false;
  bool finished = false;
  int64_t num_drafts = 0, num_draft_tokens = 0, num_accepted_tokens = 0;
  std::chrono::steady_clock::time_point submitted_at = std::chrono::steady_clock::now();
  bool first_token_seen = false;  // reported to the scheduler (TTFT samples for the autoscaler)
  int32_t attempt_with_token = -1;  // the last attempt whose first token was reported
  int32_t failures_without_progress = 0;  // replica failures in a row of attempts that streamed no token
};

using RequestSelf = caf::stateful_actor<RequestState>*;

/// The request actor's behaviour: `id` and `token` (the cluster token, for CancelMsg), the
/// scheduler it reports to, the client's `sink` (receives StreamChunk), the first attempt's
/// `item`, and a deadline of `timeout_s` seconds from now (<= 0: none).
caf::behavior request_actor(RequestSelf self, int64_t id, std::string token, caf::actor scheduler, caf::actor sink,
                            WorkItem item, double timeout_s);

}  // namespace specserve
