// The HTTP front end (server/http_server.h) over a fake scheduler actor: the transport-level
// behaviour that the request parser's tests cannot see — body limits however the body is
// sent, clients that go away, stopping with streams open, methods, the listen backlog, and
// that finished requests leave nothing behind.
#include "server/http_server.h"

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
#include "tests/test_util.h"

namespace specserve {
namespace {

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
  int32_t tokens_per_chunk = 1;    // tokens per StreamChunk (several: a speculative step)
  std::map<int64_t, caf::actor> held;
  std::vector<int64_t> cancelled;
  int32_t max_model_len = 1024;
  int64_t prefix_cache_queries = 0;  // reported in each replica's load
  int64_t prefix_cache_hits = 0;
  int64_t goodput_drafting = 0;      // disable_by_goodput counters, in each replica's load
  int64_t goodput_skipped = 0;
  ShardLoad ended;                   // ClusterStatus::ended (replica loads that were reset)
  bool lifecycle = false;            // report an autoscaled cluster: replica 0 ready (promoted), 1 standby
  int32_t idle_min_replicas = -1;    // >= 0: an autoscaled cluster with no replica ready (both standby), this min

  bool wait_cancelled(size_t n, double seconds) {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, std::chrono::duration<double>(seconds), [&] { return cancelled.size() >= n; });
  }
};

// Answers SubmitMsg, CancelMsg and StatusQuery as the head's scheduler does.
caf::behavior fake_scheduler(caf::event_based_actor* self, std::shared_ptr<FakeCluster> fc) {
  return {
      [self, fc](SubmitMsg& m) -> std::tuple<int64_t, int32_t, std::string> {
        std::lock_guard<std::mutex> lock(fc->mu);
        const int64_t id = fc->next_id++;
        StreamChunk c;
        c.request_id = id;
        if (!fc->fail_with.empty()) {
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
int connect_to(uint16_t port) {
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

void send_all(int fd, const std::string& s) {
  size_t off = 0;
  while (off < s.size()) {
    const ssize_t n = ::send(fd, s.data() + off, s.size() - off, MSG_NOSIGNAL);
    if (n <= 0) return;
    off += static_cast<size_t>(n);
  }
}

// Reads until the peer closes the connection or `seconds` pass.
std::string read_until_closed(int fd, double seconds) {
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

std::string post_request(const std::string& path, const std::string& body) {
  return "POST " + path + " HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
         std::to_string(body.size()) + "\r\n\r\n" + body;
}

long rss_kib() {
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
    auto s = HttpServer::start(opts_, rt_->system(), scheduler_, "token", *tok_, *gguf_);
    ASSERT_TRUE(s.ok()) << s.status().message();
    server_ = std::move(*s);
  }
  httplib::Client client() {
    httplib::Client c("127.0.0.1", server_->port());
    c.set_read_timeout(30, 0);
    return c;
  }

  static const GgufFile* gguf_;
  static const Tokenizer* tok_;
  std::unique_ptr<ActorRuntime> rt_;
  std::shared_ptr<FakeCluster> fc_;
  caf::actor scheduler_;
  HttpServerOptions opts_;
  std::unique_ptr<HttpServer> server_;
};
const GgufFile* HttpServerTest::gguf_ = nullptr;
const Tokenizer* HttpServerTest::tok_ = nullptr;

TEST_F(HttpServerTest, CompletesThroughTheScheduler) {
  start();
  auto c = client();
  auto r = c.Post("/v1/completions", R"({"prompt": "Hi", "max_tokens": 3})", "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const json j = json::parse(r->body);
  EXPECT_EQ(j["choices"][0]["text"], "aaa");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
}

// Bug: cpp-httplib 0.11 checks its payload limit against Content-Length only, so a chunked
// body, or a gzip one (which it inflates), had no limit (a 200 KiB gzip body became 200 MiB).
TEST_F(HttpServerTest, BodyLimitHoldsForChunkedAndCompressedBodies) {
  start();
  const std::string big = R"({"prompt": "Hi", "max_tokens": 1, "user": ")" + std::string(200 << 10, 'a') + "\"}";
  {
    auto c = client();
    c.set_compress(true);  // Content-Encoding: gzip; ~1 KiB on the wire
    auto r = c.Post("/v1/completions", big, "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 413) << r->body;
    EXPECT_EQ(json::parse(r->body)["error"]["type"], "invalid_request_error");
  }
  {
    auto c = client();
    size_t sent = 0;
    auto r = c.Post(
        "/v1/completions",
        [&](size_t, httplib::DataSink& sink) {
          const size_t n = std::min<size_t>(16 << 10, big.size() - sent);
          if (!sink.write(big.data() + sent, n)) return false;
          sent += n;
          if (sent == big.size()) sink.done();
          return true;
        },
        "application/json");  // no length: Transfer-Encoding: chunked
    if (r) EXPECT_EQ(r->status, 413) << r->body;  // (or the server closed while the client still wrote)
  }
  {
    // A small gzip body still works, and the server is fine.
    auto c = client();
    c.set_compress(true);
    auto r = c.Post("/v1/completions", R"({"prompt": "Hi", "max_tokens": 2})", "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200) << r->body;
  }
}

std::string chunked_request(const std::string& body, const std::string& path = "/v1/completions") {
  std::string out = "POST " + path + " HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n";
  for (size_t i = 0; i < body.size(); i += 8192) {
    const std::string part = body.substr(i, 8192);
    char len[32];
    std::snprintf(len, sizeof len, "%zx\r\n", part.size());
    out += len + part + "\r\n";
  }
  return out + "0\r\n\r\n";
}

// Reads from `fd` until `done(got)` or `seconds` pass (or the peer closes).
std::string read_until(int fd, double seconds, const std::function<bool(const std::string&)>& done) {
  std::string got;
  const auto end = Clock::now() + std::chrono::duration<double>(seconds);
  char buf[4096];
  while (!done(got) && Clock::now() < end) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    got.append(buf, static_cast<size_t>(n));
  }
  return got;
}

// Bug: after refusing a body it had not read to the end, the server kept the connection open
// and read the rest of the body as the next requests, answering those too (400, 414): a client
// that reused the connection read a stale answer.
TEST_F(HttpServerTest, RefusedBodyClosesOrKeepsTheConnectionUsable) {
  start();
  auto has_body = [](const std::string& got) { return got.find("}}") != std::string::npos; };
  {
    // Far over the limit: refused before the end of the body, with Connection: close.
    const int fd = connect_to(server_->port());
    ASSERT_GE(fd, 0);
    const std::string req = chunked_request(R"({"prompt": "x", "user": ")" + std::string(1 << 20, 'a') + "\"}");
    std::thread sender([&] { send_all(fd, req); });
    const std::string got = read_until(fd, 10.0, has_body);
    ::shutdown(fd, SHUT_RDWR);
    sender.join();
    ::close(fd);
    EXPECT_EQ(got.rfind("HTTP/1.1 413", 0), 0u) << got.substr(0, 200);
    EXPECT_NE(got.find("Connection: close"), std::string::npos) << got.substr(0, 300);
  }
  {
    // A little over: read to its end and refused; the connection serves the next request.
    const int fd = connect_to(server_->port());
    ASSERT_GE(fd, 0);
    send_all(fd, chunked_request(R"({"prompt": "x", "user": ")" + std::string(100 << 10, 'a') + "\"}"));
    const std::string first = read_until(fd, 10.0, has_body);
    EXPECT_EQ(first.rfind("HTTP/1.1 413", 0), 0u) << first.substr(0, 200);
    EXPECT_EQ(first.find("Connection: close"), std::string::npos) << first.substr(0, 300);
    send_all(fd, post_request("/v1/completions", R"({"prompt": "Hi", "max_tokens": 2})"));
    const std::string second = read_until(fd, 10.0, [](const std::string& g) { return g.find("\"usage\"") != std::string::npos; });
    ::close(fd);
    EXPECT_EQ(second.rfind("HTTP/1.1 200", 0), 0u) << second.substr(0, 300);
  }
}

// Bug: /tokenize and /detokenize took the body cpp-httplib had read, bounded only by a
// Content-Length: a chunked body (or a compressed one) of any size was held in memory and
// tokenized. They now read it as the completion routes do: 413 past max_body_bytes.
TEST_F(HttpServerTest, TokenizerRoutesBoundAChunkedBody) {
  start();
  auto has_body = [](const std::string& got) { return got.find("}}") != std::string::npos; };
  for (const char* path : {"/tokenize", "/detokenize"}) {
    const int fd = connect_to(server_->port());
    ASSERT_GE(fd, 0);
    // 100 KiB over a 64 KiB limit: read to its end and refused.
    const std::string body = std::string(path) == "/tokenize"
                                 ? R"({"prompt": ")" + std::string(100 << 10, 'a') + "\"}"
                                 : R"({"tokens": [)" + std::string(100 << 10, '1') + "]}";
    send_all(fd, chunked_request(body, path));
    const std::string got = read_until(fd, 20.0, has_body);
    ::close(fd);
    EXPECT_EQ(got.rfind("HTTP/1.1 413", 0), 0u) << path << ": " << got.substr(0, 300);
  }
  // A small chunked body still works.
  const int fd = connect_to(server_->port());
  ASSERT_GE(fd, 0);
  send_all(fd, chunked_request(R"({"prompt": "Hello world"})", "/tokenize"));
  const std::string got = read_until(fd, 10.0, [](const std::string& g) { return g.find("\"tokens\"") != std::string::npos; });
  ::close(fd);
  EXPECT_EQ(got.rfind("HTTP/1.1 200", 0), 0u) << got.substr(0, 300);
}

// Bug: "Content-Length: -5" (read as 2^64 - 5 by cpp-httplib) held the thread for its 30 s read
// timeout before a 413.
TEST_F(HttpServerTest, ContentLengthThatIsNotAByteCountIsA400AtOnce) {
  start();
  for (const char* cl : {"-5", "12abc", "99999999999999999999999", "0x10"}) {
    const int fd = connect_to(server_->port());
    ASSERT_GE(fd, 0);
    send_all(fd, std::string("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: ") + cl +
                     "\r\n\r\n");
    const auto t0 = Clock::now();
    const std::string got = read_until(fd, 10.0, [](const std::string& g) { return g.find("}}") != std::string::npos; });
    const double waited = std::chrono::duration<double>(Clock::now() - t0).count();
    ::close(fd);
    EXPECT_EQ(got.rfind("HTTP/1.1 400", 0), 0u) << cl << ": " << got.substr(0, 200);
    EXPECT_NE(got.find("not a byte count"), std::string::npos) << cl << ": " << got.substr(0, 400);
    EXPECT_LT(waited, 5.0) << cl;
  }
  auto c = client();  // the server still answers
  auto r = c.Post("/v1/completions", R"({"prompt": "Hi", "max_tokens": 2})", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
}

// Bug: a POST with neither Content-Length nor Transfer-Encoding (curl -X POST without -d) held
// the client and an HTTP thread for the 30 s read timeout: cpp-httplib read to the end of the
// connection for a body the request does not have.
TEST_F(HttpServerTest, PostWithoutALengthIsAnsweredAtOnce) {
  start();
  struct Case {
    const char* path;
    const char* status;
  };
  for (const Case& c : {Case{"/v1/completions", "HTTP/1.1 400"}, Case{"/health", "HTTP/1.1 405"}, Case{"/nowhere", "HTTP/1.1 404"}}) {
    const int fd = connect_to(server_->port());
    ASSERT_GE(fd, 0);
    send_all(fd, std::string("POST ") + c.path + " HTTP/1.1\r\nHost: x\r\n\r\n");
    const auto t0 = Clock::now();
    const std::string got = read_until(fd, 10.0, [](const std::string& g) { return g.find("}}") != std::string::npos; });
    const double waited = std::chrono::duration<double>(Clock::now() - t0).count();
    ::close(fd);
    EXPECT_EQ(got.rfind(c.status, 0), 0u) << c.path << ": " << got.substr(0, 300);
    EXPECT_LT(waited, 5.0) << c.path;
  }
}

// Bug: a non-streamed request ran to max_tokens after its client had gone.
TEST_F(HttpServerTest, NonStreamedRequestOfAGoneClientIsCancelled) {
  fc_->hold = true;
  start();
  const int fd = connect_to(server_->port());
  ASSERT_GE(fd, 0);
  send_all(fd, post_request("/v1/completions", R"({"prompt": "Hi", "max_tokens": 500})"));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  ::close(fd);
  EXPECT_TRUE(fc_->wait_cancelled(1, 10.0)) << "the request was not cancelled after its client disconnected";
}

TEST_F(HttpServerTest, NonStreamedRequestOfAHalfClosedClientIsCancelled) {
  fc_->hold = true;
  start();
  const int fd = connect_to(server_->port());
  ASSERT_GE(fd, 0);
  send_all(fd, post_request("/v1/chat/completions", R"({"messages": [{"role": "user", "content": "Hi"}]})"));
  ::shutdown(fd, SHUT_WR);
  EXPECT_TRUE(fc_->wait_cancelled(1, 10.0));
  ::close(fd);
}

TEST_F(HttpServerTest, StreamOfAGoneClientIsCancelled) {
  fc_->hold = true;
  start();
  const int fd = connect_to(server_->port());
  ASSERT_GE(fd, 0);
  send_all(fd, post_request("/v1/completions", R"({"prompt": "Hi", "max_tokens": 500, "stream": true})"));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  ::close(fd);
  EXPECT_TRUE(fc_->wait_cancelled(1, 4.0));  // a look at the socket each idle second, not the 5 s ping
}

// Bug: stop() cut open streams mid-body (no [DONE], no last chunk: clients saw IncompleteRead).
TEST_F(HttpServerTest, StopEndsOpenStreamsCleanly) {
  fc_->hold = true;
  start();
  const int fd = connect_to(server_->port());
  ASSERT_GE(fd, 0);
  send_all(fd, post_request("/v1/chat/completions",
                            R"({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 500, "stream": true})"));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const auto t0 = Clock::now();
  std::thread stopper([&] { server_->stop(); });
  const std::string got = read_until_closed(fd, 10.0);
  stopper.join();
  ::close(fd);
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 4.0);
  EXPECT_NE(got.find("HTTP/1.1 200"), std::string::npos) << got;
  EXPECT_NE(got.find("shutting down"), std::string::npos) << got;
  EXPECT_NE(got.find("data: [DONE]"), std::string::npos) << got;
  EXPECT_NE(got.find("\r\n0\r\n\r\n"), std::string::npos) << "the chunked body was not terminated: " << got;
  EXPECT_TRUE(fc_->wait_cancelled(1, 5.0));
}

TEST_F(HttpServerTest, StopRightAfterStartReturns) {
  for (int i = 0; i < 5; ++i) {
    start();
    const auto t0 = Clock::now();
    server_->stop();
    EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 5.0);
    server_.reset();
  }
}

// Bug: a failure the cluster reports for a prompt longer than the context (a request that came
// before any replica had registered its max_model_len) was a 500.
TEST_F(HttpServerTest, PromptTooLongFromTheClusterIs413) {
  fc_->fail_with = "prompt too long: needs 2002 token positions but the largest max_model_len of any replica is 1024";
  start();
  auto c = client();
  auto r = c.Post("/v1/completions", R"({"prompt": "Hi", "max_tokens": 3})", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 413) << r->body;
  const json e = json::parse(r->body)["error"];
  EXPECT_EQ(e["code"], "context_length_exceeded");
  EXPECT_EQ(e["param"], "prompt");
  fc_->fail_with = "the replica failed";
  r = c.Post("/v1/completions", R"({"prompt": "Hi", "max_tokens": 3})", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 500) << r->body;
  // Every target shard down (review of the tensor-parallel serving): the service is unavailable,
  // as /health says, not an internal error.
  fc_->fail_with = "no replica is left: every target shard is down and none can be started";
  r = c.Post("/v1/completions", R"({"prompt": "Hi", "max_tokens": 3})", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 503) << r->body;
  EXPECT_EQ(json::parse(r->body)["error"]["type"], "service_unavailable");
}

TEST_F(HttpServerTest, WrongMethodIs405WithAllow) {
  start();
  auto c = client();
  auto r = c.Get("/v1/completions");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 405);
  EXPECT_EQ(r->get_header_value("Allow"), "POST");
  EXPECT_EQ(json::parse(r->body)["error"]["code"], "method_not_allowed");
  r = c.Post("/health", "", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 405);
  r = c.Get("/v1/nothing");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 404);
}

TEST_F(HttpServerTest, TokenizerRoutesAnswerAndTheApiKeyGuardsThem) {
  opts_.api_key = "sesame";
  start();
  auto c = client();
  const std::string body = R"({"prompt": "Hello world"})";
  auto r = c.Post("/tokenize", body, "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 401) << r->body;
  c.set_bearer_token_auth("sesame");
  r = c.Post("/tokenize", body, "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const json t = json::parse(r->body);
  EXPECT_EQ(t["tokens"].get<std::vector<int32_t>>(), tok_->encode("Hello world", true, true));
  r = c.Post("/detokenize", dump_json(json{{"tokens", t["tokens"]}}), "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(json::parse(r->body)["prompt"], "Hello world");
  r = c.Post("/detokenize", R"({"tokens": [-3]})", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);
  EXPECT_EQ(json::parse(r->body)["error"]["param"], "tokens[0]");
  r = c.Get("/tokenize");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 405);
  EXPECT_EQ(r->get_header_value("Allow"), "POST");
}

// Bug: a request body nested 100000 deep crashed the server (stack overflow while writing the
// error message); a number beyond a double was a 500.
TEST_F(HttpServerTest, HostileJsonIsA400AndTheServerStaysUp) {
  opts_.max_body_bytes = 1 << 20;
  start();
  auto c = client();
  const std::string deep = R"({"prompt": "x", "max_tokens": )" + std::string(100000, '[') + std::string(100000, ']') + "}";
  auto r = c.Post("/v1/completions", deep, "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);
  r = c.Post("/v1/completions", R"({"prompt": "x", "temperature": 1e999})", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400) << r->body;
  r = c.Get("/health");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
}

// Bug: with min_replicas 0 an idle cluster (no replica ready) answered 503, so a load balancer
// never sent the request that scales it up from zero.
TEST_F(HttpServerTest, HealthIsIdleNotUnavailableWhenTheAutoscalerStartsOnDemand) {
  fc_->idle_min_replicas = 0;
  start();
  auto c = client();
  auto r = c.Get("/health");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
  json j = json::parse(r->body);
  EXPECT_EQ(j["status"], "idle");
  EXPECT_EQ(j["replicas_ready"], 0);
  // min_replicas 1 and none ready: the cluster is not ready (it starts its floor on its own).
  {
    std::lock_guard<std::mutex> lock(fc_->mu);
    fc_->idle_min_replicas = 1;
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(600));  // /health reuses a status up to 0.5 s old
  r = c.Get("/health");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 503) << r->body;
  EXPECT_EQ(json::parse(r->body)["status"], "not ready");
}

// Bug: cpp-httplib 0.11 listens with a backlog of 5: a burst of clients overflowed the accept
// queue, and their connections waited for SYN retransmits (1 s and more) or were reset.
TEST_F(HttpServerTest, BurstOfConnectionsIsAcceptedAtOnce) {
  start();
  const int n = 300;
  std::vector<int> fds;
  for (int i = 0; i < n; ++i) {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(server_->port());
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
    fds.push_back(fd);
  }
  int connected = 0;
  const auto end = Clock::now() + std::chrono::milliseconds(500);
  std::vector<bool> done(n, false);
  while (connected < n && Clock::now() < end) {
    for (int i = 0; i < n; ++i) {
      if (done[i]) continue;
      pollfd p{fds[i], POLLOUT, 0};
      if (::poll(&p, 1, 0) > 0) {
        int err = 0;
        socklen_t len = sizeof err;
        ::getsockopt(fds[i], SOL_SOCKET, SO_ERROR, &err, &len);
        if (err == 0) {
          done[i] = true;
          ++connected;
        }
      }
    }
  }
  for (int fd : fds) ::close(fd);
  EXPECT_EQ(connected, n);
}

// Bug: each request's Job held its RequestHandles, whose state held the chunk callback, which
// held the Job: nothing of a finished request (its chunks included) was ever freed.
TEST_F(HttpServerTest, FinishedRequestsAreFreed) {
  fc_->text = std::string(1 << 20, 'a');  // 1 MiB per token
  start();
  auto c = client();
  auto once = [&] {
    auto r = c.Post("/v1/completions", R"({"prompt": "Hi", "max_tokens": 1})", "application/json");
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200);
  };
  for (int i = 0; i < 5; ++i) once();  // warm up allocator and pools
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const long before = rss_kib();
  for (int i = 0; i < 100; ++i) once();
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const long grown = rss_kib() - before;
  EXPECT_LT(grown, 40 << 10) << "RSS grew by " << grown << " KiB over 100 requests of 1 MiB each";
}

}  // namespace
}  // namespace specserve

namespace specserve {
namespace {

// The latency histograms follow vLLM V1: one inter-token observation per engine step that
// produced tokens (a speculative step's chunk holds several), one time-per-output-token and one
// time-to-first-token observation per request.
TEST_F(HttpServerTest, LatencyHistogramsCountStepsAndRequests) {
  fc_->tokens_per_chunk = 3;
  start();
  auto c = client();
  auto r = c.Post("/v1/completions", R"({"prompt": "x", "max_tokens": 7})", "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(json::parse(r->body)["choices"][0]["text"], "aaaaaaa");
  auto m = c.Get("/metrics");
  ASSERT_TRUE(m);
  auto count = [&](const std::string& family) {
    const std::string key = family + "_count{model_name=\"fake\"} ";
    const size_t at = m->body.find(key);
    return at == std::string::npos ? -1L : std::stol(m->body.substr(at + key.size()));
  };
  EXPECT_EQ(count("specserve:time_to_first_token_seconds"), 1) << m->body;
  EXPECT_EQ(count("specserve:inter_token_latency_seconds"), 2) << m->body;  // chunks of 3, 3, 1 tokens
  EXPECT_EQ(count("specserve:request_time_per_output_token_seconds"), 1) << m->body;
  EXPECT_EQ(count("specserve:e2e_request_latency_seconds"), 1) << m->body;
}

// vLLM V1's prefix-cache counters: the replicas' totals (ShardLoad) summed, as *_total counters.
TEST_F(HttpServerTest, PrefixCacheCountersSumTheReplicas) {
  fc_->prefix_cache_queries = 1000;
  fc_->prefix_cache_hits = 250;
  start();
  auto c = client();
  auto m = c.Get("/metrics");
  ASSERT_TRUE(m);
  EXPECT_NE(m->body.find("# TYPE specserve:prefix_cache_queries_total counter"), std::string::npos) << m->body;
  EXPECT_NE(m->body.find("specserve:prefix_cache_queries_total{model_name=\"fake\"} 2000\n"), std::string::npos) << m->body;
  EXPECT_NE(m->body.find("specserve:prefix_cache_hits_total{model_name=\"fake\"} 500\n"), std::string::npos) << m->body;
}

// disable_by_goodput's counters: the replicas' totals plus those of ended replica loads, as
// *_total counters.
TEST_F(HttpServerTest, GoodputCountersSumTheReplicas) {
  fc_->goodput_drafting = 30;
  fc_->goodput_skipped = 7;
  fc_->ended.goodput_drafting = 5;  // a replica incarnation that ended: still counted
  fc_->ended.prompt_tokens = 11;
  start();
  auto c = client();
  auto m = c.Get("/metrics");
  ASSERT_TRUE(m);
  EXPECT_NE(m->body.find("# TYPE specserve:spec_decode_goodput_drafting_total counter"), std::string::npos) << m->body;
  EXPECT_NE(m->body.find("specserve:spec_decode_goodput_drafting_total{model_name=\"fake\"} 65\n"), std::string::npos) << m->body;
  EXPECT_NE(m->body.find("specserve:spec_decode_goodput_skipped_total{model_name=\"fake\"} 14\n"), std::string::npos) << m->body;
  EXPECT_NE(m->body.find("specserve:prompt_tokens_total{model_name=\"fake\"} 11\n"), std::string::npos) << m->body;
}

// The replica lifecycle as metrics: a one-hot state gauge and the seconds spent in each state
// per replica, the warm pool's size, and the last promotion's three times.
TEST_F(HttpServerTest, LifecycleMetricsShowStatesTimeInEachAndPromotionTimes) {
  fc_->lifecycle = true;
  start();
  auto c = client();
  auto m = c.Get("/metrics");
  ASSERT_TRUE(m);
  const std::string& b = m->body;
  auto has = [&](const std::string& line) { return b.find(line + "\n") != std::string::npos; };
  EXPECT_TRUE(has(R"(specserve:replica_state{model_name="fake",replica="0",state="ready"} 1)")) << b;
  EXPECT_TRUE(has(R"(specserve:replica_state{model_name="fake",replica="0",state="standby"} 0)")) << b;
  EXPECT_TRUE(has(R"(specserve:replica_state{model_name="fake",replica="1",state="standby"} 1)")) << b;
  EXPECT_TRUE(has(R"(specserve:replica_state_seconds_total{model_name="fake",replica="0",state="loading"} 1.5)")) << b;
  EXPECT_TRUE(has(R"(specserve:replica_state_seconds_total{model_name="fake",replica="0",state="ready"} 10)")) << b;
  EXPECT_TRUE(has(R"(specserve:replica_state_seconds_total{model_name="fake",replica="1",state="standby"} 12)")) << b;
  EXPECT_TRUE(has(R"(specserve:num_replicas_standby{model_name="fake"} 1)")) << b;
  EXPECT_TRUE(has(R"(specserve:replica_cold_start_seconds{model_name="fake",replica="0"} 2.25)")) << b;
  EXPECT_TRUE(has(R"(specserve:replica_promotion_seconds{model_name="fake",replica="0"} 0.04)")) << b;
  EXPECT_NE(b.find(R"(specserve:replica_promotion_routable_seconds{model_name="fake",replica="0"} )"), std::string::npos) << b;
  EXPECT_NE(b.find(R"(specserve:replica_promotion_dispatch_seconds{model_name="fake",replica="0"} )"), std::string::npos) << b;
  EXPECT_TRUE(has(R"(specserve:autoscaler_promotions_total{model_name="fake"} 1)")) << b;
}

}  // namespace
}  // namespace specserve
