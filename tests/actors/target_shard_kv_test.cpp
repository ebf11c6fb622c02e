// A target shard's KV fetch of a migrated sequence runs off its step loop
// (actors/target_shard_migration.cpp, actors/kv_data_plane.h: start_fetch / KvFetch::run / finish_fetch):
// while fetches from a stalled peer wait for their deadline (a second one arriving meanwhile, which
// needs the UCX agent that the first transfer is using), the shard's other sequences keep
// producing tokens; after the deadline the migrated sequences recompute their KV and finish, and
// the shard stays up. Then, with the peer reconnected and stalled again: a fetching request counts
// as waiting in the shard's load, an abort during its fetch is answered at once, and a drain moves
// a fetching request on as soon as its fetch returns.
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
  // Room for request A to step through the whole test (below).
  t.models.target.max_model_len = 4096;
  t.scheduler.max_num_seqs = 8;
  t.scheduler.kv_cache_bytes = int64_t{256} << 20;
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
  // NOTE: it must outlast both fetch deadlines and the drain (~12 s): 400 tokens ended after
  // ~4 s on an AVX-512 core in a fresh-clone CI run ("A must still be running: length").
  WorkItem a;
  a.request_id = 1;
  for (int i = 0; i < 12; ++i) a.prompt.push_back(100 + i);
  a.max_tokens = 4000;
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

  // Requests D and E: two more fetches from the stalled peer. While they wait, the shard's load
  // counts them as waiting; D is aborted (answered at once, not at the deadline); then the
  // replica drains: A leaves at once, E when its fetch returns (it recomputes where it lands),
  // and D's late fetch leaves nothing behind.
  std::map<int64_t, std::string> left;  // request -> MigratedSeq reason
  int32_t max_waiting = 0;
  auto receive2 = [&](std::chrono::milliseconds d) {
    me->receive(on_event, [&](const KvReleaseMsg&) { released = true; },
                [&](const ShardLoad& l) { max_waiting = std::max(max_waiting, l.num_waiting); },
                [&](const MigratedSeq& m) { left[m.request_id] = m.reason; }, caf::after(d) >> [] {});
  };
  // The shard dropped its endpoint to the peer when the transfers failed; a new peer list (as the
  // scheduler broadcasts when a replica comes back) reconnects it while the peer progresses. A
  // one-token request F sent after it tells that the shard has handled it (same sender, in order).
  progress = true;
  progresser = std::thread([&] {
    while (progress.load()) {
      (*peer)->progress();
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  });
  me->send(shard, peers);
  WorkItem f = a;
  f.request_id = 6;
  f.max_tokens = 1;
  me->send(shard, f);
  const auto f_by = Clock::now() + std::chrono::seconds(30);
  while (seen[6].finish.empty() && Clock::now() < f_by) receive2(std::chrono::milliseconds(100));
  ASSERT_EQ(seen[6].finish, "length");
  progress = false;
  progresser.join();
  me->send(shard, migrated(4, 9));
  me->send(shard, migrated(5, 10));
  const auto sent2 = Clock::now();
  while (Clock::now() < sent2 + std::chrono::milliseconds(500)) receive2(std::chrono::milliseconds(50));
  EXPECT_GE(max_waiting, 2) << "fetching requests must count as waiting in the shard's load";
  me->send(shard, AbortMsg{4});
  const auto aborted_at = Clock::now();
  while (seen[4].finish.empty() && Clock::now() < aborted_at + std::chrono::seconds(2)) receive2(std::chrono::milliseconds(50));
  EXPECT_EQ(seen[4].finish, "abort") << "an abort during the fetch is answered at once";
  EXPECT_LT(seen[4].done - sent2, std::chrono::milliseconds(static_cast<int64_t>(kDeadlineS * 1000) - 500));
  me->send(shard, migrate_atom::value, false);
  const auto drained_at = Clock::now();
  while (!left.count(1) && Clock::now() < drained_at + std::chrono::seconds(5)) receive2(std::chrono::milliseconds(50));
  EXPECT_EQ(left[1], "drain") << "A leaves at once";
  while (!left.count(5) && Clock::now() < drained_at + std::chrono::seconds(static_cast<int64_t>(kDeadlineS) + 30)) {
    receive2(std::chrono::milliseconds(100));
  }
  EXPECT_EQ(left[5], "drain") << "E leaves once its fetch returned";
  EXPECT_TRUE(seen[5].finish.empty()) << "E must not finish here: " << seen[5].finish;
  EXPECT_EQ(left.count(4), 0u) << "the aborted D must not come back";
  EXPECT_EQ(seen[4].tokens.size(), 0u);

  me->send(shard, AbortMsg{1});
  me->send_exit(shard, caf::exit_reason::user_shutdown);
  me->wait_for(shard);
}

}  // namespace
}  // namespace specserve
