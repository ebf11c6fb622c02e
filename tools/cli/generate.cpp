// `specserve generate`: load a model, generate from one prompt, stream the text, report timing.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "actors/backend_factory.h"
#include "actors/gpu_memory_plan.h"
#include "core/logging.h"
#include "model/chat_template.h"
#include "spec/engine.h"
#include "tools/cli/common.h"
#include "tools/cli/registry.h"
#include "tools/cli/spec_options.h"
#include "tools/cli/subcommands.h"

namespace specserve::cli {
namespace {

struct GenerateArgs {
  std::string model, prompt, chat, system;
  int max_tokens = 128;
  int min_tokens = 0;
  float temperature = 0.0f, top_p = 1.0f, min_p = 0.0f;
  int top_k = -1;
  int64_t seed = -1;
  int threads = 0;
  std::string device = "cpu";
  std::string dtype = "auto";
  double gpu_memory_utilization = 0.9;
  int tensor_parallel_size = 1;
  int max_model_len = 0;
  bool ignore_eos = false;
  std::vector<std::string> stop;
  SpecArgs spec;
};

int run_generate(const GenerateArgs& a) {
  auto log = get_logger("cli");
  const std::string path = a.model.empty() ? default_model_path() : a.model;
  // cuda:N: the KV pools are sized from --gpu-memory-utilization once the weights are loaded (actors/gpu_memory_plan.h).
  DeviceMemoryBudget memory(a.device, a.gpu_memory_utilization, "--gpu-memory-utilization");
  if (Status st = apply_dtype_option(a.dtype, a.device); !st.ok()) {
    std::fprintf(stderr, "specserve generate: %s\n", st.message().c_str());
    return exit_status_for(st);
  }
  // Bad speculative flags or files are reported before the target loads, not after.
  if (Status st = check_spec_args_before_load(a.spec, path, "specserve generate"); !st.ok()) {
    std::fprintf(stderr, "specserve generate: %s\n", st.message().c_str());
    return exit_status_for(st);
  }
  auto loaded = load_model_on_device(path, a.device, a.threads, a.tensor_parallel_size);
  if (!loaded.ok()) {
    // A message about the file starts with its path: "--model PATH: ..." says which flag gave it.
    const std::string msg = loaded.status().message();
    std::fprintf(stderr, "specserve generate: %s%s\n", msg.rfind(path, 0) == 0 ? "--model " : "", msg.c_str());
    return exit_status_for(loaded.status());
  }
  LoadedModel& lm = (*loaded)->lm;
  Backend* backend = &(*loaded)->backend();
  memory.target_loaded(*backend);
  std::string text = a.prompt;
  // Special-token text ("<|im_start|>") is its token in --prompt (as llama.cpp's llama-cli and
  // vLLM read a prompt) and in the rendered chat template.
  const bool parse_special = true;
  if (!a.chat.empty()) {
    std::vector<ChatMessage> msgs;
    if (!a.system.empty()) msgs.push_back({"system", a.system});
    msgs.push_back({"user", a.chat});
    auto rendered = apply_chat_template(*lm.file, msgs, true);
    if (!rendered.ok()) {
      std::fprintf(stderr, "specserve generate: --chat: %s\n", rendered.status().to_string().c_str());
      return exit_status_for(rendered.status());
    }
    text = *rendered;
  }
  GenerateParams p;
  p.prompt = lm.tokenizer->encode(text, /*add_special=*/true, parse_special);
  p.max_tokens = a.max_tokens;
  p.sampling.temperature = a.temperature;
  p.sampling.top_k = a.top_k;
  p.sampling.top_p = a.top_p;
  p.sampling.min_p = a.min_p;
  p.sampling.ignore_eos = a.ignore_eos;
  p.sampling.min_tokens = a.min_tokens;
  if (a.seed >= 0) {
    p.sampling.seed = static_cast<uint64_t>(a.seed);
    p.sampling.has_seed = true;
  }
  p.stop = a.stop;

  EngineOptions eo;
  eo.max_model_len = a.max_model_len;
  eo.max_num_seqs = 1;
  // On a GPU: the target's KV pool (and the draft's) from --gpu-memory-utilization, less the weights.
  GpuMemoryInputs kv_inputs = engine_memory_inputs(lm.model->config(), eo);
  kv_inputs.max_model_len_field = "--max-model-len";
  EngineKvPlanner kv_plan(memory, kv_inputs, &eo);
  DraftKvPlanner draft_kv = kv_plan.draft_planner();
  if (!memory.active()) {
    // On the CPU one sequence needs room for its prompt and --max-tokens (at most max_model_len)
    // plus a step's drafted rows (k <= 64), not the engine's default of 4 sequences of
    // max_model_len (~1.5 GB for the default model's 8,192 tokens, touched as it is allocated);
    // a draft with its own KV (draft_model, layer_skip, eagle) gets the same count (eagle adds
    // blocks for one step's tree rows: EagleProposer::load).
    const int64_t mml = a.max_model_len > 0 ? a.max_model_len : lm.model->config().context_length;
    const int64_t tokens = std::min<int64_t>(mml, static_cast<int64_t>(p.prompt.size()) + a.max_tokens) + 64 + 2 * eo.block_size;
    eo.num_kv_blocks = (tokens + eo.block_size - 1) / eo.block_size;
    const ModelConfig& c = lm.model->config();
    log->info("KV cache: {} blocks of {} tokens ({:.1f} MiB): the prompt's {} tokens, --max-tokens {} and a step's drafts",
              eo.num_kv_blocks, eo.block_size,
              static_cast<double>(eo.num_kv_blocks * kv_block_bytes(c.num_layers, c.kv_dim(), eo.block_size)) / (1 << 20),
              p.prompt.size(), a.max_tokens);
    draft_kv = [n = eo.num_kv_blocks](int64_t, int64_t) -> Expected<int64_t> { return n; };
  }
  auto proposer = make_proposer(a.spec, lm, *backend, &eo, std::move(draft_kv));
  if (!proposer.ok()) {
    std::fprintf(stderr, "specserve generate: %s\n", proposer.status().to_string().c_str());
    return exit_status_for(proposer.status());
  }
  if (Status plan = kv_plan.finish(); !plan.ok()) {
    std::fprintf(stderr, "specserve generate: %s\n", plan.to_string().c_str());
    return exit_status_for(plan);
  }
  if (!kv_plan.summary().empty()) log->info("{}", kv_plan.summary());
  auto engine = Engine::create(*lm.model, lm.tokenizer.get(), proposer->get(), eo);
  if (!engine.ok()) {
    std::fprintf(stderr, "specserve generate: %s\n", engine.status().to_string().c_str());
    return exit_status_for(engine.status());
  }
  auto id = (*engine)->add_request(p);
  if (!id.ok()) {
    std::fprintf(stderr, "specserve generate: %s\n", id.status().to_string().c_str());
    return exit_status_for(id.status());
  }
  const auto t0 = std::chrono::steady_clock::now();
  double ttft = -1;
  int64_t n_gen = 0;
  FinishReason fr = FinishReason::kNone;
  std::string stop_reason;  // finish "stop": the stop string or stop token id that ended it (none for EOS)
  std::string error;  // finish reason "error": why (e.g. non-finite logits from corrupt weights)
  std::vector<SeqEvent> events;
  while ((*engine)->has_work()) {
    events.clear();
    Status st = (*engine)->step(&events);
    if (!st.ok()) {
      std::fprintf(stderr, "\nspecserve generate: %s\n", st.to_string().c_str());
      return 1;
    }
    for (const auto& ev : events) {
      if (!ev.tokens.empty() && ttft < 0) ttft = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      n_gen += static_cast<int64_t>(ev.tokens.size());
      std::fwrite(ev.text.data(), 1, ev.text.size(), stdout);
      std::fflush(stdout);
      if (ev.finish != FinishReason::kNone) fr = ev.finish;
      if (!ev.stop_string.empty()) stop_reason = " (stop string " + nlohmann::json(ev.stop_string).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) +
                                                      ")";  // escaped: "\n"
      if (ev.stop_token >= 0) stop_reason = " (stop token " + std::to_string(ev.stop_token) + ")";
      if (!ev.error.empty()) error = ev.error;
    }
  }
  const double total = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("\n");
  std::fflush(stdout);
  const double decode_s = total - ttft;
  std::fprintf(stderr, "\n--- prompt tokens: %zu | generated tokens: %lld | finish: %s%s\n", p.prompt.size(),
               static_cast<long long>(n_gen), finish_reason_name(fr), stop_reason.c_str());
  // No token at all (the first greedy token ended the sequence): no time to first token.
  char ttft_text[32] = "n/a";
  if (ttft >= 0) std::snprintf(ttft_text, sizeof ttft_text, "%.1f ms", ttft * 1e3);
  std::fprintf(stderr, "--- time to first token: %s | decode: %.2f tokens/s | total %.2f s\n", ttft_text,
               ttft >= 0 && n_gen > 1 && decode_s > 0 ? (n_gen - 1) / decode_s : 0.0, total);
  if (*proposer) {
    auto s = (*engine)->take_finished_stats(*id);
    if (s) print_spec_stats(*s, **proposer, eo.num_speculative_tokens, (*engine)->stats());
  }
  // A sequence that failed (finish reason "error") is a failed command: say why, exit 1.
  if (fr == FinishReason::kError) {
    std::fprintf(stderr, "specserve generate: the generation failed: %s\n",
                 error.empty() ? "the engine ended the sequence with an error" : error.c_str());
    return 1;
  }
  return 0;
}

}  // namespace

void add_generate(CLI::App& app) {
  auto args = std::make_shared<GenerateArgs>();
  auto* sub = app.add_subcommand("generate", "Generate text from one prompt on the local CPU or a GPU (--device), streaming it to stdout");
  sub->add_option("--model", args->model, "GGUF model path (default: the fetched SmolLM2-135M-Instruct Q4_1)")->check(non_empty_path());
  auto* prompt = sub->add_option("--prompt", args->prompt, "Plain-text prompt (no chat template)");
  auto* chat = sub->add_option("--chat", args->chat, "User message, formatted with the model's chat template");
  prompt->excludes(chat);
  sub->add_option("--system", args->system, "System message for --chat")->needs(chat);  // with --prompt it was ignored
  sub->add_option("--max-tokens", args->max_tokens, "Maximum tokens to generate")->check(CLI::Range(1, 1 << 20))->capture_default_str();
  sub->add_option("--temperature", args->temperature, "Sampling temperature; 0 = greedy")->check(CLI::Range(0.0, 100.0))->capture_default_str();
  sub->add_option("--top-k", args->top_k, "Top-k filter (<= 0: off)")->capture_default_str();
  sub->add_option("--top-p", args->top_p, "Nucleus filter in (0, 1]")->capture_default_str();
  sub->add_option("--min-p", args->min_p, "Min-p filter in [0, 1]")->capture_default_str();
  sub->add_option("--seed", args->seed, "Random seed (default: random)")->check(int64_in_range(0, INT64_MAX));
  sub->add_option("--stop", args->stop, "Stop string (repeatable)");
  sub->add_flag("--ignore-eos", args->ignore_eos, "Keep generating past end-of-sequence tokens");
  sub->add_option("--min-tokens", args->min_tokens, "No stop (EOS, stop strings) before this many tokens (vLLM's min_tokens; <= --max-tokens)")
      ->check(CLI::Range(0, 1 << 20));
  sub->add_option("--threads", args->threads, "CPU threads (default: all cores), split between tensor-parallel ranks")->check(CLI::Range(0, 1024));
  sub->add_option("--tensor-parallel-size", args->tensor_parallel_size,
                  "Split the model over N ranks (attention heads by kv-head group, MLP columns; Gloo all-reduce over "
                  "loopback), each a thread with its own CPU backend; N <= the model's kv heads")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  sub->add_option("--device", args->device, "Where the model runs: cpu or cuda:N (cuda needs tensor-parallel size 1)")->capture_default_str();
  add_dtype_option(*sub, &args->dtype);
  add_enforce_eager_flag(*sub);
  add_gpu_memory_utilization_option(*sub, &args->gpu_memory_utilization,
                                    "cuda:N: fraction of the GPU's total memory to use for weights, activations and KV (vLLM's)");
  sub->add_option("--max-model-len", args->max_model_len, "Context length limit in tokens (0 or left out: the model's)")->check(CLI::Range(0, INT32_MAX))->check(max_model_len_not_one());
  add_spec_options(*sub, &args->spec);
  register_command("generate", [args, prompt, chat] {
    if (prompt->count() == 0 && chat->count() == 0) {
      std::fprintf(stderr, "specserve generate: one of --prompt or --chat is required\n");
      return 2;
    }
    if (args->prompt.empty() && args->chat.empty()) {
      std::fprintf(stderr, "specserve generate: %s is empty\n", prompt->count() ? "--prompt" : "--chat");
      return 2;
    }
    if (args->threads < 0) {
      std::fprintf(stderr, "specserve generate: --threads = %d: must be >= 0 (0 = every core)\n", args->threads);
      return 2;
    }
    if (args->min_tokens > args->max_tokens) {
      std::fprintf(stderr, "specserve generate: --min-tokens = %d: must be <= --max-tokens = %d\n", args->min_tokens, args->max_tokens);
      return 2;
    }
    return run_generate(*args);
  });
}

}  // namespace specserve::cli
