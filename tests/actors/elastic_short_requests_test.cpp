// The head's side of the autoscaler's load (AutoscaleInput::mean_ongoing, kept by the scheduler
// as request-seconds between ticks): requests that come and go between two 100 ms ticks (here
// each gets its first token from a fake shard and is cancelled within milliseconds) keep the
// only replica of a scale-from-zero cluster; once they stop, it drains after downscale_delay_s.
// (A fresh-user trial: 1-token HTTP requests once a second paid a cold start every ~5 s.)
#include "tests/actors/elastic_fixtures.h"

namespace specserve {
namespace {

using namespace elastic_testing;

// Submits a request, waits for its first token and cancels it: a few milliseconds in all.
void short_request(Launched& c) {
  auto h = c.client->submit(request(2));
  ASSERT_TRUE(h.ok()) << h.status().to_string();
  auto chunk = (*h)->next(std::chrono::seconds(10));
  ASSERT_TRUE(chunk.has_value()) << c.rec.dump() << describe(c.client->status());
  (*h)->cancel();
  auto r = (*h)->wait();
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->finish_reason, "abort");
}

TEST(ElasticLifecycle, RequestsShorterThanATickKeepTheOnlyReplica) {
  Launched c;
  Topology t = make_topology(1, /*drafts=*/false);
  t.autoscale.min_replicas = 0;
  t.autoscale.max_replicas = 1;
  t.autoscale.warm_pool = 0;
  t.autoscale.upscale_delay_s = 0;
  t.autoscale.downscale_delay_s = 1.0;
  ASSERT_NO_FATAL_FAILURE(c.start(t));
  auto first = c.client->submit(request(2));  // scale from zero
  ASSERT_TRUE(first.ok()) << first.status().to_string();
  ASSERT_TRUE(until(5, [&] { return c.num_starts(0) == 1; })) << describe(c.client->status());
  c.spawn(0);
  ASSERT_TRUE((*first)->next(std::chrono::seconds(10)).has_value()) << c.rec.dump();
  (*first)->cancel();
  ASSERT_TRUE((*first)->wait().ok());
  // 3 s of one short request every 0.3 s: more than the 1 s delay between ticks that see none
  // ongoing, were only the ticks' snapshots counted.
  for (int i = 0; i < 10; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    ASSERT_NO_FATAL_FAILURE(short_request(c));
  }
  auto st = c.client->status();
  ASSERT_TRUE(st.ok()) << st.status().to_string();
  EXPECT_EQ(st->autoscale.num_drains, 0) << describe(st);
  EXPECT_EQ(state_of(*st, 0), "ready") << describe(st);
  EXPECT_EQ(c.num_starts(0), 1) << "started cold again:\n" << describe(st);
  // With no request at all it is drained after the delay (scale to zero still works).
  EXPECT_TRUE(until(10, [&] {
    auto s = c.client->status();
    return s.ok() && s->autoscale.num_drains >= 1;
  })) << describe(c.client->status());
}

}  // namespace
}  // namespace specserve
