// A second live worker for a slot the topology gives one (a node started twice under one name):
// after waiting for the holder to be found down (it is not: it serves), the head tells the
// newcomer to quit, failing, without registering it, and a drain asked by anything but one of the
// replica's own workers is ignored, so the impostor stopping cannot drain the replica it never
// served (found by a trial: `specserve node --name node0` run a second time, then stopped, took
// the real replica 0 down for good).
#include <gtest/gtest.h>

#include "tests/actors/actors_cluster_fixture.h"
#include "tests/test_util.h"

namespace specserve {
namespace {

using namespace actors_testing;  // NOLINT: the shared in-process cluster helpers

TEST(ActorsDuplicateWorker, ASecondTargetShardForAServedReplicaIsToldToQuitAndCannotDrainIt) {
  SpeculativeSpec spec;
  spec.method = SpeculativeMethod::kNgram;
  spec.num_speculative_tokens = 3;
  Cluster c(spec, /*draft_worker=*/false);
  auto st = c.client().status();
  ASSERT_TRUE(st.ok());
  ASSERT_EQ(st->replicas.size(), 1u);
  ASSERT_TRUE(st->replicas[0].ready);

  WorkerConfig wc = c.shard_config();
  wc.node = "impostor";
  caf::scoped_actor self{c.runtime().system()};
  caf::actor dup = spawn_target_shard(c.runtime().system(), wc);
  self->monitor(dup);
  bool quit = false;
  caf::error reason;
  self->receive([&](const caf::down_msg& m) { quit = true, reason = m.reason; }, caf::after(std::chrono::seconds(120)) >> [] {});
  EXPECT_TRUE(quit) << "the second target shard of replica 0 was not told to quit";
  // It fails (its process exits 1, its node does not restart it), it does not retire quietly.
  EXPECT_EQ(reason, caf::make_error(caf::exit_reason::user_shutdown)) << c.runtime().system().render(reason);

  // A drain asked for replica 0 by an actor that is none of its workers (the impostor, gone
  // now; any other handle) changes nothing.
  for (const caf::actor& asker : {dup, caf::actor_cast<caf::actor>(self)}) {
    int32_t answer = 99;
    self->request(c.head().scheduler(), std::chrono::seconds(5), drain_rep_atom::value, std::string(kToken), int32_t{0}, true, asker)
        .receive([&](int32_t n) { answer = n; }, [&](caf::error& e) { ADD_FAILURE() << c.runtime().system().render(e); });
    EXPECT_EQ(answer, -1);
  }
  st = c.client().status();
  ASSERT_TRUE(st.ok());
  int shards = 0;
  for (const auto& w : st->workers) {
    shards += w.role == "target_shard";
    EXPECT_NE(w.node, "impostor") << "the refused worker shows in status";
  }
  EXPECT_EQ(shards, 1);
  ASSERT_EQ(st->replicas.size(), 1u);
  EXPECT_TRUE(st->replicas[0].ready);
  EXPECT_EQ(st->replicas[0].state, "ready");
  // And the replica still serves, with the target's own output.
  auto ps = prompts(c.head());
  auto r = c.client().generate(greedy(ps[0], 12));
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->tokens, testing::greedy_reference(ps[0], 12));
}

// The other side of the wait: a holder that dies while a new worker for its slot waits (a node
// restarted its worker, or a host came back, before the old one was found down) leaves the slot
// to the newcomer, which then serves the replica.
TEST(ActorsDuplicateWorker, ANewWorkerTakesTheSlotOfAHolderThatDiesWhileItWaits) {
  SpeculativeSpec spec;
  spec.method = SpeculativeMethod::kNgram;
  spec.num_speculative_tokens = 3;
  Cluster c(spec, /*draft_worker=*/false);
  ASSERT_TRUE(c.client().status().ok());
  WorkerConfig wc = c.shard_config();
  wc.node = "replacement";
  caf::actor next = spawn_target_shard(c.runtime().system(), wc);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // its hello is in; the holder still serves
  caf::anon_send_exit(c.shard(), caf::exit_reason::kill);
  bool served = false;
  for (const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(60); !served && std::chrono::steady_clock::now() < end;) {
    auto st = c.client().status();
    ASSERT_TRUE(st.ok());
    for (const auto& w : st->workers) served = served || (w.node == "replacement" && w.state == "ready");
    served = served && !st->replicas.empty() && st->replicas[0].ready;
    if (!served) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_TRUE(served) << "the replacement never took the dead holder's slot";
  auto ps = prompts(c.head());
  auto r = c.client().generate(greedy(ps[1], 10));
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->tokens, testing::greedy_reference(ps[1], 10));
  caf::anon_send_exit(next, caf::exit_reason::user_shutdown);
}

}  // namespace
}  // namespace specserve
