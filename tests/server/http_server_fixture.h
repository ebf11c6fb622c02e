// The HTTP front end's test fixture (server/http_server.h over a fake scheduler actor), shared by
// http_server_test.cpp (transport: body limits, clients that go away, stopping, methods, the
// listen backlog) and http_server_metrics_test.cpp (/metrics over the fake cluster's status).
#pragma once

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <thread>

#include "actors/messages.h"
#include "actors/runtime.h"
#include "model/gguf.h"
#include "model/tokenizer.h"
#include "server/http_server.h"
#include "tests/test_util.h"

namespace specserve::http_testing {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

// What the fake scheduler does with each request, and what it saw.
struct FakeCluster {
  std::mutex mu;
  std::condition_variable cv;
  int64_t next_id = 1;
  std::string text = "a";          // the text of every token
  bool hold = false;               // one token, then nothing until cancelled
  std::string fail_with;           // non-empty: every request fails with this error
  int64_t fail_only_id = 0;        // with fail_with: only the request of this id fails (0: all)
  int64_t refuse_submit = 0;       // > 0: the submission that would get this id is refused (kOutOfRange, a prompt past max_model_len)
  int32_t tokens_per_chunk = 1;    // tokens per StreamChunk (several: a speculative step)
  std::map<int64_t, caf::actor> held;
  std::vector<int64_t> cancelled;
  int32_t max_model_len = 1024;
  int64_t prefix_cache_queries = 0;  // reported in each replica's load
  int64_t prefix_cache_hits = 0;
  int64_t goodput_drafting = 0;      // disable_by_goodput counters, in each replica's load
  int64_t goodput_skipped = 0;
  int64_t num_preemptions = 0;       // in each replica's load
  ShardLoad ended;                   // ClusterStatus::ended (replica loads that were reset)
  ShardLoad by_source;               // its *_by_source vectors, in each replica's load
  ShardLoad shard0;                  // replica 0's own load (its counters and gauges), when with_prefill
  ShardLoad prefill;                 // replica 0's prefill worker's load, when with_prefill
  bool with_prefill = false;
  bool lifecycle = false;            // report an autoscaled cluster: replica 0 ready (promoted), 1 standby
  int32_t idle_min_replicas = -1;    // >= 0: an autoscaled cluster with no replica ready (both standby), this min

  bool wait_cancelled(size_t n, double seconds) {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, std::chrono::duration<double>(seconds), [&] { return cancelled.size() >= n; });
  }
};

// Answers SubmitMsg, CancelMsg and StatusQuery as the head's scheduler does.
inline caf::behavior fake_scheduler(caf::event_based_actor* self, std::shared_ptr<FakeCluster> fc) {
  return {
      [self, fc](SubmitMsg& m) -> std::tuple<int64_t, int32_t, std::string> {
        std::lock_guard<std::mutex> lock(fc->mu);
        if (fc->refuse_submit > 0 && fc->next_id == fc->refuse_submit) {
          return {0, static_cast<int32_t>(StatusCode::kOutOfRange), "prompt: 2000 tokens: past max_model_len 1024"};
        }
        const int64_t id = fc->next_id++;
        StreamChunk c;
        c.request_id = id;
        if (!fc->fail_with.empty() && (fc->fail_only_id == 0 || fc->fail_only_id == id)) {
          c.finish_reason = "error";
          c.error = fc->fail_with;
          self->send(m.sink, c);
        } else if (fc->hold) {
          c.tokens = {1};
          c.text = fc->text;
          self->send(m.sink, c);
          fc->held[id] = m.sink;
        } else {
          for (int32_t k = 0; k < m.request.max_tokens; k += fc->tokens_per_chunk) {
            StreamChunk t = c;
            const int32_t n = std::min(fc->tokens_per_chunk, m.request.max_tokens - k);
            t.tokens.assign(static_cast<size_t>(n), 1);
            for (int32_t j = 0; j < n; ++j) t.text += fc->text;
            if (k + n == m.request.max_tokens) {
              t.finish_reason = "length";
              t.prompt_tokens = static_cast<int32_t>(m.request.prompt_token_ids.size());
              t.completion_tokens = m.request.max_tokens;
            }
            self->send(m.sink, t);
          }
        }
        return {id, 0, ""};
      },
      [self, fc](const CancelMsg& m) {
        std::lock_guard<std::mutex> lock(fc->mu);
        fc->cancelled.push_back(m.request_id);
        if (auto it = fc->held.find(m.request_id); it != fc->held.end()) {
          StreamChunk c;
          c.request_id = m.request_id;
          c.finish_reason = "abort";
          self->send(it->second, c);
          fc->held.erase(it);
        }
        fc->cv.notify_all();
      },
      [fc](const StatusQuery&) -> ClusterStatus {
        std::lock_guard<std::mutex> lock(fc->mu);
        ClusterStatus s;
        ReplicaStatus r;
        r.ready = true;
        r.load.prefix_cache_queries = fc->prefix_cache_queries;
        r.load.prefix_cache_hits = fc->prefix_cache_hits;
        r.load.goodput_drafting = fc->goodput_drafting;
        r.load.goodput_skipped = fc->goodput_skipped;
        r.load.num_preemptions = fc->num_preemptions;
        r.load.drafts_by_source = fc->by_source.drafts_by_source;
        r.load.draft_tokens_by_source = fc->by_source.draft_tokens_by_source;
        r.load.accepted_by_source = fc->by_source.accepted_by_source;
        s.ended = fc->ended;
        s.replicas.push_back(r);
        r.replica = 1;  // a second replica, down: its counters still count in the totals
        r.ready = false;
        s.replicas.push_back(r);
        s.max_model_len = fc->max_model_len;
        if (fc->lifecycle) {
          s.replicas[0].state = "ready";
          s.replicas[0].state_seconds_total = {0.25, 1.5, 0.5, 10, 0, 2, 0};
          s.replicas[0].num_promotions = 1;
          s.replicas[0].promotion_routable_seconds = 0.00002;
          s.replicas[0].promotion_dispatch_seconds = 0.00005;
          s.replicas[0].promotion_seconds = 0.04;
          s.replicas[0].cold_start_seconds = 2.25;
          s.replicas[1].state = "standby";
          s.replicas[1].state_seconds_total = {0.25, 1.5, 0.5, 0, 0, 12, 0};
          s.autoscale.enabled = true;
          s.autoscale.target_ready = 1;
          s.autoscale.num_promotions = 1;
          s.autoscale.num_cold_starts = 3;
          s.autoscale.num_failed_starts = 2;
        }
        if (fc->with_prefill) {
          s.replicas[0].load = fc->shard0;
          s.replicas[0].has_prefill_worker = true;
          s.replicas[0].prefill_load = fc->prefill;
        }
        if (fc->idle_min_replicas >= 0) {
          for (auto& x : s.replicas) {
            x.ready = false;
            x.state = "standby";
          }
          s.autoscale.enabled = true;
          s.autoscale.min_replicas = fc->idle_min_replicas;
          s.autoscale.max_replicas = 1;
          s.autoscale.warm_pool = 1;
        }
        return s;
      },
  };
}

// A connected TCP socket to 127.0.0.1:port (-1 on failure).
inline int connect_to(uint16_t port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

inline void send_all(int fd, const std::string& s) {
  size_t off = 0;
  while (off < s.size()) {
    const ssize_t n = ::send(fd, s.data() + off, s.size() - off, MSG_NOSIGNAL);
    if (n <= 0) return;
    off += static_cast<size_t>(n);
  }
}

// Reads until the peer closes the connection or `seconds` pass.
inline std::string read_until_closed(int fd, double seconds) {
  std::string out;
  const auto end = Clock::now() + std::chrono::duration<double>(seconds);
  char buf[4096];
  while (Clock::now() < end) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 50) <= 0) continue;
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

inline std::string post_request(const std::string& path, const std::string& body) {
  return "POST " + path + " HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
         std::to_string(body.size()) + "\r\n\r\n" + body;
}

inline long rss_kib() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
  }
  return 0;
}

class HttpServerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    gguf_ = &specserve::testing::default_gguf();
    tok_ = &specserve::testing::default_tokenizer();
  }
  void SetUp() override {
    rt_ = std::make_unique<ActorRuntime>();
    fc_ = std::make_shared<FakeCluster>();
    scheduler_ = rt_->system().spawn(fake_scheduler, fc_);
    opts_.port = 0;
    opts_.threads = 8;
    opts_.max_body_bytes = 64 << 10;
    opts_.served_model_name = "fake";
  }
  void TearDown() override {
    server_.reset();
    caf::anon_send_exit(scheduler_, caf::exit_reason::user_shutdown);
    rt_.reset();
  }
  void start() {
    auto s = HttpServer::start(opts_, rt_->system(), scheduler_, "token", PromptCodec(*gguf_, *tok_));
    ASSERT_TRUE(s.ok()) << s.status().message();
    server_ = std::move(*s);
  }
  httplib::Client client() {
    httplib::Client c("127.0.0.1", server_->port());
    c.set_read_timeout(30, 0);
    return c;
  }

  static inline const GgufFile* gguf_ = nullptr;
  static inline const Tokenizer* tok_ = nullptr;
  std::unique_ptr<ActorRuntime> rt_;
  std::shared_ptr<FakeCluster> fc_;
  caf::actor scheduler_;
  HttpServerOptions opts_;
  std::unique_ptr<HttpServer> server_;
};

}  // namespace specserve::http_testing
