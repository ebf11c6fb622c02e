// Tests of the autoscaler's policy (scheduler/autoscale_policy.h) with a simulated clock: single
// ticks as `snapshot -> decision` rows. Traces through a simulated head are in
// autoscale_trace_test.cpp.
#include "scheduler/autoscale_policy.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tests/scheduler/autoscale_test_util.h"

namespace specserve {
namespace {

using namespace autoscale_testing;

// ---------------------------------------------------------------- single ticks

TEST(AutoscalePolicy, FirstTickStartsMinReplicasPlusThePool) {
  Autoscaler a(opts(1, 3, 1), 1);
  AutoscaleInput in;
  in.replicas = {rv(0, S::kStopped), rv(1, S::kStopped), rv(2, S::kStopped)};
  auto d = a.tick(in);
  EXPECT_EQ(d.target_ready, 1);
  EXPECT_EQ(d.start, (std::vector<int32_t>{0, 1}));  // one to serve, one for the pool
  EXPECT_TRUE(d.promote.empty());
  EXPECT_TRUE(d.drain.empty());
  // Next tick, both starting: nothing more is started.
  in.now_s = 0.1;
  in.replicas = {rv(0, S::kLoading), rv(1, S::kStarting), rv(2, S::kStopped)};
  d = a.tick(in);
  EXPECT_TRUE(d.start.empty());
  // Both became standby (the head parks every replica that reports ready): one is promoted.
  in.now_s = 0.2;
  in.replicas = {rv(0, S::kStandby), rv(1, S::kStandby), rv(2, S::kStopped)};
  d = a.tick(in);
  EXPECT_EQ(d.promote, (std::vector<int32_t>{0}));
  EXPECT_TRUE(d.start.empty());
  EXPECT_TRUE(d.stop.empty());
}

TEST(AutoscalePolicy, PressureHeldForTheDelayPromotesAndRefillsThePool) {
  Autoscaler a(opts(1, 3, 1, /*up=*/1.0), 1);
  AutoscaleInput in;
  in.replicas = {rv(0, S::kReady, 5), rv(1, S::kStandby), rv(2, S::kStopped)};
  in.num_queued = 2;  // ongoing 7 at 2 per replica: 4 wanted, 3 at most
  in.now_s = 10.0;
  auto d = a.tick(in);
  EXPECT_TRUE(d.pressure);
  EXPECT_FALSE(d.changed) << "upscale before upscale_delay_s";
  in.now_s = 10.5;
  EXPECT_FALSE(a.tick(in).changed);
  in.now_s = 11.0;
  d = a.tick(in);
  ASSERT_TRUE(d.changed);
  EXPECT_EQ(d.target_ready, 3);
  EXPECT_EQ(d.promote, (std::vector<int32_t>{1}));
  EXPECT_EQ(d.start, (std::vector<int32_t>{2})) << "the rest of the deficit starts cold";
  EXPECT_NE(d.reason.find("pressure"), std::string::npos) << d.reason;
}

TEST(AutoscalePolicy, PressureInterruptedRestartsTheDelay) {
  Autoscaler a(opts(1, 3, 1, /*up=*/1.0), 1);
  AutoscaleInput in;
  in.replicas = {rv(0, S::kReady, 6), rv(1, S::kStandby), rv(2, S::kStopped)};
  in.now_s = 0;
  a.tick(in);
  in.now_s = 0.9;
  in.replicas[0].num_assigned = 1;  // a lull
  EXPECT_FALSE(a.tick(in).pressure);
  in.replicas[0].num_assigned = 6;
  in.now_s = 1.0;
  EXPECT_FALSE(a.tick(in).changed) << "the lull restarted the timer";
  in.now_s = 1.9;
  EXPECT_FALSE(a.tick(in).changed);
  in.now_s = 2.0;
  EXPECT_TRUE(a.tick(in).changed);
}

TEST(AutoscalePolicy, DrainGoesToStandbyWhileThePoolIsShortElseStops) {
  Autoscaler a(opts(1, 3, 1, 1.0, /*down=*/3.0), 3);
  AutoscaleInput in;
  in.replicas = {rv(0, S::kReady, 1), rv(1, S::kReady, 0), rv(2, S::kReady, 0)};
  in.now_s = 0;
  EXPECT_TRUE(a.tick(in).idle);
  in.now_s = 2.9;
  EXPECT_FALSE(a.tick(in).changed);
  in.now_s = 3.0;
  auto d = a.tick(in);
  ASSERT_TRUE(d.changed);
  EXPECT_EQ(d.target_ready, 1);
  ASSERT_EQ(d.drain.size(), 2u);
  // Fewest assigned first, ties by the highest id: 2 then 1; the first fills the pool.
  EXPECT_EQ(d.drain[0].replica, 2);
  EXPECT_TRUE(d.drain[0].to_standby);
  EXPECT_EQ(d.drain[1].replica, 1);
  EXPECT_FALSE(d.drain[1].to_standby);
  EXPECT_TRUE(d.start.empty());
}

// Bug (fresh-user review): with a cold start under way, a drained ready replica was stopped
// (the starting one counted as the pool) and then the warm standby too (standby + starting
// exceeded the pool): two warm replicas thrown away for one still warming.
TEST(AutoscalePolicy, WarmReplicasAreKeptOverOneStillStarting) {
  {
    SCOPED_TRACE("a warm standby is not stopped while another replica starts");
    Autoscaler a(opts(0, 2, 1, 1.0, /*down=*/3.0), 1);
    AutoscaleInput in;
    in.replicas = {rv(0, S::kReady, 0), rv(1, S::kStandby), rv(2, S::kWarming)};
    in.now_s = 0;
    EXPECT_TRUE(a.tick(in).idle);
    in.now_s = 3.0;
    auto d = a.tick(in);
    ASSERT_TRUE(d.changed);
    EXPECT_EQ(d.target_ready, 0);
    ASSERT_EQ(d.drain.size(), 1u);
    EXPECT_FALSE(d.drain[0].to_standby) << "the standby already fills the pool";
    EXPECT_TRUE(d.stop.empty()) << "the warm standby must stay";
    // Replica 2 finishes warming: now the pool has one warm replica too many.
    in.replicas = {rv(0, S::kStopped), rv(1, S::kStandby), rv(2, S::kStandby)};
    in.now_s = 3.1;
    d = a.tick(in);
    EXPECT_EQ(d.stop, (std::vector<int32_t>{2}));
  }
  {
    SCOPED_TRACE("a drained replica refills the pool while a cold start is under way");
    Autoscaler a(opts(1, 3, 1, 1.0, /*down=*/3.0), 2);
    AutoscaleInput in;
    in.replicas = {rv(0, S::kReady, 1), rv(1, S::kReady, 0), rv(2, S::kStarting)};
    in.now_s = 0;
    EXPECT_TRUE(a.tick(in).idle);
    in.now_s = 3.0;
    auto d = a.tick(in);
    ASSERT_TRUE(d.changed);
    ASSERT_EQ(d.drain.size(), 1u);
    EXPECT_EQ(d.drain[0].replica, 1);
    EXPECT_TRUE(d.drain[0].to_standby);
    EXPECT_TRUE(d.start.empty());
  }
}

// Bug (fresh-user review): with a TTFT SLO the target went 1 -> 2 -> 3 within 1.2 s: the second
// step rested on samples taken before the first. Samples from before the last change of the
// target are ignored.
TEST(AutoscalePolicy, TtftSamplesFromBeforeTheLastChangeDoNotScaleUpAgain) {
  AutoscaleOptions o = opts(1, 3, 1, /*up=*/1.0, /*down=*/3.0);
  o.ttft_slo_ms = 150;
  o.target_ongoing_requests = 100;  // the count alone never asks for more
  Autoscaler a(o, 1);
  AutoscaleInput in;
  in.replicas = {rv(0, S::kReady, 4, -100.0), rv(1, S::kStandby), rv(2, S::kStandby)};
  for (int i = 0; i <= 10; ++i) in.ttft.push_back({0.1 * i, 0.3, 0});  // slow, on replica 0 (past its grace)
  in.now_s = 0.0;
  EXPECT_TRUE(a.tick(in).pressure);
  in.now_s = 1.0;
  auto d = a.tick(in);
  ASSERT_TRUE(d.changed);
  EXPECT_EQ(d.target_ready, 2);
  EXPECT_EQ(d.promote, (std::vector<int32_t>{1}));
  in.replicas = {rv(0, S::kReady, 2, -100.0), rv(1, S::kReady, 2, 1.0), rv(2, S::kStandby)};
  for (double now = 1.1; now < 4.0; now += 0.1) {
    in.now_s = now;
    d = a.tick(in);
    EXPECT_FALSE(d.pressure) << "at t=" << now;
    EXPECT_EQ(d.target_ready, 2) << "at t=" << now;
  }
  // Fresh slow samples (after the change, from a replica past its grace) are pressure again.
  for (int i = 0; i < 10; ++i) in.ttft.push_back({3.5 + 0.05 * i, 0.3, 0});
  in.now_s = 4.0;
  EXPECT_TRUE(a.tick(in).pressure);
}

// Bug (fresh-user review): after traffic ended, scale-down waited for old slow TTFT samples to
// leave the look-back window (35 s instead of downscale_delay_s): with nothing ongoing they
// hold nothing up.
TEST(AutoscalePolicy, OldSlowSamplesDoNotBlockIdleWhenNothingIsOngoing) {
  AutoscaleOptions o = opts(1, 3, 1, /*up=*/1.0, /*down=*/3.0);
  o.ttft_slo_ms = 150;
  Autoscaler a(o, 2);
  AutoscaleInput in;
  in.replicas = {rv(0, S::kReady, 0, -100.0), rv(1, S::kReady, 0, -100.0), rv(2, S::kStandby)};
  for (int i = 0; i < 10; ++i) in.ttft.push_back({5.0 + 0.1 * i, 0.3, 0});
  in.now_s = 6.0;
  EXPECT_TRUE(a.tick(in).idle);
  in.now_s = 9.0;
  auto d = a.tick(in);
  EXPECT_TRUE(d.changed);
  EXPECT_EQ(d.target_ready, 1);
}

TEST(AutoscalePolicy, SurplusStandbyStopsHighestIdFirst) {
  Autoscaler a(opts(1, 3, 1), 1);
  AutoscaleInput in;
  in.replicas = {rv(0, S::kReady), rv(1, S::kStandby), rv(2, S::kStandby)};
  auto d = a.tick(in);
  EXPECT_EQ(d.stop, (std::vector<int32_t>{2}));
  EXPECT_TRUE(d.promote.empty());
}

TEST(AutoscalePolicy, ScaleFromZeroIsImmediate) {
  Autoscaler a(opts(0, 2, 1, /*up=*/30.0), 0);
  AutoscaleInput in;
  in.replicas = {rv(0, S::kStandby), rv(1, S::kStopped)};
  in.now_s = 5;
  auto d = a.tick(in);
  EXPECT_EQ(d.target_ready, 0);
  EXPECT_TRUE(d.promote.empty());
  in.num_queued = 1;
  in.oldest_wait_s = 0.01;
  d = a.tick(in);
  EXPECT_EQ(d.target_ready, 1);
  EXPECT_EQ(d.promote, (std::vector<int32_t>{0}));
  EXPECT_EQ(d.start, (std::vector<int32_t>{1})) << "the pool is refilled";
  EXPECT_NE(d.reason.find("scale from zero"), std::string::npos) << d.reason;
}

TEST(AutoscalePolicy, BelowMinReplicasIsRestoredAtOnce) {
  Autoscaler a(opts(2, 3, 0, 100, 100), 2);
  AutoscaleInput in;
  // Replica 1 died (stopped): the target stays 2; the standby-less deficit starts it cold.
  in.replicas = {rv(0, S::kReady), rv(1, S::kStopped), rv(2, S::kStopped)};
  auto d = a.tick(in);
  EXPECT_EQ(d.target_ready, 2);
  EXPECT_EQ(d.start, (std::vector<int32_t>{1}));
  in.can_start = false;
  d = a.tick(in);
  EXPECT_TRUE(d.start.empty()) << "no launcher: nothing to start";
}

TEST(AutoscalePolicy, BoundsRespectedUnderAnyLoad) {
  Autoscaler a(opts(1, 2, 1, 0.0, 0.0), 1);
  AutoscaleInput in;
  in.replicas = {rv(0, S::kReady, 1000), rv(1, S::kStandby), rv(2, S::kStandby), rv(3, S::kStandby)};
  in.num_queued = 100000;
  for (int i = 0; i < 20; ++i) {
    in.now_s = i;
    auto d = a.tick(in);
    EXPECT_LE(d.target_ready, 2);
    for (int32_t p : d.promote) {
      for (auto& r : in.replicas) {
        if (r.id == p) r.state = S::kReady;
      }
    }
    int32_t ready = 0;
    for (auto& r : in.replicas) ready += r.state == S::kReady;
    EXPECT_LE(ready, 2);
  }
  EXPECT_EQ(a.target_ready(), 2);
}

TEST(AutoscalePolicy, OldestWaitAndKvUsageArePressure) {
  AutoscaleOptions o = opts(1, 2, 0, 0.0);
  o.ttft_slo_ms = 500;
  o.target_kv_cache_usage = 0.8;
  {
    Autoscaler a(o, 1);
    AutoscaleInput in;
    in.replicas = {rv(0, S::kReady, 1), rv(1, S::kStandby)};
    in.num_queued = 1;  // 2 ongoing: 1 replica is enough by load
    in.oldest_wait_s = 0.4;
    EXPECT_FALSE(a.tick(in).pressure);
    in.oldest_wait_s = 0.6;
    auto d = a.tick(in);
    EXPECT_TRUE(d.pressure);
    EXPECT_EQ(d.promote, (std::vector<int32_t>{1}));
  }
  {
    Autoscaler a(o, 1);
    AutoscaleInput in;
    in.replicas = {rv(0, S::kReady, 1), rv(1, S::kStandby)};
    in.replicas[0].kv_cache_usage = 0.95;
    auto d = a.tick(in);
    EXPECT_TRUE(d.pressure);
    EXPECT_NE(d.reason.find("KV"), std::string::npos) << d.reason;
  }
}

TEST(AutoscalePolicy, NewReplicasFirstSlowSamplesAreIgnored) {
  AutoscaleOptions o = opts(1, 3, 1, 0.0, 100);
  o.ttft_slo_ms = 200;
  o.new_replica_grace_s = 2.0;
  Autoscaler a(o, 2);
  AutoscaleInput in;
  in.now_s = 10.0;
  // Replica 1 was just promoted (ready since 9.5): its slow first TTFTs do not count.
  in.replicas = {rv(0, S::kReady, 2, 0.0), rv(1, S::kReady, 2, 9.5), rv(2, S::kStandby)};
  for (int i = 0; i < 10; ++i) in.ttft.push_back({9.6 + 0.04 * i, 1.5, 1});
  in.ttft.push_back({9.7, 0.05, 0});
  auto d = a.tick(in);
  EXPECT_FALSE(d.pressure) << d.reason;
  EXPECT_FALSE(d.changed);
  EXPECT_DOUBLE_EQ(d.ttft_p90_s, 0.05);
  // The same slow samples from a replica past its grace window are pressure.
  in.replicas[1].ready_since_s = 5.0;
  d = a.tick(in);
  EXPECT_TRUE(d.pressure);
  EXPECT_EQ(d.target_ready, 3);
  // Samples older than look_back_period_s are ignored.
  Autoscaler b(o, 2);
  in.now_s = 30.0;
  EXPECT_FALSE(b.tick(in).pressure);
}

// Issue: a scale-up right after a scale-down cold-started a replica whose process was still
// shutting down (two processes of one replica on one device). Draining replicas are un-drained
// first; a stopped replica whose workers have not gone yet is not started.
TEST(AutoscalePolicy, BurstDuringDrainUndrainsInsteadOfColdStarting) {
  Autoscaler a(opts(1, 3, 0, /*up=*/0.0, /*down=*/0.0), 3);
  AutoscaleInput in;
  in.replicas = {rv(0, S::kReady, 0), rv(1, S::kReady, 0), rv(2, S::kReady, 0)};
  in.now_s = 0;
  auto d = a.tick(in);
  ASSERT_TRUE(d.changed);
  ASSERT_EQ(d.drain.size(), 2u);  // 2 then 1, both to stop (no pool)
  // The burst arrives while both drain: 10 queued want every slot.
  in.replicas = {rv(0, S::kReady, 0), rv(1, S::kDraining, 1), rv(2, S::kDraining, 1)};
  in.num_queued = 10;
  in.now_s = 0.1;
  d = a.tick(in);
  EXPECT_EQ(d.target_ready, 3);
  EXPECT_EQ(d.undrain, (std::vector<int32_t>{1, 2}));
  EXPECT_TRUE(d.start.empty()) << "a draining replica's slot was cold-started";
  EXPECT_TRUE(d.promote.empty());
  // Replica 2 finished draining and was retired, but its worker is still stopping: the deficit
  // of one is not covered by starting it.
  in.replicas = {rv(0, S::kReady, 5), rv(1, S::kReady, 5), rv(2, S::kStopped)};
  in.replicas[2].startable = false;
  in.now_s = 0.2;
  d = a.tick(in);
  EXPECT_EQ(d.target_ready, 3);
  EXPECT_TRUE(d.start.empty()) << "started a replica whose process is still stopping";
  in.replicas[2].startable = true;  // its down messages arrived
  in.now_s = 0.3;
  d = a.tick(in);
  EXPECT_EQ(d.start, (std::vector<int32_t>{2}));
}

// Review of the draft-worker replacement: a replica that is leaving (its worker stopping, or its
// draft worker dead and a replacement promoted) was undrained when a burst came; a draftless
// ready replica is drained first on a scale-down, and never into the pool.
TEST(AutoscalePolicy, LeavingReplicasAreNotUndrainedAndDraftlessOnesDrainFirstToStop) {
  Autoscaler a(opts(1, 3, 1, /*up=*/0.0, /*down=*/0.0), 3);
  AutoscaleInput in;
  in.replicas = {rv(0, S::kReady, 0), rv(1, S::kDraining, 1), rv(2, S::kStandby)};
  in.replicas[1].leaving = true;
  in.num_queued = 10;  // a burst wants every slot
  auto d = a.tick(in);
  EXPECT_TRUE(d.undrain.empty()) << "a leaving replica was undrained";
  EXPECT_EQ(d.promote, (std::vector<int32_t>{2}));
  EXPECT_EQ(d.ongoing, 11) << "its request still counts as ongoing";

  Autoscaler b(opts(1, 3, 1, /*up=*/0.0, /*down=*/0.0), 2);
  AutoscaleInput idle;
  // Two ready, no load: one drains. The busier one is draftless: it goes, and to stop (the pool
  // is short, yet a replica without its draft worker is no standby).
  idle.replicas = {rv(0, S::kReady, 0), rv(1, S::kReady, 2)};
  idle.replicas[1].draftless = true;
  d = b.tick(idle);
  ASSERT_EQ(d.drain.size(), 1u);
  EXPECT_EQ(d.drain[0].replica, 1);
  EXPECT_FALSE(d.drain[0].to_standby);
}

// Issue: a replica that never registered stayed `starting` forever and blocked the pool refill.
TEST(AutoscalePolicy, StuckStartingIsAbandonedAndRetriedWithBackoff) {
  AutoscaleOptions o = opts(1, 2, 1);
  o.start_timeout_s = 30;
  o.start_backoff_s = 2;
  o.start_backoff_max_s = 5;
  Autoscaler a(o, 1);
  AutoscaleInput in;
  in.replicas = {rv(0, S::kReady, 0), rv(1, S::kStarting)};
  in.replicas[1].state_since_s = 0;
  in.now_s = 29.9;
  auto d = a.tick(in);
  EXPECT_TRUE(d.abandon.empty());
  EXPECT_TRUE(d.start.empty());
  in.now_s = 30.0;
  d = a.tick(in);
  EXPECT_EQ(d.abandon, (std::vector<int32_t>{1}));
  EXPECT_TRUE(d.start.empty()) << "restarted in the tick that gave it up";
  // The head stopped it and counted a failure: backoff 2 s, then 4 s, capped at 5 s.
  in.replicas[1] = rv(1, S::kStopped);
  in.replicas[1].state_since_s = 30.0;
  in.replicas[1].num_start_failures = 1;
  in.now_s = 31.9;
  EXPECT_TRUE(a.tick(in).start.empty()) << "started before its backoff";
  in.now_s = 32.0;
  EXPECT_EQ(a.tick(in).start, (std::vector<int32_t>{1})) << "the pool is refilled after the backoff";
  in.replicas[1].num_start_failures = 2;
  in.now_s = 33.9;
  EXPECT_TRUE(a.tick(in).start.empty());
  in.now_s = 34.0;
  EXPECT_EQ(a.tick(in).start, (std::vector<int32_t>{1}));
  in.replicas[1].num_start_failures = 10;
  in.now_s = 34.9;
  EXPECT_TRUE(a.tick(in).start.empty());
  in.now_s = 35.0;
  EXPECT_EQ(a.tick(in).start, (std::vector<int32_t>{1})) << "backoff capped at start_backoff_max_s";
  // Loading and warming without progress are given up too; progress (a new state) restarts it.
  in.replicas[1] = rv(1, S::kWarming);
  in.replicas[1].state_since_s = 20.0;
  in.now_s = 49.9;
  EXPECT_TRUE(a.tick(in).abandon.empty());
  in.now_s = 50.0;
  EXPECT_EQ(a.tick(in).abandon, (std::vector<int32_t>{1}));
}

TEST(AutoscalePolicy, StartingReplicaCoveringTheDeficitIsListed) {
  // A pool refill (replica 2) is starting when a burst wants 2 more ready replicas: the standby
  // one is promoted and the starting one counted: the caller times it as the scale-up's cold path.
  Autoscaler a(opts(1, 4, 1, /*up=*/0.0), 1);
  AutoscaleInput in;
  in.now_s = 5.0;
  in.replicas = {rv(0, S::kReady, 6), rv(1, S::kStandby), rv(2, S::kLoading), rv(3, S::kStopped)};
  in.replicas[2].state_since_s = 4.0;
  auto d = a.tick(in);
  EXPECT_EQ(d.target_ready, 3);
  EXPECT_EQ(d.wanted, 3);
  EXPECT_EQ(d.promote, (std::vector<int32_t>{1}));
  EXPECT_EQ(d.starting_for_deficit, (std::vector<int32_t>{2}));
  EXPECT_EQ(d.num_start_for_deficit, 0);
  // Nothing left over for the deficit: replica 3 refills the pool.
  EXPECT_EQ(d.start, (std::vector<int32_t>{3}));
  // No deficit: no starting replica is listed.
  Autoscaler b(opts(1, 4, 1), 1);
  in.replicas = {rv(0, S::kReady, 1), rv(1, S::kStandby), rv(2, S::kLoading), rv(3, S::kStopped)};
  d = b.tick(in);
  EXPECT_TRUE(d.starting_for_deficit.empty());
  EXPECT_EQ(d.wanted, 1);
}

TEST(AutoscalePolicy, ReleasedHeldStartsCoverOnlyWhatTheLoadWantsNow) {
  // Target 3 from a burst, 2 ready, the clients gone (0 ongoing): the held deficit start is not
  // planned once the caller says so; the pool refill still is.
  AutoscaleInput in;
  in.now_s = 1.0;
  in.replicas = {rv(0, S::kReady), rv(1, S::kReady), rv(2, S::kStopped), rv(3, S::kStopped)};
  Autoscaler plain(opts(1, 4, 1, 0.0, 1000.0), 3);
  auto d = plain.tick(in);
  EXPECT_EQ(d.target_ready, 3);
  EXPECT_EQ(d.num_start_for_deficit, 1);
  EXPECT_EQ(d.start, (std::vector<int32_t>{2, 3}));
  Autoscaler rechecked(opts(1, 4, 1, 0.0, 1000.0), 3);
  in.deficit_by_wanted = true;
  d = rechecked.tick(in);
  EXPECT_EQ(d.target_ready, 3) << "the target itself keeps its hysteresis";
  EXPECT_EQ(d.wanted, 1);
  EXPECT_EQ(d.num_start_for_deficit, 0);
  EXPECT_EQ(d.start, (std::vector<int32_t>{2})) << "the pool refill only";
  EXPECT_TRUE(d.drain.empty());
  // The load is back: the deficit is covered again.
  in.now_s = 1.1;
  in.num_queued = 6;
  d = rechecked.tick(in);
  EXPECT_EQ(d.num_start_for_deficit, 1);
}

TEST(AutoscalePolicy, IdleReasonWithNoLoadSaysSo) {
  Autoscaler a(opts(1, 3, 0, 0.0, /*down=*/1.0), 2);
  AutoscaleInput in;
  in.replicas = {rv(0, S::kReady), rv(1, S::kReady), rv(2, S::kStopped)};
  in.now_s = 1.0;
  EXPECT_FALSE(a.tick(in).changed);
  in.now_s = 2.5;
  auto d = a.tick(in);
  ASSERT_TRUE(d.changed);
  EXPECT_EQ(d.target_ready, 1);
  EXPECT_EQ(d.reason.rfind("idle: no ongoing request for ", 0), 0u) << d.reason;
  EXPECT_EQ(d.reason.find("wanted"), std::string::npos) << d.reason;
}

// Short requests that come and go between ticks (mean_ongoing) are load: one a second, 15 ms
// each, keeps the only replica of a scale-from-zero cluster; without them it is idle. (A
// fresh-user trial: 1-token requests every second paid a cold start every ~5 s.)
TEST(AutoscalePolicy, RequestsShorterThanATickKeepTheirReplica) {
  for (const bool seen : {true, false}) {
    Autoscaler a(opts(0, 1, 0, 0.0, /*down=*/2.0), 1);
    AutoscaleInput in;
    in.replicas = {rv(0, S::kReady)};
    bool scaled_down = false;
    for (int t = 1; t <= 100 && !scaled_down; ++t) {  // 10 s of 0.1 s ticks
      in.now_s = 0.1 * t;
      in.mean_ongoing = seen && t % 10 == 0 ? 0.15 : 0.0;  // 15 ms of the tick's 100, gone before it
      scaled_down = a.tick(in).target_ready == 0;
    }
    EXPECT_EQ(scaled_down, !seen) << (seen ? "scaled to zero under steady short requests" : "never idle");
  }
  // The mean, not the peak: many short requests that overlap now and then (0.75 at once on
  // average) want one replica at one per replica; 1.5 on average want two.
  AutoscaleOptions one = opts(1, 4, 0, 0.0);
  one.target_ongoing_requests = 1;
  for (const auto& [mean, want] : {std::pair{0.75, 1}, std::pair{1.5, 2}}) {
    Autoscaler b(one, 1);
    AutoscaleInput in;
    in.replicas = {rv(0, S::kReady), rv(1, S::kStopped), rv(2, S::kStopped), rv(3, S::kStopped)};
    in.now_s = 1.0;
    in.mean_ongoing = mean;
    auto d = b.tick(in);
    EXPECT_EQ(d.wanted, want) << "mean " << mean;
  }
}

TEST(AutoscalePolicy, MedianOfAnEvenCountIsTheMeanOfTheMiddleTwo) {
  EXPECT_EQ(median_of({}), 0.0);
  EXPECT_EQ(median_of({3.0}), 3.0);
  EXPECT_EQ(median_of({4.0, 1.0}), 2.5);
  EXPECT_EQ(median_of({5.0, 1.0, 3.0}), 3.0);
  EXPECT_EQ(median_of({4.0, 1.0, 3.0, 2.0}), 2.5);
}

TEST(AutoscalePolicy, Percentile90) {
  EXPECT_EQ(percentile90({}), 0.0);
  EXPECT_EQ(percentile90({3.0}), 3.0);
  std::vector<double> v;
  for (int i = 1; i <= 10; ++i) v.push_back(i);
  EXPECT_EQ(percentile90(v), 9.0);
  v.push_back(11);
  EXPECT_EQ(percentile90(v), 10.0);
}

}  // namespace
}  // namespace specserve
