// The HTTP front end (server/http_server.h) over a fake scheduler actor: the transport-level
// behaviour that the request parser's tests cannot see — body limits however the body is
// sent, clients that go away, stopping with streams open, methods, the listen backlog, and
// that finished requests leave nothing behind. /metrics: http_server_metrics_test.cpp.
#include "tests/server/http_server_fixture.h"

namespace specserve {
namespace {

using namespace http_testing;

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

// CORS (vLLM's --allowed-origins, default any): a browser's preflight is answered before the
// API key is asked for, and answers carry Access-Control-Allow-Origin (401s too, so a page can
// read the error); an origin not in the list gets a 400 preflight and no header; an empty list
// turns CORS off.
TEST_F(HttpServerTest, CorsPreflightAndHeadersFollowTheAllowedOrigins) {
  opts_.api_key = "sk-cors";
  opts_.allowed_origins = {"http://app.example"};
  start();
  auto c = client();
  httplib::Headers pre = {{"Origin", "http://app.example"}, {"Access-Control-Request-Method", "POST"},
                          {"Access-Control-Request-Headers", "authorization, content-type"}};
  auto p = c.Options("/v1/chat/completions", pre);
  ASSERT_TRUE(p);
  EXPECT_EQ(p->status, 200) << p->body;
  EXPECT_EQ(p->get_header_value("Access-Control-Allow-Origin"), "http://app.example");
  EXPECT_NE(p->get_header_value("Access-Control-Allow-Methods").find("POST"), std::string::npos);
  EXPECT_EQ(p->get_header_value("Access-Control-Allow-Headers"), "authorization, content-type");
  auto unauth = c.Post("/v1/completions", httplib::Headers{{"Origin", "http://app.example"}}, R"({"prompt": "Hi", "max_tokens": 2})",
                       "application/json");
  ASSERT_TRUE(unauth);
  EXPECT_EQ(unauth->status, 401);
  EXPECT_EQ(unauth->get_header_value("Access-Control-Allow-Origin"), "http://app.example");
  auto ok = c.Post("/v1/completions", httplib::Headers{{"Origin", "http://app.example"}, {"Authorization", "Bearer sk-cors"}},
                   R"({"prompt": "Hi", "max_tokens": 2})", "application/json");
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200);
  EXPECT_EQ(ok->get_header_value("Access-Control-Allow-Origin"), "http://app.example");
  // Another origin: refused preflight, no header on answers.
  pre.erase("Origin");
  pre.emplace("Origin", "http://evil.example");
  auto bad = c.Options("/v1/chat/completions", pre);
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->status, 400);
  auto other = c.Get("/health", httplib::Headers{{"Origin", "http://evil.example"}});
  ASSERT_TRUE(other);
  EXPECT_FALSE(other->has_header("Access-Control-Allow-Origin"));
}

TEST_F(HttpServerTest, CorsAllowsAnyOriginByDefaultAndNoneWhenTheListIsEmpty) {
  start();
  auto any = client().Get("/health", httplib::Headers{{"Origin", "http://anything.example"}});
  ASSERT_TRUE(any);
  EXPECT_EQ(any->get_header_value("Access-Control-Allow-Origin"), "*");
  server_.reset();
  opts_.allowed_origins.clear();
  start();
  auto none = client().Get("/health", httplib::Headers{{"Origin", "http://anything.example"}});
  ASSERT_TRUE(none);
  EXPECT_FALSE(none->has_header("Access-Control-Allow-Origin"));
  auto pre = client().Options("/v1/models", httplib::Headers{{"Origin", "http://anything.example"}, {"Access-Control-Request-Method", "GET"}});
  ASSERT_TRUE(pre);
  EXPECT_NE(pre->status, 200);
}

// stream_options: include_usage gives a last chunk with the usage and null usage before it;
// with continuous_usage_stats too (vLLM's), every chunk carries the usage so far, its
// completion_tokens never going back and ending at the total.
TEST_F(HttpServerTest, StreamUsageIsLastOrContinuous) {
  start();
  auto c = client();
  for (bool continuous : {false, true}) {
    SCOPED_TRACE(continuous);
    const std::string body = std::string(R"({"prompt": "Hi", "max_tokens": 4, "stream": true, "stream_options": {"include_usage": true)") +
                             (continuous ? R"(, "continuous_usage_stats": true)" : "") + "}}";
    auto r = c.Post("/v1/completions", body, "application/json");
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    std::vector<json> chunks;
    for (size_t at = 0; (at = r->body.find("data: {", at)) != std::string::npos; ++at) {
      chunks.push_back(json::parse(r->body.substr(at + 6, r->body.find("\n\n", at) - at - 6)));
    }
    ASSERT_GE(chunks.size(), 5u) << r->body;  // 4 tokens, the finish, the usage chunk
    const json& last = chunks.back();
    EXPECT_TRUE(last["choices"].empty());
    EXPECT_EQ(last["usage"]["completion_tokens"], 4);
    int64_t seen = 0;
    for (size_t i = 0; i + 1 < chunks.size(); ++i) {
      if (!continuous) {
        EXPECT_TRUE(chunks[i]["usage"].is_null()) << chunks[i].dump();
        continue;
      }
      ASSERT_TRUE(chunks[i]["usage"].is_object()) << chunks[i].dump();
      const int64_t done = chunks[i]["usage"]["completion_tokens"];
      EXPECT_GE(done, seen);
      EXPECT_EQ(chunks[i]["usage"]["total_tokens"], chunks[i]["usage"]["prompt_tokens"].get<int64_t>() + done);
      seen = done;
    }
    if (continuous) EXPECT_EQ(seen, 4);
  }
  // A value that is not a boolean is named.
  auto bad = c.Post("/v1/completions", R"({"prompt": "Hi", "stream": true, "stream_options": {"continuous_usage_stats": "yes"}})",
                    "application/json");
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->status, 400);
  EXPECT_EQ(json::parse(bad->body)["error"]["param"], "stream_options.continuous_usage_stats") << bad->body;
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
// before any replica had registered its max_model_len) was a 500 (then a 413: now the 400
// context_length_exceeded of vLLM and OpenAI, as when the front end checks).
TEST_F(HttpServerTest, PromptTooLongFromTheClusterIs400ContextLengthExceeded) {
  fc_->fail_with = "prompt too long: needs 2002 token positions but the largest max_model_len of any replica is 1024";
  start();
  auto c = client();
  auto r = c.Post("/v1/completions", R"({"prompt": "Hi", "max_tokens": 3})", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400) << r->body;
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
