// The head's replica lifecycle with fake workers (tests/actors/elastic_fixtures.h):
//  - a draft worker that registers after the head gave up its replica's start is told to quit
//    (it would otherwise run on unattached, and block the slot's next start), the real draft
//    worker actor included;
//  - a replica whose target shard dies loses its draft worker too (a restart starts both);
//  - the counters of a replica whose shard died stay in the cluster's totals (ClusterStatus::ended).
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

}  // namespace
}  // namespace specserve
