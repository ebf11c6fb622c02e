// specserve server: what the HTTP front end's .cpp files share (not part of the public API).
//
// http_server.cpp (options, start: routes, authentication, error pages; stop),
// http_server_generate.cpp (the completion routes: body limits, submission, non-streamed and
// streamed answers) and http_server_metrics.cpp (the Prometheus families and their refresh)
// all work on HttpServer::Impl, defined here. Include only from server/http_server*.cpp.
#pragma once

#include <httplib.h>
#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "actors/client.h"
#include "actors/runtime.h"
#include "server/http_server.h"
#include "server/metrics.h"
#include "server/openai_api.h"

namespace specserve {
namespace http_server_internal {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

/// Seconds from `t` to now (steady clock).
double seconds_since(Clock::time_point t);

/// Seconds since the Unix epoch (OpenAI's `created`).
int64_t unix_now();

/// Answers `res` with `e`: its HTTP status and OpenAI's error object as JSON.
void send_error(httplib::Response& res, const ApiError& e);

/// A chunk of choice `index`, stamped when it arrived from the scheduler.
struct Arrival {
  size_t index = 0;
  StreamChunk chunk;
  Clock::time_point at;
};

/// The chunks of all choices of one HTTP request, in arrival order (pushed on CAF threads,
/// popped by the HTTP thread).
// NOTE: the chunk callbacks hold the Job weakly: the Job holds the RequestHandles, whose
// shared state holds the callback, so a strong capture was a cycle that kept every request's
// Job, handles and chunks alive for the life of the process.
struct Job {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Arrival> queue;
  std::vector<std::shared_ptr<RequestHandle>> handles;
  void push(size_t i, const StreamChunk& c) {
    const auto now = Clock::now();  // metrics measure the engine, not when the HTTP thread looks
    std::lock_guard<std::mutex> lock(mu);
    queue.push_back(Arrival{i, c, now});
    cv.notify_all();
  }
  /// Waits up to `timeout` for chunks and takes them all.
  std::deque<Arrival> take(std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait_for(lock, timeout, [&] { return !queue.empty(); });
    std::deque<Arrival> out;
    out.swap(queue);
    return out;
  }
  void cancel_all() {
    for (auto& h : handles) h->cancel();
  }
};

/// cpp-httplib's server with its listening socket in reach.
/// httplib::Server (plain HTTP) or httplib::SSLServer (HTTPS: HttpServerOptions::ssl_certfile).
template <class Base>
class ListeningServer : public Base {
 public:
  using Base::Base;
  /// Re-listens with a backlog of `n` connections. NOTE: cpp-httplib 0.11 listens with a
  /// backlog of 5 (compiled into the library), so a burst of clients overflowed the accept
  /// queue: connections waited for SYN retransmits (seconds) or were reset.
  bool set_backlog(int n) { return ::listen(this->svr_sock_, n) == 0; }
};

/// Per-choice timing, for the latency histograms.
struct ChoiceTiming {
  std::optional<Clock::time_point> first_token;
  Clock::time_point last_token;
  int64_t num_tokens = 0;
  bool finished = false;
};

}  // namespace http_server_internal

/// The server's state, shared by the route handlers (on cpp-httplib's threads).
struct HttpServer::Impl {
  using Clock = http_server_internal::Clock;
  HttpServerOptions opts;
  caf::actor_system* sys = nullptr;
  std::unique_ptr<Client> client;
  ServedModel model;
  std::unique_ptr<httplib::Server> svr;  ///< plain or TLS (ListeningServer)
  bool tls = false;
  std::thread thread;
  uint16_t port = 0;
  MetricsRegistry metrics;
  MetricLabels labels;
  std::mutex status_mu;
  std::optional<ClusterStatus> status;
  Clock::time_point status_at;
  std::atomic<int32_t> max_model_len{0};
  std::atomic<bool> stopped{false};
  std::atomic<int32_t> open_streams{0};  // streamed responses not yet ended

  /// The scheduler's status, at most `max_age_s` old (nullopt when it does not answer).
  std::optional<ClusterStatus> cluster_status(double max_age_s) {
    {
      std::lock_guard<std::mutex> lock(status_mu);
      if (status && http_server_internal::seconds_since(status_at) <= max_age_s) return status;
    }
    auto st = client->status(std::chrono::seconds(2));
    std::lock_guard<std::mutex> lock(status_mu);
    if (!st.ok()) return std::nullopt;
    status = *st;
    status_at = Clock::now();
    if (st->max_model_len > 0) max_model_len = st->max_model_len;
    return status;
  }

  /// The served model with the context length a replica reported (else the options').
  ServedModel model_now() {
    if (max_model_len.load() == 0) cluster_status(0.5);
    ServedModel m = model;
    m.max_model_len = max_model_len.load();
    if (m.max_model_len == 0) m.max_model_len = opts.max_model_len;  // no replica has reported yet
    return m;
  }

  // ---- http_server_metrics.cpp ----
  /// Declares every metric family (and the histograms' zero series) in `metrics`.
  void declare_metrics();
  /// Sets the gauges and counters from a fresh ClusterStatus (no-op when the scheduler does not answer).
  void refresh_cluster_metrics();
  void declare_lifecycle_metrics();
  /// Replica lifecycle states and autoscaler counters from `st`.
  void refresh_lifecycle_metrics(const ClusterStatus& st);
  /// Observes a finished choice: time to first token, end-to-end latency, time per output token,
  /// request_success by `finish` reason (not for "error").
  void observe_choice(const http_server_internal::ChoiceTiming& t, Clock::time_point start, Clock::time_point end,
                      const std::string& finish);
  /// Counts every choice of `timing` not finished yet as finished "abort" (observe_choice), and
  /// marks it finished: the server cancels them (a gone client, a failed sibling choice, the
  /// server stopping). vLLM V1 counts aborted requests in request_success by that reason.
  void observe_abandoned(std::vector<http_server_internal::ChoiceTiming>& timing, Clock::time_point start);
  /// Records the tokens of chunk `a` in `t`, observing inter-token latency.
  void observe_tokens(http_server_internal::ChoiceTiming& t, const http_server_internal::Arrival& a);
  // ---- http_server_generate.cpp ----
  /// Parses `body` as a `kind` request, submits its choices and answers (JSON or SSE stream).
  void handle_generate(const httplib::Request& req, const std::string& body, httplib::Response& res, ApiKind kind);
  /// Reads the body into *body within max_body_bytes, whatever its framing (Content-Length,
  /// chunked, compressed). False when it could not: the error (413 past the limit, 400 on a read
  /// failure) is already in `res`.
  bool read_bounded_body(const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& reader,
                         std::string* body);
  /// Reads the body within max_body_bytes (413 past it), then handle_generate.
  void read_body_and_generate(const httplib::Request& req, httplib::Response& res,
                              const httplib::ContentReader& reader, ApiKind kind);
};

}  // namespace specserve
