// Promotion and scale-up with fake workers (tests/actors/elastic_fixtures.h):
//  - a promoted replica gets the requests waiting (not started) in a busy replica's engine, and
//    running ones move to it until the load is even (scheduler/rebalance.h), so it serves at once;
//    the head reports decision -> routed / first request sent / first token;
//  - a request handed back that can only go back where it came from does not ping-pong, and a
//    hand-back that gave nothing is not asked again on every tick;
//  - a promotion's first token is the first the promoted replica makes (for a moved request too);
//    a promotion with no work waiting is not measured; nothing is promoted while the cluster drains;
//  - scale from zero is a measured promotion; cold starts covering a scale-up are timed from the
//    decision as cold, and held cold starts for load that went away are not started;
//  - a worker stopping the only routed replica (SIGTERM) promotes a standby one, which takes its
//    requests (they finished on the leaving replica while the standby sat idle), and status shows
//    the leaving replica as draining.
#include "tests/actors/elastic_fixtures.h"

namespace specserve {
namespace {

using namespace elastic_testing;

TEST(ElasticPromotion, PromotedReplicaTakesRequestsWaitingInABusyEngine) {
  Promotion p;
  ASSERT_NO_FATAL_FAILURE(p.start(64));
  // 3 requests: replica 0 runs one and holds two waiting; nothing stays queued at the head.
  std::vector<std::shared_ptr<RequestHandle>> hs;
  ASSERT_NO_FATAL_FAILURE(p.submit(3, 10, &hs));
  // 3 ongoing want 2 replicas: replica 1 is promoted, replica 0 hands one waiting request back,
  // and it runs on replica 1 (one batch slot there; the other waiting one stays in line).
  ASSERT_TRUE(until(5, [&] { return p.rec.count_prefix("r1/target_shard: work ") == 1; })) << p.rec.dump();
  EXPECT_EQ(p.rec.count_prefix("r0/target_shard: reclaim"), 1) << p.rec.dump();
  EXPECT_EQ(p.rec.count("r0/target_shard: work 3"), 1);
  EXPECT_EQ(p.rec.count("r1/target_shard: work 3"), 1) << "the last admitted request goes, not the oldest waiting one";
  ClusterStatus st;
  ASSERT_TRUE(until(5, [&] {
    auto s = p.client->status();
    if (s.ok()) st = *s;
    return s.ok() && !st.autoscale.promotion_seconds.empty();
  })) << "decision -> first token was not measured";
  EXPECT_EQ(state_of(st, 1), "ready");
  EXPECT_EQ(st.autoscale.num_promotions, 1);
  ASSERT_EQ(st.autoscale.promotion_routable_seconds.size(), 1u);
  ASSERT_EQ(st.autoscale.promotion_dispatch_seconds.size(), 1u);
  ASSERT_EQ(st.autoscale.promotion_seconds.size(), 1u);
  const double routed = st.autoscale.promotion_routable_seconds[0];
  const double sent = st.autoscale.promotion_dispatch_seconds[0];
  const double first = st.autoscale.promotion_seconds[0];
  EXPECT_GE(routed, 0.0);
  EXPECT_LE(routed, sent);
  EXPECT_LE(sent, first);
  for (const auto& r : st.replicas) {
    if (r.replica != 1) continue;
    EXPECT_EQ(r.promotion_routable_seconds, routed);
    EXPECT_EQ(r.promotion_dispatch_seconds, sent);
    EXPECT_EQ(r.promotion_seconds, first);
    EXPECT_EQ(r.assigned, 1);
  }
  EXPECT_EQ(st.migrated, 1);
  EXPECT_EQ(st.queued, 0);
  // Stable: no further hand-backs (replica 1's only slot is taken).
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  EXPECT_EQ(p.rec.count_prefix("r0/target_shard: reclaim"), 1) << p.rec.dump();
}

// A burst admitted whole by one replica (a large batch: nothing waits in its engine) is split
// with the promoted replica: running sequences move (scheduler/rebalance.h rule 2), once, and the
// load ends even; with scheduler.rebalance_running off they stay.
TEST(ElasticPromotion, PromotedReplicaTakesRunningSequencesFromABusyReplica) {
  for (const bool on : {true, false}) {
    SCOPED_TRACE(on ? "rebalance_running: true" : "rebalance_running: false");
    Promotion p;
    ASSERT_NO_FATAL_FAILURE(p.start(64, /*replica1_max_num_seqs=*/16, /*upscale_delay_s=*/0.3, /*replica0_max_num_seqs=*/16, on));
    std::vector<std::shared_ptr<RequestHandle>> hs;
    ASSERT_NO_FATAL_FAILURE(p.submit(8, 10, &hs));
    ASSERT_TRUE(until(5, [&] { return p.rec.count_prefix("r0/target_shard: work ") == 8; })) << p.rec.dump();
    EXPECT_EQ(p.rec.count_prefix("r1/target_shard: work "), 0) << "the burst was admitted before the promotion";
    ASSERT_TRUE(until(5, [&] {
      auto s = p.client->status();
      return s.ok() && state_of(*s, 1) == "ready";
    })) << describe(p.client->status());
    if (on) {
      ASSERT_TRUE(until(5, [&] { return p.rec.count_prefix("r1/target_shard: work ") == 4; })) << p.rec.dump();
      EXPECT_EQ(p.rec.count("r0/target_shard: reclaim 4 running"), 1) << p.rec.dump();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(500));  // stable: nothing more moves
    auto st = p.client->status();
    ASSERT_TRUE(st.ok());
    EXPECT_EQ(p.rec.count_prefix("r0/target_shard: reclaim"), on ? 1 : 0) << p.rec.dump();
    EXPECT_EQ(p.rec.count_prefix("r1/target_shard: reclaim"), 0) << p.rec.dump();
    EXPECT_EQ(st->migrated, on ? 4 : 0);
    for (const auto& r : st->replicas) EXPECT_EQ(r.assigned, on ? 4 : (r.replica == 0 ? 8 : 0)) << "replica " << r.replica;
    // Measured on a moved sequence's first token there; without the move no work waited for it.
    EXPECT_EQ(st->autoscale.promotion_seconds.size(), on ? 1u : 0u) << describe(st);
  }
}

// Bug (fresh-user review): when the busy replica could give nothing back (its sequences near
// their end), the head asked again on every 100 ms tick, logging each time. A hand-back that gave
// nothing now waits a second before the next.
TEST(ElasticPromotion, HandBackThatGaveNothingIsNotAskedEveryTick) {
  Promotion p;
  ASSERT_NO_FATAL_FAILURE(p.start(64, 16, /*upscale_delay_s=*/0.3, /*replica0_max_num_seqs=*/16, true,
                                  /*replica0_keeps_running=*/true));
  std::vector<std::shared_ptr<RequestHandle>> hs;
  ASSERT_NO_FATAL_FAILURE(p.submit(8, 10, &hs));
  ASSERT_TRUE(until(5, [&] { return p.rec.count_prefix("r0/target_shard: reclaim") >= 1; })) << p.rec.dump();
  const auto t0 = std::chrono::steady_clock::now();
  std::this_thread::sleep_for(std::chrono::milliseconds(2500));
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LE(p.rec.count_prefix("r0/target_shard: reclaim"), 1 + static_cast<int>(std::ceil(elapsed / 1.0)))
      << p.rec.dump();
  EXPECT_EQ(p.rec.count_prefix("r1/target_shard: work "), 0) << "nothing was given";
}

TEST(ElasticPromotion, HandedBackRequestThatFitsNowhereElseDoesNotPingPong) {
  Promotion p;
  // Replica 1's cache holds 1 block of 16 tokens: a 40-token request never fits there.
  ASSERT_NO_FATAL_FAILURE(p.start(1));
  std::vector<std::shared_ptr<RequestHandle>> hs;  // kept: a dropped handle cancels its request
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_NO_FATAL_FAILURE(p.submit(3, 40, &hs));
  ASSERT_TRUE(until(5, [&] { return p.rec.count_prefix("r0/target_shard: reclaim") >= 1; }))
      << p.rec.dump() << describe(p.client->status());
  // The handed-back request can only go back to replica 0: replica 0 is not asked again for a
  // while (one futile round per second at most, instead of one per message round trip: without
  // the guard the same window holds thousands).
  std::this_thread::sleep_for(std::chrono::milliseconds(700));
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LE(p.rec.count_prefix("r0/target_shard: reclaim"), 1 + static_cast<int>(std::ceil(elapsed)))
      << "in " << elapsed << " s:\n" << p.rec.dump();
  EXPECT_EQ(p.rec.count_prefix("r1/target_shard: work"), 0);
  auto st = p.client->status();
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->queued, 0);
  EXPECT_EQ(st->running, 3) << "every request is still on replica 0";
}

TEST(ElasticPromotion, FirstTokenOnThePromotedReplicaCountsForAMovedRequestToo) {
  Promotion p;
  // Replica 1 runs 2 requests at once: both re-queued requests below get a token there.
  ASSERT_NO_FATAL_FAILURE(p.start(64, 2));
  // Two requests on replica 0 (one slot): the first runs and streams a token, the second waits.
  // Two ongoing requests want one replica: no promotion yet.
  std::vector<std::shared_ptr<RequestHandle>> hs;
  ASSERT_NO_FATAL_FAILURE(p.submit(2, 10, &hs));
  auto c = hs[0]->next(std::chrono::seconds(5));
  ASSERT_TRUE(c.has_value() && c->tokens == std::vector<int32_t>{42}) << p.rec.dump();
  EXPECT_EQ(p.rec.count_prefix("r1/target_shard: work"), 0) << p.rec.dump();
  // Replica 0's shard dies: both requests are re-queued (the first with its token, first in
  // line), replica 1 is promoted and gets both. The first one sent streamed a token on replica 0
  // already: the promotion is measured on the first token replica 1 makes for it (the request
  // actor reports the first token of every attempt).
  caf::anon_send_exit(p.shards[0], caf::exit_reason::kill);
  ASSERT_TRUE(until(5, [&] { return p.rec.count_prefix("r1/target_shard: work ") == 2; }))
      << p.rec.dump() << describe(p.client->status());
  ClusterStatus st;
  EXPECT_TRUE(until(5, [&] {
    auto s = p.client->status();
    if (s.ok()) st = *s;
    return s.ok() && !st.autoscale.promotion_seconds.empty();
  })) << "decision -> first token was not measured:\n" << p.rec.dump() << describe(p.client->status());
  EXPECT_EQ(st.autoscale.num_promotions, 1);
  ASSERT_EQ(st.autoscale.promotion_dispatch_seconds.size(), 1u);
  if (!st.autoscale.promotion_seconds.empty()) {
    EXPECT_LE(st.autoscale.promotion_dispatch_seconds[0], st.autoscale.promotion_seconds[0]);
  }
  // The second request's stream: exactly one token (from replica 1), none twice.
  c = hs[1]->next(std::chrono::seconds(5));
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->tokens, std::vector<int32_t>{42});
}

// Bug: a promoted replica that got no request during its burst timed "decision -> first token"
// on the first request of the next burst (102 s of idle time as a promotion).
TEST(ElasticPromotion, PromotionWithNoWaitingWorkIsNotMeasured) {
  Promotion p;
  // Replica 1's cache holds 2 blocks of 16 tokens: the burst's 40-token requests never fit there.
  ASSERT_NO_FATAL_FAILURE(p.start(2));
  std::vector<std::shared_ptr<RequestHandle>> hs;  // kept: a dropped handle cancels its request
  ASSERT_NO_FATAL_FAILURE(p.submit(3, 40, &hs));
  // Replica 1 is promoted; the request replica 0 hands back can only go back there.
  ASSERT_TRUE(until(5, [&] { return p.rec.count_prefix("r0/target_shard: reclaim") >= 1; }))
      << p.rec.dump() << describe(p.client->status());
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(p.rec.count_prefix("r1/target_shard: work"), 0) << p.rec.dump();
  // A request that arrives after the decision is the first one replica 1 gets.
  auto late = p.client->submit(request(5));
  ASSERT_TRUE(late.ok()) << late.status().to_string();
  hs.push_back(*late);
  ASSERT_TRUE(until(5, [&] { return p.rec.count("r1/target_shard: work 4") == 1; })) << p.rec.dump();
  auto c = hs.back()->next(std::chrono::seconds(5));
  ASSERT_TRUE(c.has_value());
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  auto st = p.client->status();
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->autoscale.num_promotions, 1);
  EXPECT_EQ(st->autoscale.promotion_routable_seconds.size(), 1u);
  EXPECT_TRUE(st->autoscale.promotion_dispatch_seconds.empty()) << "timed a request that arrived after the decision";
  EXPECT_TRUE(st->autoscale.promotion_seconds.empty()) << "timed a request that arrived after the decision";
  EXPECT_EQ(st->autoscale.num_promotions_without_waiting_work, 1);
  for (const auto& r : st->replicas) {
    if (r.replica == 1) EXPECT_EQ(r.promotion_seconds, 0.0);
  }
}

// A promoted replica that leaves ready before any request came ends its scale-up unmeasured:
// routed again later, it must not time itself from the old decision.
TEST(ElasticPromotion, PromotionEndsUnmeasuredWhenTheReplicaLeavesReady) {
  Promotion p;
  ASSERT_NO_FATAL_FAILURE(p.start(2));  // the burst's 40-token requests never fit on replica 1
  std::vector<std::shared_ptr<RequestHandle>> hs;
  ASSERT_NO_FATAL_FAILURE(p.submit(3, 40, &hs));
  ASSERT_TRUE(until(5, [&] { return p.rec.count_prefix("r0/target_shard: reclaim") >= 1; }))
      << p.rec.dump() << describe(p.client->status());
  auto st = p.client->status();
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->autoscale.num_promotions_without_waiting_work, 0);
  caf::anon_send_exit(p.shards[1], caf::exit_reason::kill);
  ASSERT_TRUE(until(5, [&] {
    auto s = p.client->status();
    return s.ok() && state_of(*s, 1) == "stopped";
  })) << describe(p.client->status());
  st = p.client->status();
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->autoscale.num_promotions_without_waiting_work, 1);
  EXPECT_TRUE(st->autoscale.promotion_dispatch_seconds.empty());
}

// Bug: a SIGTERM drain of the whole cluster still promoted a standby replica.
TEST(ElasticPromotion, NoPromotionWhileTheClusterDrains) {
  Promotion p;
  ASSERT_NO_FATAL_FAILURE(p.start(64, 1, /*upscale_delay_s=*/0.5));
  std::vector<std::shared_ptr<RequestHandle>> hs;
  ASSERT_NO_FATAL_FAILURE(p.submit(3, 10, &hs));  // 3 ongoing want 2 replicas, after the upscale delay
  std::thread drain([&] { (void)p.head->drain(std::chrono::milliseconds(2000)); });
  std::this_thread::sleep_for(std::chrono::milliseconds(1200));
  auto st = p.client->status();
  ASSERT_TRUE(st.ok());
  EXPECT_TRUE(st->draining);
  EXPECT_EQ(state_of(*st, 1), "standby") << describe(st);
  EXPECT_EQ(st->autoscale.num_promotions, 0);
  EXPECT_EQ(p.rec.count_prefix("r1/target_shard: work"), 0) << p.rec.dump();
  drain.join();
}

// Scale from zero (min_replicas 0): the standby replica routed for the first request is a
// promotion, counted and measured like any other.
TEST(ElasticPromotion, ScaleFromZeroIsAMeasuredPromotion) {
  Recorder rec;
  ActorRuntime rt;
  Topology t = make_topology(1, /*drafts=*/false);
  t.autoscale.min_replicas = 0;
  t.autoscale.max_replicas = 1;
  t.autoscale.warm_pool = 1;
  t.autoscale.upscale_delay_s = 0;
  t.autoscale.downscale_delay_s = 1000;
  auto head = Head::start(rt, t, kToken, /*publish=*/false);
  ASSERT_TRUE(head.ok()) << head.status().to_string();
  auto client = Client::in_process(rt.system(), (*head)->scheduler(), kToken);
  FakeSpec f;
  f.scheduler = (*head)->scheduler();
  f.rec = &rec;
  rt.system().spawn(fake_worker, f);
  ASSERT_TRUE(until(5, [&] {
    auto st = client->status();
    return st.ok() && state_of(*st, 0) == "standby";
  })) << describe(client->status());
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  auto st = client->status();
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(state_of(*st, 0), "standby") << "min_replicas 0: nothing is routed while idle";
  auto h = client->submit(request(10));
  ASSERT_TRUE(h.ok()) << h.status().to_string();
  auto c = (*h)->next(std::chrono::seconds(5));
  ASSERT_TRUE(c.has_value()) << rec.dump() << describe(client->status());
  ASSERT_TRUE(until(5, [&] {
    st = client->status();
    return st.ok() && !st->autoscale.promotion_seconds.empty();
  })) << "scale from zero was not measured: " << describe(st);
  EXPECT_EQ(st->autoscale.num_promotions, 1);
  EXPECT_EQ(st->autoscale.promotion_routable_seconds.size(), 1u);
  EXPECT_EQ(st->autoscale.promotion_dispatch_seconds.size(), 1u);
  EXPECT_EQ(st->autoscale.num_promotions_without_waiting_work, 0);
  EXPECT_NE(st->autoscale.last_reason.find("scale from zero"), std::string::npos) << st->autoscale.last_reason;
  client.reset();
  (*head)->stop();
}

// 4 declared replicas, autoscale 1..3 with a warm pool of 1, immediate scale-up, no scale-down
// within a test: the scale-up tests' cluster.
Topology scale_up_topology(int32_t target_ongoing_requests) {
  Topology t = make_topology(4, /*drafts=*/false);
  t.autoscale.min_replicas = 1;
  t.autoscale.max_replicas = 3;
  t.autoscale.warm_pool = 1;
  t.autoscale.upscale_delay_s = 0;
  t.autoscale.downscale_delay_s = 1000;
  t.autoscale.target_ongoing_requests = target_ongoing_requests;
  return t;
}

// Starts `t` with replica 0 ready and replica 1 in standby (the warm pool).
void start_one_ready_one_standby(Launched& l, const Topology& t) {
  ASSERT_NO_FATAL_FAILURE(l.start(t));
  ASSERT_TRUE(until(5, [&] { return l.num_starts(0) == 1 && l.num_starts(1) == 1; }));
  l.spawn(0);
  ASSERT_TRUE(l.wait_state(0, "ready")) << describe(l.client->status());
  l.spawn(1);
  ASSERT_TRUE(l.wait_state(1, "standby")) << describe(l.client->status());
}

// Bug: a replica started cold (a pool refill) that covered a later scale-up was promoted on
// ready as a warm promotion, timed from when it became ready, and cold_scale_up_seconds stayed
// empty.
TEST(ElasticPromotion, ColdStartCoveringAScaleUpIsTimedFromTheDecisionAsCold) {
  Launched l;
  ASSERT_NO_FATAL_FAILURE(start_one_ready_one_standby(l, scale_up_topology(2)));
  std::vector<std::shared_ptr<RequestHandle>> hs;
  auto submit = [&](int n) {
    for (int i = 0; i < n; ++i) {
      auto h = l.client->submit(request(10));
      ASSERT_TRUE(h.ok()) << h.status().to_string();
      hs.push_back(*h);
    }
  };
  // 3 ongoing want 2: replica 1 is promoted (warm), replica 2 refills the pool (cold, left starting).
  ASSERT_NO_FATAL_FAILURE(submit(3));
  ASSERT_TRUE(l.wait_state(1, "ready")) << describe(l.client->status());
  ASSERT_TRUE(until(5, [&] { return l.num_starts(2) == 1; })) << describe(l.client->status());
  // 5 ongoing want 3: no standby left; the starting replica 2 covers the scale-up.
  ASSERT_NO_FATAL_FAILURE(submit(2));
  ASSERT_TRUE(until(5, [&] {
    auto st = l.client->status();
    return st.ok() && st->autoscale.target_ready == 3;
  })) << describe(l.client->status());
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the cold start takes a while
  l.spawn(2);
  ClusterStatus st;
  ASSERT_TRUE(until(5, [&] {
    auto s = l.client->status();
    if (s.ok()) st = *s;
    return s.ok() && !st.autoscale.cold_scale_up_seconds.empty();
  })) << "the cold path was not measured: " << describe(l.client->status()) << l.rec.dump();
  EXPECT_EQ(state_of(st, 2), "ready");
  EXPECT_EQ(st.autoscale.num_promotions, 1) << "replica 2 counted as a warm promotion";
  ASSERT_EQ(st.autoscale.cold_scale_up_seconds.size(), 1u);
  EXPECT_GE(st.autoscale.cold_scale_up_seconds[0], 0.3) << "not timed from the decision";
  for (const auto& r : st.replicas) {
    if (r.replica == 2) EXPECT_EQ(r.num_promotions, 0);
  }
}

// Bug (fresh-user test): after held starts, the pool refill's replica finished its cold start
// before the one started for the scale-up, was routed at once, and was reported as a warm
// promotion timed from that moment; cold_scale_up_seconds stayed empty.
TEST(ElasticPromotion, ColdStartsFinishingInEitherOrderTimeTheScaleUpAsCold) {
  Launched l;
  ASSERT_NO_FATAL_FAILURE(start_one_ready_one_standby(l, scale_up_topology(2)));
  std::vector<std::shared_ptr<RequestHandle>> hs;
  for (int i = 0; i < 6; ++i) {  // 6 ongoing want 3: replica 1 promoted, one more started cold + the refill
    auto h = l.client->submit(request(10));
    ASSERT_TRUE(h.ok()) << h.status().to_string();
    hs.push_back(*h);
  }
  ASSERT_TRUE(l.wait_state(1, "ready")) << describe(l.client->status());
  ASSERT_TRUE(until(8, [&] { return l.num_starts(2) == 1 && l.num_starts(3) == 1; })) << describe(l.client->status());
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the cold starts take a while
  // Either may be the one started for the scale-up: the other finishes first and is routed.
  l.spawn(3);
  ClusterStatus st;
  ASSERT_TRUE(until(5, [&] {
    auto s = l.client->status();
    if (s.ok()) st = *s;
    return s.ok() && (state_of(st, 3) == "ready" || state_of(st, 3) == "standby");
  })) << describe(l.client->status());
  l.spawn(2);
  ASSERT_TRUE(until(5, [&] {
    auto s = l.client->status();
    if (s.ok()) st = *s;
    return s.ok() && !st.autoscale.cold_scale_up_seconds.empty();
  })) << "the cold path was not measured: " << describe(l.client->status()) << l.rec.dump();
  EXPECT_EQ(st.autoscale.num_promotions, 1) << "a cold-started replica counted as a warm promotion: " << describe(st);
  ASSERT_EQ(st.autoscale.cold_scale_up_seconds.size(), 1u);
  EXPECT_GE(st.autoscale.cold_scale_up_seconds[0], 0.3) << "not timed from the decision";
  int ready = 0;
  for (const auto& r : st.replicas) {
    if (r.replica >= 2) EXPECT_EQ(r.num_promotions, 0) << "replica " << r.replica;
    ready += r.state == "ready";
  }
  EXPECT_EQ(ready, 3) << describe(st);
}

// Bug: cold starts held back (CPU host, until the promoted replica's first token) started after
// the clients had gone, with 0 ongoing, and were stopped again later.
TEST(ElasticPromotion, HeldColdStartsForLoadThatWentAwayAreNotStarted) {
  Launched l;
  Topology t = scale_up_topology(1);
  ASSERT_NO_FATAL_FAILURE(l.start(t));
  ASSERT_TRUE(until(5, [&] { return l.num_starts(0) == 1 && l.num_starts(1) == 1; }));
  l.spawn(0);
  ASSERT_TRUE(l.wait_state(0, "ready")) << describe(l.client->status());
  l.spawn(1, /*first_token=*/false);  // its first token never comes: the cold starts stay held
  ASSERT_TRUE(l.wait_state(1, "standby")) << describe(l.client->status());
  ASSERT_EQ(l.num_starts(), 2u);
  {
    std::vector<std::shared_ptr<RequestHandle>> hs;
    for (int i = 0; i < 3; ++i) {  // 3 ongoing want 3: replica 1 promoted, one more held
      auto h = l.client->submit(request(10));
      ASSERT_TRUE(h.ok()) << h.status().to_string();
      hs.push_back(*h);
    }
    ASSERT_TRUE(until(5, [&] { return l.rec.count_prefix("r1/target_shard: work") >= 1; })) << l.rec.dump();
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    EXPECT_EQ(l.num_starts(), 2u) << "the cold starts were not held";
  }  // the clients go: their requests are cancelled
  ASSERT_TRUE(until(5, [&] {
    auto st = l.client->status();
    return st.ok() && st->autoscale.ongoing == 0;
  })) << describe(l.client->status());
  // The hold ends (5 s after the promotion): only the pool refill starts.
  std::this_thread::sleep_for(std::chrono::milliseconds(6000));
  auto st = l.client->status();
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->autoscale.target_ready, 3) << "the target keeps its hysteresis";
  EXPECT_EQ(l.num_starts(), 3u) << "a held scale-up start began with 0 ongoing: " << describe(st);
}

TEST(ElasticPromotion, StoppingTheOnlyRoutedReplicaPromotesAStandbyThatTakesItsRequests) {
  Promotion p;
  ASSERT_NO_FATAL_FAILURE(p.start(64));
  std::vector<std::shared_ptr<RequestHandle>> hs;
  ASSERT_NO_FATAL_FAILURE(p.submit(1, 10, &hs));
  ASSERT_TRUE(until(5, [&] { return p.rec.count_prefix("r0/target_shard: work") == 1; })) << p.rec.dump();
  // Replica 0's worker asks for a drain as a SIGTERM'd target shard does.
  caf::scoped_actor self{p.rt.system()};
  int32_t answer = -2;
  self->request(p.head->scheduler(), std::chrono::seconds(5), drain_rep_atom::value, std::string(kToken), int32_t{0}, false,
                p.shards[0])
      .receive([&](int32_t n) { answer = n; }, [&](caf::error& e) { ADD_FAILURE() << p.rt.system().render(e); });
  EXPECT_EQ(answer, 1);
  EXPECT_TRUE(until(5, [&] { return p.rec.count_prefix("r1/target_shard: work") == 1; }))
      << "the request did not move to the promoted replica:\n" << p.rec.dump() << describe(p.client->status());
  EXPECT_EQ(p.rec.count("r0/target_shard: migrate"), 1) << p.rec.dump();
  auto st = p.client->status();
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(state_of(*st, 1), "ready") << describe(st);
  EXPECT_EQ(state_of(*st, 0), "draining") << describe(st);
}

// Review of the drain's promotion: with the cluster scaled to zero (min_replicas 0, both
// replicas in the warm pool), a pool member whose worker stops routed the other standby for
// nothing (no request to hand over; drained back later).
TEST(ElasticPromotion, APoolMemberStoppingPromotesNoStandby) {
  Launched c;
  Topology t = make_topology(2, /*drafts=*/false);
  t.autoscale.min_replicas = 0;
  t.autoscale.max_replicas = 2;
  t.autoscale.warm_pool = 2;
  ASSERT_NO_FATAL_FAILURE(c.start(t));
  std::vector<caf::actor> shards;
  for (int32_t r = 0; r < 2; ++r) {
    FakeSpec f;
    f.replica = r;
    f.scheduler = c.head->scheduler();
    f.rec = &c.rec;
    shards.push_back(c.rt.system().spawn(fake_worker, f));
    ASSERT_TRUE(c.wait_state(r, "standby")) << describe(c.client->status());
  }
  caf::scoped_actor self{c.rt.system()};
  int32_t answer = -2;
  self->request(c.head->scheduler(), std::chrono::seconds(5), drain_rep_atom::value, std::string(kToken), int32_t{0}, false,
                shards[0])
      .receive([&](int32_t n) { answer = n; }, [&](caf::error& e) { ADD_FAILURE() << c.rt.system().render(e); });
  EXPECT_EQ(answer, 0) << "nothing to hand over";
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  auto st = c.client->status();
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(state_of(*st, 1), "standby") << describe(st);
  EXPECT_EQ(st->autoscale.num_promotions, 0) << describe(st);
}

// Helper review of the autoscaler: a replica whose KV cache filled up (its sequences preempting
// each other, fewer of them than its batch) kept every request while the replica promoted beside
// it sat idle: the rebalance counted only requests beyond a batch. Those waiting for cache room
// now go back to the head and run on the promoted replica.
TEST(ElasticPromotion, RequestsWaitingForKvRoomMoveToThePromotedReplica) {
  Promotion p;
  ASSERT_NO_FATAL_FAILURE(p.start(64, /*replica1_max_num_seqs=*/4, /*upscale_delay_s=*/0, /*replica0_max_num_seqs=*/4));
  std::vector<std::shared_ptr<RequestHandle>> hs;
  ASSERT_NO_FATAL_FAILURE(p.submit(3, 50, &hs));
  ASSERT_TRUE(until(5, [&] { return p.rec.count_prefix("r0/target_shard: work") == 3; })) << p.rec.dump();
  ASSERT_TRUE(until(5, [&] {
    auto st = p.client->status();
    return st.ok() && state_of(*st, 1) == "ready";
  })) << describe(p.client->status());
  // 3 on replica 0 (a batch of 4) and none on replica 1 is within the running rebalance's gap.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  ASSERT_EQ(p.rec.count_prefix("r1/target_shard: work"), 0) << p.rec.dump();
  // Replica 0's cache fills: one request runs, two wait for room.
  caf::anon_send(p.shards[0], std::string("kv_full 1"));
  EXPECT_TRUE(until(5, [&] { return p.rec.count_prefix("r1/target_shard: work") == 2; }))
      << "the requests waiting for KV room stayed:\n" << p.rec.dump() << describe(p.client->status());
  EXPECT_EQ(p.rec.count("r0/target_shard: reclaim 2"), 1) << p.rec.dump();
}

// Helper review of the autoscaler: a scale-down moved the drained replica's sequences into
// replicas without free KV blocks for them, which then preempted (and the KV pressure brought a
// replica back). Replica 0 holds one long prompt (26 blocks); replica 1 keeps two short requests
// and has `replica1_kv_blocks` in all. Returns how often replica 0 was asked to migrate.
int drain_with_receiver_blocks(int32_t replica1_kv_blocks) {
  Promotion p;
  p.start(replica1_kv_blocks, /*replica1_max_num_seqs=*/4, /*upscale_delay_s=*/0, /*replica0_max_num_seqs=*/1,
          /*rebalance_running=*/true, /*replica0_keeps_running=*/false, /*downscale_delay_s=*/0.3,
          /*target_ongoing_requests=*/3);
  std::vector<std::shared_ptr<RequestHandle>> hs;
  p.submit(1, 400, &hs);  // A: the long prompt, on replica 0
  EXPECT_TRUE(until(5, [&] { return p.rec.count_prefix("r0/target_shard: work") == 1; })) << p.rec.dump();
  p.submit(3, 8, &hs);  // B, C, D: 4 ongoing want 2 replicas; the waiting ones go to replica 1
  EXPECT_TRUE(until(5, [&] { return p.rec.count_prefix("r1/target_shard: work") == 3; }))
      << p.rec.dump() << describe(p.client->status());
  hs.erase(hs.begin() + 1);  // B cancelled: 3 ongoing want 1 replica; the emptiest (replica 0) drains
  EXPECT_TRUE(until(5, [&] {
    auto st = p.client->status();
    return st.ok() && st->autoscale.num_drains >= 1;
  })) << describe(p.client->status()) << p.rec.dump();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  // A drain that moved its sequences ends (standby); one that did not waits for them.
  EXPECT_TRUE(until(5, [&] {
    auto st = p.client->status();
    return st.ok() && state_of(*st, 0) == (p.rec.count("r0/target_shard: migrate") ? "standby" : "draining");
  })) << describe(p.client->status());
  return p.rec.count("r0/target_shard: migrate");
}

TEST(ElasticPromotion, ADrainMovesSequencesOnlyWhereTheirKvFits) {
  EXPECT_EQ(drain_with_receiver_blocks(64), 1) << "with room, the drained replica's sequences move";
  EXPECT_EQ(drain_with_receiver_blocks(20), 0) << "18 free blocks cannot take 26: they finish where they are";
}

}  // namespace
}  // namespace specserve
