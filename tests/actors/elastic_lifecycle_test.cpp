// The head's replica lifecycle with fake workers (tests/actors/elastic_fixtures.h):
//  - a draft worker that registers after the head gave up its replica's start is told to quit
//    (it would otherwise run on unattached, and block the slot's next start), the real draft
//    worker actor included;
//  - a replica whose target shard dies loses its draft worker too (a restart starts both);
//  - the counters of a replica whose shard died stay in the cluster's totals (ClusterStatus::ended);
//  - a replica whose draft worker dies is replaced (a standby promoted, or one started cold for
//    it), and a standby whose draft worker dies is started again.
// Failed starts and parking: elastic_start_failure_test.cpp.
#include <map>

#include "tests/actors/elastic_fixtures.h"

namespace specserve {
namespace {

using namespace elastic_testing;

TEST(ElasticLifecycle, DraftWorkerOfAGivenUpStartIsToldToQuit) {
  // Declared before the actor system: the fake workers and the head's launcher callback use them.
  Recorder rec;
  std::mutex mu;
  std::vector<int32_t> starts;
  ActorRuntime rt;
  Topology t = make_topology(2, /*drafts=*/true);
  t.autoscale.min_replicas = 1;
  t.autoscale.max_replicas = 2;
  t.autoscale.warm_pool = 0;
  t.autoscale.start_timeout_s = 0.5;
  // The first start of replica 0 is "launched": its target shard registers and stays loading
  // (below); every later start fails, so the replica stays stopped.
  auto start = [&](int32_t replica) -> Status {
    std::lock_guard<std::mutex> lock(mu);
    starts.push_back(replica);
    if (starts.size() == 1 && replica == 0) return Status();
    return unavailable("test: no more starts");
  };
  auto head = Head::start(rt, t, kToken, /*publish=*/false, start);
  ASSERT_TRUE(head.ok()) << head.status().to_string();
  caf::actor sched = (*head)->scheduler();
  ASSERT_TRUE(until(5, [&] {
    std::lock_guard<std::mutex> lock(mu);
    return !starts.empty();
  }));
  {
    std::lock_guard<std::mutex> lock(mu);
    ASSERT_EQ(starts[0], 0);
  }
  FakeSpec shard;
  shard.replica = 0;
  shard.state = "loading";
  shard.scheduler = sched;
  shard.rec = &rec;
  rt.system().spawn(fake_worker, shard);
  auto client = Client::in_process(rt.system(), sched, kToken);
  // start_timeout_s passes without progress: the start is given up and its shard told to quit.
  ASSERT_TRUE(until(10, [&] { return rec.count("r0/target_shard: retire") == 1; })) << rec.dump();
  auto st = client->status();
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(state_of(*st, 0), "stopped");
  // The same start's draft worker registers late (it loads on its own): it must go too.
  FakeSpec draft;
  draft.role = "draft_worker";
  draft.replica = 0;
  draft.scheduler = sched;
  draft.rec = &rec;
  rt.system().spawn(fake_worker, draft);
  EXPECT_TRUE(until(5, [&] { return rec.count("r0/draft_worker: retire") == 1; })) << rec.dump();
  st = client->status();
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(state_of(*st, 0), "stopped");
  for (const auto& w : st->workers) {
    EXPECT_FALSE(w.role == "draft_worker" && w.replica == 0 && w.state == "ready")
        << "the late draft worker was taken as the stopped replica's";
  }
  client.reset();
  (*head)->stop();
}

TEST(ElasticLifecycle, RealDraftWorkerRegisteringLateQuits) {
  // The real draft worker actor (ngram; it loads the target model like in production) handles
  // the head's retire by quitting normally.
  Recorder rec;  // outlives the actor system (fake workers write to it)
  std::atomic<int> calls{0};
  ActorRuntime rt;
  Topology t = make_topology(2, /*drafts=*/true);
  SpeculativeSpec spec;
  spec.method = SpeculativeMethod::kNgram;
  spec.num_speculative_tokens = 3;
  spec.prompt_lookup_min = 1;
  spec.prompt_lookup_max = 3;
  t.models.speculative = spec;
  t.autoscale.min_replicas = 1;
  t.autoscale.max_replicas = 2;
  t.autoscale.start_timeout_s = 0.5;
  auto start = [&](int32_t replica) -> Status {
    if (calls++ == 0 && replica == 0) return Status();
    return unavailable("test: no more starts");
  };
  auto head = Head::start(rt, t, kToken, /*publish=*/false, start);
  ASSERT_TRUE(head.ok()) << head.status().to_string();
  caf::actor sched = (*head)->scheduler();
  ASSERT_TRUE(until(5, [&] { return calls.load() > 0; }));
  FakeSpec shard;
  shard.replica = 0;
  shard.state = "loading";
  shard.scheduler = sched;
  shard.rec = &rec;
  rt.system().spawn(fake_worker, shard);
  ASSERT_TRUE(until(10, [&] { return rec.count("r0/target_shard: retire") == 1; })) << rec.dump();
  WorkerConfig wc;
  wc.node = "local";
  wc.role = WorkerRole::kDraftWorker;
  wc.replica = 0;
  wc.topology = t;
  wc.threads = 1;
  wc.token = kToken;
  wc.scheduler = sched;
  caf::actor draft = spawn_draft_worker(rt.system(), wc);
  caf::scoped_actor self{rt.system()};
  self->monitor(draft);
  bool down = false;
  self->receive([&](caf::down_msg& m) { down = m.reason == caf::exit_reason::normal; },
                caf::after(std::chrono::seconds(60)) >> [] {});
  EXPECT_TRUE(down) << "the late draft worker did not quit normally within 60 s";
  (*head)->stop();
}

TEST(ElasticLifecycle, ShardDownTakesItsDraftWorkerWithIt) {
  Recorder rec;  // outlives the actor system (fake workers write to it)
  ActorRuntime rt;
  Topology t = make_topology(2, /*drafts=*/true);
  t.autoscale.min_replicas = 1;
  t.autoscale.max_replicas = 2;
  t.autoscale.warm_pool = 1;
  auto head = Head::start(rt, t, kToken, /*publish=*/false);  // no launcher: replicas register on their own
  ASSERT_TRUE(head.ok()) << head.status().to_string();
  caf::actor sched = (*head)->scheduler();
  auto client = Client::in_process(rt.system(), sched, kToken);
  std::vector<caf::actor> shards;
  for (int32_t r = 0; r < 2; ++r) {  // one after the other: replica 0 is the one routed at start-up
    for (const char* role : {"target_shard", "draft_worker"}) {
      FakeSpec f;
      f.role = role;
      f.replica = r;
      f.scheduler = sched;
      f.rec = &rec;
      caf::actor a = rt.system().spawn(fake_worker, f);
      if (std::string(role) == "target_shard") shards.push_back(a);
    }
    ASSERT_TRUE(until(5, [&] {
      auto st = client->status();
      return st.ok() && state_of(*st, r) == (r == 0 ? "ready" : "standby");
    })) << "replica " << r;
  }
  EXPECT_EQ(rec.count("r1/target_shard: attach"), 1) << "a standby replica keeps its draft worker attached";
  // The standby replica's target shard dies: its draft worker is told to quit with it.
  caf::anon_send_exit(shards[1], caf::exit_reason::kill);
  EXPECT_TRUE(until(5, [&] { return rec.count("r1/draft_worker: retire") == 1; })) << rec.dump();
  EXPECT_EQ(rec.count("r0/draft_worker: retire"), 0);
  client.reset();
  (*head)->stop();
}

// A replica's load starts again from 0 when its shard dies (the next shard's engine counts from
// 0); what the dead one had counted moves to ClusterStatus::ended, so the cluster's totals
// (/metrics) never go back.
TEST(ElasticLifecycle, CountersOfADeadShardStayInTheClusterTotals) {
  Recorder rec;
  ActorRuntime rt;
  Topology t = make_topology(1, /*drafts=*/false);
  auto head = Head::start(rt, t, kToken, /*publish=*/false);
  ASSERT_TRUE(head.ok()) << head.status().to_string();
  caf::actor sched = (*head)->scheduler();
  auto client = Client::in_process(rt.system(), sched, kToken);
  FakeSpec f;
  f.replica = 0;
  f.scheduler = sched;
  f.rec = &rec;
  f.prompt_tokens = 100;
  f.goodput_drafting = 7;
  caf::actor shard = rt.system().spawn(fake_worker, f);
  ASSERT_TRUE(until(5, [&] {
    auto st = client->status();
    return st.ok() && state_of(*st, 0) == "ready";
  }));
  caf::anon_send(shard, step_atom::value);
  ASSERT_TRUE(until(5, [&] {
    auto st = client->status();
    return st.ok() && st->replicas.size() == 1 && st->replicas[0].load.prompt_tokens == 100;
  }));
  caf::anon_send_exit(shard, caf::exit_reason::kill);
  ClusterStatus last;
  EXPECT_TRUE(until(5, [&] {
    auto st = client->status();
    if (st.ok()) last = *st;
    return st.ok() && st->replicas.size() == 1 && st->replicas[0].load.prompt_tokens == 0 &&
           st->ended.prompt_tokens == 100;
  })) << "replica load " << (last.replicas.empty() ? -1 : last.replicas[0].load.prompt_tokens) << ", ended "
      << last.ended.prompt_tokens;
  EXPECT_EQ(last.ended.goodput_drafting, 7);
  EXPECT_EQ(last.ended.num_running, 0) << "gauges are not carried";
  client.reset();
  (*head)->stop();
}

// A cluster of `n` declared replicas with draft workers whose processes the head's launcher
// starts (recorded); the test spawns a started replica's fake target shard and draft worker.
struct DraftCluster : Launched {
  std::map<int32_t, caf::actor> drafts;
  // (min 1, max 2 with no scale-up for the load, or the autoscaler is off: min = max, no pool)
  void start(int32_t n, int32_t warm_pool) {
    Topology t = make_topology(n, /*drafts=*/true);
    t.autoscale.min_replicas = 1;
    t.autoscale.max_replicas = 2;
    t.autoscale.warm_pool = warm_pool;
    t.autoscale.upscale_delay_s = 1000;
    t.autoscale.downscale_delay_s = 1000;
    Launched::start(t);
  }
  void spawn(int32_t replica, const std::string& draft_state = "ready") {
    Launched::spawn(replica);
    FakeSpec f;
    f.role = "draft_worker";
    f.replica = replica;
    f.state = draft_state;
    f.scheduler = head->scheduler();
    f.rec = &rec;
    drafts[replica] = rt.system().spawn(fake_worker, f);
  }
  bool draft_lost(int32_t replica) {
    auto st = client->status();
    if (!st.ok()) return false;
    for (const auto& r : st->replicas) {
      if (r.replica == replica) return r.draft_lost;
    }
    return false;
  }
};

// Helper review of the autoscaler: under an autoscaler nothing restarts a draft worker alone
// (scheduler.worker_restarts is off there), so a replica whose draft worker died served without
// speculation for good, its status row a plain "ready". Now a warm standby is promoted, the
// draftless replica's sequences move there and it stops; the pool is refilled.
TEST(ElasticLifecycle, AReplicaWhoseDraftWorkerDiesIsReplacedByAStandby) {
  DraftCluster c;
  ASSERT_NO_FATAL_FAILURE(c.start(3, /*warm_pool=*/1));
  ASSERT_TRUE(until(5, [&] { return c.num_starts(0) == 1 && c.num_starts(1) == 1; }));
  c.spawn(0);
  ASSERT_TRUE(c.wait_state(0, "ready")) << describe(c.client->status());
  c.spawn(1);
  ASSERT_TRUE(c.wait_state(1, "standby")) << describe(c.client->status());
  auto h = c.client->submit(request(8));
  ASSERT_TRUE(h.ok()) << h.status().to_string();
  ASSERT_TRUE(until(5, [&] { return c.rec.count_prefix("r0/target_shard: work") == 1; })) << c.rec.dump();
  EXPECT_FALSE(c.draft_lost(0));

  caf::anon_send_exit(c.drafts[0], caf::exit_reason::kill);
  EXPECT_TRUE(c.wait_state(1, "ready")) << "the standby was not promoted:\n" << describe(c.client->status());
  EXPECT_TRUE(until(5, [&] { return c.rec.count_prefix("r1/target_shard: work") == 1; }))
      << "the request did not move to the replacement:\n" << c.rec.dump() << describe(c.client->status());
  EXPECT_EQ(c.rec.count("r0/target_shard: migrate"), 1) << c.rec.dump();
  EXPECT_TRUE(until(5, [&] { return c.rec.count("r0/target_shard: retire") == 1; }))
      << "the draftless replica did not stop:\n" << c.rec.dump() << describe(c.client->status());
  // The warm pool is refilled: a cold start of a stopped slot (2, or 0 once its shard is gone).
  EXPECT_TRUE(until(5, [&] { return c.num_starts(2) + c.num_starts(0) >= 2; })) << describe(c.client->status());
  auto st = c.client->status();
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->autoscale.num_drains, 0) << "a replacement is no scale-down";
  EXPECT_EQ(st->autoscale.num_stops, 0) << "a replacement is no scale-down";
}

// With no standby to promote, the replica whose draft worker died serves on without speculation
// (status says so) while a stopped replica is started cold for it; once that one is warm it is
// promoted and the draftless one stops. A standby whose draft worker dies is stopped and started
// again (it was promoted later as if whole).
TEST(ElasticLifecycle, WithNoStandbyADraftlessReplicaServesOnUntilAColdStartReplacesIt) {
  DraftCluster c;
  ASSERT_NO_FATAL_FAILURE(c.start(2, /*warm_pool=*/0));
  ASSERT_TRUE(until(5, [&] { return c.num_starts(0) == 1; })) << describe(c.client->status());
  c.spawn(0);
  ASSERT_TRUE(c.wait_state(0, "ready")) << describe(c.client->status());
  EXPECT_EQ(c.num_starts(1), 0);

  caf::anon_send_exit(c.drafts[0], caf::exit_reason::kill);
  EXPECT_TRUE(until(5, [&] { return c.draft_lost(0); })) << describe(c.client->status());
  EXPECT_TRUE(until(5, [&] { return c.num_starts(1) == 1; })) << "no replacement started:\n" << describe(c.client->status());
  auto st = c.client->status();
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(state_of(*st, 0), "ready") << "it serves on until replaced:\n" << describe(st);
  auto h = c.client->submit(request(8));
  ASSERT_TRUE(h.ok()) << h.status().to_string();
  EXPECT_TRUE(until(5, [&] { return c.rec.count_prefix("r0/target_shard: work") == 1; })) << c.rec.dump();
  // Only one replacement, however many ticks pass while it loads.
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  EXPECT_EQ(c.num_starts(1), 1);

  c.spawn(1);
  EXPECT_TRUE(c.wait_state(1, "ready")) << describe(c.client->status());
  EXPECT_TRUE(until(5, [&] { return c.rec.count_prefix("r1/target_shard: work") == 1; }))
      << "the request did not move to the replacement:\n" << c.rec.dump() << describe(c.client->status());
  EXPECT_TRUE(until(5, [&] { return c.rec.count("r0/target_shard: retire") == 1; })) << c.rec.dump();
  EXPECT_FALSE(c.draft_lost(1));
}

// Review of the replacement's counters: a draftless replica the policy drains as a scale-down
// (it goes first) is a stop like any other; only a swap for a replica with drafts is not.
// NOTE: told apart by draft_lost, it counted as a drain but never as a stop.
TEST(ElasticLifecycle, ADraftlessReplicaScaledDownCountsAsAStop) {
  DraftCluster c;
  Topology t = make_topology(2, /*drafts=*/true);
  t.autoscale.min_replicas = 1;
  t.autoscale.max_replicas = 2;
  t.autoscale.warm_pool = 0;
  t.autoscale.upscale_delay_s = 0;
  t.autoscale.downscale_delay_s = 0.3;
  t.autoscale.target_ongoing_requests = 1;
  ASSERT_NO_FATAL_FAILURE(c.Launched::start(t));
  ASSERT_TRUE(until(5, [&] { return c.num_starts(0) == 1; })) << describe(c.client->status());
  c.spawn(0);
  ASSERT_TRUE(c.wait_state(0, "ready")) << describe(c.client->status());
  {
    std::vector<std::shared_ptr<RequestHandle>> hs;
    for (int i = 0; i < 2; ++i) {  // 2 ongoing at 1 per replica: replica 1 started cold
      auto h = c.client->submit(request(8));
      ASSERT_TRUE(h.ok()) << h.status().to_string();
      hs.push_back(*h);
    }
    ASSERT_TRUE(until(5, [&] { return c.num_starts(1) == 1; })) << describe(c.client->status());
    c.spawn(1);
    ASSERT_TRUE(c.wait_state(1, "ready")) << describe(c.client->status());
    // Replica 0's draft worker dies; no slot is free for a replacement: it serves on without.
    caf::anon_send_exit(c.drafts[0], caf::exit_reason::kill);
    ASSERT_TRUE(until(5, [&] { return c.draft_lost(0); })) << describe(c.client->status());
  }  // the requests are cancelled: the load is gone, one replica is drained
  ASSERT_TRUE(until(5, [&] { return c.rec.count("r0/target_shard: retire") == 1; }))
      << "the draftless replica was not the one scaled down:\n" << c.rec.dump() << describe(c.client->status());
  auto st = c.client->status();
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->autoscale.num_drains, 1) << describe(st);
  EXPECT_EQ(st->autoscale.num_stops, 1) << describe(st);
  EXPECT_EQ(state_of(*st, 1), "ready") << describe(st);
}

TEST(ElasticLifecycle, AStandbyWhoseDraftWorkerDiesIsStartedAgain) {
  DraftCluster c;
  ASSERT_NO_FATAL_FAILURE(c.start(2, /*warm_pool=*/1));
  ASSERT_TRUE(until(5, [&] { return c.num_starts(0) == 1 && c.num_starts(1) == 1; }));
  c.spawn(0);
  ASSERT_TRUE(c.wait_state(0, "ready")) << describe(c.client->status());
  c.spawn(1);
  ASSERT_TRUE(c.wait_state(1, "standby")) << describe(c.client->status());
  caf::anon_send_exit(c.drafts[1], caf::exit_reason::kill);
  EXPECT_TRUE(until(5, [&] { return c.rec.count("r1/target_shard: retire") == 1; })) << c.rec.dump();
  EXPECT_TRUE(until(5, [&] { return c.num_starts(1) == 2; })) << "not started again:\n" << describe(c.client->status());
  EXPECT_EQ(c.rec.count("r0/target_shard: retire"), 0) << c.rec.dump();
  auto st = c.client->status();
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(state_of(*st, 0), "ready") << describe(st);
}

// Review of the draft-worker replacement: a draft worker that fails to load (it says "failed",
// then quits) made its replica restart in a loop (no backoff, never parked) where it used to
// serve without speculation; it serves without speculation again, and is not restarted.
TEST(ElasticLifecycle, ADraftWorkerThatFailsToLoadIsNotReplacedInALoop) {
  DraftCluster c;
  ASSERT_NO_FATAL_FAILURE(c.start(2, /*warm_pool=*/0));
  ASSERT_TRUE(until(5, [&] { return c.num_starts(0) == 1; })) << describe(c.client->status());
  c.spawn(0, "failed");
  ASSERT_TRUE(c.wait_state(0, "ready")) << "a replica whose draft failed serves without it:\n" << describe(c.client->status());
  caf::anon_send_exit(c.drafts[0], caf::exit_reason::user_shutdown);  // the failed worker quits
  EXPECT_TRUE(until(5, [&] { return c.draft_lost(0); })) << describe(c.client->status());
  std::this_thread::sleep_for(std::chrono::milliseconds(800));
  EXPECT_EQ(c.num_starts(0), 1) << "restarted";
  EXPECT_EQ(c.num_starts(1), 0) << "a replacement was started for a draft that cannot load";
  auto st = c.client->status();
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(state_of(*st, 0), "ready") << describe(st);
  EXPECT_EQ(c.rec.count("r0/target_shard: retire"), 0) << c.rec.dump();
}

}  // namespace
}  // namespace specserve
