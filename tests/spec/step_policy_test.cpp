// Tests for spec/step_policy.h: each row is a small StepState and StepLimits and the StepPlan
// the policy must return (TensorRT-LLM's table-driven scheduler tests). Block size 4 unless a
// row says otherwise; "R" is a running sequence, "W" a waiting one, "D" a decode entry, "P" a
// prefill entry.
#include "spec/step_policy.h"

#include <gtest/gtest.h>

#include <ostream>
#include <string>
#include <vector>

namespace specserve {

// Printers for readable failures (found by ADL).
void PrintTo(const ScheduledSeq& s, std::ostream* os) {
  *os << (s.is_prefill ? "P(" : "D(") << s.id << ", rows " << s.rows << ", drafts " << s.num_draft_tokens
      << (s.completes ? ", completes)" : ")");
}
bool operator==(const ScheduledSeq& a, const ScheduledSeq& b) {
  return a.id == b.id && a.is_prefill == b.is_prefill && a.rows == b.rows && a.num_draft_tokens == b.num_draft_tokens &&
         a.completes == b.completes;
}

namespace {

/// Running: num_tokens known, num_cached in the KV cache, num_blocks held, adaptive k, output left.
RunningSeq R(int64_t id, int32_t num_tokens, int32_t num_cached, int32_t num_blocks, int32_t k = 0, int32_t output_left = 100,
             int32_t priority = 0, int64_t waited = 0) {
  RunningSeq r;
  r.id = id;
  r.priority = priority;
  r.arrival = id;
  r.num_tokens = num_tokens;
  r.num_cached = num_cached;
  r.num_blocks = num_blocks;
  r.k = k;
  r.num_output_left = output_left;
  r.num_steps_waited = waited;
  return r;
}

/// A decoding running sequence (one uncached token) holding just the blocks of its cached tokens + 1.
RunningSeq Rdec(int64_t id, int32_t num_tokens, int32_t k = 0, int32_t output_left = 100, int32_t priority = 0) {
  return R(id, num_tokens, num_tokens - 1, (num_tokens + 3) / 4, k, output_left, priority);
}

WaitingSeq W(int64_t id, int32_t num_tokens, int32_t priority = 0, int64_t waited = 0) {
  WaitingSeq w;
  w.id = id;
  w.priority = priority;
  w.arrival = id;
  w.num_tokens = num_tokens;
  w.num_steps_waited = waited;
  return w;
}

/// A waiting sequence with a prefix-cache hit of num_cached tokens, of whose blocks `evictable`
/// are held by nobody now.
WaitingSeq Wc(int64_t id, int32_t num_tokens, int32_t num_cached, std::vector<int32_t> evictable) {
  WaitingSeq w = W(id, num_tokens);
  w.num_cached = num_cached;
  w.evictable_hit_blocks = std::move(evictable);
  return w;
}

/// `r` holding `blocks` together with other running sequences.
RunningSeq shared(RunningSeq r, std::vector<int32_t> blocks) {
  r.shared_blocks = std::move(blocks);
  return r;
}

ScheduledSeq D(int64_t id, int32_t k = 0) { return {id, false, 1 + k, k, true}; }
ScheduledSeq P(int64_t id, int32_t rows, bool completes) { return {id, true, rows, 0, completes}; }

StepState S(std::vector<RunningSeq> running, std::vector<WaitingSeq> waiting, int32_t num_free_blocks, int32_t block_size = 4) {
  StepState s;
  s.running = std::move(running);
  s.waiting = std::move(waiting);
  s.num_free_blocks = num_free_blocks;
  s.block_size = block_size;
  return s;
}

StepLimits L(int32_t max_num_seqs, int32_t budget) {
  StepLimits l;
  l.max_num_seqs = max_num_seqs;
  l.max_num_batched_tokens = budget;
  l.max_model_len = 1024;
  return l;
}

StepLimits spec(StepLimits l, int32_t k, int32_t disable_by_batch_size = 0) {
  l.num_speculative_tokens = k;
  l.has_proposer = true;
  l.disable_by_batch_size = disable_by_batch_size;
  return l;
}

StepLimits aging(StepLimits l, int32_t steps) {
  l.priority_aging_steps = steps;
  return l;
}

StepLimits model_len(StepLimits l, int32_t n) {
  l.max_model_len = n;
  return l;
}

struct Row {
  std::string name;
  StepState state;
  StepLimits limits;
  std::vector<int64_t> admitted;
  std::vector<int64_t> preempted;
  std::vector<ScheduledSeq> scheduled;
  bool speculate = false;
};

void PrintTo(const Row& r, std::ostream* os) { *os << r.name; }

void expect_plan(const StepPlan& got, const Row& r) {
  EXPECT_EQ(got.admitted, r.admitted) << r.name;
  EXPECT_EQ(got.preempted, r.preempted) << r.name;
  EXPECT_EQ(got.scheduled, r.scheduled) << r.name;
  EXPECT_EQ(got.speculate, r.speculate) << r.name;
  int32_t rows = 0;
  for (const ScheduledSeq& s : got.scheduled) rows += s.rows;
  EXPECT_EQ(got.num_batched_tokens, rows) << r.name;
  EXPECT_LE(got.num_batched_tokens, r.limits.max_num_batched_tokens) << r.name;
}

std::vector<Row> rows() {
  std::vector<Row> t;
  // ---- admission ----
  t.push_back({"admits_the_queue_when_blocks_are_free", S({}, {W(1, 10), W(2, 3)}, 10), L(8, 64),
               {1, 2}, {}, {P(1, 10, true), P(2, 3, true)}});
  // W1 needs ceil(11/4) = 3 blocks, W2 ceil(31/4) = 8 of the 3 left: it blocks W3 (1 block).
  t.push_back({"head_of_line_blocks_small_prompts_behind_a_big_one", S({}, {W(1, 10), W(2, 30), W(3, 2)}, 6), L(8, 64),
               {1}, {}, {P(1, 10, true)}});
  // The running sequence still needs ceil(9/4) - 2 = 1 block: 2 remain for W2's ceil(6/4) = 2.
  t.push_back({"admission_leaves_the_blocks_running_sequences_need", S({R(1, 9, 0, 2)}, {W(2, 5)}, 3), L(8, 64),
               {2}, {}, {P(1, 9, true), P(2, 5, true)}});
  t.push_back({"admission_refused_when_running_sequences_need_the_blocks", S({R(1, 9, 0, 2)}, {W(2, 5)}, 2), L(8, 64),
               {}, {}, {P(1, 9, true)}});
  // 1-token prompts need ceil(2/4) = 1 block each: the promise counts within one plan.
  t.push_back({"blocks_promised_in_the_same_plan_count", S({}, {W(1, 1), W(2, 1), W(3, 1)}, 2), L(8, 64),
               {1, 2}, {}, {D(1), D(2)}});
  t.push_back({"max_num_seqs", S({Rdec(1, 5), Rdec(2, 5)}, {W(3, 2), W(4, 2), W(5, 2)}, 20), L(3, 64),
               {3}, {}, {D(1), D(2), P(3, 2, true)}});
  // ---- priorities and aging ----
  t.push_back({"priority_order_then_fcfs", S({}, {W(1, 2, 1), W(2, 2, 0), W(3, 2, 0), W(4, 2, -1)}, 20), L(3, 64),
               {4, 2, 3}, {}, {P(4, 2, true), P(2, 2, true), P(3, 2, true)}});
  t.push_back({"head_of_line_holds_across_priorities", S({}, {W(1, 2, 1), W(2, 40, 0)}, 6), L(8, 64),
               {}, {}, {}});
  // W1 (priority 5) waited 50 steps: 5 - 50/10 = 0, and it arrived before W2.
  t.push_back({"aging_promotes_a_long_waiting_request", S({}, {W(1, 2, 5, 50), W(2, 2, 0, 0)}, 20), aging(L(1, 64), 10),
               {1}, {}, {P(1, 2, true)}});
  t.push_back({"aging_needs_the_full_period", S({}, {W(1, 2, 5, 49), W(2, 2, 0, 0)}, 20), aging(L(1, 64), 10),
               {2}, {}, {P(2, 2, true)}});
  t.push_back({"no_aging_when_off", S({}, {W(1, 2, 5, 1000), W(2, 2, 0, 0)}, 20), L(1, 64),
               {2}, {}, {P(2, 2, true)}});
  // The budget goes in rank order: the priority-0 prefill first.
  t.push_back({"budget_in_rank_order", S({R(1, 20, 0, 0, 0, 100, 1), R(2, 20, 0, 0, 0, 100, 0)}, {}, 20), L(8, 24),
               {}, {}, {P(2, 20, true), P(1, 4, false)}});
  // ---- budget, chunked prefill, decode first ----
  t.push_back({"decode_first_then_prefill_chunks", S({R(1, 30, 0, 0), Rdec(2, 9), R(3, 12, 4, 1)}, {}, 20), L(8, 16),
               {}, {}, {D(2), P(1, 15, false)}});
  t.push_back({"prefill_chunk_resumes_where_the_cache_ends", S({R(1, 30, 16, 4)}, {}, 20), L(8, 64),
               {}, {}, {P(1, 14, true)}});
  // Draft tokens count against the budget: 1 + 4, then 1 + min(4, 3 - 1), then nothing left.
  t.push_back({"budget_counts_draft_tokens", S({Rdec(1, 9, 4), Rdec(2, 9, 4), Rdec(3, 9, 4)}, {}, 20), spec(L(8, 8), 4),
               {}, {}, {D(1, 4), D(2, 2)}, true});
  t.push_back({"k_is_the_adaptive_k_capped_by_num_speculative_tokens", S({Rdec(1, 9, 2), Rdec(2, 9, 8)}, {}, 20), spec(L(8, 64), 5),
               {}, {}, {D(1, 2), D(2, 5)}, true});
  // Seq 1's request never speculates (GenerateParams::num_speculative_tokens 0: the engine
  // gives it k 0): one row, while seq 2 in the same step drafts its 3.
  t.push_back({"k_zero_never_drafts_next_to_one_that_does", S({Rdec(1, 9, 0), Rdec(2, 9, 3)}, {}, 20), spec(L(8, 64), 4),
               {}, {}, {D(1), D(2, 3)}, true});
  t.push_back({"k_capped_by_output_left", S({Rdec(1, 9, 4, 3), Rdec(2, 9, 4, 1)}, {}, 20), spec(L(8, 64), 4),
               {}, {}, {D(1, 2), D(2, 0)}, true});
  // max_model_len 20, 17 tokens known: at most 20 - 17 - 1 = 2 drafts (plus the bonus token).
  t.push_back({"k_capped_by_context", S({Rdec(1, 17, 4), Rdec(2, 19, 4)}, {}, 20), model_len(spec(L(8, 64), 4), 20),
               {}, {}, {D(1, 2), D(2, 0)}, true});
  t.push_back({"no_drafts_without_a_proposer", S({Rdec(1, 9, 4)}, {}, 20), L(8, 64),
               {}, {}, {D(1)}});
  t.push_back({"a_sequence_admitted_this_step_does_not_draft", S({}, {W(1, 1)}, 20), spec(L(8, 64), 4),
               {1}, {}, {D(1)}, true});
  // ---- disable_by_batch_size (counts the sequences running after admission) ----
  t.push_back({"disable_by_batch_size_off_above", S({Rdec(1, 9, 2), Rdec(2, 9, 2), Rdec(3, 9, 2)}, {}, 20), spec(L(8, 64), 2, 2),
               {}, {}, {D(1), D(2), D(3)}, false});
  t.push_back({"disable_by_batch_size_on_at", S({Rdec(1, 9, 2), Rdec(2, 9, 2)}, {}, 20), spec(L(8, 64), 2, 2),
               {}, {}, {D(1, 2), D(2, 2)}, true});
  t.push_back({"disable_by_batch_size_counts_admitted", S({Rdec(1, 9, 2), Rdec(2, 9, 2)}, {W(3, 4)}, 20), spec(L(8, 64), 2, 2),
               {3}, {}, {D(1), D(2), P(3, 4, true)}, false});
  // ---- KV blocks and preemption ----
  // Each running sequence needs one new block (9 tokens in 2 blocks), none is free, and
  // nothing is admitted. Seq 1's block comes from the last ranked, seq 2 (priority 1), which
  // frees 2; seq 3 takes the other; seq 4, now the last ranked, preempts itself.
  t.push_back({"preempts_lowest_priority_then_latest_arrival",
               S({R(1, 9, 8, 2), R(2, 9, 8, 2, 0, 100, 1), R(3, 9, 8, 2), R(4, 9, 8, 2)}, {W(5, 1)}, 0), L(8, 64),
               {}, {2, 4}, {D(1), D(3)}});
  // Seq 2 (decode, 2 new blocks) preempts seq 3 (1 block) and takes it with the free one; seq
  // 1's prefill (3 new blocks) then preempts seq 2, which returns those 2 and its own.
  t.push_back({"preempts_until_the_entry_fits",
               S({R(1, 17, 8, 2), R(2, 9, 8, 1), R(3, 9, 8, 1)}, {}, 1), L(8, 64),
               {}, {3, 2}, {P(1, 9, true)}});
  // Seq 2 is the last ranked and itself needs the block: its own entry leaves the plan.
  t.push_back({"self_preemption", S({R(1, 8, 7, 2), R(2, 9, 8, 2)}, {}, 0), L(8, 64),
               {}, {2}, {D(1)}});
  // Seq 2's decode took the only free block before seq 1's prefill (ranked first) needed two:
  // preempting seq 2 returns that block and its own, and its entry leaves the plan.
  t.push_back({"victim_entry_already_planned_returns_its_blocks", S({R(1, 16, 8, 2), R(2, 5, 4, 1)}, {}, 1), L(8, 64),
               {}, {2}, {P(1, 8, true)}});
  // A sequence left out by the budget still holds blocks: it is a victim like any other.
  t.push_back({"unscheduled_running_sequence_can_be_preempted", S({R(1, 9, 8, 2), R(2, 40, 0, 0), R(3, 30, 20, 5)}, {}, 0), L(8, 1),
               {}, {3}, {D(1)}});
  // Draft rows get only what is left and never preempt: seq 1's 4 drafts would need a new
  // block (8 + 4 > 8 slots); seq 2 keeps its drafts within its blocks (5 + 1 + 2 <= 8).
  t.push_back({"drafts_trimmed_to_free_blocks_never_preempt", S({R(1, 8, 7, 2, 4), R(2, 6, 5, 2, 2)}, {}, 0), spec(L(8, 64), 4),
               {}, {}, {D(1, 0), D(2, 2)}, true});
  // Seq 1 takes the one free block for its drafts; seq 2 keeps the 3 that fit its 12 slots.
  t.push_back({"drafts_take_the_blocks_left_in_rank_order", S({R(1, 8, 7, 2, 4), Rdec(2, 9, 4)}, {}, 1), spec(L(8, 64), 4),
               {}, {}, {D(1, 4), D(2, 3)}, true});
  // Block size 1: 5 free; seq 1 needs 1, admitted seq 2 promises 4 and uses 3; 1 block is left
  // for seq 1's drafts beyond its own token, so 1 of 3.
  t.push_back({"block_size_1", S({R(1, 9, 8, 8, 3)}, {W(2, 3)}, 5, 1), spec(L(8, 64), 3),
               {2}, {}, {D(1, 1), P(2, 3, true)}, true});
  // ---- prefix caching (block size 4) ----
  // W1 hit 8 of 10 tokens in 2 blocks nobody holds: ceil(11/4) - 2 new + 2 evictable = 3 blocks.
  t.push_back({"prefix_hit_prefill_starts_after_the_hit", S({}, {Wc(1, 10, 8, {5, 6})}, 3), L(8, 64),
               {1}, {}, {P(1, 2, true)}});
  t.push_back({"evictable_hit_blocks_are_not_free_for_its_admission", S({}, {Wc(1, 10, 8, {5, 6})}, 2), L(8, 64),
               {}, {}, {}});
  // W2's hit blocks are held by seq 1 (not evictable): it needs only its 1 new block.
  t.push_back({"hit_on_blocks_a_running_sequence_holds_costs_nothing",
               S({shared(Rdec(1, 9), {0, 1})}, {Wc(2, 10, 8, {})}, 1), L(8, 64),
               {2}, {}, {D(1), P(2, 2, true)}});
  // A hit leaving one uncached token is a decode entry from the start.
  t.push_back({"hit_leaving_the_last_token_is_a_decode_entry", S({}, {Wc(1, 9, 8, {0, 1})}, 3), L(8, 64),
               {1}, {}, {D(1)}});
  // Two admissions hitting the same evictable blocks claim them once: 3 + 1 blocks of 4.
  t.push_back({"an_evictable_hit_shared_by_two_admissions_counts_once",
               S({}, {Wc(1, 9, 8, {0, 1}), Wc(2, 9, 8, {0, 1})}, 4), L(8, 64),
               {1, 2}, {}, {D(1), D(2)}});
  // Seq 2 claims evictable block 9 (1 of the 2 free); its last token takes the other, so seq
  // 1's drafts (a new block) get none.
  t.push_back({"drafts_do_not_take_evictable_blocks_admission_claimed",
               S({R(1, 8, 7, 2, 4)}, {Wc(2, 5, 4, {9})}, 2), spec(L(8, 64), 4),
               {2}, {}, {D(1, 0), D(2)}, true});
  // Preempting seq 2 (last ranked) frees only its unshared block, which seq 1 takes; seq 3
  // then has to preempt itself. (Unshared, seq 2's 2 blocks would have served both.)
  t.push_back({"preempting_a_sharer_frees_only_its_own_blocks",
               S({shared(R(1, 9, 8, 2), {0}), shared(R(2, 9, 8, 2, 0, 100, 1), {0}), R(3, 9, 8, 2)}, {}, 0), L(8, 64),
               {}, {2, 3}, {D(1)}});
  // Seq 3 and seq 2 share their only block: it frees with the second of them.
  t.push_back({"a_shared_block_frees_with_its_last_holder",
               S({R(1, 9, 8, 2), shared(R(2, 5, 4, 1, 0, 100, 1), {7}), shared(R(3, 5, 4, 1, 0, 100, 1), {7})}, {}, 0), L(8, 64),
               {}, {3, 2}, {D(1)}});
  return t;
}

class StepPolicyTable : public ::testing::TestWithParam<Row> {};

TEST_P(StepPolicyTable, Plan) {
  const Row& r = GetParam();
  auto got = plan_step(r.state, r.limits);
  ASSERT_TRUE(got.ok()) << r.name << ": " << got.status().to_string();
  expect_plan(*got, r);
  // plan_admission (what Engine::add_migrated asks) is rule 2 alone: the same admissions.
  EXPECT_EQ(plan_admission(r.state, r.limits), r.admitted) << r.name;
}

INSTANTIATE_TEST_SUITE_P(Rows, StepPolicyTable, ::testing::ValuesIn(rows()),
                         [](const ::testing::TestParamInfo<Row>& i) { return i.param.name; });

TEST(StepPolicy, LoneSequenceTooBigForTheCache) {
  // 16 tokens cached in all 4 blocks of the pool, nothing free: the next token has nowhere to go.
  auto got = plan_step(S({R(1, 17, 16, 4)}, {}, 0), L(8, 64));
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(got.status().message().find("seq 1"), std::string::npos) << got.status().message();
  // With others running, they are preempted first; then the same error.
  got = plan_step(S({R(1, 17, 16, 4, 0, 100, 0), R(2, 5, 0, 0, 0, 100, 1)}, {}, 0), L(8, 64));
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), StatusCode::kResourceExhausted);
}

TEST(StepPolicy, AgingEndsStarvation) {
  // A stream of fresh priority-0 requests keeps one slot busy; the priority-3 request waits.
  // Simulated over steps: each step the running request finishes and a new one arrives.
  StepLimits lim = aging(L(1, 64), 4);
  WaitingSeq low = W(1, 2, 3);
  int64_t next_id = 2;
  int admitted_at = -1;
  for (int step = 0; step < 40 && admitted_at < 0; ++step) {
    auto plan = plan_step(S({}, {low, W(next_id, 2, 0)}, 20), lim);
    ASSERT_TRUE(plan.ok());
    ASSERT_EQ(plan->admitted.size(), 1u);
    if (plan->admitted[0] == low.id) admitted_at = step;
    ++next_id;
    ++low.num_steps_waited;
  }
  // 3 - floor(12 / 4) = 0 ties with the fresh request, and the old one arrived first.
  EXPECT_EQ(admitted_at, 12);
  // Without aging it never runs.
  lim.priority_aging_steps = 0;
  low.num_steps_waited = 1000;
  auto plan = plan_step(S({}, {low, W(next_id, 2, 0)}, 20), lim);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->admitted, std::vector<int64_t>{next_id});
}

TEST(StepPolicy, AgedPriorityHoldsWhenRunning) {
  // Seq 1 (priority 3) was promoted by 40 waited steps (3 - 40/10 = -1): once running it ranks
  // before the fresh priority-0 seq 2, which is the victim when blocks run short.
  auto got = plan_step(S({R(1, 9, 8, 2, 0, 100, 3, 40), R(2, 9, 8, 2, 0, 100, 0, 0)}, {}, 1), aging(L(8, 64), 10));
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->preempted, std::vector<int64_t>{2});
  EXPECT_EQ(got->scheduled, std::vector<ScheduledSeq>{D(1)});
}

// ---- plan_prefill_after_drafts ------------------------------------------------------------

TEST(StepPolicyAfterDrafts, UnusedDraftBudgetGoesToPrefill) {
  // Budget 12: seq 1 decodes with 4 drafts (5 rows), seq 2 prefills 7 of its 20 tokens.
  const StepState st = S({Rdec(1, 9, 4), R(2, 20, 0, 0)}, {}, 20);
  const StepLimits lim = spec(L(8, 12), 4);
  auto plan = plan_step(st, lim);
  ASSERT_TRUE(plan.ok());
  ASSERT_EQ(plan->scheduled, (std::vector<ScheduledSeq>{D(1, 4), P(2, 7, false)}));
  // The proposer found 1 draft token: 3 rows go back, to seq 2's chunk.
  const std::vector<int32_t> drafted = {1, 0};
  StepPlan after = plan_prefill_after_drafts(st, lim, *plan, drafted);
  EXPECT_EQ(after.scheduled, (std::vector<ScheduledSeq>{D(1, 1), P(2, 10, false)}));
  EXPECT_EQ(after.num_batched_tokens, 12);
  // No drafts at all: 4 rows back.
  after = plan_prefill_after_drafts(st, lim, *plan, std::vector<int32_t>{0, 0});
  EXPECT_EQ(after.scheduled, (std::vector<ScheduledSeq>{D(1, 0), P(2, 11, false)}));
}

TEST(StepPolicyAfterDrafts, LeftOutSequencesFirstDecodesThenPrefill) {
  // Budget 5: seq 1 takes all of it (1 + 4 drafts); seq 2 (decode) and seq 3 (prefill) wait.
  const StepState st = S({Rdec(1, 9, 4), Rdec(2, 9, 4), R(3, 6, 0, 0)}, {}, 20);
  const StepLimits lim = spec(L(8, 5), 4);
  auto plan = plan_step(st, lim);
  ASSERT_TRUE(plan.ok());
  ASSERT_EQ(plan->scheduled, (std::vector<ScheduledSeq>{D(1, 4)}));
  StepPlan after = plan_prefill_after_drafts(st, lim, *plan, std::vector<int32_t>{0});
  // 4 rows back: a decode row for seq 2 (no drafts: they were not asked for), 3 for seq 3.
  EXPECT_EQ(after.scheduled, (std::vector<ScheduledSeq>{D(1, 0), D(2, 0), P(3, 3, false)}));
  EXPECT_EQ(after.num_batched_tokens, 5);
}

TEST(StepPolicyAfterDrafts, LimitedByFreeBlocks) {
  // Seq 2 prefills 4 tokens into its 1 free block; the budget returned could take 4 more
  // tokens, but no block is left for them.
  const StepState st = S({Rdec(1, 5, 4), R(2, 20, 0, 0)}, {}, 1, 4);
  const StepLimits lim = spec(L(8, 9), 4);
  auto plan = plan_step(st, lim);
  ASSERT_TRUE(plan.ok());
  // Seq 1 holds 2 blocks (8 slots) with 4 cached: they take its last token and 3 of 4 drafts.
  ASSERT_EQ(plan->scheduled, (std::vector<ScheduledSeq>{D(1, 3), P(2, 4, false)}));
  StepPlan after = plan_prefill_after_drafts(st, lim, *plan, std::vector<int32_t>{0, 0});
  EXPECT_EQ(after.scheduled, (std::vector<ScheduledSeq>{D(1, 0), P(2, 4, false)}));
}

TEST(StepPolicyAfterDrafts, SharedBlocksOfAPreemptedSequenceStayHeld) {
  // Seq 2 (last ranked) shares block 0 with seq 1: preempting it frees 1 block, which seq 1's
  // decode takes (its drafts fit 3 of 8 in its blocks). Seq 3's prefill waits for the budget.
  const StepState st =
      S({shared(R(1, 9, 8, 2, 8), {0}), shared(R(2, 9, 8, 2, 0, 100, 2), {0}), R(3, 12, 4, 2, 0, 100, 1)}, {}, 0);
  const StepLimits lim = spec(L(8, 9), 8);
  auto plan = plan_step(st, lim);
  ASSERT_TRUE(plan.ok());
  ASSERT_EQ(plan->preempted, std::vector<int64_t>{2});
  ASSERT_EQ(plan->scheduled, std::vector<ScheduledSeq>{D(1, 3)});
  // No drafts: 8 rows back. No block is free (block 0 stays with seq 1), so seq 3 fills only
  // the 4 slots of its own blocks — not 8, as if preempting seq 2 had freed both its blocks.
  StepPlan after = plan_prefill_after_drafts(st, lim, *plan, std::vector<int32_t>{0});
  EXPECT_EQ(after.scheduled, (std::vector<ScheduledSeq>{D(1, 0), P(3, 4, false)}));
}

TEST(StepPolicyAfterDrafts, KeepsAdmissionAndPreemption) {
  const StepState st = S({R(1, 9, 8, 2), R(2, 9, 8, 2, 0, 100, 1)}, {}, 0);
  const StepLimits lim = L(8, 64);
  auto plan = plan_step(st, lim);
  ASSERT_TRUE(plan.ok());
  ASSERT_EQ(plan->preempted, std::vector<int64_t>{2});
  StepPlan after = plan_prefill_after_drafts(st, lim, *plan, std::vector<int32_t>{0});
  EXPECT_EQ(after.preempted, std::vector<int64_t>{2});
  // Seq 2's freed blocks are free, but it is preempted: it does not come back this step.
  EXPECT_EQ(after.scheduled, std::vector<ScheduledSeq>{D(1)});
}

}  // namespace
}  // namespace specserve
