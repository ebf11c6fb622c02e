// actors/request_actor.h: a request survives kMaxRequeues replica failures (each next attempt
// continues from what was streamed); at the next failure it ends with finish reason "error" and
// a message, so a request that crashes its workers cannot take down every replica in turn.
#include "actors/request_actor.h"

#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "actors/runtime.h"

namespace specserve {
namespace {

using namespace std::chrono_literals;

TEST(RequestActor, GivesUpWithAnErrorAfterTooManyReplicaFailures) {
  ActorRuntime rt;
  caf::scoped_actor head{rt.system()};  // plays the scheduler and the client's sink
  WorkItem item;
  item.prompt = {1, 2, 3};
  item.max_tokens = 8;
  auto req = rt.system().spawn(request_actor, int64_t{7}, std::string("tok"), caf::actor(head), caf::actor(head), item,
                               0.0);
  for (int32_t i = 1; i <= kMaxRequeues; ++i) {
    bool got = false;
    head->request(req, 5s, requeue_atom::value)
        .receive([&](WorkItem& w) { got = true; EXPECT_EQ(w.attempt, item.attempt + i); },
                 [&](caf::error& e) { ADD_FAILURE() << "requeue " << i << ": " << rt.system().render(e); });
    EXPECT_TRUE(got) << i;
  }
  bool refused = false;
  head->request(req, 5s, requeue_atom::value)
      .receive([&](WorkItem&) { ADD_FAILURE() << "re-queued past kMaxRequeues"; }, [&](caf::error&) { refused = true; });
  EXPECT_TRUE(refused);
  bool chunk = false, done = false;
  for (int i = 0; i < 2; ++i) {
    head->receive(
        [&](StreamChunk& c) {
          chunk = true;
          EXPECT_EQ(c.finish_reason, "error");
          EXPECT_NE(c.error.find("failed " + std::to_string(kMaxRequeues + 1) + " times in a row"), std::string::npos)
              << c.error;
          EXPECT_EQ(c.num_requeues, kMaxRequeues);
          EXPECT_EQ(c.request_id, 7);
        },
        [&](done_atom, int64_t id) {
          done = true;
          EXPECT_EQ(id, 7);
        },
        caf::after(5s) >> [] {});
  }
  EXPECT_TRUE(chunk);
  EXPECT_TRUE(done);
}

// A replica lost while the request made progress is not the request's fault: an attempt that
// streamed a token resets the count, so a long request outlives many unrelated failures.
TEST(RequestActor, AnAttemptThatStreamedATokenResetsTheCount) {
  ActorRuntime rt;
  caf::scoped_actor head{rt.system()};
  WorkItem item;
  item.prompt = {1, 2, 3};
  item.max_tokens = 64;
  auto req = rt.system().spawn(request_actor, int64_t{9}, std::string("tok"), caf::actor(head), caf::actor(head), item,
                               0.0);
  int32_t attempt = item.attempt;
  for (int32_t i = 0; i < 3 * kMaxRequeues; ++i) {
    ShardEvent ev;
    ev.request_id = 9;
    ev.attempt = attempt;
    ev.tokens = {100 + i};
    head->send(req, ev);
    bool got = false;
    head->request(req, 5s, requeue_atom::value)
        .receive([&](WorkItem& w) { got = true; attempt = w.attempt; EXPECT_EQ(w.resume_output.size(), size_t(i + 1)); },
                 [&](caf::error& e) { ADD_FAILURE() << "failure " << i << ": " << rt.system().render(e); });
    ASSERT_TRUE(got) << i;
  }
  caf::anon_send_exit(req, caf::exit_reason::kill);
}

}  // namespace
}  // namespace specserve
