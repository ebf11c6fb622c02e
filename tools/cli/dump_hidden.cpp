// `specserve dump-hidden`: self-distillation data (hidden states, tokens, target argmax) for
// training Medusa / EAGLE heads (tools/train/). See tools/cli/dump_hidden_lib.h for the format.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>

#include <signal.h>
#include <unistd.h>

#include "cpu/cpu_backend.h"
#include "model/gguf.h"
#include "tools/cli/common.h"
#include "tools/cli/dump_hidden_lib.h"
#include "tools/cli/registry.h"
#include "tools/cli/spec_options.h"
#include "tools/cli/subcommands.h"

namespace specserve::cli {
namespace {

struct DumpArgs {
  std::string model;
  DumpHiddenOptions opts;
  int threads = 0;
  std::string dtype = "auto";
  bool print_fingerprint = false;
};

// Set by SIGINT / SIGTERM: the dump stops at its next step and removes what it created.
// NOTE: an interrupted dump left its .dump-hidden.partial directory (up to a whole dump).
std::atomic<bool> g_stop{false};
extern "C" void request_stop(int) { g_stop.store(true); }

/// A library message without its own "dump-hidden: " prefix (the CLI prints its own).
std::string without_prefix(const std::string& m) {
  const std::string p = "dump-hidden: ";
  return m.rfind(p, 0) == 0 ? m.substr(p.size()) : m;
}

int run_dump_hidden(const DumpArgs& a) {
  const std::string path = a.model.empty() ? default_model_path() : a.model;
  if (a.print_fingerprint) {
    auto f = GgufFile::open(path);
    if (!f.ok()) {
      std::fprintf(stderr, "specserve dump-hidden: %s\n", f.status().to_string().c_str());
      return 1;
    }
    std::printf("%s\n", fingerprint_hex(*f).c_str());
    return 0;
  }
  // Bad input (exit 2) is found before the model loads where it can be.
  if (Status st = check_dump_options(a.opts); !st.ok()) {
    std::fprintf(stderr, "specserve dump-hidden: %s\n", without_prefix(st.message()).c_str());
    return 2;
  }
  if (Status st = apply_dtype_option(a.dtype, "cpu"); !st.ok()) {
    std::fprintf(stderr, "specserve dump-hidden: %s\n", st.message().c_str());
    return exit_status_for(st);
  }
  auto backend = make_cpu_backend(a.threads);
  auto loaded = load_model(path, *backend);
  if (!loaded.ok()) {
    std::fprintf(stderr, "specserve dump-hidden: %s\n", loaded.status().to_string().c_str());
    return 1;
  }
  const bool tty = isatty(fileno(stderr));
  auto last_logged = std::chrono::steady_clock::time_point{};
  auto progress = [tty, last_logged](const std::string& line, bool final_line) mutable {
    // On a terminal one line is rewritten in place; in a log an update is its own line, at
    // most one per 10 s (and every final line).
    if (tty) {
      std::fprintf(stderr, "\r\033[K[dump-hidden] %s%s", line.c_str(), final_line ? "\n" : "");
    } else {
      const auto now = std::chrono::steady_clock::now();
      if (!final_line && now - last_logged < std::chrono::seconds(10)) return;
      last_logged = now;
      std::fprintf(stderr, "[dump-hidden] %s\n", line.c_str());
    }
    std::fflush(stderr);
  };
  DumpHiddenOptions opts = a.opts;
  opts.stop = &g_stop;
  struct sigaction sa {};
  sa.sa_handler = request_stop;
  sigemptyset(&sa.sa_mask);
  // (a second signal kills at once; interrupted writes resume)
  sa.sa_flags = SA_RESTART | SA_RESETHAND;
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);
  auto sum = dump_hidden(*loaded, opts, progress);
  if (!sum.ok() && sum.status().code() == StatusCode::kCancelled) {
    std::fprintf(stderr, "\nspecserve dump-hidden: %s; what it wrote into %s is removed\n",
                 without_prefix(sum.status().message()).c_str(), a.opts.out_dir.c_str());
    return 130;  // (the shell's code for a command ended by SIGINT)
  }
  if (!sum.ok()) {
    // Bad input (a prompt line, --prompts, --out) exits 2 like the flag checks; the rest 1.
    const StatusCode c = sum.status().code();
    const bool bad_input = c == StatusCode::kInvalidArgument || c == StatusCode::kNotFound;
    std::fprintf(stderr, "\nspecserve dump-hidden: %s\n", without_prefix(bad_input ? sum.status().message() : sum.status().to_string()).c_str());
    return bad_input ? 2 : 1;
  }
  std::string skipped = std::to_string(sum->num_prompts_skipped) + " prompts skipped (" +
                        std::to_string(sum->num_prompts_too_long) + " over --max-prompt-tokens, " +
                        std::to_string(sum->num_prompts_empty) + " empty";
  if (sum->num_prompts_empty > 0) skipped += ", the first at line " + std::to_string(sum->first_empty_prompt_line);
  skipped += ")";
  std::fprintf(stderr,
               "[dump-hidden] %lld sequences, %lld positions (%lld generated), argmax mismatches %lld of %lld checked; "
               "%s; generate %.1f s (output head %.1f s); %lld left out (no position recorded); fingerprint %s -> %s\n",
               static_cast<long long>(sum->num_sequences), static_cast<long long>(sum->num_positions),
               static_cast<long long>(sum->num_generated), static_cast<long long>(sum->num_argmax_mismatches),
               static_cast<long long>(sum->num_argmax_checked), skipped.c_str(),
               sum->generate_seconds, sum->head_seconds, static_cast<long long>(sum->num_sequences_unrecorded),
               sum->target_fingerprint.c_str(), a.opts.out_dir.c_str());
  return 0;
}

}  // namespace

void add_dump_hidden(CLI::App& app) {
  auto args = std::make_shared<DumpArgs>();
  auto* sub = app.add_subcommand(
      "dump-hidden",
      "Self-distillation data for Medusa/EAGLE heads: the target's greedy continuation of each prompt, recording "
      "per position its final-norm hidden state (float16), token id and argmax next token (.npy + index.json)");
  sub->footer("Exit status: 0 done, 1 failure, 2 bad input, 130 interrupted (SIGINT/SIGTERM: what it wrote is "
              "removed; a dump killed outright leaves .dump-hidden.partial-HOST-PID in --out, removed by the next dump there on that host)");
  sub->add_option("--model", args->model, "GGUF model path (default: the fetched SmolLM2-135M-Instruct Q4_1)")->check(non_empty_path());
  // NOTE: not ->required(): --print-fingerprint needs neither; "REQUIRED" is in the text instead.
  sub->add_option("--prompts", args->opts.prompts_path,
                  "REQUIRED (unless --print-fingerprint). JSONL prompt file: {\"messages\": [{\"role\", \"content\"}, ...]} "
                  "or {\"prompt\": \"...\"} per line (a prompt's special-token text such as <|im_start|> is its token, as "
                  "generate --prompt and the HTTP API read it; \"task\" allowed; other keys ignored with a warning; empty "
                  "prompts skipped and reported)");
  sub->add_option("--out", args->opts.out_dir,
                  "REQUIRED (unless --print-fingerprint). Output directory, created with its parents (hidden.npy, "
                  "tokens.npy, argmax.npy, head.npy, embed.npy, index.json); a previous dump there is replaced "
                  "when the new one is complete");
  sub->add_option("--max-new-tokens", args->opts.max_new_tokens,
                  "Greedy continuation tokens per prompt (every one is recorded but the last of a sequence that "
                  "reaches this cap)")
      ->check(CLI::Range(1, 1 << 16))->capture_default_str();
  sub->add_option("--max-num-seqs", args->opts.max_num_seqs, "Sequences generated at once")->check(CLI::Range(1, 1024))->capture_default_str();
  sub->add_option("--max-prompts", args->opts.max_prompts, "Use only the first N usable prompts (0: all)")
      ->check(CLI::Range(0, 1 << 30))->capture_default_str();
  sub->add_option("--max-prompt-tokens", args->opts.max_prompt_tokens, "Skip prompts longer than this (tokens)")
      ->check(CLI::Range(1, 1 << 20))->capture_default_str();
  sub->add_option("--check-every", args->opts.check_every,
                  "Continuation rows take their argmax from the generated token; every Nth is computed and "
                  "compared (1: all rows, slowest)")
      ->check(CLI::Range(1, 1 << 20))->capture_default_str();
  sub->add_flag("--no-weights", [args](int64_t) { args->opts.write_weights = false; },
                "Do not write head.npy / embed.npy (the dequantized output head and embedding; default: written); a previous "
                "dump's in --out are removed (they may be another model's)");
  sub->add_flag("--print-fingerprint", args->print_fingerprint,
                "Print the model's fingerprint (16 hex digits, model/model_fingerprint.h) and exit");
  sub->add_option("--threads", args->threads, "CPU threads (0: all cores)")->check(CLI::Range(0, 1024))->capture_default_str();
  // The CPU only (no --device, so no --enforce-eager): the shared help spoke of CUDA.
  add_dtype_option(*sub, &args->dtype)
      ->description("Matmul arithmetic on the CPU (vLLM's --dtype): auto (fp32, or SPECSERVE_CPU_MATMUL's kernel), float32 (float), "
                    "bfloat16 (Intel AMX bf16 tiles with fp32 sums; an error where the CPU lacks AMX); float16 is CUDA's, "
                    "refused here. dump-hidden runs on the CPU only");
  register_command("dump-hidden", [args] { return run_dump_hidden(*args); });
}

}  // namespace specserve::cli
