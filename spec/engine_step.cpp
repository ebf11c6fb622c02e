// specserve spec: Engine::step — plan (spec/step_policy.h), drafts from the proposer, one target
// forward pass over every scheduled sequence, then per sequence verification (engine_verify.cpp)
// and the KV, hidden-state and adaptive-k bookkeeping of what it accepted.
#include <algorithm>
#include <chrono>
#include <map>
#include <set>

#include "core/logging.h"
#include "spec/engine.h"
#include "spec/engine_internal.h"
#include "spec/tree_verify.h"

namespace specserve {


Status Engine::step(std::vector<SeqEvent>* events) {
  for (int64_t id : aborted_) {
    SeqEvent ev;
    ev.seq_id = id;
    ev.finish = FinishReason::kAbort;
    events->push_back(std::move(ev));
  }
  aborted_.clear();
  // (A finished sequence's last hand-over happens in the step it finished; this only releases
  // one that step() left early, as on a forward error.)
  for (auto& r : running_) {
    if (r->release_after_handover) {
      r->release_after_handover = false;
      proposer_->release(r->id);
    }
  }
  running_.erase(std::remove_if(running_.begin(), running_.end(), [](const auto& s) { return s->finish != FinishReason::kNone; }),
                 running_.end());
  if (running_.empty() && waiting_.empty()) return Status();

  // Migrated sequences waiting with their KV outside the cache go first through the same
  // admission rule the plan applies (in queue order), so that they start with it loaded.
  for (size_t i = 0; i < waiting_.size(); ++i) {
    if (waiting_[i]->import_kv && admit_import(*waiting_[i])) --i;
  }
  // ---- plan (spec/step_policy.h): admission, rows and draft budget, preemption ----
  const StepState state = step_state();
  const StepLimits limits = step_limits();
  auto planned = plan_step(state, limits);
  if (!planned.ok()) return planned.status();
  StepPlan plan = std::move(*planned);
  for (int64_t id : plan.admitted) {
    auto it = std::find_if(waiting_.begin(), waiting_.end(), [&](const auto& w) { return w->id == id; });
    SPECSERVE_CHECK(it != waiting_.end(), "admitted seq " + std::to_string(id) + " is not waiting");
    Seq& s = **it;
    s.import_kv = nullptr;  // (admit_import above admits such a sequence first; never reached)
    if (opts_.enable_prefix_caching) {
      // The hit the plan counted on: nothing changed the pool since step_state(), so the same
      // look-up finds the same blocks (admissions only add references).
      const auto planned_hit = std::find_if(state.waiting.begin(), state.waiting.end(), [&](const WaitingSeq& w) { return w.id == id; });
      const std::span<const BlockHash> cand = hit_candidates(s);
      const int32_t num_tokens = static_cast<int32_t>(s.tokens.size());
      s.num_cached = s.blocks.acquire_cached_prefix(*pool_, cand, static_cast<int32_t>(cand.size()), num_tokens);
      SPECSERVE_CHECK(s.num_cached == planned_hit->num_cached, "seq " + std::to_string(id) + ": prefix hit of " +
                                                                   std::to_string(s.num_cached) + " tokens, planned " +
                                                                   std::to_string(planned_hit->num_cached));
      stats_.prefix_cache_queries += num_tokens;
      stats_.prefix_cache_hits += s.num_cached;
      if (s.num_cached > 0) get_logger("spec")->debug("seq {}: prefix cache hit of {} of {} tokens", s.id, s.num_cached, num_tokens);
    }
    running_.push_back(std::move(*it));
    waiting_.erase(it);
  }
  // Aging (StepLimits::priority_aging_steps) counts the steps a sequence spends waiting.
  for (auto& w : waiting_) ++w->num_steps_waited;
  for (int64_t id : plan.preempted) {
    auto it = std::find_if(running_.begin(), running_.end(), [&](const auto& r) { return r->id == id; });
    SPECSERVE_CHECK(it != running_.end(), "preempted seq " + std::to_string(id) + " is not running");
    Seq& victim = **it;
    victim.blocks.release_all(*pool_);
    victim.num_cached = 0;
    victim.hidden.clear();
    victim.hidden_begin = 0;  // the recompute hands every position over again from 0
    if (may_draft(victim)) proposer_->release(victim.id);
    get_logger("spec")->info("seq {}: preempted (recompute) for lack of KV blocks", victim.id);
    ++stats_.num_preemptions;
    waiting_.push_back(std::move(*it));
    running_.erase(it);
  }
  if (plan.scheduled.empty()) return Status();
  ++stats_.num_steps;
  std::map<int64_t, Seq*> by_id;
  for (auto& r : running_) by_id[r->id] = r.get();

  // ---- disable_by_goodput (spec/goodput.h): which decode entries draft in this step ----
  std::vector<bool> may_propose(plan.scheduled.size(), true);
  if (opts_.disable_by_goodput) {
    std::vector<GoodputCandidate> cands;
    std::vector<size_t> cand_entry;
    int64_t base_rows = 0, base_tokens = 0;
    for (size_t i = 0; i < plan.scheduled.size(); ++i) {
      const ScheduledSeq& e = plan.scheduled[i];
      base_rows += e.rows - e.num_draft_tokens;
      base_tokens += e.completes ? 1 : 0;
      if (e.num_draft_tokens == 0) continue;
      const Seq& s = *by_id.at(e.id);
      cands.push_back({s.gp_accepted, s.gp_drafted, e.num_draft_tokens, s.gp_skipped, s.gp_explore_after});
      cand_entry.push_back(i);
    }
    std::vector<bool> explored;
    const std::vector<bool> chosen = goodput_.choose(cands, base_rows, base_tokens, &explored);
    for (size_t j = 0; j < cands.size(); ++j) {
      Seq& s = *by_id.at(plan.scheduled[cand_entry[j]].id);
      may_propose[cand_entry[j]] = chosen[j];
      // Explorations back off (8, 16, 32, 64 steps); drafting on its merits resets the interval.
      if (explored[j]) s.gp_explore_after = std::min(2 * s.gp_explore_after, kGoodputExploreMax);
      if (chosen[j] && !explored[j]) s.gp_explore_after = kGoodputExploreEvery;
      s.gp_skipped = chosen[j] ? 0 : s.gp_skipped + 1;
      ++(chosen[j] ? stats_.goodput_drafting : stats_.goodput_skipped);
    }
  }

  // ---- drafts for the decode entries that may speculate ----
  std::vector<DraftTree> drafts(plan.scheduled.size());
  std::vector<DraftRequest> dreqs;
  std::vector<size_t> dreq_entry;
  std::vector<Seq*> dreq_seq;
  std::set<int64_t> asked;  // sequences asked for a draft of at least one token
  const int32_t hidden_size = static_cast<int32_t>(target_.config().hidden_size);
  for (size_t i = 0; i < plan.scheduled.size(); ++i) {
    const ScheduledSeq& e = plan.scheduled[i];
    Seq& s = *by_id.at(e.id);
    // A decode without draft budget: only a proposer that wants every hidden row is called, with
    // k = 0, to take the rows it has not had yet (Proposer::needs_every_hidden_row). A prefill
    // chunk keeps its rows for the first decode step, as for any proposer.
    // (A sequence disable_by_goodput leaves out is such a decode too. Medusa and EAGLE, which
    // are not called then, get its rows with its next draft request: at most its whole length,
    // as after a long prompt.)
    const bool hand_over_only = !e.is_prefill && wants_every_hidden_row(s) && !s.hidden.empty();
    const int32_t num_draft_tokens = may_propose[i] ? e.num_draft_tokens : 0;
    if (num_draft_tokens == 0 && !hand_over_only) continue;
    SPECSERVE_CHECK(e.num_draft_tokens <= s.max_k, "seq " + std::to_string(s.id) + ": " + std::to_string(e.num_draft_tokens) +
                                                       " draft tokens planned over its cap " + std::to_string(s.max_k));
    DraftRequest r;
    r.seq_id = s.id;
    r.tokens = std::span<const int32_t>(s.tokens);
    r.prompt_len = s.prompt_len;
    r.num_tokens = num_draft_tokens;
    r.sampling = &s.params.sampling;
    if (wants_hidden(s)) {
      r.hidden_begin = s.hidden_begin;
      r.hidden = std::span<const float>(s.hidden);
      r.hidden_size = hidden_size;
    }
    if (num_draft_tokens > 0) asked.insert(s.id);
    dreqs.push_back(r);
    dreq_entry.push_back(i);
    dreq_seq.push_back(&s);
  }
  if (!dreqs.empty()) {
    std::vector<DraftTree> proposed(dreqs.size());
    const auto t0 = std::chrono::steady_clock::now();
    Status st = proposer_->propose(dreqs, &proposed);
    const double draft_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    stats_.draft_seconds += draft_s;
    if (opts_.disable_by_goodput && st.ok()) {
      int64_t drafting = 0;
      for (const DraftRequest& r : dreqs) drafting += r.num_tokens > 0 ? 1 : 0;
      goodput_.observe_draft(drafting, draft_s);
    }
    if (st.ok() && proposed.size() != dreqs.size()) {
      st = internal_error("returned " + std::to_string(proposed.size()) + " drafts for " + std::to_string(dreqs.size()) + " sequences");
    }
    if (!st.ok()) {
      // NOTE: a failing proposer degrades this step to plain decoding; the requests go on.
      get_logger("spec")->warn("proposer {} failed, decoding without drafts this step: {}", proposer_->name(), st.to_string());
      proposed.assign(dreqs.size(), DraftTree{});
      asked.clear();  // not what drafting brings: disable_by_goodput learns nothing from it
    } else {
      // The hidden rows are handed over; a failed call gets them again with the next ones.
      for (size_t j = 0; j < dreqs.size(); ++j) {
        Seq& s = *dreq_seq[j];
        if (dreqs[j].hidden_size == 0) continue;
        s.hidden_begin += static_cast<int32_t>(s.hidden.size() / static_cast<size_t>(hidden_size));
        s.hidden.clear();
      }
    }
    const int64_t vocab = target_.config().vocab_size;
    for (size_t i = 0; i < dreqs.size(); ++i) {
      DraftTree& d = proposed[i];
      // A tree's node count is its draft budget (k); q is dense [vocab] per node.
      Status valid = validate_draft_tree(d, dreqs[i].num_tokens, vocab);
      if (!valid.ok()) {
        get_logger("spec")->warn("seq {}: proposer {} returned an invalid draft; ignored: {}", dreqs[i].seq_id, proposer_->name(),
                                 valid.message());
        d = DraftTree{};
        asked.erase(dreqs[i].seq_id);
      }
      if (d.tokens.empty()) d = DraftTree{};  // no guess: a plain decode row
      drafts[dreq_entry[i]] = std::move(d);
    }
  }
  // The draft budget the proposer left unused goes to prefill (and to decodes left out).
  std::vector<int32_t> num_drafted(plan.scheduled.size());
  for (size_t i = 0; i < drafts.size(); ++i) num_drafted[i] = static_cast<int32_t>(drafts[i].tokens.size());
  std::map<int64_t, DraftTree> draft_of;
  for (size_t i = 0; i < drafts.size(); ++i) {
    if (!drafts[i].tokens.empty()) draft_of[plan.scheduled[i].id] = std::move(drafts[i]);
  }
  plan = plan_prefill_after_drafts(state, limits, std::move(plan), num_drafted);

  // ---- KV blocks: the plan fits the free blocks by construction ----
  struct Planned { Seq* seq; int32_t rows; bool completes; DraftTree draft; };
  std::vector<Planned> batch_plan;
  for (const ScheduledSeq& e : plan.scheduled) {
    Seq& s = *by_id.at(e.id);
    if (e.is_prefill) stats_.prefill_tokens += e.rows;
    Status st = s.blocks.reserve(*pool_, s.num_cached + e.rows);
    SPECSERVE_CHECK(st.ok(), "seq " + std::to_string(s.id) + ": the step plan does not fit the KV cache: " + st.to_string());
    auto d = draft_of.find(e.id);
    batch_plan.push_back({&s, e.rows, e.completes, d == draft_of.end() ? DraftTree{} : std::move(d->second)});
  }

  // ---- one target forward ----
  ForwardBatch batch;
  for (const Planned& p : batch_plan) {
    SequenceInput in;
    Seq& s = *p.seq;
    in.num_cached = s.num_cached;
    in.tokens.assign(s.tokens.begin() + s.num_cached, s.tokens.begin() + s.num_cached + (p.draft.tokens.empty() ? p.rows : 1));
    in.tokens.insert(in.tokens.end(), p.draft.tokens.begin(), p.draft.tokens.end());
    in.block_table = s.blocks.blocks();
    // A prefill chunk that does not complete the prompt uses no logits at all.
    in.argmax_only = picks_suffice(s) || (!p.completes && opts_.argmax_on_device);
    if (p.completes && p.draft.tokens.empty() && draws_on_device(s)) {
      // A plain step of a temperature-only request: the backend draws the token with the
      // uniform verify_chain's sample_from would have taken (one per step, in the same order).
      in.argmax_only = true;
      in.sample_temperature = s.params.sampling.temperature;
      in.sample_uniform = s.sampler->next_uniform();
    }
    if (!p.draft.tokens.empty()) {
      for (int32_t r = 0; r < p.rows; ++r) in.logit_rows.push_back(r);
    }
    if (!p.draft.parents.empty()) {
      // Row 0 is the last known token (it follows the cached prefix); node i is row i + 1.
      in.parents.push_back(-1);
      for (int32_t par : p.draft.parents) in.parents.push_back(par + 1);
    }
    if (wants_hidden(s)) {
      // Every row: prefill rows all go to the proposer; of a draft's rows only the accepted
      // path's will, which is known after verification.
      for (int32_t r = 0; r < static_cast<int32_t>(in.tokens.size()); ++r) in.hidden_rows.push_back(r);
      batch.return_hidden = true;
    }
    batch.seqs.push_back(std::move(in));
  }
  ForwardOutput out;
  const auto t0 = std::chrono::steady_clock::now();
  SPECSERVE_RETURN_IF_ERROR(target_.forward(batch, *kv_, &out));
  const double forward_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  stats_.forward_seconds += forward_s;
  if (opts_.disable_by_goodput) {
    // The step-time fit sees decode steps only (a prefill chunk's attention is not linear in its rows).
    int64_t rows = 0;
    for (const SequenceInput& in : batch.seqs) rows += static_cast<int64_t>(in.tokens.size());
    if (std::none_of(plan.scheduled.begin(), plan.scheduled.end(), [](const ScheduledSeq& e) { return e.is_prefill; })) {
      goodput_.observe_forward(rows, forward_s);
    }
  }

  // ---- verify and emit ----
  const int32_t vocab = static_cast<int32_t>(out.vocab_size);
  for (size_t i = 0; i < batch_plan.size(); ++i) {
    Planned& pl = batch_plan[i];
    Seq& s = *pl.seq;
    const bool keep_hidden = wants_hidden(s);
    // Appends hidden row `r` of this sequence (position s.hidden_begin + kept rows) to s.hidden.
    auto keep_hidden_row = [&](int32_t r) {
      const float* h = out.hidden_row(static_cast<int32_t>(i), r);
      s.hidden.insert(s.hidden.end(), h, h + out.hidden_size);
    };
    if (!pl.completes) {
      if (keep_hidden) {
        for (int32_t r = 0; r < pl.rows; ++r) keep_hidden_row(r);
      }
      s.num_cached += pl.rows;
      s.blocks.set_num_tokens(s.num_cached);
      cache_full_blocks(s);
      continue;
    }
    const int32_t k = static_cast<int32_t>(pl.draft.tokens.size());
    const int32_t base = s.num_cached + pl.rows - 1 - k;  // position of the last known token
    // Every known token's KV is valid now: cache its full blocks before emit() may finish the
    // sequence and release them (a one-token request still leaves its prompt cached).
    s.blocks.set_num_tokens(base + 1);
    cache_full_blocks(s);
    SeqEvent ev;
    ev.seq_id = s.id;
    const bool greedy = s.params.sampling.is_greedy();
    int32_t accepted = 0;
    bool alive = true;
    // NOTE: a row the sampler cannot use (NaN, +inf: corrupt weights or a kernel bug) fails
    // this sequence alone with an error, instead of aborting the process in the sampler.
    const bool picks = batch.seqs[i].argmax_only;
    if (picks) stats_.argmax_rows += k + 1;
    for (int32_t r = 0; r <= k; ++r) {
      if (picks ? out.argmax_of(static_cast<int32_t>(i), r) < 0 : !samplable_row(out.row(static_cast<int32_t>(i), r), vocab)) {
        ev.error = "the target model produced non-finite logits (NaN or +inf) at position " + std::to_string(base + r) +
                   " of sequence " + std::to_string(s.id) + ": its weights are corrupt or a kernel failed";
        finish(s, FinishReason::kError);
        alive = false;
        break;
      }
    }
    // Trees (and, under typical acceptance, sampled chains) go through spec/tree_verify.h; plain
    // chains through the chain verifier (verify_chain).
    const bool is_tree = !pl.draft.parents.empty();
    const bool tree_verified = k > 0 && (is_tree || (opts_.typical_acceptance && !greedy));
    std::vector<int32_t> path;
    if (alive && tree_verified) {
      path = verify_tree(s, pl.draft, out, static_cast<int32_t>(i), picks, &ev);
      accepted = static_cast<int32_t>(path.size());
    } else if (alive) {
      accepted = verify_chain(s, pl.draft, out, static_cast<int32_t>(i), picks, &ev);
    }
    if (opts_.disable_by_goodput && asked.count(s.id)) {
      // Per step it was asked to draft: an empty draft (draft_p_min pruned everything) counts
      // as 0 rows and 0 accepted, so its draft time is weighed against what it brings.
      s.gp_accepted = GoodputModel::ema(s.gp_accepted, accepted);
      s.gp_drafted = GoodputModel::ema(s.gp_drafted, k);
      goodput_.observe_acceptance(k, accepted);
    }
    if (k > 0) {
      SpecStats step_spec;
      step_spec.num_drafts = 1;
      step_spec.num_draft_tokens = k;
      step_spec.num_accepted_tokens = accepted;
      step_spec.accepted_per_pos.assign(static_cast<size_t>(k), 0);
      for (int32_t a = 0; a < accepted; ++a) step_spec.accepted_per_pos[static_cast<size_t>(a)] = 1;
      // How deep this draft went: a chain's length, a tree's deepest node (parents come first).
      int32_t depth = k;
      if (is_tree) {
        std::vector<int32_t> node_depth(static_cast<size_t>(k), 1);
        depth = 0;
        for (int32_t v = 0; v < k; ++v) {
          const int32_t par = pl.draft.parents[static_cast<size_t>(v)];
          if (par >= 0) node_depth[static_cast<size_t>(v)] = node_depth[static_cast<size_t>(par)] + 1;
          depth = std::max(depth, node_depth[static_cast<size_t>(v)]);
        }
      }
      step_spec.drafted_per_pos.assign(static_cast<size_t>(k), 0);
      for (int32_t d = 0; d < depth; ++d) step_spec.drafted_per_pos[static_cast<size_t>(d)] = 1;
      s.spec.add(step_spec);
      DraftSourceStats& by = stats_.by_source[static_cast<size_t>(pl.draft.source)];
      ++by.num_drafts;
      by.num_draft_tokens += k;
      by.num_accepted_tokens += accepted;
      if (s.finish != FinishReason::kNone) {
        // finish() (from emit) already recorded this sequence's counters: add this step's too.
        finished_stats_[s.id].add(step_spec);
        stats_.spec.add(step_spec);
      }
      // NOTE: for a tree, k is the node budget and a branching tree is never wholly accepted:
      // the heuristic would shrink it to 1, so trees keep their k — also on the steps where a
      // tree proposer drafts a chain (a pruned tree, a prompt-lookup chain of
      // spec/lookup_first_proposer.h): k stays the budget of its next tree.
      if (opts_.adaptive_k && !is_tree && !proposer_->drafts_trees()) {
        // NOTE: adaptive k follows Hugging Face's assisted-generation heuristic: +2 after a
        // fully accepted draft, -1 after any rejection, kept within [1, the request's cap].
        s.k = accepted == k ? std::min(s.k + 2, s.max_k) : std::max(1, s.k - 1);
      }
    }
    if (s.release_after_handover) {
      // Finished by a stop or its length: the rows of this step whose token is in the output
      // (the last known token(s), then the accepted drafts that were emitted) go to the
      // proposer after this loop.
      const int32_t d = static_cast<int32_t>(out.hidden_size);
      int32_t room = static_cast<int32_t>(s.tokens.size()) - s.hidden_begin - static_cast<int32_t>(s.hidden.size() / static_cast<size_t>(d));
      for (int32_t r = 0; r < (k == 0 ? pl.rows : 1) && room > 0; ++r, --room) keep_hidden_row(r);
      for (int32_t a = 0; a < accepted && room > 0; ++a, --room) keep_hidden_row(tree_verified ? path[static_cast<size_t>(a)] + 1 : a + 1);
    }
    if (s.finish == FinishReason::kNone) {
      if (keep_hidden) {
        // Positions base - rows + 1 .. base (a prefill's rows, or the last known token), then
        // the accepted drafts at base + 1 ...: the rows whose KV stays.
        for (int32_t r = 0; r < (k == 0 ? pl.rows : 1); ++r) keep_hidden_row(r);
        for (int32_t a = 0; a < accepted; ++a) keep_hidden_row(tree_verified ? path[static_cast<size_t>(a)] + 1 : a + 1);
      }
      // KV is valid for the last known token and the accepted drafts; rejected slots go.
      if (tree_verified) SPECSERVE_RETURN_IF_ERROR(compact_path(s, base, path));
      s.num_cached = base + 1 + accepted;
      SPECSERVE_CHECK(!keep_hidden || s.hidden_begin + static_cast<int32_t>(s.hidden.size() / static_cast<size_t>(out.hidden_size)) ==
                                          s.num_cached,
                      "seq " + std::to_string(s.id) + ": hidden rows out of step with its KV");
      s.blocks.set_num_tokens(s.num_cached);
      s.blocks.truncate(*pool_, s.num_cached + 1);
      cache_full_blocks(s);
    }
    ev.finish = s.finish;
    ev.stop_token = s.stop_token;
    ev.stop_string = s.stop_string;
    events->push_back(std::move(ev));
  }

  // ---- the last hand-over of the sequences that finished in this step (needs_every_hidden_row) ----
  std::vector<DraftRequest> last;
  std::vector<Seq*> last_seq;
  for (const Planned& p : batch_plan) {
    Seq& s = *p.seq;
    if (!s.release_after_handover) continue;
    last_seq.push_back(&s);
    if (s.hidden.empty()) continue;
    DraftRequest r;
    r.seq_id = s.id;
    r.tokens = std::span<const int32_t>(s.tokens);
    r.prompt_len = s.prompt_len;
    r.num_tokens = 0;
    r.sampling = &s.params.sampling;
    r.hidden_begin = s.hidden_begin;
    r.hidden = std::span<const float>(s.hidden);
    r.hidden_size = hidden_size;
    last.push_back(r);
  }
  if (!last.empty()) {
    std::vector<DraftTree> ignored(last.size());
    const auto t1 = std::chrono::steady_clock::now();
    Status st = proposer_->propose(last, &ignored);
    stats_.draft_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
    // NOTE: the output is complete already: a failure here loses the proposer's copy of the
    // rows only, so it is a warning, not an error of the step.
    if (!st.ok()) get_logger("spec")->warn("proposer {} failed on the last hidden rows of finished sequences: {}", proposer_->name(), st.to_string());
  }
  for (Seq* s : last_seq) {
    s->hidden.clear();
    s->hidden_begin = 0;
    s->release_after_handover = false;
    proposer_->release(s->id);
  }
  return Status();
}

}  // namespace specserve
