// `specserve bench` (a benchmark client for any OpenAI-compatible endpoint): the pure parts —
// prompt sets, the server-sent event parser, the meaning of one streamed chunk, per-request
// results and their summary in the shape of vLLM's benchmark_serving. No sockets, no threads:
// tests/tools/bench_http_lib_test.cpp checks them without a server.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"

namespace specserve::cli::bench_http {

/// One prompt of the set and the category it came with ("" when the file has none).
struct BenchPrompt {
  std::string prompt;
  std::string category;
};

/// Reads a prompt set. Three formats, told apart by the first non-blank character and line:
///  - one JSON array (the whole file parses as an array: ShareGPT's file, or a list of prompt
///    objects): each element an object as below;
///  - JSON lines (first line starts with '{'): each line an object with "turns" (Spec-Bench /
///    MT-bench: the first turn is the prompt), or else "prompt" or "text" (a string), or else
///    "conversations" (ShareGPT: the first turn's "value", as vLLM's benchmark takes it);
///    "category" is kept when present. Blank lines are skipped.
///  - plain text: one prompt per non-blank line (no escapes; a trailing '\r' is dropped); a
///    first line starting with '[' that is not a JSON array ("[INST] ...") is text.
/// A ShareGPT conversation of fewer than 2 turns is left out, as vLLM's benchmark does (not its
/// filters by token length: see --max-prompt-chars), and so is one whose first turn has no text
/// (the public file has both); they are counted in *num_skipped.
/// Errors: not_found naming the path when it cannot be opened; corrupt_data naming the path and
/// the 1-based line (or 0-based array element) that does not parse, is not an object or has no
/// prompt, or the byte where an array of objects stops parsing; invalid_argument when the file
/// holds no prompt.
Expected<std::vector<BenchPrompt>> load_prompts(const std::string& path, int64_t* num_skipped = nullptr);

/// The `num_prompts` prompts a run sends, in order: the set shuffled by `seed` (Fisher-Yates
/// over std::mt19937_64, so the same seed picks the same prompts on every platform), cycled when
/// `num_prompts` exceeds the set. `num_prompts` 0 means every prompt once. `all` must be non-empty.
std::vector<BenchPrompt> select_prompts(const std::vector<BenchPrompt>& all, int num_prompts, uint64_t seed);

/// An endpoint's base, split: "http://host:8000/prefix" -> {"http", "host", 8000, "/prefix"}.
struct BaseUrl {
  std::string scheme;  ///< "http" or "https"
  std::string host;
  int port = 0;
  std::string path_prefix;  ///< "" or "/x/y" without a trailing '/'; prepended to every endpoint path

  /// "scheme://host:port", what httplib::Client takes.
  std::string scheme_host_port() const;
};

/// Parses --base-url. A missing scheme means http; a missing port 80 (http) or 443 (https).
/// Errors: invalid_argument naming the URL for another scheme, an empty host or a bad port.
Expected<BaseUrl> parse_base_url(const std::string& url);

/// An OpenAI client's base URL ("http://host:8000/v1", what `openai.OpenAI(base_url=...)`
/// takes) given to --base-url, whose endpoints start with "/v1/" too: drops the prefix's "/v1"
/// so requests do not go to /v1/v1/... (a 404). True when it did.
bool drop_openai_v1_suffix(BaseUrl* url, const std::string& endpoint);

/// Incremental parser of a text/event-stream body (the WHATWG "server-sent events" format):
/// bytes arrive in arbitrary pieces; every complete event's data (its "data:" lines joined by
/// '\n') goes to the callback. Comments (":" lines, e.g. sse-starlette's pings), "event:", "id:"
/// and "retry:" fields are ignored; an event is complete at a blank line. Lines end with "\n" or
/// "\r\n" (a lone '\r' as a line end, allowed by the spec but sent by no OpenAI server, is not).
/// Not thread-safe: one parser per response.
class SseParser {
 public:
  using OnData = std::function<void(std::string_view data)>;

  /// Feeds the next piece of the body; calls `on_data` for each event it completes.
  void feed(std::string_view bytes, const OnData& on_data);

  /// The body ended: an event whose data lines were not followed by a blank line is delivered
  /// (lenient, as clients are), as is a last line without its newline.
  void finish(const OnData& on_data);

  /// Number of events delivered so far.
  int num_events() const { return num_events_; }

 private:
  void line(std::string_view l, const OnData& on_data);
  void dispatch(const OnData& on_data);

  std::string partial_;  ///< a line not yet ended
  std::string data_;     ///< data lines of the event being read
  bool has_data_ = false;
  int num_events_ = 0;
};

/// The API a request goes to; it decides where a chunk's text is.
enum class Endpoint { kCompletions, kChatCompletions };

/// Endpoint of a path: "/v1/completions" or "/v1/chat/completions" (any path ending in
/// "chat/completions" is chat). Errors: invalid_argument naming the path for anything else.
Expected<Endpoint> endpoint_of(std::string_view path);

/// What one streamed event says.
struct StreamChunk {
  bool done = false;                  ///< the "[DONE]" sentinel
  std::string text;                   ///< content delta (chat: choices[0].delta.content; completions: choices[0].text)
  std::string finish_reason;          ///< "" while the choice goes on
  std::optional<int64_t> prompt_tokens;      ///< usage.prompt_tokens when the chunk carries usage
  std::optional<int64_t> completion_tokens;  ///< usage.completion_tokens when the chunk carries usage
  std::string error;                  ///< the server's message when the event is {"error": ...}
};

/// Interprets one event's data. Errors: corrupt_data quoting (the start of) the data when it is
/// not JSON or not an object.
Expected<StreamChunk> parse_stream_chunk(std::string_view data, Endpoint endpoint);

/// The request body: {"model", "messages": [{"role": "user", "content": prompt}] (chat) or
/// "prompt" (completions), "max_tokens", "temperature", "stream": true,
/// "stream_options": {"include_usage": true}} plus "seed" when given, "ignore_eos" when true,
/// and every key of `extra` (an object; its keys win).
nlohmann::json request_body(Endpoint endpoint, const std::string& model, const std::string& prompt, int max_tokens,
                            double temperature, std::optional<int64_t> seed, bool ignore_eos,
                            const nlohmann::json& extra);

/// A message from an error body: OpenAI's {"error": {"message": ...}}, FastAPI's {"detail": ...},
/// or the (start of the) body itself.
std::string error_message_of(std::string_view body);

/// What one request measured. Times in seconds from the moment the request was sent.
struct RequestResult {
  bool success = false;
  std::string category;
  int64_t prompt_tokens = -1;    ///< usage.prompt_tokens, else the client's count (--tokenizer), else -1
  bool prompt_tokens_from_tokenizer = false;  ///< counted by the client, not reported by the server
  int64_t output_tokens = 0;     ///< usage.completion_tokens, else the number of non-empty deltas
  bool usage_reported = false;
  int num_deltas = 0;            ///< non-empty content deltas
  double ttft_s = 0;             ///< send -> first non-empty content delta
  double latency_s = 0;          ///< send -> end of the response
  std::vector<double> itl_s;     ///< between consecutive non-empty content deltas
  std::string finish_reason;
  std::string generated_text;
  int http_status = 0;           ///< 0 when no response came (connection, timeout)
  std::string error;             ///< "" on success
};

/// mean / median / std / p90 / p99 of one latency, in milliseconds (0 for no samples).
struct LatencyStats {
  int64_t count = 0;
  double mean_ms = 0, median_ms = 0, std_ms = 0, p90_ms = 0, p99_ms = 0;
};

/// The p-th percentile (0..100) of `values`, with numpy's default linear interpolation between
/// closest ranks (what vLLM's benchmark_serving reports). 0 for an empty vector.
double percentile(std::vector<double> values, double p);

/// Stats of `values_s` (seconds) in milliseconds; std is the population standard deviation (numpy's).
LatencyStats latency_stats(const std::vector<double>& values_s);

/// One run (one concurrency level) summarised as vLLM's benchmark_serving does: only successful
/// requests count; TPOT per request = (latency - TTFT) / (output_tokens - 1), for requests with
/// more than one output token; ITL pools every gap between deltas (a delta that carries several
/// tokens, as speculative decoding may send, is one gap); throughputs divide by the run's wall time.
struct BenchSummary {
  int max_concurrency = 1;
  int num_requests = 0;  ///< issued
  int completed = 0;
  int failed = 0;
  double duration_s = 0;
  int64_t total_input_tokens = 0;   ///< from usage; requests without usage add nothing
  int64_t total_output_tokens = 0;
  int num_without_usage = 0;        ///< completed requests whose output tokens were counted as deltas
  int num_prompt_tokens_counted = 0;  ///< completed requests whose prompt tokens the client counted
  int num_prompt_tokens_unknown = 0;  ///< completed requests without a prompt token count (not in the totals)
  double request_throughput = 0;    ///< completed / duration, req/s
  double output_throughput = 0;     ///< output tokens / duration
  double total_token_throughput = 0;  ///< (input + output tokens) / duration
  LatencyStats ttft, tpot, itl, e2el;
  std::map<std::string, int> finish_reasons;  ///< completed requests by finish_reason ("" -> "none")
  std::map<std::string, int> errors;          ///< failed requests by message
};

/// Summarises the results of one run that took `duration_s` of wall time.
BenchSummary summarize(const std::vector<RequestResult>& results, double duration_s, int max_concurrency);

/// The summary as JSON with vLLM's flat names (duration, completed, total_input_tokens,
/// request_throughput, output_throughput, total_token_throughput, mean_ttft_ms, median_ttft_ms,
/// std_ttft_ms, p90_ttft_ms, p99_ttft_ms, and the same for tpot, itl, e2el) plus max_concurrency,
/// num_requests, failed, num_without_usage, num_prompt_tokens_counted, num_prompt_tokens_unknown,
/// finish_reasons and errors.
nlohmann::json summary_json(const BenchSummary& s);

/// The per-request detail of a run as JSON: one object per request (category, prompt_tokens,
/// output_tokens, ttft_ms (null when no token came), e2el_ms, itl_ms, finish_reason, generated_text, http_status, error).
nlohmann::json requests_json(const std::vector<RequestResult>& results);

/// vLLM's "Serving Benchmark Result" block for one run, as text.
std::string format_summary(const BenchSummary& s, const std::string& label);

/// A Markdown table, one row per run: concurrency, completed/failed, req/s, output and total
/// tokens/s, and p50/p90/p99 of TTFT, TPOT, ITL and E2E latency.
std::string format_table(const std::vector<BenchSummary>& runs);

}  // namespace specserve::cli::bench_http
