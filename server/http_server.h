// specserve server: the OpenAI-compatible HTTP front end of a head, and its Prometheus
// /metrics.
//
// Routes (OpenAI API reference; vLLM's server for the extensions):
//   POST /v1/completions, POST /v1/chat/completions   (stream: true -> server-sent events,
//                                                       "data: {...}\n\n" ... "data: [DONE]\n\n")
//   GET  /v1/models, GET /v1/models/{id}
//   GET  /health    200 when a replica is ready, else 503 (and while draining)
//   GET  /metrics   Prometheus text format (server/metrics.h)
// With an API key, every /v1/ route needs "Authorization: Bearer KEY" (401 otherwise);
// /health and /metrics stay open, as in vLLM.
//
// Each HTTP request runs on one thread of a bounded pool (cpp-httplib); its choices are
// submitted to the head's scheduler through an in-process `Client`, so HTTP requests and
// actor-API requests share one queue and one policy. A client that disconnects, streaming or
// not, cancels its requests within about a second (their KV blocks are freed by the shard); a
// bad request gets a 4xx with OpenAI's error object and never affects another; a route asked
// with the wrong method gets 405.
#pragma once

#include <caf/all.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "actors/prompt.h"
#include "core/status.h"
#include "server/openai_api.h"

namespace specserve {

struct HttpServerOptions {
  std::string host = "127.0.0.1";  ///< listen address (loopback unless configured)
  int32_t port = 8000;             ///< 0 picks a free port
  std::string api_key;             ///< non-empty: /v1/ routes require "Authorization: Bearer <api_key>"
  std::string served_model_name;   ///< the `model` name; "" = the GGUF file's name without ".gguf"
  std::string model_path;          ///< the target GGUF path (accepted as a model name too)
  int32_t threads = 64;            ///< HTTP worker threads: concurrent connections served
  size_t max_body_bytes = size_t{32} << 20;  ///< larger bodies get 413 (counted inflated, chunked or not)
  ApiLimits limits;
  /// Context length (tokens) the API checks prompts and max_tokens against until a replica
  /// reports its own (ClusterStatus::max_model_len); 0: none until then.
  int32_t max_model_len = 0;
  /// HTTPS (vLLM's --ssl-certfile / --ssl-keyfile): PEM files of the server's certificate
  /// (chain) and its private key (unencrypted: a passphrase is refused, never asked for), both
  /// or neither; neither: plain HTTP. TLS 1.2 or later (OpenSSL through cpp-httplib's
  /// SSLServer). OpenSSL writes without MSG_NOSIGNAL: the process must ignore SIGPIPE (the
  /// specserve commands do), or a client gone mid-write kills it.
  std::string ssl_certfile;
  std::string ssl_keyfile;
  /// CORS (vLLM's --allowed-origins, the Fetch standard's CORS protocol): origins whose browser
  /// pages may call the API; "*" any (vLLM's default). A request with an Origin header that is
  /// allowed gets Access-Control-Allow-Origin; a preflight (OPTIONS with
  /// Access-Control-Request-Method) from an allowed origin gets 200 with the methods and headers
  /// allowed, from another origin 400. Empty: no CORS headers and preflights are 405.
  std::vector<std::string> allowed_origins = {"*"};
  /// Validates: port in 0..65535, threads in 1..4096, max_body_bytes >= 1 KiB, the TLS files
  /// both given or neither, each a readable file.
  Status validate() const;
};

class HttpServer {
 public:
  /// Binds host:port and serves on its own threads until stop(). `sys` and `scheduler` are
  /// the head's (the scheduler is asked for status and receives the requests, with `token`);
  /// `text` views the served model's tokenizer and chat template (the GGUF and tokenizer it
  /// points at must outlive the server). Errors: kInvalidArgument when text is not loaded; invalid options
  /// (naming the field); a certificate or key OpenSSL refuses, or a key that is not the
  /// certificate's (kInvalidArgument naming both files); the port cannot be bound (kUnavailable
  /// naming host:port).
  static Expected<std::unique_ptr<HttpServer>> start(const HttpServerOptions& options, caf::actor_system& sys,
                                                     caf::actor scheduler, std::string token, PromptCodec text);
  ~HttpServer();

  /// Loads the certificate and key of `options` as start() does, without listening: the
  /// errors start() would give for them (validate()'s and OpenSSL's), before a cluster starts.
  /// OK without TLS files.
  static Status check_tls(const HttpServerOptions& options);

  /// The port actually bound.
  uint16_t port() const;
  /// The model name requests use.
  const std::string& model_name() const;
  /// Stops accepting connections, ends open streams (their requests are cancelled; each gets
  /// an error event, `data: [DONE]` and the end of its body, within about a second) and joins
  /// the threads. Idempotent.
  void stop();

  struct Impl;

 private:
  explicit HttpServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace specserve
