// Table-driven tests of the head's rebalance policy (scheduler/rebalance.h): each row is
// `routed replicas, options -> expected hand-backs`.
#include "scheduler/rebalance.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

namespace specserve {
namespace {

/// A routed replica: id, requests on it, batch size, eligible.
RebalanceLoad rep(int32_t id, int32_t assigned, int32_t max_num_seqs = 64, bool eligible = true) {
  RebalanceLoad l;
  l.replica = id;
  l.assigned = assigned;
  l.max_num_seqs = max_num_seqs;
  l.eligible = eligible;
  return l;
}

/// A routed replica whose KV cache is full, with `kv_waiting` requests waiting for cache room.
RebalanceLoad full(int32_t id, int32_t assigned, int32_t max_num_seqs, int32_t kv_waiting) {
  RebalanceLoad l = rep(id, assigned, max_num_seqs);
  l.kv_full = true;
  l.kv_waiting = kv_waiting;
  return l;
}

RebalanceOptions opts(bool running = true, int32_t min_imbalance = 4) {
  RebalanceOptions o;
  o.running = running;
  o.min_imbalance = min_imbalance;
  return o;
}

struct Want {
  int32_t replica, count;
  bool running;
};

struct Case {
  std::string name;
  std::vector<RebalanceLoad> loads;
  RebalanceOptions options;
  std::vector<Want> want;
};

std::vector<Case> cases() {
  return {
      // ---- nothing to do ----
      {"single_replica_never_rebalances", {rep(0, 60)}, opts(), {}},
      {"empty", {}, opts(), {}},
      {"balanced", {rep(0, 10), rep(1, 10)}, opts(), {}},
      {"gap_below_min_imbalance", {rep(0, 10), rep(1, 7)}, opts(), {}},
      {"unreported_replica_is_ignored", {rep(0, 48), rep(1, 0, 0)}, opts(), {}},
      // ---- rule 1: waiting beyond a batch ----
      {"waiting_go_to_free_slots", {rep(0, 4, 2), rep(1, 0, 2)}, opts(), {{0, 2, false}}},
      {"waiting_bounded_by_free_slots", {rep(0, 6, 2), rep(1, 1, 2)}, opts(), {{0, 1, false}}},
      {"waiting_first_running_not_asked_in_the_same_plan", {rep(0, 70, 64), rep(1, 0, 64)}, opts(), {{0, 6, false}}},
      // ---- rule 1 under KV pressure (helper review of the autoscaler: a replica preempting with
      // fewer requests than its batch kept them beside a replica promoted for that pressure) ----
      {"kv_waiting_go_to_a_replica_with_room", {full(0, 3, 8, 2), rep(1, 0, 8)}, opts(), {{0, 2, false}}},
      {"kv_waiting_bounded_by_free_slots", {full(0, 5, 8, 4), rep(1, 6, 8)}, opts(), {{0, 2, false}}},
      {"kv_waiting_counts_only_when_full", {[] { RebalanceLoad l = rep(0, 3, 8); l.kv_waiting = 2; return l; }(), rep(1, 0, 8)},
       opts(), {}},
      {"full_replica_is_no_receiver_of_waiting", {rep(0, 4, 2), full(1, 0, 2, 0)}, opts(), {}},
      {"full_replica_is_no_receiver_of_running", {rep(0, 48), full(1, 0, 64, 0)}, opts(), {}},
      {"both_full_nothing_moves", {full(0, 3, 8, 2), full(1, 0, 8, 0)}, opts(), {}},
      {"waiting_slots_shared_in_replica_order", {rep(2, 4, 2), rep(0, 3, 2), rep(1, 0, 2)}, opts(), {{0, 1, false}, {2, 1, false}}},
      {"no_free_slot_no_waiting_handback", {rep(0, 4, 2), rep(1, 2, 2)}, opts(), {}},
      // ---- rule 2: running toward an even share ----
      {"promoted_replica_gets_half_of_a_burst", {rep(0, 48), rep(1, 0)}, opts(), {{0, 24, true}}},
      {"third_replica_takes_from_both", {rep(0, 24), rep(1, 24), rep(2, 0)}, opts(), {{0, 8, true}, {1, 8, true}}},
      {"odd_total_leaves_one_extra", {rep(0, 9), rep(1, 0)}, opts(), {{0, 4, true}}},
      {"receiver_room_bounded_by_its_batch", {rep(0, 40, 64), rep(1, 0, 8)}, opts(), {{0, 8, true}}},
      {"running_off_leaves_it", {rep(0, 48), rep(1, 0)}, opts(false), {}},
      {"min_imbalance_one_moves_small_gaps", {rep(0, 3), rep(1, 1)}, opts(true, 1), {{0, 1, true}}},
      {"min_imbalance_zero_is_one", {rep(0, 3), rep(1, 1)}, opts(true, 0), {{0, 1, true}}},
      // ---- rule 3: eligibility ----
      {"ineligible_donor_is_not_asked", {rep(0, 48, 64, false), rep(1, 0)}, opts(), {}},
      {"ineligible_waiting_donor_is_not_asked", {rep(0, 4, 2, false), rep(1, 0, 2)}, opts(), {}},
      {"ineligible_receiver_still_receives", {rep(0, 48), rep(1, 0, 64, false)}, opts(), {{0, 24, true}}},
  };
}

class RebalanceTable : public ::testing::TestWithParam<Case> {};

TEST_P(RebalanceTable, PlansTheExpectedHandBacks) {
  const Case& c = GetParam();
  const std::vector<Reclaim> got = plan_rebalance(c.loads, c.options);
  ASSERT_EQ(got.size(), c.want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].replica, c.want[i].replica) << i;
    EXPECT_EQ(got[i].count, c.want[i].count) << i;
    EXPECT_EQ(got[i].running, c.want[i].running) << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Rules, RebalanceTable, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Case>& i) { return i.param.name; });

// Properties over random loads: a plan never asks for more than the receivers can take, never
// asks one replica twice, never asks an ineligible one, and applying it (the hand-backs landing on
// the least loaded replicas) never makes the spread between the busiest and the least loaded
// replica larger, and after a running rebalance no replica exceeds the share by min_imbalance.
TEST(Rebalance, RandomLoadsKeepTheInvariants) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 2000; ++trial) {
    const int n = 1 + static_cast<int>(rng() % 4);
    std::vector<RebalanceLoad> loads;
    int64_t free_slots = 0;
    for (int i = 0; i < n; ++i) {
      const int32_t cap = 1 + static_cast<int32_t>(rng() % 16);
      loads.push_back(rep(i, static_cast<int32_t>(rng() % (2 * cap + 1)), cap, rng() % 5 != 0));
      if (rng() % 4 == 0) {
        loads.back().kv_full = true;
        loads.back().kv_waiting = static_cast<int32_t>(rng() % (loads.back().assigned + 1));
      }
      if (!loads.back().kv_full) free_slots += std::max(0, cap - loads.back().assigned);
    }
    const RebalanceOptions o = opts(true, 1 + static_cast<int32_t>(rng() % 4));
    const std::vector<Reclaim> plan = plan_rebalance(loads, o);
    int64_t asked = 0;
    std::vector<int> seen(static_cast<size_t>(n), 0);
    for (const Reclaim& c : plan) {
      ASSERT_GT(c.count, 0);
      ASSERT_TRUE(loads[static_cast<size_t>(c.replica)].eligible);
      ASSERT_EQ(seen[static_cast<size_t>(c.replica)]++, 0);
      ASSERT_LE(c.count, loads[static_cast<size_t>(c.replica)].assigned);
      const RebalanceLoad& g = loads[static_cast<size_t>(c.replica)];
      if (!c.running) ASSERT_LE(c.count, std::max(g.assigned - g.max_num_seqs, g.kv_full ? g.kv_waiting : 0));
      asked += c.count;
    }
    ASSERT_LE(asked, free_slots) << "trial " << trial;
    if (!plan.empty() && std::all_of(plan.begin(), plan.end(), [](const Reclaim& c) { return c.running; })) {
      // Apply: take from the donors, give one at a time to the least loaded replica with a free slot.
      std::vector<int32_t> a;
      for (const RebalanceLoad& l : loads) a.push_back(l.assigned);
      const int32_t spread_before = *std::max_element(a.begin(), a.end()) - *std::min_element(a.begin(), a.end());
      for (const Reclaim& c : plan) a[static_cast<size_t>(c.replica)] -= c.count;
      for (int64_t k = 0; k < asked; ++k) {
        size_t best = a.size();
        for (size_t i = 0; i < a.size(); ++i) {
          if (a[i] >= loads[i].max_num_seqs || loads[i].kv_full) continue;
          if (best == a.size() || a[i] < a[best]) best = i;
        }
        ASSERT_LT(best, a.size());
        ++a[best];
      }
      const int32_t spread_after = *std::max_element(a.begin(), a.end()) - *std::min_element(a.begin(), a.end());
      EXPECT_LE(spread_after, spread_before) << "trial " << trial;
    }
  }
}

}  // namespace
}  // namespace specserve
