// Table-driven tests of the head's dispatch policy (scheduler/dispatch.h): each row is
// `queue, replicas, now, options -> expected plan`, in the style of TensorRT-LLM's scheduler tests.
#include "scheduler/dispatch.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

namespace specserve {
namespace {

/// A queued request: id, priority, arrival_seq, enqueued_at_s, num_tokens.
QueuedRequest req(int64_t id, int32_t priority, int64_t arrival, double enqueued_at_s, int32_t num_tokens) {
  QueuedRequest r;
  r.id = id;
  r.priority = priority;
  r.arrival_seq = arrival;
  r.enqueued_at_s = enqueued_at_s;
  r.num_tokens = num_tokens;
  r.max_new_tokens = 16;
  return r;
}

/// `r`, handed back by replica `from` (QueuedRequest::avoid_replica).
QueuedRequest avoiding(QueuedRequest r, int32_t from) {
  r.avoid_replica = from;
  return r;
}

/// A replica: id, ready, free blocks, total blocks, num_assigned, max_num_seqs, max_model_len, block_size.
ReplicaLoad rep(int32_t id, bool ready, int32_t free_blocks, int32_t total_blocks = 100, int32_t num_assigned = 0,
                int32_t max_num_seqs = 8, int32_t max_model_len = 1024, int32_t block_size = 16) {
  ReplicaLoad r;
  r.replica = id;
  r.ready = ready;
  r.free_kv_blocks = free_blocks;
  r.total_kv_blocks = total_blocks;
  r.block_size = block_size;
  r.num_assigned = num_assigned;
  r.max_num_seqs = max_num_seqs;
  r.max_model_len = max_model_len;
  return r;
}

struct Reject {
  int64_t id;
  std::string reason_contains;  ///< every piece separated by '|' must appear in the reason
};

struct Case {
  std::string name;
  std::vector<QueuedRequest> queue;
  std::vector<ReplicaLoad> replicas;
  double now_s = 100.0;
  DispatchOptions options;
  std::vector<std::pair<int64_t, int32_t>> assign;  ///< (request, replica) in dispatch order
  std::vector<Reject> reject;
  int64_t blocked = -1;
};

DispatchOptions opts(double aging_s, int32_t max_queued = 2) {
  DispatchOptions o;
  o.aging_s = aging_s;
  o.max_queued_per_replica = max_queued;
  return o;
}

// Token counts: 10 tokens -> 1 block of 16, 20 -> 2, 40 -> 3, 100 -> 7, 159 -> 10.
std::vector<Case> cases() {
  const DispatchOptions dflt;
  return {
      // ---- order ----
      {"lower_priority_value_goes_first", {req(1, 1, 0, 100, 10), req(2, 0, 1, 100, 10)}, {rep(0, true, 1)}, 100, dflt,
       {{2, 0}}, {}, 1},
      {"all_fit_in_priority_order", {req(1, 1, 0, 100, 10), req(2, 0, 1, 100, 10), req(3, -1, 2, 100, 10)},
       {rep(0, true, 50)}, 100, dflt, {{3, 0}, {2, 0}, {1, 0}}, {}, -1},
      {"fcfs_among_equal_priority", {req(1, 0, 5, 100, 10), req(2, 0, 3, 100, 10)}, {rep(0, true, 1)}, 100, dflt,
       {{2, 0}}, {}, 1},
      {"requeued_request_keeps_its_arrival_and_goes_first",
       {req(7, 0, 20, 100, 10), req(8, 0, 21, 100, 10), req(3, 0, 2, 100, 300)}, {rep(0, true, 100)}, 100, dflt,
       {{3, 0}, {7, 0}, {8, 0}}, {}, -1},
      {"equal_priority_and_arrival_by_id", {req(9, 0, 1, 100, 10), req(4, 0, 1, 100, 10)}, {rep(0, true, 1)}, 100,
       dflt, {{4, 0}}, {}, 9},
      // ---- aging ----
      // Waited 30 s at aging 10 s: effective 2 - 3 = -1 beats a fresh priority 0.
      {"aging_beats_starvation", {req(1, 0, 9, 100, 10), req(2, 2, 0, 70, 10)}, {rep(0, true, 1)}, 100, opts(10),
       {{2, 0}}, {}, 1},
      // Waited 19 s: effective 2 - 1 = 1, still behind priority 0.
      {"aging_partial_wait_not_enough", {req(1, 0, 9, 100, 10), req(2, 2, 0, 81, 10)}, {rep(0, true, 1)}, 100,
       opts(10), {{1, 0}}, {}, 2},
      // Waited 20 s exactly: effective 0 ties priority 0, and the earlier arrival wins.
      {"aging_tie_then_arrival", {req(1, 0, 9, 100, 10), req(2, 2, 0, 80, 10)}, {rep(0, true, 1)}, 100, opts(10),
       {{2, 0}}, {}, 1},
      {"aging_off", {req(1, 0, 9, 100, 10), req(2, 2, 0, 0, 10)}, {rep(0, true, 1)}, 100, opts(0), {{1, 0}}, {}, 2},
      {"enqueued_in_the_future_counts_as_no_wait", {req(1, 0, 9, 100, 10), req(2, 1, 0, 500, 10)}, {rep(0, true, 1)},
       100, opts(10), {{1, 0}}, {}, 2},
      // ---- head-of-line blocking ----
      {"big_head_blocks_small_behind", {req(1, 0, 0, 100, 159), req(2, 0, 1, 100, 10), req(3, 0, 2, 100, 10)},
       {rep(0, true, 5)}, 100, dflt, {}, {}, 1},
      {"head_fits_then_next_blocks_the_rest",
       {req(1, 0, 0, 100, 10), req(2, 0, 1, 100, 100), req(3, 0, 2, 100, 10)}, {rep(0, true, 5)}, 100, dflt,
       {{1, 0}}, {}, 2},
      // ---- readiness ----
      {"not_ready_replica_skipped", {req(1, 0, 0, 100, 10)}, {rep(0, false, 100), rep(1, true, 5)}, 100, dflt,
       {{1, 1}}, {}, -1},
      {"no_ready_replica_assigns_nothing", {req(1, 0, 0, 100, 10), req(2, 0, 1, 100, 10)},
       {rep(0, false, 100), rep(1, false, 100)}, 100, dflt, {}, {}, 1},
      {"no_replicas_rejects_nothing", {req(1, 0, 0, 100, 100000)}, {}, 100, dflt, {}, {}, 1},
      // ---- block accounting within one plan ----
      {"blocks_promised_earlier_count", {req(1, 0, 0, 100, 20), req(2, 0, 1, 100, 20), req(3, 0, 2, 100, 20)},
       {rep(0, true, 4)}, 100, dflt, {{1, 0}, {2, 0}}, {}, 3},
      // 15 tokens + 1 new = 16 positions = 1 block; 16 tokens + 1 = 17 -> 2 blocks.
      {"plus_one_position_boundary", {req(1, 0, 0, 100, 15), req(2, 0, 1, 100, 16)}, {rep(0, true, 2)}, 100, dflt,
       {{1, 0}}, {}, 2},
      {"per_replica_block_size", {req(1, 0, 0, 100, 40)}, {rep(0, true, 2, 100, 0, 8, 1024, 16),
                                                          rep(1, true, 2, 100, 0, 8, 1024, 32)},
       100, dflt, {{1, 1}}, {}, -1},
      // ---- least-loaded choice ----
      // 2 blocks each: 13 -> 11 -> 9 on replica 1, then replica 0 (10 free) has the most.
      {"most_free_blocks_after_plan", {req(1, 0, 0, 100, 20), req(2, 0, 1, 100, 20), req(3, 0, 2, 100, 20)},
       {rep(0, true, 10), rep(1, true, 13)}, 100, dflt, {{1, 1}, {2, 1}, {3, 0}}, {}, -1},
      {"tie_on_blocks_fewest_assigned", {req(1, 0, 0, 100, 10)}, {rep(0, true, 10, 100, 3), rep(1, true, 10, 100, 1)},
       100, dflt, {{1, 1}}, {}, -1},
      {"tie_on_everything_lowest_id", {req(1, 0, 0, 100, 10), req(2, 0, 1, 100, 10)},
       {rep(5, true, 10), rep(2, true, 10)}, 100, dflt, {{1, 2}, {2, 5}}, {}, -1},
      {"only_replica_long_enough", {req(1, 0, 0, 100, 600)}, {rep(0, true, 90, 100, 0, 8, 512), rep(1, true, 50)},
       100, dflt, {{1, 1}}, {}, -1},
      // ---- max_num_seqs + local queue ----
      // max_num_seqs 2, 1 on it, 2 queued allowed: 3 more fit.
      {"max_num_seqs_plus_queue", {req(1, 0, 0, 100, 10), req(2, 0, 1, 100, 10), req(3, 0, 2, 100, 10),
                                   req(4, 0, 3, 100, 10)},
       {rep(0, true, 100, 100, 1, 2)}, 100, opts(10, 2), {{1, 0}, {2, 0}, {3, 0}}, {}, 4},
      {"max_num_seqs_no_queue", {req(1, 0, 0, 100, 10), req(2, 0, 1, 100, 10)}, {rep(0, true, 100, 100, 1, 2)}, 100,
       opts(10, 0), {{1, 0}}, {}, 2},
      // Replica 0 has the larger cache but a full batch (2 of 2): the request would wait there,
      // while it runs at once on replica 1 (1 of 2). Then both batches are full: most free blocks.
      {"free_batch_slot_beats_more_free_blocks", {req(1, 0, 0, 100, 10), req(2, 0, 1, 100, 10)},
       {rep(0, true, 100, 100, 2, 2), rep(1, true, 10, 100, 1, 2)}, 100, opts(10, 2), {{1, 1}, {2, 0}}, {}, -1},
      {"full_replica_spills_to_next", {req(1, 0, 0, 100, 10), req(2, 0, 1, 100, 10)},
       {rep(0, true, 100, 100, 2, 2), rep(1, true, 10, 100, 0, 1)}, 100, opts(10, 0), {{1, 1}}, {}, 2},
      // ---- hand-backs (rule 6) ----
      // Request 1 was handed back by replica 0: it goes to replica 1 although replica 0 has more
      // free blocks; request 2 (no origin) still takes the most free blocks.
      {"handed_back_request_avoids_its_origin", {avoiding(req(1, 0, 0, 100, 10), 0), req(2, 0, 1, 100, 10)},
       {rep(0, true, 50), rep(1, true, 10)}, 100, dflt, {{1, 1}, {2, 0}}, {}, -1},
      // ...but goes back when it fits nowhere else (replica 1's cache is too small for it).
      {"handed_back_request_returns_when_nothing_else_fits", {avoiding(req(1, 0, 0, 100, 40), 0)},
       {rep(0, true, 50), rep(1, true, 2)}, 100, dflt, {{1, 0}}, {}, -1},
      // A free batch slot elsewhere is not needed: avoiding the origin comes first.
      {"handed_back_request_avoids_origin_even_to_wait", {avoiding(req(1, 0, 0, 100, 10), 0)},
       {rep(0, true, 50, 100, 0, 2), rep(1, true, 10, 100, 2, 2)}, 100, opts(10, 2), {{1, 1}}, {}, -1},
      // ---- rejects ----
      {"reject_longer_than_every_max_model_len", {req(1, 0, 0, 100, 4096), req(2, 0, 1, 100, 10)},
       {rep(0, true, 100, 1000, 0, 8, 4096), rep(1, true, 100, 1000, 0, 8, 2048)}, 100, dflt, {{2, 0}},
       {{1, "4097 token positions|4096 known|max_model_len|4096"}}, -1},
      {"reject_more_blocks_than_every_cache", {req(1, 0, 0, 100, 500), req(2, 0, 1, 100, 10)},
       {rep(0, true, 20, 20), rep(1, false, 30, 30)}, 100, dflt, {{2, 0}},
       {{1, "needs 32 KV blocks|30 blocks"}}, -1},
      {"not_ready_big_replica_prevents_reject", {req(1, 0, 0, 100, 500), req(2, 0, 1, 100, 10)},
       {rep(0, true, 20, 20), rep(1, false, 40, 40)}, 100, dflt, {}, {}, 1},
      {"reject_behind_blocked_head_still_reported", {req(1, 0, 0, 100, 159), req(2, 0, 1, 100, 5000)},
       {rep(0, true, 5)}, 100, dflt, {}, {{2, "5001 token positions|1024"}}, 1},
      {"kv_fits_only_where_length_fails",  // length fits replica 1 only, and its cache is too small
       {req(1, 0, 0, 100, 1000)}, {rep(0, true, 100, 100, 0, 8, 512), rep(1, true, 10, 10, 0, 8, 2048)}, 100, dflt,
       {}, {{1, "needs 63 KV blocks|holds 10 blocks"}}, -1},
      {"bad_block_size_replica_ignored", {req(1, 0, 0, 100, 10)}, {rep(0, true, 100, 100, 0, 8, 1024, 0), rep(1, true, 5)},
       100, dflt, {{1, 1}}, {}, -1},
  };
}

class DispatchTable : public ::testing::TestWithParam<Case> {};

void expect_plan(const Case& c, const DispatchPlan& p) {
  std::vector<std::pair<int64_t, int32_t>> got;
  for (const Assignment& a : p.assign) got.emplace_back(a.request_id, a.replica);
  EXPECT_EQ(got, c.assign);
  ASSERT_EQ(p.reject.size(), c.reject.size());
  for (size_t i = 0; i < c.reject.size(); ++i) {
    EXPECT_EQ(p.reject[i].first, c.reject[i].id);
    std::string want = c.reject[i].reason_contains;
    for (size_t start = 0; start <= want.size();) {
      const size_t bar = std::min(want.find('|', start), want.size());
      const std::string piece = want.substr(start, bar - start);
      EXPECT_NE(p.reject[i].second.find(piece), std::string::npos)
          << "reason '" << p.reject[i].second << "' lacks '" << piece << "'";
      start = bar + 1;
    }
  }
  EXPECT_EQ(p.blocked_request_id, c.blocked);
}

TEST_P(DispatchTable, Plan) {
  const Case& c = GetParam();
  expect_plan(c, plan_dispatch(c.queue, c.replicas, c.now_s, c.options));
}

TEST_P(DispatchTable, IndependentOfInputOrder) {
  const Case& c = GetParam();
  std::mt19937 rng(1);
  for (int i = 0; i < 5; ++i) {
    std::vector<QueuedRequest> q = c.queue;
    std::vector<ReplicaLoad> r = c.replicas;
    std::shuffle(q.begin(), q.end(), rng);
    std::shuffle(r.begin(), r.end(), rng);
    expect_plan(c, plan_dispatch(q, r, c.now_s, c.options));
  }
}

INSTANTIATE_TEST_SUITE_P(Rows, DispatchTable, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Case>& i) { return i.param.name; });

TEST(Dispatch, EffectivePriority) {
  const DispatchOptions o = opts(10);
  EXPECT_EQ(effective_priority(req(1, 3, 0, 100, 1), 100, o), 3);
  EXPECT_EQ(effective_priority(req(1, 3, 0, 100, 1), 109.9, o), 3);
  EXPECT_EQ(effective_priority(req(1, 3, 0, 100, 1), 110, o), 2);
  EXPECT_EQ(effective_priority(req(1, 3, 0, 100, 1), 155, o), -2);
  EXPECT_EQ(effective_priority(req(1, 3, 0, 100, 1), 50, o), 3);  // clock behind: no wait
  EXPECT_EQ(effective_priority(req(1, 3, 0, 100, 1), 1e300, o), 3 - static_cast<int64_t>(1e15));  // saturates
  EXPECT_EQ(effective_priority(req(1, 3, 0, 100, 1), 1000, opts(0)), 3);
}

TEST(Dispatch, BlocksNeeded) {
  EXPECT_EQ(blocks_needed(0, 16), 1);
  EXPECT_EQ(blocks_needed(15, 16), 1);
  EXPECT_EQ(blocks_needed(16, 16), 2);
  EXPECT_EQ(blocks_needed(31, 16), 2);
  EXPECT_EQ(blocks_needed(32, 16), 3);
}

TEST(Dispatch, StarvedRequestEventuallyRuns) {
  // A stream of fresh priority-0 requests and one priority-5 request: one slot per tick. With
  // aging 1 s and one tick per second, the priority-5 request runs within 6 ticks.
  const DispatchOptions o = opts(1.0, 0);
  std::vector<QueuedRequest> queue = {req(100, 5, 0, 0.0, 10)};
  int64_t next_id = 1;
  for (int tick = 0; tick < 10; ++tick) {
    const double now = tick;
    queue.push_back(req(next_id, 0, next_id, now, 10));
    ++next_id;
    const DispatchPlan p = plan_dispatch(queue, {rep(0, true, 100, 100, 0, 1)}, now, o);
    ASSERT_EQ(p.assign.size(), 1u);
    if (p.assign[0].request_id == 100) {
      EXPECT_LE(tick, 6);
      return;
    }
    std::erase_if(queue, [&](const QueuedRequest& r) { return r.id == p.assign[0].request_id; });
  }
  FAIL() << "the priority-5 request starved";
}

}  // namespace
}  // namespace specserve
