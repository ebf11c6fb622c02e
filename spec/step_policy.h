// specserve spec: the per-step scheduling policy of the Engine — which waiting sequences are
// admitted, how many rows each running sequence gets in this step's forward pass (prefill
// chunk, or the last token plus the draft tokens it may propose), and which sequences are
// preempted when the KV cache runs short.
//
// Pure: no threads, no I/O, no engine types. The Engine snapshots its queues into a StepState,
// calls plan_step(), applies the StepPlan (admit, preempt, reserve KV blocks), asks the proposer
// for drafts, and hands the draft budget it did not use to plan_prefill_after_drafts(). Every
// rule is tested as a table of `state -> plan` (tests/spec/step_policy_test.cpp), in the manner
// of TensorRT-LLM's capacity scheduler and vLLM v1's `Scheduler.schedule()`.
//
// NOTE: the policy lives in spec/, not scheduler/, because spec/engine*.cpp use it and spec/
// may not include scheduler/ (DESIGN.md section 1).
//
// Rules of plan_step, in order (units: tokens and KV blocks; "before" = handled first):
//   1. Order. Sequences are ranked by (effective priority, arrival, id): a lower value first
//      (vLLM's meaning), first come first served within a priority. The effective priority is
//      priority - floor(num_steps_waited / priority_aging_steps), where num_steps_waited counts
//      every step the sequence spent in the waiting queue since it arrived (preemptions
//      included), so a low-priority request is never starved forever. The same rank orders
//      admission, the budget, and (reversed) preemption: a request promoted by waiting keeps
//      its place once it runs.
//   2. Admission. Waiting sequences are admitted in rank order while fewer than max_num_seqs
//      run and the head's KV blocks fit in the free blocks left after (a) the blocks every
//      running sequence still needs to hold its known tokens and (b) the blocks promised to
//      sequences admitted earlier in this plan. The head's blocks are its new ones,
//      ceil((num_tokens + 1) / block_size) — its known tokens plus the first new one — less its
//      prefix-cache hit blocks (num_cached / block_size, which it shares), plus its hit blocks
//      that are evictable now (WaitingSeq::evictable_hit_blocks: counted in num_free_blocks,
//      they stop being free once it holds them; one claimed by an earlier admission of this
//      plan is not counted twice). The first one that does not fit stops admission
//      (head-of-line blocking): a big prompt is never overtaken forever by small ones.
//      Admission does not preempt running sequences. A sequence drafts from its second step
//      on (an admitted sequence's entry has no draft rows). An admitted sequence starts with
//      its hit: num_cached tokens in the cache, so rules 4 and 5 plan only the rest (a hit that
//      leaves one uncached token makes it a decode entry).
//   3. Speculation is on for this step when there is a proposer, num_speculative_tokens > 0
//      and (disable_by_batch_size == 0 or the sequences running after admission number at most
//      disable_by_batch_size).
//   4. Decode first. Every sequence with exactly one token not yet in the KV cache, in rank
//      order while the budget (max_num_batched_tokens) lasts, gets 1 row plus k draft rows:
//      k = min(its k, num_speculative_tokens, output tokens left - 1,
//      max_model_len - num_tokens - 1, budget left - 1), at least 0 — draft tokens count
//      against the budget like any other token (vLLM v1). "Its k" (RunningSeq::k) is the
//      sequence's adaptive k within its request's cap, so a request's per-request
//      num_speculative_tokens holds here: k 0 (a request that never speculates) gets 1 row and
//      no drafts while others in the same step draft; such a sequence still counts toward
//      disable_by_batch_size (it is part of the batch).
//   5. Prefill next. Every sequence with more than one uncached token, in rank order, gets a
//      chunk of min(uncached tokens, budget left) rows (chunked prefill).
//   6. KV blocks. Each entry needs the blocks for num_cached + rows tokens less those it holds.
//      The free blocks are num_free_blocks less the evictable hit blocks that admission claimed.
//      First every entry's own tokens (its rows without draft rows), in plan order: when they
//      are not free, running sequences are preempted (recompute: all their blocks released, back
//      to the waiting queue; a block another live sequence shares — RunningSeq::shared_blocks —
//      frees only with its last holder), victims ranked last first — the highest effective priority value,
//      then the latest arrival (vLLM's order) — until the entry fits. The victim may be the
//      entry's own sequence: then its entry leaves the plan (self-preemption). A preempted
//      sequence's entry leaves the plan; the budget it held is not handed out again here (only
//      plan_prefill_after_drafts may use it). Then the draft rows, in plan order, get the blocks that are left: a decode entry
//      whose drafts do not fit loses the draft rows that need new blocks. Draft rows never
//      preempt anything. (Rule 2's accounting means a step that admits never preempts.)

#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/status.h"

namespace specserve {

/// A sequence in the waiting queue (never run, or preempted: it holds no KV blocks).
struct WaitingSeq {
  int64_t id = 0;
  int32_t priority = 0;          ///< lower is handled first
  int64_t arrival = 0;           ///< arrival order: smaller arrived earlier (ties broken by id)
  int32_t num_tokens = 0;        ///< prompt + output tokens known, >= 1 (all need KV before it samples)
  int64_t num_steps_waited = 0;  ///< steps spent waiting since it arrived (all waits added), for aging
  /// Prefix-cache hit: leading tokens whose KV is cached now (whole blocks, a multiple of
  /// block_size, < num_tokens: the last known token is always computed). 0: no hit.
  int32_t num_cached = 0;
  /// Ids of the hit blocks that nobody holds now (evictable: counted in num_free_blocks, taken
  /// out of it when this sequence is admitted). Size <= num_cached / block_size.
  std::vector<int32_t> evictable_hit_blocks;
};

/// A running sequence (admitted: it may hold KV blocks).
struct RunningSeq {
  int64_t id = 0;
  int32_t priority = 0;
  int64_t arrival = 0;
  int32_t num_tokens = 0;        ///< prompt + output tokens known, >= 1
  int32_t num_cached = 0;        ///< tokens whose KV is in the cache, < num_tokens
  int32_t num_blocks = 0;        ///< KV blocks it holds (they free on preemption unless shared)
  /// Ids of the blocks it holds that other running sequences hold too (prefix-cache sharing):
  /// preempting it frees such a block only when every holder is preempted.
  std::vector<int32_t> shared_blocks;
  /// Draft tokens it would like this step: its adaptive k, which the Engine keeps within the
  /// request's own cap (GenerateParams::num_speculative_tokens); 0: it never drafts (rule 4).
  int32_t k = 0;
  int32_t num_output_left = 1;   ///< max_tokens - output tokens so far, >= 1
  int64_t num_steps_waited = 0;  ///< steps it spent waiting since it arrived, for aging
};

/// Everything plan_step looks at, snapshot at the start of a step.
struct StepState {
  std::vector<RunningSeq> running;
  std::vector<WaitingSeq> waiting;
  int32_t num_free_blocks = 0;   ///< free KV blocks in the pool (evictable cached blocks included)
  int32_t block_size = 16;       ///< tokens per KV block, >= 1
};

/// Engine limits that bound a step (EngineOptions' names and meanings).
struct StepLimits {
  int32_t max_num_seqs = 64;             ///< sequences running at once, >= 1
  int32_t max_num_batched_tokens = 2048; ///< rows of one forward pass (prefill + decode + draft), >= 1
  int32_t max_model_len = 2048;          ///< tokens a sequence may hold, prompt + output
  int32_t num_speculative_tokens = 0;    ///< k cap; 0 turns speculation off
  int32_t disable_by_batch_size = 0;     ///< > 0: no speculation while more sequences run
  bool has_proposer = false;             ///< false: no speculation
  int32_t priority_aging_steps = 0;      ///< > 0: a waiting sequence gains a level per this many steps; 0 = no aging
};

/// One sequence's share of the step's forward pass.
struct ScheduledSeq {
  int64_t id = 0;
  bool is_prefill = false;        ///< prefill chunk (more than one uncached token) or decode
  int32_t rows = 0;               ///< tokens fed: prefill: the chunk; decode: 1 + num_draft_tokens
  int32_t num_draft_tokens = 0;   ///< decode: draft tokens it may propose (rows reserve them); prefill: 0
  bool completes = false;         ///< the rows reach its last known token, so the step samples for it
};

/// What one step does. Ids refer to the StepState given.
struct StepPlan {
  std::vector<int64_t> admitted;      ///< waiting ids to start running, in admission order
  std::vector<int64_t> preempted;     ///< running ids to preempt (recompute), in preemption order
  std::vector<ScheduledSeq> scheduled;  ///< decode entries first, then prefill entries; each id once
  int32_t num_batched_tokens = 0;     ///< sum of rows (draft rows included)
  bool speculate = false;             ///< rule 3 held for this step
};

/// Rule 2 alone: the waiting ids that plan_step(state, limits) would admit, in admission order.
/// The Engine asks it whether a migrated sequence may start running with its imported KV now
/// (Engine::add_migrated), so that it is admitted exactly as any other waiting sequence.
/// Preconditions: those of plan_step.
std::vector<int64_t> plan_admission(const StepState& state, const StepLimits& limits);

/// Plans one step of the Engine from `state` under `limits` (rules 1-6 above).
/// Preconditions (a broken one aborts: the Engine builds the state): block_size >= 1,
/// max_num_seqs >= 1, max_num_batched_tokens >= 1, ids unique, every running sequence has
/// 0 <= num_cached < num_tokens and num_output_left >= 1, every waiting one num_tokens >= 1
/// and 0 <= num_cached < num_tokens, num_cached a multiple of block_size, at most
/// num_cached / block_size evictable hit blocks.
/// Errors: kResourceExhausted when a sequence does not fit in the KV cache even with every
/// other running sequence preempted and no draft rows (num_cached + rows tokens need more
/// blocks than the pool has free with nothing else held) — the cache is too small for it.
Expected<StepPlan> plan_step(const StepState& state, const StepLimits& limits);

/// Hands the draft budget that the proposer did not use back to prefill, after plan_step.
/// `num_drafted[i]` is the number of draft tokens actually proposed for `plan.scheduled[i]`
/// (<= its num_draft_tokens; 0 for prefill entries); size == plan.scheduled.size().
/// Returns the plan with each decode entry's num_draft_tokens and rows set to what was drafted,
/// and the rows that freed (max_num_batched_tokens - new total) given, in plan order, first to
/// running sequences (or sequences admitted by `plan`) with one uncached token that the plan
/// left out (a decode row each, no drafts), then to extend prefill chunks that do not complete,
/// then to prefill sequences the plan left out — each only while the KV blocks it needs are
/// free (free blocks of `state`, less the evictable hit blocks the admitted ones claim, plus
/// those `plan.preempted` frees, less every entry's need). It
/// never admits or preempts. Aborts when num_drafted does not match the plan.
StepPlan plan_prefill_after_drafts(const StepState& state, const StepLimits& limits, StepPlan plan,
                                   std::span<const int32_t> num_drafted);

}  // namespace specserve
