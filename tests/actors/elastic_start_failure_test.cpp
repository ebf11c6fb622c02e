// Failed starts with fake workers (tests/actors/elastic_fixtures.h): a replica parked after failed
// starts in a row is started again once its backoff is over, so the cluster heals when the cause
// is fixed (it stayed dead for good); a target shard, or a tensor-parallel rank of it, that fails
// to load counts a failed start and is retried at the backoff's pace, and the queue does not wait
// for a parked replica, except under scale from zero where a request after the backoff waits for
// one retry.
#include <map>

#include "tests/actors/elastic_fixtures.h"

namespace specserve {
namespace {

using namespace elastic_testing;

// min 1, max 2, no pool, a fixed 0.4 s backoff after a failed start.
Topology failing_topology(int32_t tensor_parallel_size) {
  Topology t = make_topology(2, /*drafts=*/false);
  t.models.target.tensor_parallel_size = tensor_parallel_size;
  for (int32_t rank = 1; rank < tensor_parallel_size; ++rank) {
    for (int32_t r = 0; r < 2; ++r) {
      WorkerSpec w;
      w.replica = r;
      w.rank = rank;
      t.nodes[0].workers.push_back(w);
    }
  }
  t.autoscale.min_replicas = 1;
  t.autoscale.max_replicas = 2;
  t.autoscale.warm_pool = 0;
  t.autoscale.start_backoff_s = 0.4;
  t.autoscale.start_backoff_max_s = 0.4;
  return t;
}

// For every start of replica 0 or 1 the head asked for since the last call (*spawned counts
// them): a target shard whose model fails to load and quits; with `rank1`, its rank 0 loads (for
// ever) and rank 1 is the one that fails.
void fail_new_starts(Launched& c, std::map<int32_t, int>* spawned, bool rank1) {
  for (int32_t r = 0; r < 2; ++r) {
    while ((*spawned)[r] < c.num_starts(r)) {
      ++(*spawned)[r];
      FakeSpec f;
      f.replica = r;
      f.scheduler = c.head->scheduler();
      f.rec = &c.rec;
      if (rank1) {
        f.state = "loading";
        c.rt.system().spawn(fake_worker, f);
        f.rank = 1;
      }
      f.state = "failed";
      auto w = c.rt.system().spawn(fake_worker, f);
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      caf::anon_send_exit(w, caf::exit_reason::user_shutdown);
    }
  }
}

// Bug: after 5 failed starts in a row a replica was never started again; with every replica there,
// the cluster ran on, answering every request "no replica is left", after the cause was fixed.
TEST(ElasticLifecycle, AParkedReplicaIsStartedAgainOnceItsCauseIsFixed) {
  Recorder rec;
  std::mutex mu;
  bool broken = true;  // every start is taken and then never shows up (start_timeout_s ends it)
  int32_t starts = 0;
  caf::actor sched_for_starts;
  ActorRuntime rt;
  Topology t = make_topology(2, /*drafts=*/false);
  t.autoscale.min_replicas = 1;
  t.autoscale.max_replicas = 2;
  t.autoscale.warm_pool = 0;
  t.autoscale.start_timeout_s = 0.2;
  t.autoscale.start_backoff_s = 0.05;
  t.autoscale.start_backoff_max_s = 0.3;
  auto start = [&](int32_t replica) -> Status {
    std::lock_guard<std::mutex> lock(mu);
    ++starts;
    if (!broken && sched_for_starts) {
      FakeSpec f;
      f.replica = replica;
      f.scheduler = sched_for_starts;
      f.rec = &rec;
      rt.system().spawn(fake_worker, f);
    }
    return Status();
  };
  auto head = Head::start(rt, t, kToken, /*publish=*/false, start);
  ASSERT_TRUE(head.ok()) << head.status().to_string();
  caf::actor sched = (*head)->scheduler();
  {
    std::lock_guard<std::mutex> lock(mu);
    sched_for_starts = sched;
  }
  auto client = Client::in_process(rt.system(), sched, kToken);
  // Both replicas reach 5 failures in a row: a request then fails at once instead of waiting.
  ASSERT_TRUE(until(20, [&] {
    auto st = client->status();
    if (!st.ok()) return false;
    for (const auto& r : st->replicas) {
      if (r.num_start_failures < 5 || r.state != "stopped") return false;
    }
    return true;
  })) << describe(client->status());
  auto st = client->status();
  ASSERT_TRUE(st.ok());
  EXPECT_NE(st->replicas[0].last_start_error.find("start_timeout_s"), std::string::npos) << st->replicas[0].last_start_error;
  auto refused = client->generate(request(5));
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("no replica is left"), std::string::npos) << refused.status().to_string();
  // The cause goes away: the next start (within the 0.3 s backoff cap) brings a replica up.
  int32_t starts_when_fixed = 0;
  {
    std::lock_guard<std::mutex> lock(mu);
    broken = false;
    starts_when_fixed = starts;
  }
  ASSERT_TRUE(until(10, [&] {
    auto s = client->status();
    return s.ok() && (state_of(*s, 0) == "ready" || state_of(*s, 1) == "ready");
  })) << describe(client->status());
  {
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_GT(starts, starts_when_fixed);
  }
  st = client->status();
  ASSERT_TRUE(st.ok());
  for (const auto& r : st->replicas) {
    if (r.state != "ready") continue;
    EXPECT_EQ(r.num_start_failures, 0);
    EXPECT_EQ(r.last_start_error, "");
  }
  // And it serves: the request reaches a shard (the fake gives its first token at once).
  auto h = client->submit(request(5));
  ASSERT_TRUE(h.ok()) << h.status().to_string();
  auto chunk = (*h)->next(std::chrono::seconds(10));
  ASSERT_TRUE(chunk.has_value()) << rec.dump() << describe(client->status());
  EXPECT_EQ(chunk->tokens, std::vector<int32_t>{42});
  h->reset();
  client.reset();
  (*head)->stop();
}

// Review of the parking: a target shard that says "failed" (its model did not load) and quits
// made its replica parked but counted no failure, so the policy started it again on the next
// tick, in a loop, with no backoff. Now each such start counts, the next waits for the backoff,
// and the queue does not wait for the retries (a request fails at once with nothing else to
// serve it, even while a retry start is in flight).
TEST(ElasticLifecycle, ATargetShardThatFailsToLoadIsRetriedOnlyAfterItsBackoff) {
  Launched c;
  ASSERT_NO_FATAL_FAILURE(c.start(failing_topology(1)));
  std::map<int32_t, int> spawned;
  const auto t0 = std::chrono::steady_clock::now();
  bool both_failed = false, refused_at_once = false;
  std::string refusal;
  while (std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(2400)) {
    fail_new_starts(c, &spawned, /*rank1=*/false);
    if (!both_failed) {
      auto st = c.client->status();
      both_failed = st.ok() && st->replicas.size() == 2 && st->replicas[0].num_start_failures > 0 &&
                    st->replicas[1].num_start_failures > 0;
      if (both_failed) {
        // Both parked: a request is not held for their retries, in flight or not.
        const auto asked = std::chrono::steady_clock::now();
        auto r = c.client->generate(request(2));
        refused_at_once = !r.ok() && std::chrono::steady_clock::now() - asked < std::chrono::seconds(1);
        if (!r.ok()) refusal = r.status().message();
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const int starts = c.num_starts(0) + c.num_starts(1);
  EXPECT_GE(c.num_starts(0), 2) << "started again once its backoff was over";
  EXPECT_LE(starts, 14) << "started " << starts << " times in 2.4 s with a 0.4 s backoff on 2 replicas";
  EXPECT_TRUE(both_failed) << describe(c.client->status());
  EXPECT_TRUE(refused_at_once) << refusal;
  EXPECT_NE(refusal.find("no replica is left"), std::string::npos) << refusal;
  auto st = c.client->status();
  ASSERT_TRUE(st.ok());
  ASSERT_EQ(st->replicas.size(), 2u);
  EXPECT_GE(st->replicas[0].num_start_failures, 2) << describe(st);
  EXPECT_NE(st->replicas[0].last_start_error.find("failed to load"), std::string::npos) << st->replicas[0].last_start_error;
  EXPECT_GE(st->autoscale.num_failed_starts, 3);
}

// Review of the parking: a tensor-parallel rank > 0 that fails to load (its rank 0 still loading)
// counted nothing, so its replica was restarted on every tick with no backoff.
TEST(ElasticLifecycle, ATensorParallelRankThatFailsToLoadCountsAFailedStart) {
  Launched c;
  ASSERT_NO_FATAL_FAILURE(c.start(failing_topology(2)));
  std::map<int32_t, int> spawned;
  const auto t0 = std::chrono::steady_clock::now();
  while (std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(2400)) {
    fail_new_starts(c, &spawned, /*rank1=*/true);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const int starts = c.num_starts(0) + c.num_starts(1);
  EXPECT_GE(c.num_starts(0), 2) << "started again once its backoff was over";
  EXPECT_LE(starts, 14) << "started " << starts << " times in 2.4 s with a 0.4 s backoff on 2 replicas";
  auto st = c.client->status();
  ASSERT_TRUE(st.ok());
  EXPECT_GE(st->replicas.at(0).num_start_failures, 2) << describe(st);
  EXPECT_NE(st->replicas.at(0).last_start_error.find("rank 1 failed to load"), std::string::npos)
      << st->replicas.at(0).last_start_error;
}

// Review of the parking: under scale from zero (min_replicas 0) only demand starts a replica, and
// a parked one failed every request at once, so nothing ever started it again. A request that
// comes after its backoff now waits for one retry, and is served when the cause is gone.
TEST(ElasticLifecycle, UnderScaleFromZeroARequestAfterTheBackoffRetriesAParkedReplica) {
  Launched c;
  Topology t = make_topology(1, /*drafts=*/false);
  t.autoscale.min_replicas = 0;
  t.autoscale.max_replicas = 1;
  t.autoscale.warm_pool = 0;
  t.autoscale.start_backoff_s = 0.3;
  t.autoscale.start_backoff_max_s = 0.3;
  t.autoscale.downscale_delay_s = 0;  // once the request is gone the target is 0 again: no start but for demand
  ASSERT_NO_FATAL_FAILURE(c.start(t));
  auto first = c.client->submit(request(2));  // scale from zero: a start, whose shard fails to load
  ASSERT_TRUE(first.ok()) << first.status().to_string();
  ASSERT_TRUE(until(5, [&] { return c.num_starts(0) == 1; })) << describe(c.client->status());
  FakeSpec f;
  f.replica = 0;
  f.state = "failed";
  f.scheduler = c.head->scheduler();
  f.rec = &c.rec;
  auto w = c.rt.system().spawn(fake_worker, f);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  caf::anon_send_exit(w, caf::exit_reason::user_shutdown);
  auto failed = (*first)->wait();
  ASSERT_FALSE(failed.ok()) << "nothing could serve it";
  EXPECT_NE(failed.status().message().find("no replica is left"), std::string::npos) << failed.status().to_string();
  // The cause goes away; after the backoff a request brings the replica up and is served.
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  ASSERT_EQ(c.num_starts(0), 1) << "started again with no demand:\n" << describe(c.client->status());
  auto second = c.client->submit(request(2));
  ASSERT_TRUE(second.ok()) << second.status().to_string();
  ASSERT_TRUE(until(5, [&] { return c.num_starts(0) == 2; })) << "no retry for the request:\n" << describe(c.client->status());
  c.spawn(0);
  auto chunk = (*second)->next(std::chrono::seconds(10));
  ASSERT_TRUE(chunk.has_value()) << c.rec.dump() << describe(c.client->status());
  EXPECT_EQ(chunk->tokens, std::vector<int32_t>{42});
}
}  // namespace
}  // namespace specserve
