// specserve CLI: each subcommand registers its options on the app and runs when selected.
#pragma once

#include <CLI/CLI.hpp>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

namespace specserve::cli {

/// A check for a file-path flag (--model, --speculative-model): an empty value, as an unset
/// shell variable gives (`--model "$MODEL"`), is refused (exit 2) instead of being taken as the
/// flag left out (the default model, or no draft model at all).
inline CLI::Validator non_empty_path() {
  return CLI::Validator(
      [](std::string& v) { return v.empty() ? std::string("an empty path (leave the flag out for its default)") : std::string(); },
      "PATH");
}

/// A check for a JSON flag (--speculative-config): an empty or all-blank value, as an unset
/// shell variable gives, is refused (exit 2) instead of being taken as the flag left out (no
/// speculation), as vLLM's json.loads refuses it.
inline CLI::Validator non_empty_json() {
  return CLI::Validator(
      [](std::string& v) {
        return v.find_first_not_of(" \t\r\n") == std::string::npos
                   ? std::string("empty: give a JSON object such as '{\"method\": \"ngram\", \"num_speculative_tokens\": 4}' "
                                 "(leave the flag out for no speculation)")
                   : std::string();
      },
      "JSON");
}

/// A check for --max-model-len: 0 (the model's) or at least 2 (a context of one token leaves no
/// room for a completion); the range itself is CLI::Range's.
inline CLI::Validator max_model_len_not_one() {
  return CLI::Validator(
      [](std::string& v) {
        return v == "1" || v == "+1" ? std::string("1: leaves no room for a completion (at least 2; 0: the model's)") : std::string();
      },
      "");
}

/// A check for a 64-bit integer flag (--seed): the value must be a decimal integer in [lo, hi]
/// without leading zeros (CLI11 reads with base 0: "010" would be 8); else "VALUE: must be an
/// integer in [LO, HI]" (CLI11 puts the flag's name first; exit 2).
/// NOTE: CLI11 2.1 reads an int64 with strtoll and ignores ERANGE: 99999999999999999999 became
/// 9223372036854775807 silently, and CLI::Range checks that clamped value, so it let it through.
inline CLI::Validator int64_in_range(int64_t lo, int64_t hi) {
  return CLI::Validator(
      [lo, hi](std::string& v) {
        errno = 0;
        char* end = nullptr;
        // Decimal only: CLI11 itself converts with base 0, so "010" would become 8 and "0x10" 16;
        // a leading zero or a hex prefix is refused rather than read as another number.
        const size_t digits = v.find_first_not_of("+-");
        const bool leading_zero = digits != std::string::npos && v.size() > digits + 1 && v[digits] == '0';
        const long long x = v.empty() ? 0 : std::strtoll(v.c_str(), &end, 10);
        if (v.empty() || leading_zero || end != v.c_str() + v.size() || errno == ERANGE || x < lo || x > hi) {
          return v + ": must be an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
        }
        return std::string();
      },
      "INT in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
}

/// A comma-list flag (--max-concurrency 1,2,4): each occurrence is split at ',' and every item
/// must pass `item` (CLI::Range, CLI::IsMember, ...); an empty item ("1,,4", "1,", ",4") is an
/// error naming the value (exit 2) — CLI11's own delimiter drops empty items silently, so "1,,4"
/// ran 1 and 4. Several occurrences append. `set` receives the items in order, once per parse.
inline CLI::Option* add_list_option(CLI::App* sub, const std::string& flag, const std::string& help, CLI::Validator item,
                                    std::function<void(const std::vector<std::string>&)> set) {
  auto split = [](const std::string& v) {
    std::vector<std::string> items;
    size_t start = 0;
    while (true) {
      const size_t comma = v.find(',', start);
      items.push_back(v.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
      if (comma == std::string::npos) break;
      start = comma + 1;
    }
    return items;
  };
  CLI::Validator check(
      [split, item](std::string& v) {
        for (std::string x : split(v)) {
          if (x.empty()) return v + ": an empty item in the comma list";
          const std::string err = item(x);
          if (!err.empty()) return v + ": " + err;
        }
        return std::string();
      },
      "LIST of " + item.get_description());
  return sub
      ->add_option_function<std::vector<std::string>>(
          flag,
          [split, set](const std::vector<std::string>& raw) {
            std::vector<std::string> items;
            for (const std::string& v : raw)
              for (const std::string& x : split(v)) items.push_back(x);
            set(items);
          },
          help)
      ->check(check);
}

/// `specserve generate`: one prompt, streamed to stdout, with timing and speculative stats.
void add_generate(CLI::App& app);

/// `specserve bench-spec`: Spec-Bench speedup and acceptance per method.
void add_bench_spec(CLI::App& app);

/// `specserve bench-model`: prefill/decode tokens/s and the bandwidth bound.
void add_bench_model(CLI::App& app);
void add_bench_actors(CLI::App& app);  ///< `specserve bench-actors`: actor-path overhead vs the Engine; tokens/s vs clients.
void add_bench_http(CLI::App& app);
void add_bench_migrate(CLI::App& app);  ///< `specserve bench-migrate`: KV migration over UCX vs re-prefill.
void add_bench_kv_transfer(CLI::App& app);  ///< `specserve bench-kv-transfer`: UCX KV transfer bandwidth between two processes.  ///< `specserve bench`: any OpenAI-compatible server, N streaming clients (vLLM's benchmark_serving).

/// `specserve dump-hidden`: hidden states + target argmax over a prompt file (head training data).
void add_dump_hidden(CLI::App& app);

/// `specserve serve | up | node | worker | status | client`: the actor runtime (calls add_serve_command).
void add_cluster_commands(CLI::App& app);
/// `specserve client` (called by add_cluster_commands, after `status`).
void add_client_command(CLI::App& app);
/// `specserve serve`: a head and one replica in one process, from flags.
void add_serve_command(CLI::App& app);

/// Runs the subcommand the user chose; returns the process exit code.
int run_selected(CLI::App& app);

}  // namespace specserve::cli
