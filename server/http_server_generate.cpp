// specserve server: POST /v1/completions and /v1/chat/completions — the body read under its
// size limit, each choice submitted to the scheduler, then one JSON answer or a server-sent
// event stream; a client that goes away cancels its choices.
#include <chrono>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "core/logging.h"
#include "server/connection_watch.h"
#include "server/http_server_internal.h"

namespace specserve {

using namespace http_server_internal;

namespace {


std::string random_id(const char* prefix) {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  static const char* hex = "0123456789abcdef";
  std::string s = prefix;
  for (int i = 0; i < 24; ++i) s += hex[rng() & 15];
  return s;
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
      // A prompt past the context: 400 context_length_exceeded, as vLLM and OpenAI answer (413
      // is kept for a request body past max_body_bytes).
      e.http_status = 400;
      e.code = "context_length_exceeded";
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

// The error a choice that failed on the cluster (finish reason "error") answers with.
ApiError error_from_chunk(const StreamChunk& c, ApiKind kind) {
  ApiError e{500, c.error.empty() ? "the request failed" : c.error, "server_error", "", ""};
  // NOTE: the scheduler refuses a prompt longer than every replica's max_model_len only once
  // a replica has registered its limit, so a request that came in before (the front end could
  // not check it then) fails this way: it is the client's error, as when the front end checks.
  if (c.error.rfind("prompt too long", 0) == 0) {
    e.http_status = 400;
    e.type = "invalid_request_error";
    e.param = kind == ApiKind::kChat ? "messages" : "prompt";
    e.code = "context_length_exceeded";
  } else if (c.error.rfind("no replica is left", 0) == 0) {
    // Every target shard is down: the service, not the request, is at fault (as /health says).
    e.http_status = 503;
    e.type = "service_unavailable";
  }
  return e;
}

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
  if (s.req.include_usage) c["usage"] = s.req.continuous_usage ? usage_json(s.req, s.outputs) : json(nullptr);
  return c;
}

json choice_event(const StreamState& s, size_t index, const std::string& text, const json& logprobs,
                  const json& finish_reason, bool role, const json& stop_reason = nullptr) {
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
  ch["stop_reason"] = stop_reason;
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

bool HttpServer::Impl::read_bounded_body(const httplib::Request& http_req, httplib::Response& res,
                                         const httplib::ContentReader& reader, std::string* out) {
  // NOTE: read here, not by cpp-httplib: 0.11 checks its payload limit against Content-Length
  // only, so a chunked body, or a gzip one (it inflates Content-Encoding), had no limit at all.
  // Past the limit the rest is read and dropped, up to 4x the limit, so that the connection
  // stays usable; beyond that reading stops and the answer closes the connection.
  std::string& body = *out;
  body.clear();
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
    send_error(res, e);
    return false;
  }
  return true;
}

void HttpServer::Impl::read_body_and_generate(const httplib::Request& http_req, httplib::Response& res,
                                              const httplib::ContentReader& reader, ApiKind kind) {
  std::string body;
  if (read_bounded_body(http_req, res, reader, &body)) handle_generate(http_req, body, res, kind);
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
        // The choices already submitted are cancelled: counted as "abort" like every choice the
        // server cancels (NOTE: they were counted nowhere).
        // (A choice whose last chunk already came counts by its own finish reason.)
        std::vector<ChoiceTiming> submitted(job->handles.size());
        for (const auto& a : job->take(std::chrono::milliseconds(0))) {
          if (a.index >= submitted.size() || submitted[a.index].finished) continue;
          observe_tokens(submitted[a.index], a);
          if (!a.chunk.finish_reason.empty()) {
            submitted[a.index].finished = true;
            observe_choice(submitted[a.index], start, a.at, a.chunk.finish_reason);
          }
        }
        observe_abandoned(submitted, start);
        job->cancel_all();
        ApiError e = error_from_status(h.status());
        if (e.http_status == 400) e.param = kind == ApiKind::kChat ? "messages" : "prompt";
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
    // (the first failed choice ends the wait: its siblings are cancelled, as a stream does;
    // NOTE: they ran on to max_tokens, their answer thrown away)
    while (finished < num_choices && !stopped && !gone && !error) {
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
    // NOTE: the choices the server cancels below were counted nowhere in /metrics (vLLM counts
    // them as finished_reason "abort").
    if (gone || finished < num_choices || error) observe_abandoned(timing, start);
    if (gone) {
      job->cancel_all();
      log->info("{} {} {}: client gone: cancelling {} choice(s)", http_req.method, http_req.path, id,
                num_choices - finished);
      return send_error(res, ApiError{499, "the client closed the connection", "invalid_request_error", "", ""});
    }
    if (error) {
      job->cancel_all();
      log->warn("{} {} {}: failed: {}", http_req.method, http_req.path, id, error->message);
      return send_error(res, *error);
    }
    if (finished < num_choices) {
      job->cancel_all();
      return send_error(res, ApiError{503, "the server is shutting down", "service_unavailable", "", ""});
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
          self->observe_abandoned(s->timing, s->start);
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
        const PromptCodec& tok = s->model.text;
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
            // NOTE: a streamed choice's failure was counted nowhere (request_failure).
            t.finished = true;
            ++s->finished;
            self->observe_choice(t, s->start, a.at, c.finish_reason);
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
            const json ev = choice_event(*s, i, "", nullptr, api_finish_reason(c.finish_reason), false, out.stop_reason());
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
          self->observe_abandoned(s->timing, s->start);
          s->job->cancel_all();
        }
        --self->open_streams;
      });
}

}  // namespace specserve
