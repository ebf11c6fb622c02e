// Shared by the elastic-serving tests (tests/actors/elastic_*_test.cpp): fake workers — small
// CAF actors that register like a target shard or a draft worker, hold the requests they are given
// and record every message the head sends them (no model runs: the head only reads the GGUF's
// tokenizer) — and the fixtures that start a head with them (Promotion) or with two real target
// shards in this process (RealShards), plus the greedy oracle (reference).
// Timing: the waits are bounds (seconds) on things that take milliseconds; nothing is timed.
#pragma once

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

namespace specserve::elastic_testing {

inline constexpr const char* kToken = "elastic-test-token-0123456789";

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
  int32_t rank = 0;             // tensor-parallel rank (a target shard's)
  std::string state = "ready";  // the last state it announces (after "loading")
  int32_t max_num_seqs = 1;
  int32_t total_kv_blocks = 64;
  bool first_token = true;      // a request that runs (within max_num_seqs) gets one token at once
  bool keeps_running = false;   // reclaim gives no running request (as when all are near their end)
  int64_t prompt_tokens = 0;     // counters every load reports (ShardLoad), as an engine's totals
  int64_t goodput_drafting = 0;
  caf::actor scheduler;
  Recorder* rec = nullptr;
};

struct FakeState {
  FakeSpec spec;
  // > 0 (the message "kv_full N"): its KV cache is full; only N of its requests run, the rest
  // wait in its engine for cache room (as sequences preempted under KV pressure).
  int32_t kv_running = 0;
  std::vector<WorkItem> held;  // the first max_num_seqs run, the rest wait
  int64_t received = 0;
  int64_t num_reclaims = 0;
};
using FakeSelf = caf::stateful_actor<FakeState>*;

inline std::string tag(const FakeSpec& s) { return "r" + std::to_string(s.replica) + "/" + s.role; }

inline WorkerHello fake_hello(FakeSelf self, const std::string& state) {
  const FakeSpec& f = self->state.spec;
  WorkerHello h;
  h.token = kToken;
  h.node = "local";
  h.role = f.role;
  h.replica = f.replica;
  h.rank = f.rank;
  h.pid = static_cast<int32_t>(::getpid());
  h.state = state;
  h.total_kv_blocks = f.total_kv_blocks;
  h.block_size = 16;
  h.max_num_seqs = f.max_num_seqs;
  h.max_model_len = 512;
  h.self = caf::actor_cast<caf::actor>(self);
  return h;
}

inline void send_load(FakeSelf self, std::vector<int64_t> finished = {}) {
  auto& s = self->state;
  ShardLoad l;
  l.replica = s.spec.replica;
  l.total_kv_blocks = s.spec.total_kv_blocks;
  // Like a real shard: every request it holds has its blocks (prompt + output + 1 position).
  int64_t used = 0;
  for (const WorkItem& w : s.held) used += static_cast<int64_t>(w.prompt.size() + w.resume_output.size()) / 16 + 1;
  l.free_kv_blocks = static_cast<int32_t>(std::max<int64_t>(0, s.spec.total_kv_blocks - used));
  l.num_running = std::min<int32_t>(static_cast<int32_t>(s.held.size()), s.kv_running > 0 ? s.kv_running : s.spec.max_num_seqs);
  l.num_waiting = static_cast<int32_t>(s.held.size()) - l.num_running;
  if (s.kv_running > 0) l.free_kv_blocks = 0;
  l.received = s.received;
  l.num_reclaims = s.num_reclaims;
  l.prompt_tokens = s.spec.prompt_tokens;
  l.goodput_drafting = s.spec.goodput_drafting;
  l.finished = std::move(finished);
  self->send(s.spec.scheduler, std::move(l));
}

inline void hand_back(FakeSelf self, const WorkItem& w, const std::string& reason) {
  MigratedSeq m;
  m.request_id = w.request_id;
  m.attempt = w.attempt;
  m.replica = self->state.spec.replica;
  m.reason = reason;
  self->send(self->state.spec.scheduler, std::move(m));
}

inline caf::behavior fake_worker(FakeSelf self, FakeSpec spec) {
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
        const int32_t keep = running && !s.spec.keeps_running ? 0 : s.kv_running > 0 ? s.kv_running : s.spec.max_num_seqs;
        for (int32_t i = 0; i < n && static_cast<int32_t>(s.held.size()) > keep; ++i) {
          hand_back(self, s.held.back(), "rebalance");
          s.held.pop_back();
        }
        send_load(self);
      },
      [self](step_atom) { send_load(self); },  // the test asks for a load report
      [self](const std::string& cmd) {         // "kv_full N": the cache fills up (FakeState::kv_running)
        if (cmd.rfind("kv_full ", 0) == 0) self->state.kv_running = std::stoi(cmd.substr(8));
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

inline bool until(double seconds, const std::function<bool()>& cond) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < end) {
    if (cond()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return cond();
}

// Replicas 0..n-1 on one node, each a target shard (and a draft worker when `drafts`).
inline Topology make_topology(int32_t n, bool drafts) {
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

inline std::string state_of(const ClusterStatus& st, int32_t replica) {
  for (const auto& r : st.replicas) {
    if (r.replica == replica) return r.state;
  }
  return "?";
}

// The head's view, for failure messages.
inline std::string describe(const Expected<ClusterStatus>& st) {
  if (!st.ok()) return "status: " + st.status().to_string();
  std::string out = "autoscaler: target " + std::to_string(st->autoscale.target_ready) + ", ongoing " +
                    std::to_string(st->autoscale.ongoing) + ", last change: " + st->autoscale.last_reason + "\n";
  for (const auto& r : st->replicas) {
    out += "replica " + std::to_string(r.replica) + ": " + r.state + ", assigned " + std::to_string(r.assigned) + "\n";
  }
  return out + "queued " + std::to_string(st->queued) + ", running " + std::to_string(st->running) + "\n";
}

inline GenerateRequest request(int32_t num_tokens) {
  GenerateRequest r;
  for (int32_t i = 0; i < num_tokens; ++i) r.prompt_token_ids.push_back(100 + i);
  r.max_tokens = 8;
  r.sampling.temperature = 0;
  return r;
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

// min 1, max 2, warm pool 1, no delay, 2 requests per replica; replicas run 1 request at a time
// (max_num_seqs 1) and hold 2 more waiting (the dispatch's local queue).
struct Promotion {
  Recorder rec;  // outlives the actor system (fake workers write to it)
  ActorRuntime rt;
  std::unique_ptr<Head> head;
  std::unique_ptr<Client> client;
  std::vector<caf::actor> shards;  // replica 0's, replica 1's
  /// Submits `n` requests of `max_tokens` tokens (request()) and appends their handles to `hs`
  /// (keep them: a dropped handle cancels its request). Fails the test on a refused submit.
  void submit(int n, int32_t max_tokens, std::vector<std::shared_ptr<RequestHandle>>* hs) {
    for (int i = 0; i < n; ++i) {
      auto h = client->submit(request(max_tokens));
      ASSERT_TRUE(h.ok()) << h.status().to_string();
      hs->push_back(*h);
    }
  }
  void start(int32_t replica1_kv_blocks, int32_t replica1_max_num_seqs = 1, double upscale_delay_s = 0,
             int32_t replica0_max_num_seqs = 1, bool rebalance_running = true, bool replica0_keeps_running = false,
             double downscale_delay_s = 1000, double target_ongoing_requests = 2) {
    Topology t = make_topology(2, /*drafts=*/false);
    t.autoscale.min_replicas = 1;
    t.autoscale.max_replicas = 2;
    t.autoscale.warm_pool = 1;
    t.autoscale.upscale_delay_s = upscale_delay_s;
    t.autoscale.downscale_delay_s = downscale_delay_s;
    t.autoscale.target_ongoing_requests = target_ongoing_requests;
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
      EXPECT_EQ(r->tokens, testing::greedy_reference(head->tokenizer().encode(texts[i], true, false), max_tokens)) << "request " << i;
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

}  // namespace specserve::elastic_testing
