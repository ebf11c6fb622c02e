// A target shard's KV fetch of a migrated sequence runs off its step loop
// (actors/target_shard.cpp, actors/kv_data_plane.h: start_fetch / KvFetch::run / finish_fetch):
// while fetches from a stalled peer wait for their deadline (a second one arriving meanwhile, which
// needs the UCX agent that the first transfer is using), the shard's other sequences keep
// producing tokens; after the deadline the migrated sequences recompute their KV and finish, and
// the shard stays up.
//
// The shard is real (default model, CPU backend); the scheduler and the request actor are a
// scoped actor of the test; the stalled peer is a UcxAgent of the test process over UCX tcp that
// progresses while the shard connects and then stops (over tcp the target answers every get, so
// a get from it waits until the shard's kv_transfer_timeout_s).
#include <gtest/gtest.h>

#include <stdlib.h>

#include <atomic>
#include <chrono>
#include <map>
#include <thread>

#include <caf/all.hpp>
#include <xxhash.h>

#include "actors/kv_data_plane.h"
#include "actors/messages.h"
#include "actors/runtime.h"
#include "actors/target_shard.h"
#include "actors/worker_config.h"
#include "cpu/cpu_backend.h"
#include "kv/ucx_transport.h"
#include "model/model_loader.h"
#include "spec/engine.h"
#include "tests/test_util.h"

namespace specserve {
namespace {

using Clock = std::chrono::steady_clock;
const char* kToken = "test-token-0123456789";

Topology make_topology() {
  Topology t;
  t.source = "(test)";
  t.cluster.name = "test";
  t.models.target.path = testing::default_model_path();
  t.models.target.max_model_len = 512;
  t.scheduler.max_num_seqs = 8;
  t.scheduler.kv_cache_bytes = int64_t{64} << 20;
  NodeSpec n;
  n.name = "local";
  n.workers.push_back(WorkerSpec{});
  t.nodes.push_back(n);
  return t;
}

// The shard's export format, built as the shard builds it (same model, same engine options).
KvExportFormat shard_format(const Topology& t) {
  auto backend = make_cpu_backend(1);
  auto m = load_model(t.models.target.path, *backend, true);
  EXPECT_TRUE(m.ok());
  auto eo = engine_options_for(t, m->model->config());
  EXPECT_TRUE(eo.ok());
  auto e = Engine::create(*m->model, m->tokenizer.get(), nullptr, *eo);
  EXPECT_TRUE(e.ok());
  return kv_export_format((*e)->kv_storage(), /*model_fingerprint=*/0);
}

TEST(TargetShardKv, OtherSequencesKeepSteppingWhileAFetchFromAStalledPeerWaits) {
  ::setenv("UCX_TLS", "tcp", 1);  // the shard's agent reads it when it starts
  const Topology topo = make_topology();
  const KvExportFormat fmt = shard_format(topo);
  ASSERT_GT(fmt.block_size, 0);

  // The peer that will stall, with a region the size of the offer.
  UcxAgentOptions po;
  po.name = "staller";
  po.transports = "tcp";
  auto peer = UcxAgent::create(po);
  if (!peer.ok()) GTEST_SKIP() << "UCX tcp unusable here: " << peer.status().to_string();
  const int32_t kCached = 40;
  const int64_t num_blocks = (kCached + fmt.block_size - 1) / fmt.block_size;
  const int64_t bytes = kv_export_bytes(fmt, num_blocks);
  auto region = (*peer)->allocate_region(bytes);
  ASSERT_TRUE(region.ok()) << region.status().to_string();

  ActorRuntime rt;
  caf::scoped_actor me(rt.system());  // scheduler and request actor
  WorkerConfig wc;
  wc.node = "local";
  wc.topology = topo;
  wc.threads = 1;
  wc.token = kToken;
  wc.scheduler = me;
  const double kDeadlineS = 4.0;
  wc.kv_transfer_timeout_s = kDeadlineS;
  caf::actor shard = spawn_target_shard(rt.system(), wc);

  // Wait for "ready".
  bool ready = false;
  std::string kv_address;
  const auto ready_by = Clock::now() + std::chrono::seconds(120);
  while (!ready && Clock::now() < ready_by) {
    me->receive([&](const WorkerHello& h) {
          ASSERT_NE(h.state, "failed") << h.error;
          ready = h.state == "ready";
          kv_address = h.kv_address;
        },
        [](const ShardLoad&) {}, caf::after(std::chrono::seconds(1)) >> [] {});
  }
  ASSERT_TRUE(ready);
  if (kv_address.empty()) GTEST_SKIP() << "the shard has no KV data plane (UCX unusable)";

  // The shard connects to the peer while the peer progresses (tcp wire-up needs it), then the
  // peer stops progressing for good.
  std::atomic<bool> progress{true};
  std::thread progresser([&] {
    while (progress.load()) {
      (*peer)->progress();
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  });
  KvPeersMsg peers;
  const auto& addr = (*peer)->address();
  peers.peers.push_back(KvPeer{"staller", std::string(addr.begin(), addr.end())});
  me->send(shard, peers);

  // Request A: an ordinary long request on the same shard. Its first event also tells that the
  // shard has handled KvPeersMsg (same sender, so in order).
  WorkItem a;
  a.request_id = 1;
  for (int i = 0; i < 12; ++i) a.prompt.push_back(100 + i);
  a.max_tokens = 400;
  a.sampling.temperature = 0;
  a.sampling.ignore_eos = true;
  a.request_actor = me;
  me->send(shard, a);
  struct Seen {
    std::vector<int32_t> tokens;
    std::string finish;
    Clock::time_point done{};
  };
  std::map<int64_t, Seen> seen;
  bool released = false;
  auto on_event = [&](const ShardEvent& ev) {
    Seen& x = seen[ev.request_id];
    x.tokens.insert(x.tokens.end(), ev.tokens.begin(), ev.tokens.end());
    if (!ev.finish_reason.empty()) {
      x.finish = ev.finish_reason;
      x.done = Clock::now();
    }
  };
  auto receive_for = [&](std::chrono::milliseconds d) {
    me->receive(on_event, [&](const KvReleaseMsg&) { released = true; }, [](const ShardLoad&) {},
                caf::after(d) >> [] {});
  };
  const auto first_by = Clock::now() + std::chrono::seconds(60);
  while (seen[1].tokens.empty() && Clock::now() < first_by) receive_for(std::chrono::seconds(1));
  ASSERT_FALSE(seen[1].tokens.empty()) << "request A never started";
  progress = false;
  progresser.join();

  // Requests B and C: migrated from "staller", whose KV the shard now fetches from a peer that
  // never answers. C arrives while B's transfer waits: the shard needs the agent then (a second
  // receive region), which B's transfer must hand over rather than hold until its deadline.
  auto migrated = [&](int64_t id, int64_t offer_id) {
    WorkItem w;
    w.request_id = id;
    for (int i = 0; i < kCached; ++i) w.prompt.push_back(200 + i);
    w.resume_output = {300};
    w.max_tokens = 6;
    w.sampling.temperature = 0;
    w.sampling.ignore_eos = true;
    w.request_actor = me;
    w.kv.source = "staller";
    w.kv.offer_id = offer_id;
    w.kv.num_cached = kCached;
    w.kv.tokens_hash = kv_tokens_hash(std::span<const int32_t>(w.prompt.data(), kCached));
    w.kv.remote_addr = (*region)->remote().base;
    w.kv.rkey.assign((*region)->remote().rkey.begin(), (*region)->remote().rkey.end());
    w.kv.bytes = bytes;
    w.kv.source_process = kv_process_id() + 2;  // another process: the UCX path
    w.kv.source_address_hash = XXH3_64bits(addr.data(), addr.size());
    return w;
  };
  me->send(shard, migrated(2, 7));
  const auto sent = Clock::now();
  while (Clock::now() < sent + std::chrono::milliseconds(300)) receive_for(std::chrono::milliseconds(50));
  me->send(shard, migrated(3, 8));

  // While the fetches wait (kDeadlineS), A keeps producing tokens. Events produced before the
  // shard took C may still be on their way: count only those from 0.8 s on.
  int64_t a_before = 0;
  bool counting = false;
  const auto window_begin = sent + std::chrono::milliseconds(800);
  const auto window_end = sent + std::chrono::milliseconds(static_cast<int64_t>(kDeadlineS * 1000) - 500);
  while (Clock::now() < window_end) {
    if (!counting && Clock::now() >= window_begin) {
      counting = true;
      a_before = static_cast<int64_t>(seen[1].tokens.size());
    }
    receive_for(std::chrono::milliseconds(100));
  }
  const int64_t a_during = static_cast<int64_t>(seen[1].tokens.size()) - a_before;
  EXPECT_GE(a_during, 3) << "request A stopped stepping while KV fetches waited on a stalled peer";
  EXPECT_TRUE(seen[2].finish.empty()) << "B cannot have finished before its fetch's deadline";

  // After the deadline B and C recompute their KV and finish; the shard survives.
  const auto by = Clock::now() + std::chrono::seconds(120);
  while ((seen[2].finish.empty() || seen[3].finish.empty()) && Clock::now() < by) receive_for(std::chrono::seconds(1));
  for (int64_t id : {2, 3}) {
    SCOPED_TRACE("request " + std::to_string(id));
    EXPECT_EQ(seen[id].finish, "length");
    EXPECT_EQ(seen[id].tokens.size(), 5u) << "max_tokens 6 less the one resumed token";
  }
  EXPECT_GE(seen[2].done - sent, std::chrono::milliseconds(static_cast<int64_t>(kDeadlineS * 1000) - 100))
      << "B finished before its fetch's deadline: did the stalled get fail early?";
  EXPECT_EQ(seen[2].tokens, seen[3].tokens) << "same tokens, same greedy continuation";
  EXPECT_TRUE(released) << "the shard must tell the source (through the scheduler) to free the offer";
  EXPECT_TRUE(seen[1].finish.empty()) << "A must still be running: " << seen[1].finish;

  me->send(shard, AbortMsg{1});
  me->send_exit(shard, caf::exit_reason::user_shutdown);
  me->wait_for(shard);
}

}  // namespace
}  // namespace specserve
