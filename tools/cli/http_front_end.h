// specserve CLI: the HTTP front end's flags (vLLM's names) for `serve` and `up`, and the
// starter that cluster/launch calls once the head is up.
#pragma once

#include <CLI/CLI.hpp>

#include <string>
#include <vector>

#include "cluster/launch.h"

namespace specserve::cli {

struct HttpArgs {
  bool no_http = false;
  int port = -1;                  ///< -1: the topology's head.http_port (serve: 8000)
  std::string api_key;            ///< "" : $SPECSERVE_API_KEY when set
  std::string served_model_name;  ///< "" : the GGUF file name without .gguf
  int threads = 64;
  int max_n = 16;
  std::string ssl_certfile;       ///< HTTPS: the server's certificate (PEM); "" : plain HTTP
  std::string ssl_keyfile;        ///< HTTPS: its private key (PEM, unencrypted)
  std::string allowed_origins_json = "[\"*\"]";  ///< --allowed-origins as given (a JSON list)
  std::vector<std::string> allowed_origins = {"*"};  ///< parsed by resolve_http_args
};

/// Adds --port (unless `with_port` is false), --api-key, --served-model-name, --http-threads,
/// --max-n, --ssl-certfile, --ssl-keyfile, --allowed-origins and --no-http to `sub`.
void add_http_flags(CLI::App* sub, HttpArgs* args, bool with_port);

/// Completes and checks the flags before anything starts (HTTP on): --api-key's default is
/// $SPECSERVE_API_KEY when the flag was not given (kInvalidArgument when the variable is set but
/// empty: it must not quietly mean "no key"); --ssl-certfile / --ssl-keyfile are loaded as the
/// server will load them (HttpServer::check_tls; kInvalidArgument naming the flags).
Status resolve_http_args(HttpArgs* args);

/// The starter for ServeOptions/UpOptions::front_end (null with --no-http). The HTTP server
/// listens on head.host : (--port, else head.http_port).
FrontEndStarter make_http_front_end(const HttpArgs& args);

}  // namespace specserve::cli
