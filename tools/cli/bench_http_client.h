// `specserve bench`: the HTTP client side — where requests go (Target), a keep-alive client, one
// streamed request measured (TTFT, ITL, end-to-end latency, output tokens, or the failure), a
// closed-loop run of N clients over the prompts, and the GET /v1/models check of the server.
// The pure parts are in bench_http_lib.h; the command (flags, prompts, warm-up, report, files)
// in bench_http.cpp.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <httplib.h>

#include "core/status.h"
#include "tools/cli/bench_http_lib.h"

namespace specserve::cli::bench_http {

/// Where requests go and what they carry; shared read-only by the client threads.
struct Target {
  BaseUrl url;
  std::string path;  ///< path_prefix + endpoint
  Endpoint endpoint = Endpoint::kChatCompletions;
  std::string api_key;
  double timeout_s = 600;

  std::string describe() const { return url.scheme_host_port() + path; }
};

/// An httplib client for t's server: keep-alive, no Nagle delay, no decompression, reads that
/// fail after `read_timeout_s` without new bytes.
std::unique_ptr<httplib::Client> make_client(const Target& t, double read_timeout_s);

/// Sends one streaming request and measures it. Never throws; a failure is in the result.
RequestResult run_request(httplib::Client& cli, const Target& t, const BenchPrompt& p, const std::string& body);

/// One run: `concurrency` clients over `bodies` (in order), at most `duration_s` of issuing.
/// `prompt_counts` (one per prompt, or empty) fills prompt_tokens where the server sent no usage.
std::pair<std::vector<RequestResult>, double> run_level(const Target& t, const std::vector<BenchPrompt>& prompts,
                                                        const std::vector<std::string>& bodies,
                                                        const std::vector<int64_t>& prompt_counts, int concurrency,
                                                        double duration_s);

/// GET /v1/models: checks that the server answers and accepts the key; returns the model to use
/// (`wanted`, or the first the server lists when `wanted` is empty). Errors name the URL.
Expected<std::string> check_server(const Target& t, const std::string& wanted, const std::string& key_source);

}  // namespace specserve::cli::bench_http
