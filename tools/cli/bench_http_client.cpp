// `specserve bench`: the HTTP client side (see bench_http_client.h) — httplib clients, one
// measured streaming request, the progress line, a closed-loop run of N clients, and the
// server check.
#include "tools/cli/bench_http_client.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <mutex>
#include <string_view>
#include <thread>

#include <nlohmann/json.hpp>

namespace specserve::cli::bench_http {
namespace {

using Clock = std::chrono::steady_clock;
using json = nlohmann::json;

double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

/// httplib's error in words a user can act on, with httplib's own name.
std::string describe(httplib::Error e) {
  std::string what;
  switch (e) {
    case httplib::Error::Connection: what = "could not connect"; break;
    case httplib::Error::ConnectionTimeout: what = "connecting timed out"; break;
    case httplib::Error::Read: what = "reading the response failed (timeout or connection closed; see --request-timeout)"; break;
    case httplib::Error::Write: what = "sending the request failed"; break;
    case httplib::Error::SSLConnection: what = "TLS handshake failed"; break;
    case httplib::Error::SSLServerVerification: what = "the server's TLS certificate was not accepted"; break;
    default: what = "failed"; break;
  }
  return what + " [" + httplib::to_string(e) + "]";
}

httplib::Headers auth_headers(const Target& t) {
  httplib::Headers h;
  if (!t.api_key.empty()) h.emplace("Authorization", "Bearer " + t.api_key);
  return h;
}

/// The progress line on stderr: rewritten in place on a terminal, a line per tenth otherwise.
class Progress {
 public:
  Progress(int concurrency, int total) : concurrency_(concurrency), total_(total), tty_(isatty(STDERR_FILENO)), t0_(Clock::now()) {}

  void done(bool ok) {
    std::lock_guard<std::mutex> lock(mu_);
    ++done_;
    if (!ok) ++failed_;
    const int step = std::max(1, total_ / 10);
    if (tty_ || done_ % step == 0 || done_ == total_) print(tty_ ? "\r" : "", tty_ ? "" : "\n");
  }

  void finish() {
    std::lock_guard<std::mutex> lock(mu_);
    if (tty_) std::fprintf(stderr, "\n");
  }

 private:
  void print(const char* pre, const char* post) {
    std::fprintf(stderr, "%s[bench] concurrency %d: %d/%d requests done, %d failed, %.1f s%s", pre, concurrency_, done_,
                 total_, failed_, since(t0_), post);
    std::fflush(stderr);
  }

  std::mutex mu_;
  int concurrency_, total_;
  bool tty_;
  Clock::time_point t0_;
  int done_ = 0, failed_ = 0;
};

}  // namespace

std::unique_ptr<httplib::Client> make_client(const Target& t, double read_timeout_s) {
  auto c = std::make_unique<httplib::Client>(t.url.scheme_host_port());
  c->set_keep_alive(true);
  c->set_tcp_nodelay(true);  // a request's headers and body are separate writes: no Nagle delay
  // NOTE: no Accept-Encoding: a compressed event stream arrives in compressor-sized bursts, which
  // would measure the compressor, not the server.
  c->set_decompress(false);
  c->set_connection_timeout(10, 0);
  const auto secs = static_cast<time_t>(read_timeout_s);
  c->set_read_timeout(secs, static_cast<time_t>((read_timeout_s - static_cast<double>(secs)) * 1e6));
  c->set_write_timeout(60, 0);
  return c;
}

/// Sends one streaming request and measures it. Never throws; a failure is in the result.
RequestResult run_request(httplib::Client& cli, const Target& t, const BenchPrompt& p, const std::string& body) {
  RequestResult r;
  r.category = p.category;
  httplib::Request req;
  req.method = "POST";
  req.path = t.path;
  req.headers = auth_headers(t);
  req.headers.emplace("Accept", "text/event-stream");
  req.headers.emplace("Content-Type", "application/json");
  req.body = body;

  int status = 0;
  std::string content_type, error_body, raw_head;
  SseParser parser;
  Clock::time_point t0, last;
  bool stop = false, saw_done = false;
  auto on_event = [&](std::string_view data) {
    if (stop) return;
    const Clock::time_point now = Clock::now();
    auto chunk = parse_stream_chunk(data, t.endpoint);
    if (!chunk.ok()) {
      r.error = chunk.status().message();
      stop = true;
      return;
    }
    if (!chunk->error.empty()) {
      r.error = "error in the stream: " + chunk->error;
      stop = true;
      return;
    }
    if (chunk->done) {
      saw_done = true;
      return;
    }
    if (!chunk->text.empty()) {
      if (r.num_deltas == 0) {
        r.ttft_s = std::chrono::duration<double>(now - t0).count();
      } else {
        r.itl_s.push_back(std::chrono::duration<double>(now - last).count());
      }
      last = now;
      ++r.num_deltas;
      r.generated_text += chunk->text;
    }
    if (!chunk->finish_reason.empty()) r.finish_reason = chunk->finish_reason;
    if (chunk->completion_tokens) {
      r.output_tokens = *chunk->completion_tokens;
      r.usage_reported = true;
    }
    if (chunk->prompt_tokens) r.prompt_tokens = *chunk->prompt_tokens;
  };
  req.response_handler = [&](const httplib::Response& res) {
    status = res.status;
    content_type = res.get_header_value("Content-Type");
    return true;
  };
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    if (raw_head.size() < 512) raw_head.append(data, std::min(n, 512 - raw_head.size()));
    if (status != 200) {
      if (error_body.size() < 8192) error_body.append(data, n);
      return true;
    }
    parser.feed(std::string_view(data, n), on_event);
    return !stop;  // false cancels the transfer: the stream said something fatal
  };

  t0 = Clock::now();
  last = t0;
  httplib::Result res = cli.send(req);
  r.latency_s = since(t0);
  r.http_status = status;
  if (!res) {
    if (stop) return r;  // our own cancel: r.error says why
    r.error = "POST " + t.describe() + ": " + describe(res.error());
    return r;
  }
  r.http_status = res->status;
  if (res->status != 200) {
    r.error = error_message_of(error_body);
    return r;
  }
  parser.finish(on_event);
  if (!r.error.empty()) return r;
  if (parser.num_events() == 0) {
    r.error = "response of " + t.describe() + " is not an event stream (Content-Type: " +
              (content_type.empty() ? "none" : content_type) + "): " + error_message_of(raw_head);
    return r;
  }
  // NOTE: a stream cut short (the server died, a proxy timed out) ends with neither a
  // finish_reason nor data: [DONE]; it was counted a success, its partial text and token count in
  // the figures. Either one ends a stream (some servers send no [DONE]: older llama.cpp).
  if (!saw_done && r.finish_reason.empty()) {
    r.error = "the event stream of " + t.describe() + " ended with no finish_reason and no data: [DONE] (cut short)";
    return r;
  }
  if (!r.usage_reported) r.output_tokens = r.num_deltas;
  r.success = true;
  return r;
}

/// One run: `concurrency` clients over `bodies` (in order), at most `duration_s` of issuing.
/// `prompt_counts` (one per prompt, or empty) fills prompt_tokens where the server sent no usage.
std::pair<std::vector<RequestResult>, double> run_level(const Target& t, const std::vector<BenchPrompt>& prompts,
                                                        const std::vector<std::string>& bodies,
                                                        const std::vector<int64_t>& prompt_counts, int concurrency,
                                                        double duration_s) {
  std::vector<RequestResult> results(prompts.size());
  std::vector<char> issued(prompts.size(), 0);
  std::atomic<size_t> next{0};
  Progress progress(concurrency, static_cast<int>(prompts.size()));
  const Clock::time_point t0 = Clock::now();
  std::vector<std::thread> clients;
  for (int c = 0; c < concurrency; ++c) {
    clients.emplace_back([&] {
      auto cli = make_client(t, t.timeout_s);
      for (;;) {
        if (duration_s > 0 && since(t0) >= duration_s) return;
        const size_t i = next.fetch_add(1);
        if (i >= prompts.size()) return;
        issued[i] = 1;
        results[i] = run_request(*cli, t, prompts[i], bodies[i]);
        if (results[i].prompt_tokens < 0 && !prompt_counts.empty()) {
          results[i].prompt_tokens = prompt_counts[i];
          results[i].prompt_tokens_from_tokenizer = true;
        }
        progress.done(results[i].success);
      }
    });
  }
  for (auto& th : clients) th.join();
  const double wall = since(t0);
  progress.finish();
  std::vector<RequestResult> out;
  for (size_t i = 0; i < results.size(); ++i)
    if (issued[i]) out.push_back(std::move(results[i]));
  return {std::move(out), wall};
}

/// GET /v1/models: checks that the server answers and accepts the key; returns the model to use
/// (`wanted`, or the first the server lists when `wanted` is empty). Errors name the URL.
Expected<std::string> check_server(const Target& t, const std::string& wanted, const std::string& key_source) {
  auto cli = make_client(t, 30);
  const std::string path = t.url.path_prefix + "/v1/models";
  const std::string where = t.url.scheme_host_port() + path;
  httplib::Result res = cli->Get(path, auth_headers(t));
  if (!res) {
    return unavailable("cannot reach " + t.url.scheme_host_port() + " (GET " + path + ": " + describe(res.error()) +
                       "): is the server running, and is --base-url right?");
  }
  if (res->status == 401 || res->status == 403) {
    return invalid_argument(where + " answered HTTP " + std::to_string(res->status) + " (" + error_message_of(res->body) +
                            "): " + (t.api_key.empty() ? "the server wants an API key: pass --api-key or set OPENAI_API_KEY"
                                                       : "the API key from " + key_source + " was refused"));
  }
  if (res->status == 404 && !wanted.empty()) {
    std::fprintf(stderr, "[bench] %s answered HTTP 404; using --model %s as given\n", where.c_str(), wanted.c_str());
    return wanted;
  }
  if (res->status != 200) {
    return unavailable(where + " answered HTTP " + std::to_string(res->status) + ": " + error_message_of(res->body) +
                       (wanted.empty() ? " (pass --model to skip the model query)" : ""));
  }
  json j = json::parse(res->body, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    return corrupt_data(where + " answered with a body that is not a JSON object: " + error_message_of(res->body));
  }
  std::vector<std::string> ids;
  if (auto d = j.find("data"); d != j.end() && d->is_array()) {
    for (const auto& m : *d)
      if (m.is_object() && m.contains("id") && m["id"].is_string()) ids.push_back(m["id"].get<std::string>());
  }
  if (wanted.empty()) {
    if (ids.empty()) return corrupt_data(where + " lists no model (no data[].id): pass --model");
    return ids.front();
  }
  if (std::find(ids.begin(), ids.end(), wanted) == ids.end()) {
    std::string listed;
    for (const auto& id : ids) listed += (listed.empty() ? "" : ", ") + id;
    std::fprintf(stderr, "[bench] warning: --model %s is not among the models %s lists (%s)\n", wanted.c_str(),
                 where.c_str(), listed.c_str());
  }
  return wanted;
}

}  // namespace specserve::cli::bench_http
