#include "tools/cli/http_front_end.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>

#include "model/model_config.h"
#include "server/http_server.h"

namespace specserve::cli {

void add_http_flags(CLI::App* sub, HttpArgs* a, bool with_port) {
  if (with_port) {
    sub->add_option("--port", a->port, "OpenAI-compatible HTTP port (default 8000; 0 picks a free one)")
        ->check(CLI::Range(0, 65535));
  }
  // NOTE: an empty value given explicitly (`--api-key "$KEY"` with KEY unset) is refused: it used
  // to start the server with no key at all, saying only that no key was required.
  auto non_empty = [](const char* what) {
    return CLI::Validator([what](std::string& v) { return v.empty() ? std::string(what) : std::string(); }, "");
  };
  sub->add_option("--api-key", a->api_key,
                  "Require \"Authorization: Bearer KEY\" on the /v1/ routes (default: $SPECSERVE_API_KEY; none when unset)")
      ->check(non_empty("an empty key: leave --api-key out to serve without one"));
  sub->add_option("--served-model-name", a->served_model_name,
                  "The model name the API reports and requests use (default: the GGUF file name without .gguf)")
      ->check(non_empty("an empty name: leave --served-model-name out for the default"));
  sub->add_option("--http-threads", a->threads, "HTTP worker threads: connections served at once (default 64)")
      ->check(CLI::Range(1, 4096));
  sub->add_option("--max-n", a->max_n, "Largest `n` (choices per prompt) a request may ask for (default 16; prompts x n is at most 128)")
      ->check(CLI::Range(1, 128));
  // vLLM's names. Both or neither (HttpServerOptions::validate says which is missing).
  sub->add_option("--ssl-certfile", a->ssl_certfile,
                  "Serve HTTPS with this certificate (PEM, the chain after the server's own); needs --ssl-keyfile")
      ->check(non_empty("an empty path: leave --ssl-certfile out to serve plain HTTP"));
  sub->add_option("--ssl-keyfile", a->ssl_keyfile, "The certificate's private key (PEM, unencrypted); needs --ssl-certfile")
      ->check(non_empty("an empty path: leave --ssl-keyfile out to serve plain HTTP"));
  sub->add_option("--allowed-origins", a->allowed_origins_json,
                  "CORS: the origins whose browser pages may call the API, a JSON list (vLLM's; default [\"*\"]: any; [] : no "
                  "CORS headers)");
  sub->add_flag("--no-http", a->no_http, "Do not start the HTTP front end (actor port only)");
}

Status resolve_http_args(HttpArgs* a) {
  if (a->no_http) {
    if (!a->ssl_certfile.empty() || !a->ssl_keyfile.empty()) {
      return invalid_argument("--ssl-certfile / --ssl-keyfile with --no-http: there is no HTTP server to serve them");
    }
    return Status();
  }
  {
    const auto j = nlohmann::json::parse(a->allowed_origins_json, nullptr, /*allow_exceptions=*/false);
    bool ok = j.is_array();
    for (const auto& o : j) ok = ok && o.is_string() && !o.get<std::string>().empty();
    if (!ok) {
      return invalid_argument("--allowed-origins = " + a->allowed_origins_json +
                              ": expected a JSON list of origins, e.g. '[\"http://localhost:3000\"]' or '[\"*\"]'");
    }
    a->allowed_origins = j.get<std::vector<std::string>>();
    // An origin is "scheme://host[:port]" as a browser sends it (no path, no trailing slash):
    // anything else would never match, silently.
    for (const std::string& o : a->allowed_origins) {
      const size_t sep = o.find("://");
      if (o == "*" || (sep != std::string::npos && sep > 0 && o.size() > sep + 3 && o.find('/', sep + 3) == std::string::npos)) continue;
      return invalid_argument("--allowed-origins: \"" + o + "\" is not an origin (scheme://host[:port], no path or trailing "
                              "slash, e.g. \"http://localhost:3000\"; or \"*\")");
    }
  }
  HttpServerOptions tls;
  tls.ssl_certfile = a->ssl_certfile;
  tls.ssl_keyfile = a->ssl_keyfile;
  if (Status st = HttpServer::check_tls(tls); !st.ok()) return Status(st.code(), "--ssl-certfile / --ssl-keyfile: " + st.message());
  if (!a->api_key.empty()) return Status();
  if (const char* env = std::getenv("SPECSERVE_API_KEY")) {
    // As for an empty --api-key: an empty variable must not quietly mean "no key".
    if (*env == '\0') {
      return invalid_argument("SPECSERVE_API_KEY is set but empty: unset it to serve without an API key, or give a key");
    }
    a->api_key = env;
  }
  return Status();
}

FrontEndStarter make_http_front_end(const HttpArgs& a) {
  if (a.no_http) return nullptr;
  return [a](const Topology& t, Head& head, ActorRuntime& rt, const std::string& token) -> Expected<std::shared_ptr<void>> {
    HttpServerOptions o;
    o.host = t.head.host;
    o.port = a.port >= 0 ? a.port : t.head.http_port;
    o.api_key = a.api_key;
    o.served_model_name = a.served_model_name;
    o.model_path = t.models.target.path;
    o.threads = a.threads;
    o.limits.max_n = a.max_n;
    o.ssl_certfile = a.ssl_certfile;
    o.allowed_origins = a.allowed_origins;
    o.ssl_keyfile = a.ssl_keyfile;
    // Until a replica reports its context: the configured max_model_len, else the model's.
    if (t.models.target.max_model_len) {
      o.max_model_len = *t.models.target.max_model_len;
    } else if (auto cfg = ModelConfig::from_gguf(head.gguf()); cfg.ok()) {
      o.max_model_len = static_cast<int32_t>(std::min<int64_t>(cfg->context_length, INT32_MAX));
    }
    auto s = HttpServer::start(o, rt.system(), head.scheduler(), token, PromptCodec(head.gguf(), head.tokenizer()));
    if (!s.ok()) {
      // A bad certificate or key names its flags; anything else is the port's.
      const bool tls_error = s.status().message().rfind("ssl_", 0) == 0;
      const std::string field = tls_error ? "--ssl-certfile / --ssl-keyfile"
                                : a.port >= 0 ? "--port"
                                              : t.where("head.http_port") + ": head.http_port";
      return Status(s.status().code(), field + ": " + s.status().message());
    }
    std::fprintf(stderr, "specserve: OpenAI-compatible API on %s://%s:%u/v1 (model \"%s\"%s)\n",
                 o.ssl_certfile.empty() ? "http" : "https", o.host.c_str(),
                 static_cast<unsigned>((*s)->port()), (*s)->model_name().c_str(),
                 o.api_key.empty() ? "" : ", API key required");
    return std::shared_ptr<void>(std::shared_ptr<HttpServer>(std::move(*s)));
  };
}

}  // namespace specserve::cli
