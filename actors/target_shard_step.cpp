// specserve actors: the target shard's steps: one engine step per message, its events (accepted
// tokens, logprobs, finishes) to the request actors and its load to the scheduler
// (actors/target_shard.h).
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "actors/target_shard_internal.h"
#include "core/logging.h"
#include "scheduler/dispatch.h"

namespace specserve {
namespace target_shard_internal {
namespace {

// The engine's per-token SampleResults into the event's flat arrays: logprobs [n], and
// top_logprob_ids / top_logprob_values [n * top_n] row-major, highest first. The engine returns
// exactly min(sampling.logprobs, vocab) = top_n entries per token and one SampleResult per
// emitted token; anything else is a bug.
void fill_logprobs(const std::vector<SampleResult>& lps, int32_t top_n, ShardEvent* ev) {
  SPECSERVE_CHECK(lps.size() == ev->tokens.size(),
                  "engine returned " + std::to_string(lps.size()) + " logprobs for " + std::to_string(ev->tokens.size()) + " tokens");
  ev->top_n = top_n;
  ev->logprobs.reserve(lps.size());
  ev->top_logprob_ids.reserve(lps.size() * static_cast<size_t>(top_n));
  ev->top_logprob_values.reserve(lps.size() * static_cast<size_t>(top_n));
  for (const SampleResult& lp : lps) {
    ev->logprobs.push_back(lp.logprob);
    if (top_n == 0) continue;
    SPECSERVE_CHECK(lp.top_logprobs.size() == static_cast<size_t>(top_n),
                    "engine returned " + std::to_string(lp.top_logprobs.size()) + " top logprobs, expected " + std::to_string(top_n));
    for (const TokenLogprob& t : lp.top_logprobs) {
      ev->top_logprob_ids.push_back(t.token);
      ev->top_logprob_values.push_back(t.logprob);
    }
  }
}

}  // namespace

void schedule_step(Self self) {
  if (self->state.step_pending) return;
  self->state.step_pending = true;
  self->send(self, step_atom::value);
}

ShardLoad load_of(ShardState& s) {
  ShardLoad l;
  l.replica = s.cfg.replica;
  const BlockPool& pool = s.engine->block_pool();
  l.total_kv_blocks = pool.num_blocks();
  l.num_running = s.engine->num_running();
  l.num_waiting = s.engine->num_waiting();
  // Migrated requests whose KV is being fetched are not in the engine yet, but will be: they
  // count as waiting, and the blocks they need as taken (else the head would place work on
  // room they are about to fill).
  int64_t fetching_blocks = 0;
  for (const auto& [serial, p] : s.fetching) {
    if (p.aborted) continue;
    ++l.num_waiting;
    ++l.num_fetching;
    fetching_blocks += blocks_needed(static_cast<int64_t>(p.item.prompt.size() + p.item.resume_output.size()), pool.block_size());
  }
  l.free_kv_blocks = static_cast<int32_t>(std::max<int64_t>(0, pool.num_free() - fetching_blocks));
  const EngineStats& st = s.engine->stats();
  l.num_steps = st.num_steps;
  l.generated_tokens = st.generated_tokens;
  l.num_drafts = st.spec.num_drafts;
  l.num_draft_tokens = st.spec.num_draft_tokens;
  l.num_accepted_tokens = st.spec.num_accepted_tokens;
  l.forward_seconds = st.forward_seconds;
  l.draft_seconds = st.draft_seconds;
  l.received = s.received;
  l.prompt_tokens = st.prompt_tokens;
  l.accepted_per_pos = st.spec.accepted_per_pos;
  l.prefix_cache_queries = st.prefix_cache_queries;
  l.prefix_cache_hits = st.prefix_cache_hits;
  l.kv_imported_tokens = s.kv_imported_tokens;
  l.kv_recomputed_tokens = s.kv_recomputed_tokens;
  l.num_reclaims = s.num_reclaims;
  l.num_preemptions = st.num_preemptions;
  l.goodput_drafting = st.goodput_drafting;
  l.goodput_skipped = st.goodput_skipped;
  for (const DraftSourceStats& b : st.by_source) {
    l.drafts_by_source.push_back(b.num_drafts);
    l.draft_tokens_by_source.push_back(b.num_draft_tokens);
    l.accepted_by_source.push_back(b.num_accepted_tokens);
  }
  return l;
}

void do_step(Self self) {
  auto& s = self->state;
  s.step_pending = false;
  std::vector<SeqEvent> events;
  Status st = s.engine->step(&events);
  ShardLoad load;
  std::vector<int64_t> handover;
  // A request's last event leaves after the load report that counts it: the head's books (the
  // replica's tokens, its free slots) hold the request before its client hears it finished.
  // NOTE: the events went first, and a status read right after an answer could show the load
  // of the step before.
  std::vector<std::pair<caf::actor, ShardEvent>> finals;
  if (!st.ok() && s.tp_peers && s.tp_peers->broken()) {
    // Not this batch's fault: the tensor-parallel group is broken (a rank died or stalled). The
    // shard stops and the scheduler re-queues every request it held.
    get_logger("actors")->error("replica {}: step failed: {}; the tensor-parallel group is broken, the replica stops",
                                s.cfg.replica, st.to_string());
    self->quit(caf::exit_reason::user_shutdown);
    return;
  }
  if (!st.ok() && !s.by_request.empty()) {
    // NOTE: a failed step (one sequence outgrew the whole KV cache) fails the longest request,
    // not its batch-mates nor the shard; the next step runs without it.
    auto victim = std::max_element(s.by_request.begin(), s.by_request.end(), [](const auto& a, const auto& b) {
      return a.second.num_tokens < b.second.num_tokens;
    });
    const int64_t rid = victim->first;
    Running r = victim->second;
    get_logger("actors")->error("replica {}: step failed: {}; failing request {} ({} tokens)", s.cfg.replica,
                                st.to_string(), rid, r.num_tokens);
    ShardEvent ev;
    ev.request_id = rid;
    ev.attempt = r.attempt;
    ev.finish_reason = "error";
    ev.error = st.to_string() + " (request of " + std::to_string(r.num_tokens) + " tokens)";
    finals.emplace_back(r.request_actor, std::move(ev));
    s.engine->abort(r.seq_id);
    load.finished.push_back(rid);
    s.by_request.erase(rid);
    s.by_seq.erase(r.seq_id);
  }
  for (SeqEvent& e : events) {
    auto it = s.by_seq.find(e.seq_id);
    if (it == s.by_seq.end()) continue;
    const int64_t rid = it->second;
    Running& r = s.by_request[rid];
    r.num_tokens += static_cast<int64_t>(e.tokens.size());
    const bool emitted = !e.tokens.empty();
    ShardEvent ev;
    ev.request_id = rid;
    ev.attempt = r.attempt;
    ev.tokens = std::move(e.tokens);
    fill_logprobs(e.logprobs, r.top_n, &ev);
    ev.text = std::move(e.text);
    if (e.finish != FinishReason::kNone) {
      ev.finish_reason = finish_reason_name(e.finish);
      ev.stop_token = e.stop_token;
      ev.stop_string = std::move(e.stop_string);
      if (e.finish == FinishReason::kError) {
        ev.error = e.error;
        get_logger("actors")->error("replica {}: request {} failed: {}", s.cfg.replica, rid, e.error);
      }
      if (auto sp = s.engine->take_finished_stats(e.seq_id)) {
        ev.num_drafts = sp->num_drafts;
        ev.num_draft_tokens = sp->num_draft_tokens;
        ev.num_accepted_tokens = sp->num_accepted_tokens;
      }
    }
    if (e.finish != FinishReason::kNone) {
      finals.emplace_back(r.request_actor, std::move(ev));
    } else if (!ev.tokens.empty() || !ev.text.empty()) {
      self->send(r.request_actor, std::move(ev));
    }
    if (e.finish != FinishReason::kNone) {
      load.finished.push_back(rid);
      s.by_request.erase(rid);
      s.by_seq.erase(it);
    } else if (prefill_only(s) && emitted) {
      handover.push_back(rid);
    }
  }
  // A prefill worker hands every request over once its prompt is in the KV cache and its first
  // token is out (disaggregated prefill): a decode replica continues from the shipped KV.
  for (int64_t rid : handover) migrate_out(self, rid, "prefill");
  ShardLoad l = load_of(s);
  l.finished = std::move(load.finished);
  self->send(s.cfg.scheduler, std::move(l));
  for (auto& [to, ev] : finals) self->send(to, std::move(ev));
  if (s.engine->has_work()) schedule_step(self);
  maybe_quit(self);
}

}  // namespace target_shard_internal
}  // namespace specserve
