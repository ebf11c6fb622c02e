#include "server/http_server.h"

#include <httplib.h>
#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <filesystem>
#include <mutex>
#include <optional>
#include <random>
#include <thread>

#include "actors/client.h"
#include "actors/runtime.h"
#include "core/logging.h"
#include "server/connection_watch.h"
#include "server/metrics.h"

namespace specserve {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::string random_id(const char* prefix) {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  static const char* hex = "0123456789abcdef";
  std::string s = prefix;
  for (int i = 0; i < 24; ++i) s += hex[rng() & 15];
  return s;
}

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

void send_error(httplib::Response& res, const ApiError& e) {
  res.status = e.http_status;
  res.set_content(dump_json(e.to_json()), "application/json");
}

ApiError error_from_status(const Status& st) {
  ApiError e;
  e.message = st.message();
  switch (st.code()) {
    case StatusCode::kInvalidArgument:
    case StatusCode::kNotFound:
    case StatusCode::kUnsupported:
      e.http_status = 400;
      break;
    case StatusCode::kOutOfRange:
      e.http_status = 413;
      break;
    case StatusCode::kUnavailable:
    case StatusCode::kResourceExhausted:
    case StatusCode::kDeadlineExceeded:
      e.http_status = 503;
      e.type = "service_unavailable";
      break;
    default:
      e.http_status = 500;
      e.type = "server_error";
  }
  return e;
}

// A chunk of choice `index`, stamped when it arrived from the scheduler.
struct Arrival {
  size_t index = 0;
  StreamChunk chunk;
  Clock::time_point at;
};

// The chunks of all choices of one HTTP request, in arrival order (pushed on CAF threads,
// popped by the HTTP thread).
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
  // Waits up to `timeout` for chunks and takes them all.
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

// The error a choice that failed on the cluster (finish reason "error") answers with.
ApiError error_from_chunk(const StreamChunk& c, ApiKind kind) {
  ApiError e{500, c.error.empty() ? "the request failed" : c.error, "server_error", "", ""};
  // NOTE: the scheduler refuses a prompt longer than every replica's max_model_len only once
  // a replica has registered its limit, so a request that came in before (the front end could
  // not check it then) fails this way: it is the client's error, as when the front end checks.
  if (c.error.rfind("prompt too long", 0) == 0) {
    e.http_status = 413;
    e.type = "invalid_request_error";
    e.param = kind == ApiKind::kChat ? "messages" : "prompt";
    e.code = "context_length_exceeded";
  }
  return e;
}

// cpp-httplib's server with its listening socket in reach.
class ListeningServer : public httplib::Server {
 public:
  /// Re-listens with a backlog of `n` connections. NOTE: cpp-httplib 0.11 listens with a
  /// backlog of 5 (compiled into the library), so a burst of clients overflowed the accept
  /// queue: connections waited for SYN retransmits (seconds) or were reset.
  bool set_backlog(int n) { return ::listen(svr_sock_, n) == 0; }
};

// Per-choice timing, for the latency histograms.
struct ChoiceTiming {
  std::optional<Clock::time_point> first_token;
  Clock::time_point last_token;
  int64_t num_tokens = 0;
  bool finished = false;
};

}  // namespace

struct HttpServer::Impl {
  HttpServerOptions opts;
  caf::actor_system* sys = nullptr;
  std::unique_ptr<Client> client;
  ServedModel model;
  ListeningServer svr;
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

  // The scheduler's status, at most `max_age_s` old (nullopt when it does not answer).
  std::optional<ClusterStatus> cluster_status(double max_age_s) {
    {
      std::lock_guard<std::mutex> lock(status_mu);
      if (status && seconds_since(status_at) <= max_age_s) return status;
    }
    auto st = client->status(std::chrono::seconds(2));
    std::lock_guard<std::mutex> lock(status_mu);
    if (!st.ok()) return std::nullopt;
    status = *st;
    status_at = Clock::now();
    if (st->max_model_len > 0) max_model_len = st->max_model_len;
    return status;
  }

  ServedModel model_now() {
    if (max_model_len.load() == 0) cluster_status(0.5);
    ServedModel m = model;
    m.max_model_len = max_model_len.load();
    if (m.max_model_len == 0) m.max_model_len = opts.max_model_len;  // no replica has reported yet
    return m;
  }

  void declare_metrics();
  void refresh_cluster_metrics();
  void declare_lifecycle_metrics();
  void refresh_lifecycle_metrics(const ClusterStatus& st);
  void observe_choice(const ChoiceTiming& t, Clock::time_point start, Clock::time_point end, const std::string& finish);
  void observe_tokens(ChoiceTiming& t, const Arrival& a);
  void handle_generate(const httplib::Request& req, const std::string& body, httplib::Response& res, ApiKind kind);
  void read_body_and_generate(const httplib::Request& req, httplib::Response& res,
                              const httplib::ContentReader& reader, ApiKind kind);
};

void HttpServer::Impl::declare_metrics() {
  using K = MetricsRegistry::Kind;
  metrics.declare("specserve:num_requests_running", K::kGauge, "Number of requests in model execution batches.");
  metrics.declare("specserve:num_requests_waiting", K::kGauge, "Number of requests waiting to be processed.");
  metrics.declare("specserve:kv_cache_usage_perc", K::kGauge, "KV-cache usage. 1 means 100 percent usage.");
  metrics.declare("specserve:num_replicas_ready", K::kGauge, "Replicas ready to serve.");
  metrics.declare("specserve:prompt_tokens", K::kCounter, "Number of prefill tokens processed.");
  metrics.declare("specserve:generation_tokens", K::kCounter, "Number of generation tokens processed.");
  metrics.declare("specserve:request_success", K::kCounter, "Count of successfully processed requests (HTTP).");
  metrics.declare("specserve:time_to_first_token_seconds", K::kHistogram, "Histogram of time to first token in seconds.",
                  ttft_buckets());
  metrics.declare("specserve:inter_token_latency_seconds", K::kHistogram,
                  "Histogram of inter-token latency in seconds (one per engine step that produced tokens).", itl_buckets());
  metrics.declare("specserve:request_time_per_output_token_seconds", K::kHistogram,
                  "Histogram of time per output token in seconds, per request (first to last token).", itl_buckets());
  metrics.declare("specserve:e2e_request_latency_seconds", K::kHistogram,
                  "Histogram of end to end request latency in seconds.", e2e_buckets());
  metrics.declare("specserve:spec_decode_num_drafts", K::kCounter, "Number of spec decoding drafts.");
  metrics.declare("specserve:spec_decode_num_draft_tokens", K::kCounter, "Number of draft tokens.");
  metrics.declare("specserve:spec_decode_num_accepted_tokens", K::kCounter, "Number of accepted tokens.");
  metrics.declare("specserve:spec_decode_num_accepted_tokens_per_pos", K::kCounter,
                  "Accepted tokens per draft position.");
  metrics.declare("specserve:prefix_cache_queries", K::kCounter,
                  "Prefix cache queries: tokens looked up in the prefix cache at admission.");
  metrics.declare("specserve:prefix_cache_hits", K::kCounter, "Prefix cache hits: tokens found in the prefix cache.");
  metrics.declare("specserve:spec_decode_draft_seconds", K::kCounter, "Seconds spent proposing draft tokens.");
  metrics.declare("specserve:spec_decode_verify_seconds", K::kCounter,
                  "Seconds spent in target forward passes, which verify the drafts (prefill included).");
  // Families with labels only appear once observed: give the histograms their zero series.
  metrics.observe("specserve:time_to_first_token_seconds", labels, 0, 0);
  metrics.observe("specserve:inter_token_latency_seconds", labels, 0, 0);
  metrics.observe("specserve:request_time_per_output_token_seconds", labels, 0, 0);
  metrics.observe("specserve:e2e_request_latency_seconds", labels, 0, 0);
  declare_lifecycle_metrics();
}

void HttpServer::Impl::declare_lifecycle_metrics() {
  using K = MetricsRegistry::Kind;
  metrics.declare("specserve:replica_state", K::kGauge,
                  "1 for the replica's current lifecycle state (starting, loading, warming, ready, draining, standby, stopped), else 0.");
  metrics.declare("specserve:replica_state_seconds", K::kCounter, "Seconds each replica spent in each lifecycle state.");
  metrics.declare("specserve:num_replicas_standby", K::kGauge, "Standby replicas: loaded and warm, not routed (the warm pool).");
  metrics.declare("specserve:autoscaler_target_replicas", K::kGauge, "Ready replicas the autoscaler wants.");
  metrics.declare("specserve:autoscaler_promotions", K::kCounter, "Standby replicas promoted to ready.");
  metrics.declare("specserve:autoscaler_cold_starts", K::kCounter, "Replica processes started by the autoscaler.");
  metrics.declare("specserve:autoscaler_drains", K::kCounter, "Ready replicas drained by the autoscaler.");
  metrics.declare("specserve:replica_cold_start_seconds", K::kGauge,
                  "The replica's last cold start: process start requested to ready (loaded and warmed up).");
  metrics.declare("specserve:replica_promotion_routable_seconds", K::kGauge,
                  "The replica's last warm promotion: the autoscaler's decision to the replica being routed.");
  metrics.declare("specserve:replica_promotion_dispatch_seconds", K::kGauge,
                  "The replica's last warm promotion: the autoscaler's decision to the first request sent to it.");
  metrics.declare("specserve:replica_promotion_seconds", K::kGauge,
                  "The replica's last warm promotion: the autoscaler's decision to the first token of the first request sent to it that had none yet.");
}

void HttpServer::Impl::refresh_lifecycle_metrics(const ClusterStatus& st) {
  static const char* const kStates[] = {"starting", "loading", "warming", "ready", "draining", "standby", "stopped"};
  int64_t standby = 0;
  for (const ReplicaStatus& r : st.replicas) {
    if (r.state.empty()) continue;
    standby += r.state == "standby";
    MetricLabels rl = labels;
    rl.emplace_back("replica", std::to_string(r.replica));
    for (size_t k = 0; k < std::size(kStates); ++k) {
      MetricLabels l = rl;
      l.emplace_back("state", kStates[k]);
      metrics.set("specserve:replica_state", l, r.state == kStates[k] ? 1.0 : 0.0);
      if (k < r.state_seconds_total.size()) {
        metrics.set_counter_at_least("specserve:replica_state_seconds", l, r.state_seconds_total[k]);
      }
    }
    if (r.cold_start_seconds > 0) metrics.set("specserve:replica_cold_start_seconds", rl, r.cold_start_seconds);
    if (r.num_promotions > 0) {
      metrics.set("specserve:replica_promotion_routable_seconds", rl, r.promotion_routable_seconds);
      if (r.promotion_dispatch_seconds > 0) metrics.set("specserve:replica_promotion_dispatch_seconds", rl, r.promotion_dispatch_seconds);
    }
    if (r.promotion_seconds > 0) metrics.set("specserve:replica_promotion_seconds", rl, r.promotion_seconds);
  }
  metrics.set("specserve:num_replicas_standby", labels, static_cast<double>(standby));
  const AutoscaleStatus& a = st.autoscale;
  metrics.set("specserve:autoscaler_target_replicas", labels, a.enabled ? a.target_ready : 0.0);
  metrics.set_counter_at_least("specserve:autoscaler_promotions", labels, static_cast<double>(a.num_promotions));
  metrics.set_counter_at_least("specserve:autoscaler_cold_starts", labels, static_cast<double>(a.num_cold_starts));
  metrics.set_counter_at_least("specserve:autoscaler_drains", labels, static_cast<double>(a.num_drains));
}

void HttpServer::Impl::refresh_cluster_metrics() {
  auto st = cluster_status(0.0);
  if (!st) return;
  int64_t running = 0, waiting = st->queued, used = 0, total = 0, ready = 0;
  double prompt = 0, gen = 0, drafts = 0, draft_tokens = 0, accepted = 0, draft_s = 0, forward_s = 0;
  double pc_queries = 0, pc_hits = 0;
  std::vector<double> per_pos;
  for (const ReplicaStatus& r : st->replicas) {
    const ShardLoad& l = r.load;
    if (r.ready) {
      ++ready;
      running += l.num_running;
      waiting += l.num_waiting;
      used += l.total_kv_blocks - l.free_kv_blocks;
      total += l.total_kv_blocks;
    }
    // Counters: every replica's totals, down ones included (they stay in the status).
    prompt += static_cast<double>(l.prompt_tokens);
    gen += static_cast<double>(l.generated_tokens);
    drafts += static_cast<double>(l.num_drafts);
    draft_tokens += static_cast<double>(l.num_draft_tokens);
    accepted += static_cast<double>(l.num_accepted_tokens);
    draft_s += l.draft_seconds;
    forward_s += l.forward_seconds;
    pc_queries += static_cast<double>(l.prefix_cache_queries);
    pc_hits += static_cast<double>(l.prefix_cache_hits);
    if (per_pos.size() < l.accepted_per_pos.size()) per_pos.resize(l.accepted_per_pos.size(), 0.0);
    for (size_t i = 0; i < l.accepted_per_pos.size(); ++i) per_pos[i] += static_cast<double>(l.accepted_per_pos[i]);
  }
  metrics.set("specserve:num_requests_running", labels, static_cast<double>(running));
  metrics.set("specserve:num_requests_waiting", labels, static_cast<double>(waiting));
  metrics.set("specserve:kv_cache_usage_perc", labels, total > 0 ? static_cast<double>(used) / static_cast<double>(total) : 0.0);
  metrics.set("specserve:num_replicas_ready", labels, static_cast<double>(ready));
  metrics.set_counter_at_least("specserve:prompt_tokens", labels, prompt);
  metrics.set_counter_at_least("specserve:generation_tokens", labels, gen);
  metrics.set_counter_at_least("specserve:spec_decode_num_drafts", labels, drafts);
  metrics.set_counter_at_least("specserve:spec_decode_num_draft_tokens", labels, draft_tokens);
  metrics.set_counter_at_least("specserve:spec_decode_num_accepted_tokens", labels, accepted);
  metrics.set_counter_at_least("specserve:spec_decode_draft_seconds", labels, draft_s);
  metrics.set_counter_at_least("specserve:spec_decode_verify_seconds", labels, forward_s);
  metrics.set_counter_at_least("specserve:prefix_cache_queries", labels, pc_queries);
  metrics.set_counter_at_least("specserve:prefix_cache_hits", labels, pc_hits);
  for (size_t i = 0; i < per_pos.size(); ++i) {
    MetricLabels l = labels;
    l.emplace_back("position", std::to_string(i));
    metrics.set_counter_at_least("specserve:spec_decode_num_accepted_tokens_per_pos", l, per_pos[i]);
  }
  refresh_lifecycle_metrics(*st);
}

void HttpServer::Impl::observe_choice(const ChoiceTiming& t, Clock::time_point start, Clock::time_point end,
                                      const std::string& finish) {
  if (t.first_token) {
    metrics.observe("specserve:time_to_first_token_seconds", labels,
                    std::chrono::duration<double>(*t.first_token - start).count());
  }
  metrics.observe("specserve:e2e_request_latency_seconds", labels, std::chrono::duration<double>(end - start).count());
  if (t.first_token && t.num_tokens > 1) {
    metrics.observe("specserve:request_time_per_output_token_seconds", labels,
                    std::chrono::duration<double>(t.last_token - *t.first_token).count() / static_cast<double>(t.num_tokens - 1));
  }
  MetricLabels l = labels;
  l.emplace_back("finished_reason", finish);
  // vLLM V1 counts every finished request by its reason (stop, length, abort); failures are not successes.
  if (finish != "error") metrics.add("specserve:request_success", l, 1);
}

void HttpServer::Impl::observe_tokens(ChoiceTiming& t, const Arrival& a) {
  const size_t k = a.chunk.tokens.size();
  if (k == 0) return;
  if (!t.first_token) {
    t.first_token = a.at;
  } else {
    // NOTE: vLLM V1's meaning: one observation per engine step that produced tokens for the
    // request (a chunk holds all of a step's tokens, several with speculation), so speculation
    // shows as fewer, not shorter, gaps; per-token time is request_time_per_output_token.
    const double gap = std::chrono::duration<double>(a.at - t.last_token).count();
    metrics.observe("specserve:inter_token_latency_seconds", labels, gap);
  }
  t.num_tokens += static_cast<int64_t>(k);
  t.last_token = a.at;
}

namespace {

// Everything one streamed response needs between calls of the content provider.
struct StreamState {
  std::shared_ptr<Job> job;
  ParsedRequest req;
  ServedModel model;
  std::string id;
  int64_t created = 0;
  Clock::time_point start;
  std::vector<ChoiceOutput> outputs;
  std::vector<ChoiceTiming> timing;
  size_t finished = 0;
  bool started = false;
  bool complete = false;  // [DONE] written
  Clock::time_point last_write;
  std::optional<DisconnectWatch> watch;
};

json chunk_base(const StreamState& s) {
  json c;
  c["id"] = s.id;
  c["object"] = s.req.kind == ApiKind::kChat ? "chat.completion.chunk" : "text_completion";
  c["created"] = s.created;
  c["model"] = s.model.name;
  if (s.req.include_usage) c["usage"] = nullptr;
  return c;
}

json choice_event(const StreamState& s, size_t index, const std::string& text, const json& logprobs,
                  const json& finish_reason, bool role) {
  json ch;
  ch["index"] = index;
  if (s.req.kind == ApiKind::kChat) {
    json delta = json::object();
    if (role) delta["role"] = "assistant";
    if (role || !text.empty()) delta["content"] = text;
    ch["delta"] = delta;
  } else {
    ch["text"] = text;
  }
  ch["logprobs"] = logprobs;
  ch["finish_reason"] = finish_reason;
  json c = chunk_base(s);
  c["choices"] = json::array({ch});
  return c;
}

bool write_event(httplib::DataSink& sink, const std::string& data, StreamState* s) {
  const std::string line = "data: " + data + "\n\n";
  s->last_write = Clock::now();
  return sink.write(line.data(), line.size());
}

}  // namespace

void HttpServer::Impl::read_body_and_generate(const httplib::Request& http_req, httplib::Response& res,
                                              const httplib::ContentReader& reader, ApiKind kind) {
  // NOTE: read here, not by cpp-httplib: 0.11 checks its payload limit against Content-Length
  // only, so a chunked body, or a gzip one (it inflates Content-Encoding), had no limit at all.
  // Past the limit the rest is read and dropped, up to 4x the limit, so that the connection
  // stays usable; beyond that reading stops and the answer closes the connection.
  std::string body;
  size_t seen = 0;
  bool too_large = false;
  const bool ok = reader([&](const char* data, size_t n) {
    seen += n;
    if (seen > opts.max_body_bytes) {
      if (!too_large) std::string().swap(body);
      too_large = true;
      return seen / 4 <= opts.max_body_bytes;
    }
    body.append(data, n);
    return true;
  });
  if (!ok || too_large) {
    ApiError e;
    if (too_large || res.status == 413) {
      e.http_status = 413;
      e.message = "the request body is larger than " + std::to_string(opts.max_body_bytes) + " bytes (after decompression)";
    } else {
      e.message = "could not read the request body";
    }
    // NOTE: the rest of the body is still on the connection, and cpp-httplib 0.11 reads it as
    // the next requests (answering those with 400s) whatever this answer says, so the client
    // is told not to reuse the connection. (Shutting the socket's reading side would not help:
    // cpp-httplib writes nothing, this answer included, to a socket that reads as closed.)
    if (!ok) res.set_header("Connection", "close");
    get_logger("server")->info("{} {}: {} {}", http_req.method, http_req.path, e.http_status, e.message);
    return send_error(res, e);
  }
  handle_generate(http_req, body, res, kind);
}

void HttpServer::Impl::handle_generate(const httplib::Request& http_req, const std::string& body, httplib::Response& res,
                                       ApiKind kind) {
  const auto start = Clock::now();
  auto log = get_logger("server");
  ServedModel model = model_now();
  ParsedRequest req;
  if (auto err = parse_openai_request(body, kind, model, opts.limits, &req)) {
    log->info("{} {}: {} {}", http_req.method, http_req.path, err->http_status, err->message);
    return send_error(res, *err);
  }
  auto job = std::make_shared<Job>();
  const size_t num_choices = req.prompts.size() * static_cast<size_t>(req.n);
  for (size_t p = 0; p < req.prompts.size(); ++p) {
    for (int32_t j = 0; j < req.n; ++j) {
      const size_t idx = p * static_cast<size_t>(req.n) + static_cast<size_t>(j);
      std::weak_ptr<Job> weak = job;
      auto h = client->submit(req.request_for(p, j), [weak, idx](const StreamChunk& c) {
        if (auto j = weak.lock()) j->push(idx, c);
      });
      if (!h.ok()) {
        job->cancel_all();
        ApiError e = error_from_status(h.status());
        if (e.http_status == 413 || e.http_status == 400) e.param = kind == ApiKind::kChat ? "messages" : "prompt";
        log->info("{} {}: {} {}", http_req.method, http_req.path, e.http_status, e.message);
        return send_error(res, e);
      }
      job->handles.push_back(*h);
    }
  }
  const std::string id = random_id(kind == ApiKind::kChat ? "chatcmpl-" : "cmpl-");
  const int64_t created = unix_now();
  if (!req.stream) {
    std::vector<ChoiceOutput> outputs(num_choices);
    std::vector<ChoiceTiming> timing(num_choices);
    size_t finished = 0;
    std::optional<ApiError> error;
    DisconnectWatch watch(http_req);
    bool gone = false;
    while (finished < num_choices && !stopped && !gone) {
      for (auto& a : job->take(std::chrono::milliseconds(500))) {
        const size_t i = a.index;
        const StreamChunk& c = a.chunk;
        if (timing[i].finished) continue;
        observe_tokens(timing[i], a);
        outputs[i].add(c);
        if (!c.finish_reason.empty()) {
          timing[i].finished = true;
          ++finished;
          observe_choice(timing[i], start, a.at, c.finish_reason);
          if (c.finish_reason == "error" && !error) error = error_from_chunk(c, kind);
        }
      }
      // A client that went away: cancel its choices (they would run to max_tokens).
      if (finished < num_choices) gone = watch.gone();
    }
    if (gone) {
      job->cancel_all();
      log->info("{} {} {}: client gone: cancelling {} choice(s)", http_req.method, http_req.path, id,
                num_choices - finished);
      return send_error(res, ApiError{499, "the client closed the connection", "invalid_request_error", "", ""});
    }
    if (finished < num_choices) {
      job->cancel_all();
      return send_error(res, ApiError{503, "the server is shutting down", "service_unavailable", "", ""});
    }
    if (error) {
      job->cancel_all();
      log->warn("{} {} {}: failed: {}", http_req.method, http_req.path, id, error->message);
      return send_error(res, *error);
    }
    res.set_content(dump_json(completion_response(req, model, id, created, outputs)), "application/json");
    return;
  }
  auto s = std::make_shared<StreamState>();
  s->job = job;
  s->req = std::move(req);
  s->model = model;
  s->id = id;
  s->created = created;
  s->start = start;
  s->outputs.resize(num_choices);
  s->timing.resize(num_choices);
  s->last_write = Clock::now();
  s->watch.emplace(http_req);
  Impl* self = this;
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  ++open_streams;
  res.set_chunked_content_provider(
      "text/event-stream",
      [s, self, num_choices, kind](size_t, httplib::DataSink& sink) -> bool {
        static const std::string done = "data: [DONE]\n\n";
        if (s->complete) {
          sink.done();
          return true;
        }
        // Ends the stream with an error event and [DONE] (OpenAI's client raises it).
        auto fail = [&](const ApiError& e) {
          s->job->cancel_all();
          s->complete = true;
          if (!write_event(sink, dump_json(e.to_json()), s.get())) return false;
          sink.write(done.data(), done.size());
          sink.done();
          return true;
        };
        if (self->stopped) {
          // NOTE: the head drained first; what is left did not finish in the drain timeout.
          // Ending the chunked body properly lets the client tell this from a network failure.
          get_logger("server")->info("stream {}: server stopping: cancelling {} choice(s)", s->id,
                                     num_choices - s->finished);
          const bool ok = fail(ApiError{503, "the server is shutting down", "service_unavailable", "", ""});
          s->watch->stop_reading();  // after the writes (cpp-httplib takes a read end as a gone client)
          return ok;
        }
        const Tokenizer& tok = *s->model.tokenizer;
        if (!s->started) {
          s->started = true;
          for (size_t i = 0; i < num_choices; ++i) {
            const bool chat = s->req.kind == ApiKind::kChat;
            const std::string echo = (!chat && s->req.echo) ? s->req.prompts[i / s->req.n].text : "";
            if (chat || !echo.empty()) {
              if (!write_event(sink, dump_json(choice_event(*s, i, echo, nullptr, nullptr, chat)), s.get())) return false;
            }
          }
        }
        auto items = s->job->take(std::chrono::milliseconds(1000));
        if (items.empty()) {
          // A write finds a gone client only after the peer's reset; a request that waits in
          // the queue writes nothing, so it looks at the socket too.
          if (s->watch->gone()) return false;
          // SSE comment: keeps proxies from closing an idle stream and finds a gone client.
          if (seconds_since(s->last_write) > 5.0) {
            static const std::string ping = ": keep-alive\n\n";
            s->last_write = Clock::now();
            if (!sink.write(ping.data(), ping.size())) return false;
          }
          return true;
        }
        for (auto& a : items) {
          const size_t i = a.index;
          const StreamChunk& c = a.chunk;
          ChoiceTiming& t = s->timing[i];
          if (t.finished) continue;
          self->observe_tokens(t, a);
          ChoiceOutput& out = s->outputs[i];
          const size_t begin = out.tokens.size();
          out.add(c);
          if (c.finish_reason == "error") {
            const ApiError e = error_from_chunk(c, kind);
            get_logger("server")->warn("stream {}: choice {} failed: {}", s->id, i, e.message);
            return fail(e);
          }
          if (!c.text.empty() || (s->req.logprobs && !c.tokens.empty())) {
            const json lp = logprobs_json(s->req, tok, out, begin, out.tokens.size(), 0);
            if (!write_event(sink, dump_json(choice_event(*s, i, c.text, lp, nullptr, false)), s.get())) return false;
          }
          if (!c.finish_reason.empty()) {
            t.finished = true;
            ++s->finished;
            self->observe_choice(t, s->start, a.at, c.finish_reason);
            const json ev = choice_event(*s, i, "", nullptr, api_finish_reason(c.finish_reason), false);
            if (!write_event(sink, dump_json(ev), s.get())) return false;
          }
        }
        if (s->finished == num_choices) {
          if (s->req.include_usage) {
            json u = chunk_base(*s);
            u["choices"] = json::array();
            u["usage"] = usage_json(s->req, s->outputs);
            if (!write_event(sink, dump_json(u), s.get())) return false;
          }
          if (!sink.write(done.data(), done.size())) return false;
          s->complete = true;
          sink.done();
        }
        return true;
      },
      [s, self](bool) {
        // The response ended: normally, or because the client went away / the server stops.
        // Unfinished choices are cancelled, which frees their KV blocks.
        if (s->finished < s->outputs.size() && !s->complete) {
          get_logger("server")->info("stream {}: client gone or server stopping: cancelling {} choice(s)", s->id,
                                     s->outputs.size() - s->finished);
          s->job->cancel_all();
        }
        --self->open_streams;
      });
}

Status HttpServerOptions::validate() const {
  if (port < 0 || port > 65535) return invalid_argument("port = " + std::to_string(port) + ": must be in 0..65535");
  if (threads < 1 || threads > 4096) return invalid_argument("http threads = " + std::to_string(threads) + ": must be in 1..4096");
  if (max_body_bytes < 1024) return invalid_argument("max body bytes = " + std::to_string(max_body_bytes) + ": must be >= 1024");
  if (host.empty()) return invalid_argument("host: empty");
  return Status();
}

HttpServer::HttpServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

HttpServer::~HttpServer() { stop(); }

uint16_t HttpServer::port() const { return impl_->port; }

const std::string& HttpServer::model_name() const { return impl_->model.name; }

void HttpServer::stop() {
  if (!impl_ || impl_->stopped.exchange(true)) return;
  // Open streams end themselves (an error event, [DONE], the last chunk) within a second (their
  // wait for chunks); after svr.stop() cpp-httplib would cut them mid-body.
  const auto deadline = Clock::now() + std::chrono::seconds(3);
  while (impl_->open_streams.load() > 0 && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  impl_->svr.stop();
  if (impl_->thread.joinable()) impl_->thread.join();
}

Expected<std::unique_ptr<HttpServer>> HttpServer::start(const HttpServerOptions& options, caf::actor_system& sys,
                                                        caf::actor scheduler, std::string token,
                                                        const Tokenizer& tokenizer, const GgufFile& gguf) {
  SPECSERVE_RETURN_IF_ERROR(options.validate());
  auto impl = std::make_unique<Impl>();
  Impl* d = impl.get();
  d->opts = options;
  d->sys = &sys;
  d->client = Client::in_process(sys, scheduler, std::move(token));
  d->model.name = options.served_model_name;
  if (d->model.name.empty()) {
    d->model.name = std::filesystem::path(options.model_path).filename().string();
    if (d->model.name.size() > 5 && d->model.name.ends_with(".gguf")) d->model.name.resize(d->model.name.size() - 5);
    if (d->model.name.empty()) d->model.name = "default";
  }
  if (!options.model_path.empty()) d->model.aliases.push_back(options.model_path);
  d->model.created = unix_now();
  d->model.tokenizer = &tokenizer;
  d->model.gguf = &gguf;
  d->labels = {{"model_name", d->model.name}};
  d->declare_metrics();

  ListeningServer& svr = d->svr;
  const int32_t threads = options.threads;
  svr.new_task_queue = [threads] { return new httplib::ThreadPool(static_cast<size_t>(threads)); };
  svr.set_payload_max_length(options.max_body_bytes);
  svr.set_read_timeout(30, 0);
  svr.set_write_timeout(30, 0);
  svr.set_keep_alive_timeout(5);
  svr.set_tcp_nodelay(true);
  svr.set_pre_routing_handler([d](const httplib::Request& req, httplib::Response& res) {
    if (d->opts.api_key.empty() || req.path.rfind("/v1/", 0) != 0) return httplib::Server::HandlerResponse::Unhandled;
    const std::string auth = req.get_header_value("Authorization");
    const std::string prefix = "Bearer ";
    if (auth.rfind(prefix, 0) == 0 && token_matches(auth.substr(prefix.size()), d->opts.api_key)) {
      return httplib::Server::HandlerResponse::Unhandled;
    }
    send_error(res, ApiError{401, "Unauthorized: a valid API key is required (header \"Authorization: Bearer <key>\")",
                             "invalid_request_error", "", "invalid_api_key"});
    return httplib::Server::HandlerResponse::Handled;
  });
  svr.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    ApiError e;
    // A route that exists for another method: 405 with Allow, as FastAPI (vLLM) answers.
    const std::string& p = req.path;
    const bool model_route = p == "/v1/models" || (p.rfind("/v1/models/", 0) == 0 && p.size() > 11);
    const char* allow = nullptr;
    if (p == "/v1/completions" || p == "/v1/chat/completions") allow = "POST";
    if (model_route || p == "/health" || p == "/metrics") allow = "GET, HEAD";
    if (res.status == 404 && allow) {
      res.status = 405;
      res.set_header("Allow", allow);
    }
    e.http_status = res.status;
    if (res.status == 405) {
      e.message = "method " + req.method + " is not allowed on " + p + " (allowed: " + allow + ")";
      e.code = "method_not_allowed";
    } else if (res.status == 404) {
      e.message = "no route " + req.method + " " + req.path;
      e.code = "not_found";
    } else if (res.status == 413) {
      e.message = "the request body is larger than the server accepts";
    } else {
      e.message = std::string("HTTP ") + std::to_string(res.status);
    }
    res.set_content(dump_json(e.to_json()), "application/json");
  });
  svr.set_exception_handler([](const httplib::Request& req, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "unknown error";
    try {
      if (ep) std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    get_logger("server")->error("{} {}: internal error: {}", req.method, req.path, what);
    send_error(res, ApiError{500, "internal error: " + what, "server_error", "", ""});
  });

  svr.Post("/v1/completions",
           [d](const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& reader) {
             d->read_body_and_generate(req, res, reader, ApiKind::kCompletion);
           });
  svr.Post("/v1/chat/completions",
           [d](const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& reader) {
             d->read_body_and_generate(req, res, reader, ApiKind::kChat);
           });
  auto model_card = [d] {
    json m;
    m["id"] = d->model.name;
    m["object"] = "model";
    m["created"] = d->model.created;
    m["owned_by"] = "specserve";
    m["root"] = d->opts.model_path;
    m["parent"] = nullptr;
    const int32_t mml = d->max_model_len.load() > 0 ? d->max_model_len.load() : d->opts.max_model_len;
    m["max_model_len"] = mml > 0 ? json(mml) : json(nullptr);
    return m;
  };
  svr.Get("/v1/models", [d, model_card](const httplib::Request&, httplib::Response& res) {
    d->model_now();
    res.set_content(dump_json(json{{"object", "list"}, {"data", json::array({model_card()})}}), "application/json");
  });
  svr.Get(R"(/v1/models/(.+))", [d, model_card](const httplib::Request& req, httplib::Response& res) {
    const std::string want = req.matches[1];
    bool ok = want == d->model.name;
    for (const auto& a : d->model.aliases) ok = ok || want == a;
    if (!ok) {
      return send_error(res, ApiError{404, "The model `" + want + "` does not exist", "invalid_request_error", "model",
                                      "model_not_found"});
    }
    res.set_content(dump_json(model_card()), "application/json");
  });
  svr.Get("/health", [d](const httplib::Request&, httplib::Response& res) {
    auto st = d->cluster_status(0.5);
    int ready = 0;
    if (st) {
      for (const auto& r : st->replicas) ready += r.ready;
    }
    const bool ok = st && ready > 0 && !st->draining;
    // Scaled to zero (min_replicas 0): no replica is ready, but a request makes the autoscaler
    // route one (promotion or cold start), so the server is healthy: 200 "idle". A 503 here would
    // keep a load balancer from ever sending that request.
    const bool idle = st && !ok && !st->draining && st->autoscale.enabled && st->autoscale.min_replicas == 0 &&
                      st->autoscale.max_replicas > 0 && !st->replicas.empty();
    res.status = ok || idle ? 200 : 503;
    json j{{"status", ok ? "ok" : idle ? "idle" : st && st->draining ? "draining" : "not ready"}, {"replicas_ready", ready}};
    res.set_content(dump_json(j), "application/json");
  });
  svr.Get("/metrics", [d](const httplib::Request&, httplib::Response& res) {
    d->refresh_cluster_metrics();
    res.set_content(d->metrics.render(), "text/plain; version=0.0.4; charset=utf-8");
  });

  const int bound = options.port == 0 ? svr.bind_to_any_port(options.host)
                                      : (svr.bind_to_port(options.host, options.port) ? options.port : -1);
  if (bound <= 0) {
    return unavailable("HTTP: cannot listen on " + options.host + ":" + std::to_string(options.port) +
                       " (address in use, or not an address of this host)");
  }
  d->port = static_cast<uint16_t>(bound);
  if (!svr.set_backlog(SOMAXCONN)) {
    get_logger("server")->warn("HTTP: could not raise the listen backlog: {}", std::strerror(errno));
  }
  d->thread = std::thread([d] { d->svr.listen_after_bind(); });
  // NOTE: svr.stop() does nothing until the listen loop runs, so stop() right after start()
  // would wait forever for the thread.
  for (int i = 0; i < 500 && !svr.is_running(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  get_logger("server")->info("HTTP: OpenAI-compatible API on http://{}:{}/v1 (model '{}'{})", options.host, d->port,
                             d->model.name, options.api_key.empty() ? "" : ", API key required");
  return std::unique_ptr<HttpServer>(new HttpServer(std::move(impl)));
}

}  // namespace specserve
