// A target shard warms up whatever its context length: with models.target.max_model_len 16
// (shorter than the warm-up text, 19 tokens) it used to fail at start ("prompt: 19 tokens leave
// no room in max_model_len 16") although requests of that length are fine; it now warms up on the
// text's first tokens and reports ready. The shard is real (default model, CPU backend); the
// scheduler is a scoped actor of the test.
#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include <caf/all.hpp>

#include "actors/messages.h"
#include "actors/runtime.h"
#include "actors/target_shard.h"
#include "actors/worker_config.h"
#include "tests/test_util.h"

namespace specserve {
namespace {

using Clock = std::chrono::steady_clock;

// The states the shard reports until it is ready or failed (or 120 s pass).
std::string run_until_ready(int32_t max_model_len) {
  Topology t;
  t.source = "(test)";
  t.cluster.name = "test";
  t.models.target.path = testing::default_model_path();
  t.models.target.max_model_len = max_model_len;
  t.scheduler.max_num_seqs = 4;
  t.scheduler.kv_cache_bytes = int64_t{16} << 20;
  NodeSpec n;
  n.name = "local";
  n.workers.push_back(WorkerSpec{});
  t.nodes.push_back(n);
  ActorRuntime rt;
  caf::scoped_actor me(rt.system());
  WorkerConfig wc;
  wc.node = "local";
  wc.topology = t;
  wc.threads = 1;
  wc.token = "test-token-0123456789";
  wc.scheduler = me;
  caf::actor shard = spawn_target_shard(rt.system(), wc);
  std::string states, error;
  const auto until = Clock::now() + std::chrono::seconds(120);
  bool done = false;
  while (!done && Clock::now() < until) {
    me->receive(
        [&](const WorkerHello& h) {
          states += (states.empty() ? "" : " ") + h.state;
          if (h.state == "failed") error = h.error;
          done = h.state == "ready" || h.state == "failed";
        },
        [](const ShardLoad&) {}, caf::after(std::chrono::seconds(1)) >> [] {});
  }
  caf::anon_send_exit(shard, caf::exit_reason::user_shutdown);
  return error.empty() ? states : states + ": " + error;
}

TEST(TargetShardWarmup, ContextShorterThanTheWarmupTextStillWarmsUp) {
  for (int32_t len : {16, 2}) {
    const std::string states = run_until_ready(len);
    EXPECT_TRUE(states.ends_with("ready")) << "max_model_len " << len << ": " << states;
    EXPECT_NE(states.find("warming"), std::string::npos) << states;
  }
}

}  // namespace
}  // namespace specserve
