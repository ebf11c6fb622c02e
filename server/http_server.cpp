// specserve server: HttpServerOptions, and HttpServer's life: start (the served model, the
// cpp-httplib server with its routes, authentication, error and exception pages, binding) and
// stop (open streams end first).
#include "server/http_server.h"

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <thread>
#include <utility>

#include "core/logging.h"
#include "server/http_server_internal.h"
#include "server/tokenize_api.h"

namespace specserve {

using namespace http_server_internal;

namespace http_server_internal {


double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

void send_error(httplib::Response& res, const ApiError& e) {
  res.status = e.http_status;
  res.set_content(dump_json(e.to_json()), "application/json");
}

}  // namespace http_server_internal

Status HttpServerOptions::validate() const {
  if (port < 0 || port > 65535) return invalid_argument("port = " + std::to_string(port) + ": must be in 0..65535");
  if (threads < 1 || threads > 4096) return invalid_argument("http threads = " + std::to_string(threads) + ": must be in 1..4096");
  if (max_body_bytes < 1024) return invalid_argument("max body bytes = " + std::to_string(max_body_bytes) + ": must be >= 1024");
  if (host.empty()) return invalid_argument("host: empty");
  if (ssl_certfile.empty() != ssl_keyfile.empty()) {
    return invalid_argument(ssl_certfile.empty() ? "ssl_keyfile = \"" + ssl_keyfile + "\" without ssl_certfile: HTTPS needs both"
                                                 : "ssl_certfile = \"" + ssl_certfile + "\" without ssl_keyfile: HTTPS needs both");
  }
  for (const auto& [field, path] : {std::pair{"ssl_certfile", &ssl_certfile}, std::pair{"ssl_keyfile", &ssl_keyfile}}) {
    if (path->empty()) continue;
    std::error_code ec;
    if (!std::filesystem::is_regular_file(*path, ec) || ::access(path->c_str(), R_OK) != 0) {
      return invalid_argument(std::string(field) + " = \"" + *path + "\": not a readable file");
    }
  }
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
  impl_->svr->stop();
  if (impl_->thread.joinable()) impl_->thread.join();
}

namespace {

// cpp-httplib's TLS server with the certificate and key of `options` (both set): TLS 1.2 or
// later (cpp-httplib's own set-up allows 1.1), no compression, and a key that needs a
// passphrase refused rather than asked for on the terminal.
Expected<std::unique_ptr<ListeningServer<httplib::SSLServer>>> make_tls_server(const HttpServerOptions& options) {
  ERR_clear_error();
  const std::string cert = options.ssl_certfile, key = options.ssl_keyfile;
  auto setup = [&cert, &key](SSL_CTX& ctx) {
    SSL_CTX_set_default_passwd_cb(&ctx, [](char*, int, int, void*) { return 0; });
    SSL_CTX_set_options(&ctx, SSL_OP_NO_COMPRESSION | SSL_OP_NO_SESSION_RESUMPTION_ON_RENEGOTIATION);
    return SSL_CTX_set_min_proto_version(&ctx, TLS1_2_VERSION) == 1 &&
           SSL_CTX_use_certificate_chain_file(&ctx, cert.c_str()) == 1 &&
           SSL_CTX_use_PrivateKey_file(&ctx, key.c_str(), SSL_FILETYPE_PEM) == 1 && SSL_CTX_check_private_key(&ctx) == 1;
  };
  auto tls = std::make_unique<ListeningServer<httplib::SSLServer>>(std::function<bool(SSL_CTX&)>(setup));
  if (tls->is_valid()) return tls;
  char why[256] = "unknown OpenSSL error";
  if (const unsigned long e = ERR_peek_last_error()) ERR_error_string_n(e, why, sizeof why);
  ERR_clear_error();
  return invalid_argument("ssl_certfile = \"" + options.ssl_certfile + "\", ssl_keyfile = \"" + options.ssl_keyfile +
                          "\": OpenSSL refused them (" + why + "): both must be PEM, the key unencrypted (no passphrase) and the certificate's own");
}

// The methods a route takes ("POST", "GET, HEAD"), or null for no route.
const char* allowed_methods(const std::string& p) {
  if (p == "/v1/completions" || p == "/v1/chat/completions" || p == "/tokenize" || p == "/detokenize") return "POST";
  const bool model_route = p == "/v1/models" || (p.rfind("/v1/models/", 0) == 0 && p.size() > 11);
  if (model_route || p == "/health" || p == "/metrics") return "GET, HEAD";
  return nullptr;
}

}  // namespace

Status HttpServer::check_tls(const HttpServerOptions& options) {
  SPECSERVE_RETURN_IF_ERROR(options.validate());
  if (options.ssl_certfile.empty()) return Status();
  auto tls = make_tls_server(options);
  return tls.ok() ? Status() : tls.status();
}

Expected<std::unique_ptr<HttpServer>> HttpServer::start(const HttpServerOptions& options, caf::actor_system& sys,
                                                        caf::actor scheduler, std::string token,
                                                        PromptCodec text) {
  SPECSERVE_RETURN_IF_ERROR(options.validate());
  if (!text.loaded()) return invalid_argument("the HTTP server needs the served model's tokenizer and chat template");
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
  d->model.text = text;
  d->labels = {{"model_name", d->model.name}};
  d->declare_metrics();
  if (options.ssl_certfile.empty()) {
    d->svr = std::make_unique<ListeningServer<httplib::Server>>();
  } else {
    auto tls = make_tls_server(options);
    if (!tls.ok()) return tls.status();
    d->svr = std::move(*tls);
    d->tls = true;
  }
  httplib::Server& svr = *d->svr;
  const int32_t threads = options.threads;
  svr.new_task_queue = [threads] { return new httplib::ThreadPool(static_cast<size_t>(threads)); };
  svr.set_payload_max_length(options.max_body_bytes);
  // Over TLS the handshake reads under this timeout too: an idle connection that never sends a
  // ClientHello held an HTTP thread for it (64 of them froze the API for 30 s, where plain HTTP
  // drops an idle one after the 5 s keep-alive wait). A live client's reads never stall 5 s.
  svr.set_read_timeout(d->tls ? 5 : 30, 0);
  svr.set_write_timeout(30, 0);
  svr.set_keep_alive_timeout(5);
  svr.set_tcp_nodelay(true);
  svr.set_pre_routing_handler([d](const httplib::Request& req, httplib::Response& res) {
    // CORS: before the key check (a browser's preflight carries no Authorization).
    if (req.has_header("Origin") && !d->opts.allowed_origins.empty()) {
      const std::string origin = req.get_header_value("Origin");
      const auto& allowed = d->opts.allowed_origins;
      const bool any = std::find(allowed.begin(), allowed.end(), "*") != allowed.end();
      const bool ok = any || std::find(allowed.begin(), allowed.end(), origin) != allowed.end();
      if (req.method == "OPTIONS" && req.has_header("Access-Control-Request-Method")) {
        if (!ok) {
          res.status = 400;
          res.set_content("Disallowed CORS origin", "text/plain");
          return httplib::Server::HandlerResponse::Handled;
        }
        res.status = 200;
        res.set_header("Access-Control-Allow-Origin", any ? "*" : origin);
        res.set_header("Access-Control-Allow-Methods", "GET, POST, OPTIONS");
        const std::string asked = req.get_header_value("Access-Control-Request-Headers");
        if (!asked.empty()) res.set_header("Access-Control-Allow-Headers", asked);
        res.set_header("Access-Control-Max-Age", "600");
        if (!any) res.set_header("Vary", "Origin");
        return httplib::Server::HandlerResponse::Handled;
      }
      if (ok) {
        res.set_header("Access-Control-Allow-Origin", any ? "*" : origin);
        if (!any) res.set_header("Vary", "Origin");
      }
    }
    // Before cpp-httplib reads a body: it reads Content-Length with strtoull, so "-5" became
    // 2^64 - 5 bytes to drain and held the thread for the whole read timeout before a 413.
    if (req.has_header("Content-Length")) {
      const std::string cl = req.get_header_value("Content-Length");
      if (cl.empty() || cl.size() > 18 || cl.find_first_not_of("0123456789") != std::string::npos) {
        res.set_header("Connection", "close");
        send_error(res, ApiError{400, "Content-Length = '" + cl.substr(0, 40) + "': not a byte count", "invalid_request_error",
                                 "Content-Length", ""});
        return httplib::Server::HandlerResponse::Handled;
      }
    }
    // RFC 9112 6.3: a request with neither Content-Length nor Transfer-Encoding has no body, but
    // cpp-httplib 0.11 reads a POST's body to the end of the connection, holding the thread for
    // its read timeout (curl -X POST without -d waited 30 s). Answered here instead.
    if ((req.method == "POST" || req.method == "PUT" || req.method == "PATCH") && !req.has_header("Content-Length") &&
        !req.has_header("Transfer-Encoding")) {
      const char* allow = allowed_methods(req.path);
      res.set_header("Connection", "close");
      if (allow != nullptr && req.method == "POST" && std::string(allow) == "POST") {
        send_error(res, ApiError{400, "the request has no body (neither Content-Length nor Transfer-Encoding): send the JSON request",
                                 "invalid_request_error", "", ""});
      } else if (allow != nullptr) {
        res.set_header("Allow", allow);
        send_error(res, ApiError{405, "method " + req.method + " is not allowed on " + req.path + " (allowed: " + allow + ")",
                                 "invalid_request_error", "", "method_not_allowed"});
      } else {
        send_error(res, ApiError{404, "no route " + req.method + " " + req.path, "invalid_request_error", "", "not_found"});
      }
      return httplib::Server::HandlerResponse::Handled;
    }
    // The key guards /v1/ and the tokenizer routes; /health and /metrics stay open (vLLM).
    const bool guarded = req.path.rfind("/v1/", 0) == 0 || req.path == "/tokenize" || req.path == "/detokenize";
    if (d->opts.api_key.empty() || !guarded) return httplib::Server::HandlerResponse::Unhandled;
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
    const char* allow = allowed_methods(p);
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
  // vLLM's tokenizer routes (server/tokenize_api.h). NOTE: with a ContentReader, as the
  // completion routes: a plain handler gets the body cpp-httplib 0.11 read, which is bounded
  // only by Content-Length, so a chunked or compressed body of any size was held in memory.
  using TokenizerFn = std::optional<ApiError> (*)(const std::string&, const ServedModel&, json*);
  auto tokenizer_route = [d](TokenizerFn answer) {
    return [d, answer](const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& reader) {
      std::string body;
      if (!d->read_bounded_body(req, res, reader, &body)) return;
      json out;
      if (auto e = answer(body, d->model_now(), &out)) return send_error(res, *e);
      res.set_content(dump_json(out), "application/json");
    };
  };
  svr.Post("/tokenize", tokenizer_route(&tokenize_response));
  svr.Post("/detokenize", tokenizer_route(&detokenize_response));
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
  const bool backlog = d->tls ? static_cast<ListeningServer<httplib::SSLServer>&>(svr).set_backlog(SOMAXCONN)
                             : static_cast<ListeningServer<httplib::Server>&>(svr).set_backlog(SOMAXCONN);
  if (!backlog) {
    get_logger("server")->warn("HTTP: could not raise the listen backlog: {}", std::strerror(errno));
  }
  d->thread = std::thread([d] { d->svr->listen_after_bind(); });
  // NOTE: svr.stop() does nothing until the listen loop runs, so stop() right after start()
  // would wait forever for the thread.
  for (int i = 0; i < 500 && !svr.is_running(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  get_logger("server")->info("HTTP: OpenAI-compatible API on {}://{}:{}/v1 (model '{}'{})", d->tls ? "https" : "http",
                             options.host, d->port,
                             d->model.name, options.api_key.empty() ? "" : ", API key required");
  return std::unique_ptr<HttpServer>(new HttpServer(std::move(impl)));
}

}  // namespace specserve
