// `specserve bench`: a benchmark client for any OpenAI-compatible endpoint (specserve's own HTTP
// server, llama.cpp's, vLLM's, SGLang's), with vLLM's benchmark_serving flags and report.
//
// N clients (threads, one keep-alive connection each) take prompts from one shared queue, so at
// most N requests are in flight (vLLM's --max-concurrency with an infinite request rate). Every
// request streams (`stream: true`, `stream_options.include_usage`); per request: TTFT (send ->
// first non-empty content delta), the gaps between deltas (ITL), end-to-end latency, output tokens
// (usage, else the number of deltas) and, on failure, the HTTP status and the server's message.
// The pure parts (prompt sets, the SSE parser, chunk meaning, percentiles, the report) live in
// bench_http_lib.{h,cpp}; the HTTP client side (the measured request, a level's N clients, the
// server check) in bench_http_client.{h,cpp}. This file: the flags, the run and its outputs.
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/chat_template.h"
#include "model/gguf.h"
#include "model/tokenizer.h"
#include "tools/cli/bench_http_client.h"
#include "tools/cli/bench_http_lib.h"
#include "tools/cli/output_file_lib.h"
#include "tools/cli/registry.h"
#include "tools/cli/subcommands.h"

extern char** environ;

namespace specserve::cli {
namespace {

using json = nlohmann::json;
using namespace bench_http;

struct HttpBenchArgs {
  std::string base_url = "http://127.0.0.1:8000";
  std::string endpoint = "/v1/chat/completions";
  std::string model;
  std::string api_key;
  std::string dataset = std::string(SPECSERVE_SOURCE_DIR) + "/../shared/data/spec_bench/question.jsonl";
  int num_prompts = 64;
  int max_prompt_chars = 0;
  std::vector<int> max_concurrency = {1};
  int max_tokens = 128;
  double temperature = 0;
  double duration_s = 0;
  int64_t seed = 0;
  bool ignore_eos = false;
  std::string extra_body;
  double request_timeout_s = 600;
  bool no_warmup = false;
  std::string output_json;
  std::string plot;
  std::string label;
  std::string tokenizer;
};

/// Prompt tokens as a server would count them (for servers that report no usage): the GGUF's
/// tokenizer over the prompt, after its chat template for the chat endpoint — what specserve's
/// own front end does (actors/prompt.cpp). Errors name the file.
Expected<std::vector<int64_t>> count_prompt_tokens(const std::string& gguf_path, Endpoint endpoint,
                                                   const std::vector<BenchPrompt>& prompts) {
  auto gguf = GgufFile::open(gguf_path);
  if (!gguf.ok()) return Status(gguf.status().code(), "--tokenizer: " + gguf.status().message());
  auto tok = Tokenizer::from_gguf(*gguf);
  if (!tok.ok()) return Status(tok.status().code(), "--tokenizer '" + gguf_path + "': " + tok.status().message());
  std::vector<int64_t> counts;
  for (const BenchPrompt& p : prompts) {
    if (endpoint == Endpoint::kChatCompletions) {
      auto text = apply_chat_template(*gguf, {ChatMessage{"user", p.prompt}}, /*add_generation_prompt=*/true);
      if (!text.ok()) return Status(text.status().code(), "--tokenizer '" + gguf_path + "': " + text.status().message());
      counts.push_back(static_cast<int64_t>(tok->encode(*text, /*add_special=*/true, /*parse_special=*/true).size()));
    } else {
      counts.push_back(static_cast<int64_t>(tok->encode(p.prompt, /*add_special=*/true, /*parse_special=*/false).size()));
    }
  }
  return counts;
}

/// Runs argv (no shell); returns the exit status, -1 when it could not start. `quiet` sends its
/// output to /dev/null.
int run_process(const std::vector<std::string>& argv, bool quiet) {
  std::vector<char*> cargv;
  for (const auto& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  if (quiet) {
    posix_spawn_file_actions_addopen(&fa, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_addopen(&fa, STDERR_FILENO, "/dev/null", O_WRONLY, 0);
  }
  pid_t pid = 0;
  const int rc = posix_spawnp(&pid, cargv[0], &fa, nullptr, cargv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) return -1;
  int st = 0;
  if (waitpid(pid, &st, 0) < 0) return -1;
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/// The python that has matplotlib: $SPECSERVE_PYTHON, the project venv (scripts/venv.sh), python3.
std::optional<std::string> find_plot_python(std::string* tried) {
  std::vector<std::string> candidates;
  if (const char* p = std::getenv("SPECSERVE_PYTHON"); p && *p) candidates.push_back(p);
  std::string cache;
  if (const char* c = std::getenv("SPECSERVE_CACHE"); c && *c) cache = c;
  else if (const char* h = std::getenv("HOME")) cache = std::string(h) + "/.cache/specserve";
  if (!cache.empty()) candidates.push_back(cache + "/venv/bin/python");
  candidates.push_back("python3");
  for (const auto& py : candidates) {
    *tried += (tried->empty() ? "" : ", ") + py;
    if (py.find('/') != std::string::npos && !std::filesystem::exists(py)) continue;
    if (run_process({py, "-c", "import matplotlib"}, /*quiet=*/true) == 0) return py;
  }
  return std::nullopt;
}

std::string now_iso() {
  std::time_t t = std::time(nullptr);
  char buf[64];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%S%z", std::localtime(&t));
  return buf;
}

std::string command_line() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>()), out;
  for (char c : all) out += c == '\0' ? ' ' : c;
  while (!out.empty() && out.back() == ' ') out.pop_back();
  return out;
}

int run_bench(const HttpBenchArgs& a) {
  auto fail = [](const std::string& msg) {
    std::fprintf(stderr, "specserve bench: error: %s\n", msg.c_str());
    return 1;
  };
  Target t;
  auto url = parse_base_url(a.base_url);
  if (!url.ok()) return fail(url.status().message());
  t.url = *url;
  if (a.endpoint.empty() || a.endpoint.front() != '/') return fail("--endpoint '" + a.endpoint + "' must start with '/'");
  auto ep = endpoint_of(a.endpoint);
  if (!ep.ok()) return fail(ep.status().message());
  t.endpoint = *ep;
  if (drop_openai_v1_suffix(&t.url, a.endpoint)) {
    std::fprintf(stderr, "specserve bench: --base-url %s ends in /v1, as an OpenAI client's does; the endpoint %s has it: "
                 "requests go to %s%s\n", a.base_url.c_str(), a.endpoint.c_str(), t.url.path_prefix.c_str(), a.endpoint.c_str());
  }
  t.path = t.url.path_prefix + a.endpoint;
  t.timeout_s = a.request_timeout_s;
  std::string key_source = "--api-key";
  t.api_key = a.api_key;
  if (t.api_key.empty()) {
    if (const char* k = std::getenv("OPENAI_API_KEY"); k && *k) {
      t.api_key = k;
      key_source = "OPENAI_API_KEY";
    }
  }
  json extra = json::object();
  if (!a.extra_body.empty()) {
    extra = json::parse(a.extra_body, nullptr, false);
    if (extra.is_discarded() || !extra.is_object()) return fail("--extra-body is not a JSON object: " + a.extra_body);
  }
  if (!a.plot.empty() && !std::filesystem::path(a.plot).has_filename()) return fail("--plot needs a file name (e.g. out.png)");
  // NOTE: checked before the run (minutes): a path in a missing directory was found only at the
  // end, and a --plot that could not be drawn (no matplotlib, the script failed) exited 0.
  if (!a.output_json.empty()) {
    if (Status st = check_output_file("--output-json", a.output_json); !st.ok()) return fail(st.message());
  }
  std::optional<std::string> plot_python;
  if (!a.plot.empty()) {
    if (Status st = check_output_file("--plot", a.plot); !st.ok()) return fail(st.message());
    std::string tried;
    plot_python = find_plot_python(&tried);
    if (!plot_python) {
      return fail("--plot " + a.plot + ": no python with matplotlib (tried " + tried +
                  "); `scripts/venv.sh --with-plot` installs one, or set SPECSERVE_PYTHON");
    }
  }

  int64_t skipped = 0;
  auto all = load_prompts(a.dataset, &skipped);
  if (!all.ok()) return fail("--dataset: " + all.status().message());
  if (skipped > 0) {
    std::fprintf(stderr,
                 "[bench] --dataset %s: %lld conversation(s) left out (fewer than 2 turns, or a first turn with no "
                 "text)\n",
                 a.dataset.c_str(), static_cast<long long>(skipped));
  }
  if (a.max_prompt_chars > 0) {
    const size_t before = all->size();
    std::erase_if(*all, [&](const BenchPrompt& p) { return p.prompt.size() > static_cast<size_t>(a.max_prompt_chars); });
    if (all->empty()) {
      return fail("--max-prompt-chars " + std::to_string(a.max_prompt_chars) + " leaves none of the " +
                  std::to_string(before) + " prompts of " + a.dataset);
    }
  }
  const std::vector<BenchPrompt> prompts = select_prompts(*all, a.num_prompts, static_cast<uint64_t>(a.seed));

  std::vector<int64_t> prompt_counts;
  if (!a.tokenizer.empty()) {
    auto counts = count_prompt_tokens(a.tokenizer, t.endpoint, prompts);
    if (!counts.ok()) return fail(counts.status().message());
    prompt_counts = std::move(*counts);
  }

  auto model = check_server(t, a.model, key_source);
  if (!model.ok()) return fail(model.status().message());
  const std::string label = a.label.empty() ? a.base_url : a.label;
  std::fprintf(stderr, "[bench] %s: model %s, %zu prompts from %s (%zu in the set), max_tokens %d, temperature %g, concurrency",
               t.describe().c_str(), model->c_str(), prompts.size(), a.dataset.c_str(), all->size(), a.max_tokens,
               a.temperature);
  for (int c : a.max_concurrency) std::fprintf(stderr, " %d", c);
  std::fprintf(stderr, "\n");

  // NOTE: a seed goes into the request only when sampling: greedy needs none, and servers differ
  // in whether they accept one. seed + i keeps the requests of a run different from each other.
  std::vector<std::string> bodies;
  for (size_t i = 0; i < prompts.size(); ++i) {
    std::optional<int64_t> seed;
    // Wrapped past 2^63 - 1 (to a negative seed, which OpenAI-compatible servers take) rather than overflowing.
    if (a.temperature > 0) seed = static_cast<int64_t>(static_cast<uint64_t>(a.seed) + i);
    bodies.push_back(request_body(t.endpoint, *model, prompts[i].prompt, a.max_tokens, a.temperature, seed, a.ignore_eos,
                                  extra)
                         .dump());
  }

  json warmup = nullptr;
  if (!a.no_warmup) {
    // NOTE: the shortest prompt: the warm-up is there to open connections and page the model in,
    // and on a CPU a long prompt's prefill would cost a minute for nothing.
    size_t shortest = 0;
    for (size_t i = 1; i < prompts.size(); ++i)
      if (prompts[i].prompt.size() < prompts[shortest].prompt.size()) shortest = i;
    auto cli = make_client(t, t.timeout_s);
    RequestResult w = run_request(*cli, t, prompts[shortest], bodies[shortest]);
    if (!w.success) {
      return fail("warm-up request to " + t.describe() + " failed: " +
                  (w.http_status ? "HTTP " + std::to_string(w.http_status) + ": " : "") + w.error);
    }
    const bool any = w.num_deltas > 0;  // no content: no TTFT (n/a, null), not 0
    std::fprintf(stderr, "[bench] warm-up: %lld output tokens, TTFT %s, %.2f s\n", static_cast<long long>(w.output_tokens),
                 any ? (std::to_string(std::lround(w.ttft_s * 1e3)) + " ms").c_str() : "n/a", w.latency_s);
    if (!any) std::fprintf(stderr, "[bench] warning: the warm-up response carried no content delta\n");
    warmup = {{"output_tokens", w.output_tokens}, {"ttft_ms", any ? json(w.ttft_s * 1e3) : json(nullptr)},
              {"e2el_ms", w.latency_s * 1e3}, {"usage_reported", w.usage_reported}};
  }

  std::vector<BenchSummary> summaries;
  json runs = json::array();
  bool any_empty = false;
  for (int c : a.max_concurrency) {
    auto [results, wall] = run_level(t, prompts, bodies, prompt_counts, c, a.duration_s);
    BenchSummary s = summarize(results, wall, c);
    if (s.completed == 0) any_empty = true;
    std::printf("%s", format_summary(s, label).c_str());
    std::fflush(stdout);
    summaries.push_back(s);
    json run = summary_json(s);
    run["requests"] = requests_json(results);
    runs.push_back(std::move(run));
  }
  if (summaries.size() > 1) std::printf("\n%s: %s\n\n%s", label.c_str(), t.describe().c_str(), format_table(summaries).c_str());
  std::fflush(stdout);

  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  json out = {{"label", label},
              {"backend", t.endpoint == Endpoint::kChatCompletions ? "openai-chat" : "openai"},
              {"base_url", a.base_url},
              {"endpoint", a.endpoint},
              {"model_id", *model},
              {"dataset", a.dataset},
              {"num_prompts", prompts.size()},
              {"max_prompt_chars", a.max_prompt_chars},
              {"num_prompts_in_set", all->size()},
              {"num_prompts_left_out", skipped},
              {"max_tokens", a.max_tokens},
              {"temperature", a.temperature},
              {"seed", a.seed},
              {"ignore_eos", a.ignore_eos},
              {"tokenizer", a.tokenizer},
              {"extra_body", extra},
              {"duration_limit_s", a.duration_s},
              {"warmup", warmup},
              {"date", now_iso()},
              {"host", host},
              {"num_cpus", std::thread::hardware_concurrency()},
              {"command", command_line()},
              {"runs", runs}};
  std::string json_path = a.output_json;
  bool temp_json = false;
  if (json_path.empty() && !a.plot.empty()) {
    json_path = (std::filesystem::temp_directory_path() / ("specserve-bench-" + std::to_string(getpid()) + ".json")).string();
    temp_json = true;
  }
  if (!json_path.empty()) {
    if (Status st = write_output_file("--output-json", json_path, out.dump(1) + "\n"); !st.ok()) return fail(st.message());
    if (!temp_json) std::fprintf(stderr, "[bench] wrote %s\n", json_path.c_str());
  }
  bool plot_failed = false;
  if (!a.plot.empty()) {
    const std::string script = std::string(SPECSERVE_SOURCE_DIR) + "/bench/plot_http_bench.py";
    if (run_process({*plot_python, script, "-o", a.plot, json_path}, false) == 0) {
      std::fprintf(stderr, "[bench] wrote %s\n", a.plot.c_str());
    } else {
      std::fprintf(stderr, "specserve bench: error: --plot: %s %s failed; no plot%s\n", plot_python->c_str(), script.c_str(),
                   temp_json ? "" : (" (the numbers are in " + json_path + ")").c_str());
      plot_failed = true;
    }
    if (temp_json) std::filesystem::remove(json_path);
  }
  return any_empty || plot_failed ? 1 : 0;
}

}  // namespace

void add_bench_http(CLI::App& app) {
  auto a = std::make_shared<HttpBenchArgs>();
  auto* sub = app.add_subcommand(
      "bench", "Benchmark any OpenAI-compatible server: N concurrent streaming clients over a prompt set (vLLM's benchmark_serving)");
  sub->add_option("--base-url", a->base_url, "Server URL; the endpoint path is appended (default http://127.0.0.1:8000)");
  sub->add_option("--endpoint", a->endpoint, "/v1/chat/completions (chat template on the server) or /v1/completions (raw prompt)");
  sub->add_option("--model", a->model, "Model name sent in each request (default: the first of GET /v1/models)");
  sub->add_option("--api-key", a->api_key, "Bearer token (default: $OPENAI_API_KEY; none when unset)");
  sub->add_option("--dataset", a->dataset,
                  "Prompts: Spec-Bench/MT-bench JSON lines (first turn of \"turns\", or \"prompt\"/\"text\", or ShareGPT's "
                  "\"conversations\" (the first turn, as vLLM's benchmark takes it; conversations of fewer than 2 turns left out); the category is kept), one JSON array of such objects (ShareGPT's "
                  "file), or a text file with one prompt per line (default: ../shared/data/spec_bench/question.jsonl "
                  "beside the checkout)");
  sub->add_option("--num-prompts", a->num_prompts,
                  "Requests per concurrency level: the set shuffled by --seed, cycled when shorter; 0: every prompt once "
                  "(default 64)")
      ->check(CLI::Range(0, 10000000));
  sub->add_option("--max-prompt-chars", a->max_prompt_chars,
                  "Leave out prompts longer than this many bytes before sampling (long prefills on a CPU); 0: keep all")
      ->check(CLI::Range(0, 1 << 30));
  add_list_option(sub, "--max-concurrency",
                  "Clients sending at once (closed loop); a comma list runs one level after another, e.g. 1,2,4,8 (default 1)",
                  int64_in_range(1, 4096), [a](const std::vector<std::string>& v) {
                    a->max_concurrency.clear();
                    for (const std::string& x : v) a->max_concurrency.push_back(std::stoi(x));
                  });
  sub->add_option("--max-tokens", a->max_tokens, "max_tokens of each request (default 128)")->check(CLI::Range(1, 1 << 20));
  sub->add_option("--temperature", a->temperature, "Sampling temperature (default 0: greedy)")->check(CLI::Range(0.0, 100.0));
  sub->add_option("--duration", a->duration_s,
                  "Seconds per level after which no new request is issued (in-flight ones finish); 0: no limit")
      ->check(CLI::Range(0.0, 1e7));
  sub->add_option("--seed", a->seed,
                  "Seed of the prompt order; with --temperature > 0 request i also sends \"seed\": seed + i (default 0)")
      ->check(int64_in_range(0, INT64_MAX));
  sub->add_flag("--ignore-eos", a->ignore_eos,
                "Send \"ignore_eos\": true (vLLM/specserve extension; other servers may ignore it) so every request "
                "makes max_tokens tokens");
  sub->add_option("--extra-body", a->extra_body,
                  "JSON object merged into every request body, e.g. '{\"top_p\":0.9}' (its keys win)");
  sub->add_option("--request-timeout", a->request_timeout_s,
                  "Seconds a request may wait for its next bytes before it fails (default 600)")
      ->check(CLI::Range(0.1, 1e6));
  sub->add_flag("--no-warmup", a->no_warmup,
                "Skip the warm-up: one untimed request (the shortest selected prompt) before the first level");
  // (non_empty_path: an empty value, as an unset shell variable gives, was the flag left out)
  sub->add_option("--output-json", a->output_json,
                  "Write the results here: settings, each level's summary with vLLM's names, and every request")
      ->check(non_empty_path());
  sub->add_option("--plot", a->plot,
                  "Write a PNG of output tokens/s and TTFT/TPOT p50 vs concurrency (bench/plot_http_bench.py, needs a "
                  "python with matplotlib: scripts/venv.sh --with-plot)")
      ->check(non_empty_path());
  sub->add_option("--tokenizer", a->tokenizer,
                  "GGUF whose tokenizer (and chat template, for chat) counts the prompt tokens of requests the server "
                  "reports no usage for (llama.cpp's server streams none); otherwise those are left out of the totals");
  sub->add_option("--label", a->label, "Name of the system under test, stored in the JSON and the plot (default: --base-url)");
  sub->footer(
      "Every request streams (stream: true, stream_options.include_usage). Per request: TTFT = send -> first non-empty\n"
      "content delta; ITL = gap between deltas; TPOT = (latency - TTFT) / (output tokens - 1); output tokens from usage,\n"
      "else the number of deltas. Throughputs divide by the level's wall time. Progress goes to stderr, the report to stdout.\n"
      "Exit status: 0 when every concurrency level completed at least one request (failed requests are counted and\n"
      "listed in the report); 1 when a level completed none, a warm-up or a check failed, or --plot could not draw.\n"
      "bench/run_http_bench.sh compares specserve's server with llama.cpp's.");
  register_command("bench", [a] { return run_bench(*a); });
}

}  // namespace specserve::cli
