// The head's replica lifecycle with fake workers: small CAF actors that register like a target
// shard or a draft worker, hold the requests they are given, and record every message the head
// sends them. No model runs (the head only reads the GGUF's tokenizer), so each rule is checked
// in isolation and quickly:
//  - a draft worker that registers after the head gave up its replica's start is told to quit
//    (it would otherwise run on unattached, and block the slot's next start);
//  - a replica whose target shard dies loses its draft worker too (a restart starts both);
//  - a promoted replica gets the requests waiting (not started) in a busy replica's engine, so it
//    serves at once, and the head reports decision -> routed / first request sent / first token;
//  - a request handed back that can only go back where it came from does not ping-pong;
//  - a promotion's first token is measured on a request that had none yet (a re-queued one that
//    streamed tokens elsewhere never reports a first token again);
//  - with real target shards, the handed-back request finishes on the promoted replica with the
//    tokens of the target alone.
// Timing: the waits are bounds (seconds) on things that take milliseconds; nothing is timed.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "actors/client.h"
#include "actors/draft_worker.h"
#include "actors/head.h"
#include "actors/messages.h"
#include "actors/target_shard.h"
#include "cpu/cpu_backend.h"
#include "model/model_loader.h"
#include "spec/engine.h"
#include "tests/test_util.h"

namespace specserve {
namespace {

const char* kToken = "elastic-test-token-0123456789";

// What the fake workers saw, in order ("r0/target_shard: retire", "r1/target_shard: work 3").
struct Recorder {
  std::mutex mu;
  std::vector<std::string> events;
  void add(std::string e) {
    std::lock_guard<std::mutex> lock(mu);
    events.push_back(std::move(e));
  }
  int count(const std::string& e) {
    std::lock_guard<std::mutex> lock(mu);
    int n = 0;
    for (const auto& x : events) n += x == e;
    return n;
  }
  int count_prefix(const std::string& p) {
    std::lock_guard<std::mutex> lock(mu);
    int n = 0;
    for (const auto& x : events) n += x.rfind(p, 0) == 0;
    return n;
  }
  std::string dump() {
    std::lock_guard<std::mutex> lock(mu);
    std::string out;
    for (const auto& x : events) out += x + "\n";
    return out;
  }
};

struct FakeSpec {
  std::string role = "target_shard";
  int32_t replica = 0;
  std::string state = "ready";  // the last state it announces (after "loading")
  int32_t max_num_seqs = 1;
  int32_t total_kv_blocks = 64;
  bool first_token = true;      // a request that runs (within max_num_seqs) gets one token at once
  bool keeps_running = false;   // reclaim gives no running request (as when all are near their end)
  caf::actor scheduler;
  Recorder* rec = nullptr;
};

struct FakeState {
  FakeSpec spec;
  std::vector<WorkItem> held;  // the first max_num_seqs run, the rest wait
  int64_t received = 0;
  int64_t num_reclaims = 0;
};
using FakeSelf = caf::stateful_actor<FakeState>*;

std::string tag(const FakeSpec& s) { return "r" + std::to_string(s.replica) + "/" + s.role; }

WorkerHello fake_hello(FakeSelf self, const std::string& state) {
  const FakeSpec& f = self->state.spec;
  WorkerHello h;
  h.token = kToken;
  h.node = "local";
  h.role = f.role;
  h.replica = f.replica;
  h.pid = static_cast<int32_t>(::getpid());
  h.state = state;
  h.total_kv_blocks = f.total_kv_blocks;
  h.block_size = 16;
  h.max_num_seqs = f.max_num_seqs;
  h.max_model_len = 512;
  h.self = caf::actor_cast<caf::actor>(self);
  return h;
}

void send_load(FakeSelf self, std::vector<int64_t> finished = {}) {
  auto& s = self->state;
  ShardLoad l;
  l.replica = s.spec.replica;
  l.total_kv_blocks = s.spec.total_kv_blocks;
  // Like a real shard: every request it holds has its blocks (prompt + output + 1 position).
  int64_t used = 0;
  for (const WorkItem& w : s.held) used += static_cast<int64_t>(w.prompt.size() + w.resume_output.size()) / 16 + 1;
  l.free_kv_blocks = static_cast<int32_t>(std::max<int64_t>(0, s.spec.total_kv_blocks - used));
  l.num_running = std::min<int32_t>(static_cast<int32_t>(s.held.size()), s.spec.max_num_seqs);
  l.num_waiting = static_cast<int32_t>(s.held.size()) - l.num_running;
  l.received = s.received;
  l.num_reclaims = s.num_reclaims;
  l.finished = std::move(finished);
  self->send(s.spec.scheduler, std::move(l));
}

void hand_back(FakeSelf self, const WorkItem& w, const std::string& reason) {
  MigratedSeq m;
  m.request_id = w.request_id;
  m.attempt = w.attempt;
  m.replica = self->state.spec.replica;
  m.reason = reason;
  self->send(self->state.spec.scheduler, std::move(m));
}

caf::behavior fake_worker(FakeSelf self, FakeSpec spec) {
  self->state.spec = std::move(spec);
  auto& s = self->state;
  s.spec.rec->add(tag(s.spec) + ": up");
  // Like a real worker: it quits when the head goes (the actor system waits for every actor).
  self->monitor(s.spec.scheduler);
  self->set_down_handler([self](caf::down_msg&) { self->quit(); });
  self->send(s.spec.scheduler, fake_hello(self, "loading"));
  if (s.spec.state != "loading") self->send(s.spec.scheduler, fake_hello(self, s.spec.state));
  return {
      [self](WorkItem& w) {
        auto& s = self->state;
        ++s.received;
        s.spec.rec->add(tag(s.spec) + ": work " + std::to_string(w.request_id));
        const bool runs = static_cast<int32_t>(s.held.size()) < s.spec.max_num_seqs;
        if (runs && s.spec.first_token) {
          ShardEvent ev;
          ev.request_id = w.request_id;
          ev.attempt = w.attempt;
          ev.tokens = {42};
          self->send(w.request_actor, std::move(ev));
        }
        s.held.push_back(std::move(w));
        send_load(self);
      },
      [self](reclaim_atom, int32_t n, bool running) {
        // Like the target shard: up to n waiting requests go back, the last admitted first; with
        // `running`, running ones too.
        auto& s = self->state;
        ++s.num_reclaims;
        s.spec.rec->add(tag(s.spec) + ": reclaim " + std::to_string(n) + (running ? " running" : ""));
        const int32_t keep = running && !s.spec.keeps_running ? 0 : s.spec.max_num_seqs;
        for (int32_t i = 0; i < n && static_cast<int32_t>(s.held.size()) > keep; ++i) {
          hand_back(self, s.held.back(), "rebalance");
          s.held.pop_back();
        }
        send_load(self);
      },
      [self](migrate_atom, bool) {
        auto& s = self->state;
        s.spec.rec->add(tag(s.spec) + ": migrate");
        for (const WorkItem& w : s.held) hand_back(self, w, "drain");
        s.held.clear();
        send_load(self);
      },
      [self](const AbortMsg& a) {
        auto& s = self->state;
        for (auto it = s.held.begin(); it != s.held.end(); ++it) {
          if (it->request_id != a.request_id) continue;
          ShardEvent ev;
          ev.request_id = a.request_id;
          ev.attempt = it->attempt;
          ev.finish_reason = "abort";
          self->send(it->request_actor, std::move(ev));
          s.held.erase(it);
          send_load(self, {a.request_id});
          return;
        }
      },
      [self](const AttachDraftMsg&) { self->state.spec.rec->add(tag(self->state.spec) + ": attach"); },
      [self](const KvPeersMsg&) {},
      [self](retire_atom) {
        self->state.spec.rec->add(tag(self->state.spec) + ": retire");
        self->quit();
      },
  };
}

bool until(double seconds, const std::function<bool()>& cond) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < end) {
    if (cond()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return cond();
}

// Replicas 0..n-1 on one node, each a target shard (and a draft worker when `drafts`).
Topology make_topology(int32_t n, bool drafts) {
  Topology t;
  t.source = "(test)";
  t.cluster.name = "elastic-test";
  t.models.target.path = testing::default_model_path();
  t.models.target.max_model_len = 512;
  NodeSpec node;
  node.name = "local";
  for (int32_t r = 0; r < n; ++r) {
    WorkerSpec w;
    w.replica = r;
    node.workers.push_back(w);
    if (drafts) {
      WorkerSpec d;
      d.role = WorkerRole::kDraftWorker;
      d.replica = r;
      node.workers.push_back(d);
    }
  }
  t.nodes.push_back(node);
  t.autoscale.configured = true;
  return t;
}

std::string state_of(const ClusterStatus& st, int32_t replica) {
  for (const auto& r : st.replicas) {
    if (r.replica == replica) return r.state;
  }
  return "?";
}

// The head's view, for failure messages.
std::string describe(const Expected<ClusterStatus>& st) {
  if (!st.ok()) return "status: " + st.status().to_string();
  std::string out = "autoscaler: target " + std::to_string(st->autoscale.target_ready) + ", ongoing " +
                    std::to_string(st->autoscale.ongoing) + ", last change: " + st->autoscale.last_reason + "\n";
  for (const auto& r : st->replicas) {
    out += "replica " + std::to_string(r.replica) + ": " + r.state + ", assigned " + std::to_string(r.assigned) + "\n";
  }
  return out + "queued " + std::to_string(st->queued) + ", running " + std::to_string(st->running) + "\n";
}

GenerateRequest request(int32_t num_tokens) {
  GenerateRequest r;
  for (int32_t i = 0; i < num_tokens; ++i) r.prompt_token_ids.push_back(100 + i);
  r.max_tokens = 8;
  r.sampling.temperature = 0;
  return r;
}

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

// min 1, max 2, warm pool 1, no delay, 2 requests per replica; replicas run 1 request at a time
// (max_num_seqs 1) and hold 2 more waiting (the dispatch's local queue).
struct Promotion {
  Recorder rec;  // outlives the actor system (fake workers write to it)
  ActorRuntime rt;
  std::unique_ptr<Head> head;
  std::unique_ptr<Client> client;
  std::vector<caf::actor> shards;  // replica 0's, replica 1's
  void start(int32_t replica1_kv_blocks, int32_t replica1_max_num_seqs = 1, double upscale_delay_s = 0,
             int32_t replica0_max_num_seqs = 1, bool rebalance_running = true, bool replica0_keeps_running = false) {
    Topology t = make_topology(2, /*drafts=*/false);
    t.autoscale.min_replicas = 1;
    t.autoscale.max_replicas = 2;
    t.autoscale.warm_pool = 1;
    t.autoscale.upscale_delay_s = upscale_delay_s;
    t.autoscale.downscale_delay_s = 1000;
    t.autoscale.target_ongoing_requests = 2;
    t.scheduler.rebalance_running = rebalance_running;
    auto h = Head::start(rt, t, kToken, /*publish=*/false);
    ASSERT_TRUE(h.ok()) << h.status().to_string();
    head = std::move(*h);
    client = Client::in_process(rt.system(), head->scheduler(), kToken);
    for (int32_t r = 0; r < 2; ++r) {  // one after the other: replica 0 is the one routed at start-up
      FakeSpec f;
      f.replica = r;
      f.scheduler = head->scheduler();
      f.rec = &rec;
      if (r == 0) {
        f.max_num_seqs = replica0_max_num_seqs;
        f.keeps_running = replica0_keeps_running;
      }
      if (r == 1) {
        f.total_kv_blocks = replica1_kv_blocks;
        f.max_num_seqs = replica1_max_num_seqs;
      }
      shards.push_back(rt.system().spawn(fake_worker, f));
      ASSERT_TRUE(until(5, [&] {
        auto st = client->status();
        return st.ok() && state_of(*st, r) == (r == 0 ? "ready" : "standby");
      })) << "start-up: replica " << r;
    }
  }
  ~Promotion() {
    client.reset();
    if (head) head->stop();
  }
};

TEST(ElasticPromotion, PromotedReplicaTakesRequestsWaitingInABusyEngine) {
  Promotion p;
  ASSERT_NO_FATAL_FAILURE(p.start(64));
  // 3 requests: replica 0 runs one and holds two waiting; nothing stays queued at the head.
  std::vector<std::shared_ptr<RequestHandle>> hs;
  for (int i = 0; i < 3; ++i) {
    auto h = p.client->submit(request(10));
    ASSERT_TRUE(h.ok()) << h.status().to_string();
    hs.push_back(*h);
  }
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
    for (int i = 0; i < 8; ++i) {
      auto h = p.client->submit(request(10));
      ASSERT_TRUE(h.ok()) << h.status().to_string();
      hs.push_back(*h);
    }
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
  for (int i = 0; i < 8; ++i) {
    auto h = p.client->submit(request(10));
    ASSERT_TRUE(h.ok()) << h.status().to_string();
    hs.push_back(*h);
  }
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
  for (int i = 0; i < 3; ++i) {
    auto h = p.client->submit(request(40));
    ASSERT_TRUE(h.ok()) << h.status().to_string();
    hs.push_back(*h);
  }
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
  for (int i = 0; i < 2; ++i) {
    auto h = p.client->submit(request(10));
    ASSERT_TRUE(h.ok()) << h.status().to_string();
    hs.push_back(*h);
  }
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
  for (int i = 0; i < 3; ++i) {
    auto h = p.client->submit(request(40));
    ASSERT_TRUE(h.ok()) << h.status().to_string();
    hs.push_back(*h);
  }
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
  for (int i = 0; i < 3; ++i) {
    auto h = p.client->submit(request(40));
    ASSERT_TRUE(h.ok()) << h.status().to_string();
    hs.push_back(*h);
  }
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
  for (int i = 0; i < 3; ++i) {  // 3 ongoing want 2 replicas, after the upscale delay
    auto h = p.client->submit(request(10));
    ASSERT_TRUE(h.ok()) << h.status().to_string();
    hs.push_back(*h);
  }
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

// A cluster whose replicas the head's launcher starts: the launcher records each start, and the
// test spawns a started replica's fake target shard when it wants it to register.
struct Launched {
  Recorder rec;
  std::mutex mu;
  std::vector<int32_t> starts;
  ActorRuntime rt;
  std::unique_ptr<Head> head;
  std::unique_ptr<Client> client;
  void start(const Topology& t) {
    auto h = Head::start(rt, t, kToken, /*publish=*/false, [this](int32_t replica) {
      std::lock_guard<std::mutex> lock(mu);
      starts.push_back(replica);
      return Status();
    });
    ASSERT_TRUE(h.ok()) << h.status().to_string();
    head = std::move(*h);
    client = Client::in_process(rt.system(), head->scheduler(), kToken);
  }
  int num_starts(int32_t replica) {
    std::lock_guard<std::mutex> lock(mu);
    return static_cast<int>(std::count(starts.begin(), starts.end(), replica));
  }
  size_t num_starts() {
    std::lock_guard<std::mutex> lock(mu);
    return starts.size();
  }
  void spawn(int32_t replica, bool first_token = true) {
    FakeSpec f;
    f.replica = replica;
    f.first_token = first_token;
    f.scheduler = head->scheduler();
    f.rec = &rec;
    rt.system().spawn(fake_worker, f);
  }
  bool wait_state(int32_t replica, const std::string& state, double seconds = 5) {
    return until(seconds, [&] {
      auto st = client->status();
      return st.ok() && state_of(*st, replica) == state;
    });
  }
  ~Launched() {
    client.reset();
    if (head) head->stop();
  }
};

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

// Greedy tokens of the target alone (the oracle).
std::vector<int32_t> reference(const std::vector<int32_t>& prompt, int32_t max_tokens) {
  static std::unique_ptr<Backend> backend = make_cpu_backend(1);
  static LoadedModel m = std::move(load_model(testing::default_model_path(), *backend, true).value());
  EngineOptions eo;
  eo.max_model_len = 512;
  auto e = Engine::create(*m.model, m.tokenizer.get(), nullptr, eo);
  GenerateParams p;
  p.prompt = prompt;
  p.max_tokens = max_tokens;
  p.sampling.temperature = 0;
  p.sampling.ignore_eos = true;
  EXPECT_TRUE((*e)->add_request(p).ok());
  std::vector<int32_t> out;
  std::vector<SeqEvent> ev;
  while ((*e)->has_work()) EXPECT_TRUE((*e)->step(&ev).ok());
  for (auto& x : ev) out.insert(out.end(), x.tokens.begin(), x.tokens.end());
  return out;
}

// Two real target shards in this process behind a head with min 1 / max 2 / warm pool 1 (no
// upscale delay unless given): replica 0 ready, replica 1 in standby. Submits greedy requests
// (ignore_eos, `max_tokens` each) and waits for their results.
struct RealShards {
  ActorRuntime rt;
  std::unique_ptr<Head> head;
  std::unique_ptr<Client> client;
  void start(int32_t max_num_seqs, int64_t kv_cache_bytes, double upscale_delay_s) {
    Topology t = make_topology(2, /*drafts=*/false);
    t.scheduler.max_num_seqs = max_num_seqs;
    t.scheduler.kv_cache_bytes = kv_cache_bytes;
    t.autoscale.min_replicas = 1;
    t.autoscale.max_replicas = 2;
    t.autoscale.warm_pool = 1;
    t.autoscale.upscale_delay_s = upscale_delay_s;
    t.autoscale.downscale_delay_s = 1000;
    t.autoscale.target_ongoing_requests = 2;
    auto h = Head::start(rt, t, kToken, /*publish=*/false);
    ASSERT_TRUE(h.ok()) << h.status().to_string();
    head = std::move(*h);
    client = Client::in_process(rt.system(), head->scheduler(), kToken);
    for (int32_t r = 0; r < 2; ++r) {  // one after the other: replica 0 is the one routed at start-up
      WorkerConfig wc;
      wc.node = "local";
      wc.replica = r;
      wc.topology = t;
      wc.threads = 1;
      wc.token = kToken;
      wc.scheduler = head->scheduler();
      spawn_target_shard(rt.system(), wc);
      ASSERT_TRUE(until(120, [&] {
        auto st = client->status();
        return st.ok() && state_of(*st, r) == (r == 0 ? "ready" : "standby");
      })) << "replica " << r << ": " << describe(client->status());
    }
  }
  // Submits every text as a greedy request; returns the handles (kept: a dropped one cancels).
  std::vector<std::shared_ptr<RequestHandle>> submit(const std::vector<std::string>& texts, int32_t max_tokens) {
    std::vector<std::shared_ptr<RequestHandle>> hs;
    for (const std::string& text : texts) {
      GenerateRequest r;
      r.prompt_token_ids = head->tokenizer().encode(text, true, false);
      r.max_tokens = max_tokens;
      r.sampling.temperature = 0;
      r.sampling.ignore_eos = true;
      auto h = client->submit(r);
      EXPECT_TRUE(h.ok()) << h.status().to_string();
      if (h.ok()) hs.push_back(*h);
    }
    return hs;
  }
  // Waits for each; checks finish "length", no re-queue, and the target-alone tokens; returns
  // each request's num_migrations.
  std::vector<int32_t> expect_same_tokens(const std::vector<std::shared_ptr<RequestHandle>>& hs,
                                          const std::vector<std::string>& texts, int32_t max_tokens) {
    std::vector<int32_t> moves;
    for (size_t i = 0; i < hs.size(); ++i) {
      auto r = hs[i]->wait();
      EXPECT_TRUE(r.ok()) << "request " << i << ": " << r.status().to_string();
      if (!r.ok()) continue;
      EXPECT_EQ(r->finish_reason, "length");
      EXPECT_EQ(r->tokens, reference(head->tokenizer().encode(texts[i], true, false), max_tokens)) << "request " << i;
      EXPECT_EQ(r->num_requeues, 0);
      moves.push_back(r->num_migrations);
    }
    return moves;
  }
  ~RealShards() {
    client.reset();
    if (head) head->stop();
  }
};

// The target shard's side of the hand-back (reclaim_atom): two real shards in this process, each
// running one sequence at a time (max_num_seqs 1). Three requests go to replica 0 (one runs, two
// wait in its engine); the promotion of replica 1 takes the last admitted one, which finishes
// there with exactly the tokens of the target alone, its stream uninterrupted.
TEST(ElasticPromotionRealShards, HandedBackRequestFinishesOnThePromotedReplicaWithTheSameTokens) {
  RealShards c;
  ASSERT_NO_FATAL_FAILURE(c.start(/*max_num_seqs=*/1, int64_t{16} << 20, /*upscale_delay_s=*/0));
  const std::vector<std::string> texts = {"The history of the Roman Empire begins with", "A recipe for pancakes: first, take",
                                          "The three laws of motion state that"};
  constexpr int32_t kTokens = 24;
  const auto moves = c.expect_same_tokens(c.submit(texts, kTokens), texts, kTokens);
  ASSERT_EQ(moves.size(), 3u);
  EXPECT_GE(moves[2], 1) << "the last admitted request is the one handed back";
  // NOTE: when replica 1 finishes it, request 2 may still wait on replica 0 and be handed back
  // too (it then lands wherever a slot is free first, maybe replica 0 again): more than one
  // hand-back is allowed, each lossless.
  int32_t migrations = 0;
  for (int32_t m : moves) migrations += m;
  EXPECT_GE(migrations, 1);
  auto st = c.client->status();
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->migrated, migrations);
  EXPECT_EQ(st->autoscale.num_promotions, 1);
  ASSERT_EQ(st->autoscale.promotion_seconds.size(), 1u) << describe(st);
  EXPECT_LE(st->autoscale.promotion_dispatch_seconds.at(0), st->autoscale.promotion_seconds[0]);
  for (const auto& r : st->replicas) {
    if (r.replica == 1) EXPECT_GE(r.load.generated_tokens, kTokens) << "replica 1 ran the handed-back request";
  }
}

// The target shard's side of a running rebalance: replica 0 runs 6 sequences at once
// (max_num_seqs 8) when replica 1 is promoted; 3 of them move with their KV mid-generation (or
// recompute where the data plane is unusable) and finish there with exactly the tokens of the
// target alone, their streams uninterrupted.
TEST(ElasticPromotionRealShards, RunningSequencesMoveToThePromotedReplicaWithTheSameTokens) {
  RealShards c;
  // upscale 0.5 s: the burst is admitted (and running) on replica 0 first.
  ASSERT_NO_FATAL_FAILURE(c.start(/*max_num_seqs=*/8, int64_t{32} << 20, /*upscale_delay_s=*/0.5));
  const std::vector<std::string> texts = {"The history of the Roman Empire begins with", "A recipe for pancakes: first, take",
                                          "The three laws of motion state that",           "Once upon a time, in a small village,",
                                          "The capital of France is",                      "To install Python on Linux, you"};
  constexpr int32_t kTokens = 96;
  const auto moves = c.expect_same_tokens(c.submit(texts, kTokens), texts, kTokens);
  ASSERT_EQ(moves.size(), texts.size());
  int32_t moved = 0;
  for (int32_t m : moves) moved += m > 0;
  EXPECT_EQ(moved, 3) << "6 on one replica, 0 on the other: 3 move";
  auto st = c.client->status();
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->migrated, 3) << describe(st);
  EXPECT_EQ(st->autoscale.num_promotions, 1);
  ASSERT_EQ(st->autoscale.promotion_seconds.size(), 1u) << "measured on the first token of a moved sequence";
  EXPECT_LE(st->autoscale.promotion_dispatch_seconds.at(0), st->autoscale.promotion_seconds[0]);
  for (const auto& r : st->replicas) {
    // Each moved sequence had at least 16 tokens left (actors/target_shard.cpp), generated there.
    if (r.replica == 1) EXPECT_GE(r.load.generated_tokens, 3 * 16) << "replica 1 ran the moved sequences";
  }
}

}  // namespace
}  // namespace specserve
