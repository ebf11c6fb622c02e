// `specserve client`: submit generation jobs to a running head through the actor client API.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "actors/client.h"
#include "config/topology.h"
#include "model/gguf.h"
#include "model/tokenizer.h"
#include "tools/cli/cluster_client_lib.h"
#include "tools/cli/common.h"
#include "tools/cli/registry.h"
#include "tools/cli/subcommands.h"

namespace specserve::cli {
namespace {

struct ClientArgs {
  std::string connect, token_file, config, system, tokenizer;
  std::vector<std::string> prompts, chats, stop;
  int max_tokens = 128, min_tokens = 0, top_k = -1, priority = 0, logprobs = 0, num_speculative_tokens = -1;
  float temperature = 0.0f, top_p = 1.0f, min_p = 0.0f;
  int64_t seed = -1;
  double timeout = 0;
  bool ignore_eos = false, json = false;
};

// ---- --logprobs output

// A tokenizer to show --logprobs tokens as text: --tokenizer GGUF, else the --config topology's
// target model; none (ids only) when neither is given or readable.
std::optional<Tokenizer> logprobs_tokenizer(const ClientArgs& a) {
  std::string path = a.tokenizer;
  if (path.empty() && !a.config.empty()) {
    auto t = load_topology_file(a.config);
    if (t.ok()) path = t->models.target.path;
  }
  if (path.empty()) return std::nullopt;
  auto f = GgufFile::open(path);
  if (!f.ok()) {
    std::fprintf(stderr, "specserve client: --logprobs: no token text (%s)\n", f.status().message().c_str());
    return std::nullopt;
  }
  auto tok = Tokenizer::from_gguf(*f);
  if (!tok.ok()) {
    std::fprintf(stderr, "specserve client: --logprobs: no token text (%s)\n", tok.status().message().c_str());
    return std::nullopt;
  }
  return std::move(*tok);
}

// A token's bytes as valid UTF-8: each byte that does not belong to a complete UTF-8 sequence
// becomes U+FFFD (a BPE piece may hold part of a character).
std::string utf8_or_replacement(const std::string& b) {
  std::string o;
  size_t i = 0;
  while (i < b.size()) {
    const auto c = static_cast<unsigned char>(b[i]);
    const size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    bool ok = n > 0 && i + n <= b.size();
    for (size_t k = 1; ok && k < n; ++k) ok = (static_cast<unsigned char>(b[i + k]) & 0xC0) == 0x80;
    if (ok) {
      o.append(b, i, n);
      i += n;
    } else {
      o += "\xEF\xBF\xBD";
      ++i;
    }
  }
  return o;
}

// NOTE: JSON has no infinities; -9999.0 stands for -inf, as in OpenAI's API.
double json_logprob(float v) { return std::isfinite(v) ? static_cast<double>(v) : -9999.0; }

// One {"token", "text"?, "bytes"?, "logprob"} object (text and bytes only with a tokenizer).
std::string json_token_logprob(const Tokenizer* tok, int32_t id, float logprob) {
  std::string o = "{\"token\": " + std::to_string(id);
  if (tok) {
    const std::string piece = tok->token_to_piece(id, /*special=*/true);
    o += ", \"text\": \"" + json_escape(utf8_or_replacement(piece)) + "\", \"bytes\": [";
    for (size_t i = 0; i < piece.size(); ++i) o += (i ? ", " : "") + std::to_string(static_cast<unsigned char>(piece[i]));
    o += "]";
  }
  char b[64];
  std::snprintf(b, sizeof b, ", \"logprob\": %.6g}", json_logprob(logprob));
  return o + b;
}

// `"logprobs": [...]`: per output token its id, text and logprob, and its top_n alternatives
// (highest first) under "top_logprobs".
std::string json_logprobs(const GenerateResult& r, const Tokenizer* tok) {
  std::string o = "\"top_n\": " + std::to_string(r.top_n) + ", \"logprobs\": [";
  const size_t n = static_cast<size_t>(r.top_n);
  for (size_t t = 0; t < r.tokens.size(); ++t) {
    std::string e = json_token_logprob(tok, r.tokens[t], t < r.logprobs.size() ? r.logprobs[t] : 0.0f);
    e.pop_back();  // reopen the object for its top_logprobs
    e += ", \"top_logprobs\": [";
    for (size_t j = 0; j < n && (t + 1) * n <= r.top_logprob_ids.size(); ++j) {
      e += (j ? ", " : "") + json_token_logprob(tok, r.top_logprob_ids[t * n + j], r.top_logprob_values[t * n + j]);
    }
    o += (t ? ", " : "") + e + "]}";
  }
  return o + "]";
}

// A token for a terminal line: its text quoted and escaped with a tokenizer, else "#id".
std::string show_token(const Tokenizer* tok, int32_t id) {
  if (!tok) return "#" + std::to_string(id);
  return "\"" + json_escape(utf8_or_replacement(tok->token_to_piece(id, /*special=*/true))) + "\"";
}

// --logprobs in text mode: one compact line per output token on stdout,
//   "  [i] TOKEN LOGPROB | TOP1 LP1, TOP2 LP2, ...".
void print_logprobs(const GenerateResult& r, const Tokenizer* tok) {
  const size_t n = static_cast<size_t>(r.top_n);
  for (size_t t = 0; t < r.tokens.size(); ++t) {
    std::string line = "  [" + std::to_string(t) + "] " + show_token(tok, r.tokens[t]);
    char b[32];
    std::snprintf(b, sizeof b, " %.4f", t < r.logprobs.size() ? r.logprobs[t] : 0.0f);
    line += b;
    if (n > 0 && (t + 1) * n <= r.top_logprob_ids.size()) {
      line += " |";
      for (size_t j = 0; j < n; ++j) {
        std::snprintf(b, sizeof b, " %.4f", r.top_logprob_values[t * n + j]);
        line += (j ? ", " : " ") + show_token(tok, r.top_logprob_ids[t * n + j]) + b;
      }
    }
    std::printf("%s\n", line.c_str());
  }
}

int run_client(const ClientArgs& a) {
  auto client = connect_client(a.connect, a.token_file, a.config);
  // Bad input (--connect not HOST:PORT, a token file that cannot be used) exits 2; a head that
  // cannot be reached or refuses the token 1.
  if (!client.ok()) {
    std::fprintf(stderr, "specserve client: %s\n", client.status().message().c_str());
    return exit_status_for(client.status());
  }
  std::optional<Tokenizer> tokenizer;
  if (a.logprobs > 0) tokenizer = logprobs_tokenizer(a);
  const Tokenizer* tok = tokenizer ? &*tokenizer : nullptr;
  std::vector<GenerateRequest> reqs;
  auto base = [&] {
    GenerateRequest r;
    r.max_tokens = a.max_tokens;
    r.sampling.temperature = a.temperature;
    r.sampling.top_k = a.top_k;
    r.sampling.top_p = a.top_p;
    r.sampling.min_p = a.min_p;
    r.sampling.logprobs = a.logprobs;
    r.sampling.ignore_eos = a.ignore_eos;
    r.sampling.min_tokens = a.min_tokens;
    if (a.seed >= 0) r.sampling.seed = static_cast<uint64_t>(a.seed), r.sampling.has_seed = true;
    r.stop = a.stop;
    r.priority = a.priority;
    r.timeout_s = a.timeout;
    r.num_speculative_tokens = a.num_speculative_tokens;
    return r;
  };
  for (const auto& p : a.prompts) {
    GenerateRequest r = base();
    r.prompt = p;
    reqs.push_back(std::move(r));
  }
  for (const auto& c : a.chats) {
    GenerateRequest r = base();
    if (!a.system.empty()) r.messages.push_back({"system", a.system});
    r.messages.push_back({"user", c});
    reqs.push_back(std::move(r));
  }
  const bool stream = reqs.size() == 1 && !a.json;
  // One request refused (a prompt too long for the context) does not take the others with it:
  // each is answered on its own, a refused or failed one as an error (an object with "error"
  // under --json), and the exit status says the worst (2: bad input, 1: a failure).
  std::vector<std::shared_ptr<RequestHandle>> handles;
  std::vector<std::string> refused(reqs.size());
  int rc = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (size_t i = 0; i < reqs.size(); ++i) {
    auto h = (*client)->submit(std::move(reqs[i]));
    if (!h.ok()) {
      refused[i] = h.status().message();
      rc = std::max(rc, exit_status_for(h.status()));  // a refused parameter (--top-p 2, --stop ''): 2
      handles.push_back(nullptr);
      continue;
    }
    handles.push_back(*h);
  }
  auto report_error = [&](size_t i, const std::string& why) {
    std::fprintf(stderr, "specserve client: request %zu (index %zu) failed: %s\n", i + 1, i, why.c_str());
    if (a.json) std::printf("{\"request_id\": null, \"index\": %zu, \"finish_reason\": \"error\", \"error\": \"%s\"}\n", i, json_escape(why).c_str());
    std::fflush(stdout);
  };
  int64_t total_tokens = 0, drafts = 0, draft_tokens = 0, accepted = 0;
  for (size_t i = 0; i < handles.size(); ++i) {
    if (!handles[i]) {
      report_error(i, refused[i]);
      continue;
    }
    if (stream) {
      while (auto c = handles[i]->next()) {
        std::fwrite(c->text.data(), 1, c->text.size(), stdout);
        std::fflush(stdout);
      }
    }
    auto res = handles[i]->wait();
    if (!res.ok()) {
      report_error(i, res.status().message());
      rc = std::max(rc, 1);
      continue;
    }
    total_tokens += res->completion_tokens;
    drafts += res->num_drafts;
    draft_tokens += res->num_draft_tokens;
    accepted += res->num_accepted_tokens;
    const double mal = res->num_drafts ? 1.0 + double(res->num_accepted_tokens) / res->num_drafts : 1.0;
    if (a.json) {
      std::printf("{\"request_id\": %lld, \"index\": %zu, \"text\": \"%s\", \"finish_reason\": \"%s\", \"prompt_tokens\": %d, "
                  "\"completion_tokens\": %d, \"num_drafts\": %lld, \"num_draft_tokens\": %lld, \"num_accepted_tokens\": %lld, "
                  "\"num_requeues\": %d, \"num_migrations\": %d, \"seconds\": %.3f, \"first_token_seconds\": %s, \"tokens\": [",
                  static_cast<long long>(res->request_id), i, json_escape(res->text).c_str(), res->finish_reason.c_str(),
                  res->prompt_tokens, res->completion_tokens, static_cast<long long>(res->num_drafts),
                  static_cast<long long>(res->num_draft_tokens), static_cast<long long>(res->num_accepted_tokens),
                  res->num_requeues, res->num_migrations, res->seconds,
                  // null when no token came (a timeout before the first)
                  res->first_token_seconds < 0 ? "null" : fmt::format("{:.3f}", res->first_token_seconds).c_str());
      for (size_t t = 0; t < res->tokens.size(); ++t) std::printf("%s%d", t ? ", " : "", res->tokens[t]);
      std::printf("]");
      // vLLM's stop_reason: the stop string, the stop_token_ids id, or null (EOS, length).
      if (!res->stop_string.empty()) {
        std::printf(", \"stop_reason\": \"%s\"", json_escape(res->stop_string).c_str());
      } else if (res->stop_token >= 0) {
        std::printf(", \"stop_reason\": %d", res->stop_token);
      } else {
        std::printf(", \"stop_reason\": null");
      }
      if (a.logprobs > 0) std::printf(", %s", json_logprobs(*res, tok).c_str());
      std::printf("}\n");
    } else {
      if (!stream) std::printf("=== [%zu] %s\n%s\n", i + 1, i < a.prompts.size() ? a.prompts[i].c_str() : a.chats[i - a.prompts.size()].c_str(), res->text.c_str());
      else std::printf("\n");
      if (a.logprobs > 0) print_logprobs(*res, tok);
      const std::string first =
          res->first_token_seconds < 0 ? "no token" : fmt::format("first token {:.0f} ms", res->first_token_seconds * 1e3);
      std::fprintf(stderr, "--- [%zu] finish %s | prompt %d | completion %d tokens in %.2f s (%s) | "
                   "acceptance rate %.3f | mean acceptance length %.2f%s\n",
                   i + 1, res->finish_reason.c_str(), res->prompt_tokens, res->completion_tokens, res->seconds,
                   first.c_str(), res->acceptance_rate(), mal,
                   (std::string(res->num_requeues ? " | re-queued " + std::to_string(res->num_requeues) + "x" : "") +
                    (res->num_migrations ? " | migrated " + std::to_string(res->num_migrations) + "x" : ""))
                       .c_str());
    }
    std::fflush(stdout);
  }
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!a.json && handles.size() > 1) {
    std::fprintf(stderr, "--- %zu requests: %lld tokens in %.2f s = %.1f tokens/s | drafts %lld | draft tokens %lld | "
                 "accepted %lld | acceptance rate %.3f | mean acceptance length %.2f\n",
                 handles.size(), static_cast<long long>(total_tokens), wall, total_tokens / std::max(wall, 1e-9),
                 static_cast<long long>(drafts), static_cast<long long>(draft_tokens), static_cast<long long>(accepted),
                 draft_tokens ? double(accepted) / draft_tokens : 0.0, drafts ? 1.0 + double(accepted) / drafts : 1.0);
  }
  return rc;
}

}  // namespace

void add_client_command(CLI::App& app) {
  {
    auto a = std::make_shared<ClientArgs>();
    auto* sub = app.add_subcommand("client", "Submit generation jobs to a running head through the actor client API");
    sub->add_option("--connect", a->connect, "The head's actor endpoint HOST:PORT");
    sub->add_option("--token-file", a->token_file, "Cluster token file (default ~/.config/specserve/token)");
    sub->add_option("--config", a->config, "Topology file: head endpoint and token file from it");
    sub->add_option("--prompt", a->prompts, "Plain-text prompt (repeatable: submitted concurrently)");
    auto* chat = sub->add_option("--chat", a->chats, "User message with the chat template (repeatable: submitted concurrently)");
    sub->add_option("--system", a->system, "System message for --chat")->needs(chat);  // with --prompt only it was ignored
    // The last one wins, so scripts/run.sh's defaults can be overridden by its arguments.
    sub->add_option("--max-tokens", a->max_tokens, "Maximum tokens per request (default 128)")
        ->check(CLI::Range(1, 1 << 20))
        ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
    sub->add_option("--temperature", a->temperature, "Sampling temperature; 0 = greedy (default)")
        ->check(CLI::Range(0.0, 100.0))
        ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
    sub->add_option("--top-k", a->top_k, "Top-k filter (<= 0: off)");
    sub->add_option("--top-p", a->top_p, "Nucleus filter in (0, 1]");
    sub->add_option("--min-p", a->min_p, "Min-p filter in [0, 1]");
    sub->add_option("--seed", a->seed, "Random seed")->check(int64_in_range(0, INT64_MAX));
    sub->add_option("--logprobs", a->logprobs, "Top logprobs per token (0..20); > 0 prints them per token");
    sub->add_option("--tokenizer", a->tokenizer,
                    "GGUF whose tokenizer shows --logprobs tokens as text (default: the --config target; else ids only)");
    sub->add_option("--stop", a->stop, "Stop string (repeatable)");
    sub->add_flag("--ignore-eos", a->ignore_eos, "Keep generating past end-of-sequence tokens");
    sub->add_option("--min-tokens", a->min_tokens, "No stop (EOS, stop strings) before this many tokens (vLLM's min_tokens; <= --max-tokens)")
        ->check(CLI::Range(0, 1 << 20));
    sub->add_option("--priority", a->priority, "Lower is served first (default 0)");
    sub->add_option("--timeout", a->timeout, "Seconds before the request ends with finish reason 'timeout' (0: none)")
        ->check(CLI::Range(0.0, 1e6));
    sub->add_option("--num-speculative-tokens", a->num_speculative_tokens,
                    "Draft tokens per step for these requests: -1 the server's setting, 0 off, 1..64 a cap")
        ->check(CLI::Range(-1, 64));
    sub->add_flag("--json", a->json, "One JSON object per request on stdout");
    register_command("client", [a] {
      if (a->prompts.empty() && a->chats.empty()) {
        std::fprintf(stderr, "specserve client: give at least one --prompt or --chat\n");
        return 2;
      }
      for (const auto* list : {&a->prompts, &a->chats}) {
        for (const std::string& text : *list) {
          if (text.empty()) {
            std::fprintf(stderr, "specserve client: %s is empty\n", list == &a->prompts ? "--prompt" : "--chat");
            return 2;
          }
        }
      }
      if (a->min_tokens > a->max_tokens) {
        std::fprintf(stderr, "specserve client: --min-tokens = %d: must be <= --max-tokens = %d\n", a->min_tokens, a->max_tokens);
        return 2;
      }
      return run_client(*a);
    });
  }
}

}  // namespace specserve::cli
