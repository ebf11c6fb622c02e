#include "tools/cli/spec_options.h"
#include "tools/cli/subcommands.h"

#include <fmt/format.h>

#include <cstdio>
#include <cstdlib>

#include "actors/backend_factory.h"
#include "actors/proposer_factory.h"
#include "core/dtype.h"
#include "spec/lookup_first_proposer.h"

namespace specserve::cli {

void add_spec_options(CLI::App& sub, SpecArgs* a) {
  sub.add_option("--speculative-model", a->speculative_model, "Draft model GGUF (method draft_model)")->check(non_empty_path());
  sub.add_option("--num-speculative-tokens", a->num_speculative_tokens, "Draft tokens per step (k), 1..64 (0: no speculation, only without a method or draft model); the same as \"num_speculative_tokens\" in --speculative-config "
                 "(both given: they must agree)")->check(CLI::Range(0, 64));
  sub.add_option("--speculative-config", a->speculative_config,
                 R"(JSON, vLLM keys (a number shown is the key's default): {"method": "ngram"|"draft_model"|"layer_skip"|"medusa"|"eagle", "model": PATH, )"
                 R"("num_speculative_tokens": K, "prompt_lookup_min": 5, "prompt_lookup_max": 5 (ngram's lookup; one given sets the other. With another method, not given by default: given, the lookup runs first and that method only where it finds nothing), "lookup_cached_requests": 0 (0..10000; ngram or lookup first: also search the outputs of this many earlier finished requests of this worker, in memory, 3+ matching tokens; the longer match drafts), )"
                 R"("disable_by_batch_size": N, "disable_by_goodput": false (per step, draft only for sequences whose drafts raise tokens per second), "max_model_len": N (the DRAFT's max length, as in vLLM; the target's is --max-model-len), )"
                 R"("draft_tensor_parallel_size": 1, "num_layers": N (layer_skip; default half the target's layers), )"
                 R"("adaptive_k": true, "speculative_token_tree": "[(0,), (0, 0), (1,)]", "eagle_topk": 4, "eagle_depth": 4, "draft_vocab_size": N (default 8192 for vocabularies over 16384, else all), )"
                 R"("draft_p_min": 0 (not ngram: draft only tokens whose path probability under the proposer is at least this), )"
                 R"("typical_acceptance": false (lossy: Medusa's), "posterior_threshold": 0.09, "posterior_alpha": 0.3})")
      ->check(non_empty_json());
}

Expected<std::unique_ptr<Proposer>> make_proposer(const SpecArgs& a, LoadedModel& target, Backend& backend,
                                                 EngineOptions* eo, DraftKvPlanner plan_kv) {
  auto spec = parse_spec_args(a, eo);
  if (!spec.ok()) return spec.status();
  if (!spec->has_value()) return std::unique_ptr<Proposer>();
  ProposerBuildOptions bo;
  bo.max_model_len = eo->max_model_len;
  bo.plan_kv = std::move(plan_kv);
  bo.block_size = eo->block_size;
  bo.max_num_batched_tokens = eo->max_num_batched_tokens;
  auto p = build_proposer(**spec, target, backend, bo);
  if (!p.ok()) return Status(p.status().code(), proposer_error_prefix(a, **spec, p.status().message()) + p.status().message());
  return p;
}

std::vector<Status> speculative_file_problems(const SpecArgs& a, const SpeculativeSpec& spec, const GgufFile* target_file) {
  std::vector<Status> problems;
  for (const SpeculativeFileProblem& p : check_speculative_files(spec, target_file)) {
    const std::string& msg = p.status.message();
    problems.push_back(Status(p.status.code(), p.field == "model" ? proposer_error_prefix(a, spec, msg) + msg
                                                                   : "--speculative-config " + with_field(p.field, msg)));
  }
  return problems;
}

Status check_spec_args_before_load(const SpecArgs& a, const std::string& target_path, const std::string& command) {
  EngineOptions scratch;
  auto spec = parse_spec_args(a, &scratch);
  if (!spec.ok()) return spec.status();
  if (!spec->has_value()) return Status();
  auto target = GgufFile::open(target_path);
  const std::vector<Status> problems = speculative_file_problems(a, **spec, target.ok() ? &*target : nullptr);
  if (problems.empty()) return Status();
  std::string all;
  for (const Status& st : problems) all += (all.empty() ? "" : "\n" + command + ": ") + st.message();
  return Status(problems.front().code(), all);
}

void print_spec_stats(const SpecStats& s, const Proposer& proposer, int32_t k, const EngineStats& totals) {
  const std::string method = proposer.name();
  std::fprintf(stderr, "--- speculative (%s): drafts %lld | draft tokens %lld | accepted %lld | acceptance rate %.3f | mean acceptance length %.2f\n",
               method.c_str(), static_cast<long long>(s.num_drafts), static_cast<long long>(s.num_draft_tokens),
               static_cast<long long>(s.num_accepted_tokens), s.acceptance_rate(), s.mean_acceptance_length());
  const std::string per_pos = accepted_per_position_line(s.accepted_per_pos, proposer.drafts_trees(), proposer.max_draft_depth(k));
  std::fprintf(stderr, "--- %s\n--- time drafting %.3f s | verifying (target forward) %.3f s\n", per_pos.c_str(), totals.draft_seconds, totals.forward_seconds);
  // Who drafted, where it is not just the method itself: the n-gram lookup, prompt lookup first,
  // earlier requests' outputs.
  const auto& by = totals.by_source;
  if (by[static_cast<size_t>(DraftSource::kPromptLookup)].num_drafts + by[static_cast<size_t>(DraftSource::kCachedRequests)].num_drafts > 0) {
    const auto* lookup = dynamic_cast<const LookupFirstProposer*>(&proposer);
    std::fprintf(stderr, "--- drafts by source: %s\n", draft_sources_text(by, lookup ? lookup->inner().name() : method).c_str());
  }
  const int64_t asked = totals.goodput_drafting + totals.goodput_skipped;
  if (asked > 0) {
    std::fprintf(stderr, "--- disable_by_goodput: drafts asked for in %lld of %lld sequence decode steps that could draft (%.0f %%)\n",
                 static_cast<long long>(totals.goodput_drafting), static_cast<long long>(asked),
                 100.0 * static_cast<double>(totals.goodput_drafting) / static_cast<double>(asked));
  }
}

std::string draft_source_label(DraftSource source, const std::string& model_name) {
  if (source != DraftSource::kModel || model_name.empty()) return draft_source_name(source);
  return std::string(draft_source_name(source)) + " (" + model_name + ")";
}

std::string draft_sources_text(const DraftSourceCounts& c, const std::string& model_name) {
  std::string out;
  for (size_t i = 0; i < c.size(); ++i) {
    const DraftSourceStats& b = c[i];
    if (b.num_drafts == 0) continue;
    const auto src = static_cast<DraftSource>(i);
    out += fmt::format("{}{} {} drafts, {} of {} tokens accepted ({:.3f}), {:.2f} tokens per step", out.empty() ? "" : " | ",
                       draft_source_label(src, model_name), b.num_drafts, b.num_accepted_tokens, b.num_draft_tokens,
                       b.num_draft_tokens ? static_cast<double>(b.num_accepted_tokens) / static_cast<double>(b.num_draft_tokens) : 0.0,
                       1.0 + static_cast<double>(b.num_accepted_tokens) / static_cast<double>(b.num_drafts));
  }
  return out;
}

std::string draft_sources_json(const DraftSourceCounts& c) {
  std::string out;
  for (size_t i = 0; i < c.size(); ++i) {
    const DraftSourceStats& b = c[i];
    if (b.num_drafts == 0) continue;
    out += fmt::format("{}\"{}\": {{\"num_drafts\": {}, \"num_draft_tokens\": {}, \"num_accepted_tokens\": {}}}", out.empty() ? "" : ", ",
                       draft_source_name(static_cast<DraftSource>(i)), b.num_drafts, b.num_draft_tokens, b.num_accepted_tokens);
  }
  return "{" + out + "}";
}

CLI::Option* add_gpu_memory_utilization_option(CLI::App& sub, double* value, const std::string& help) {
  CLI::Validator fraction(
      [](std::string& text) { return gpu_memory_utilization_error("--gpu-memory-utilization", text); },
      "FRACTION in (0, 1]");
  return sub.add_option("--gpu-memory-utilization", *value, help)->check(fraction)->capture_default_str();
}

CLI::Option* add_enforce_eager_flag(CLI::App& sub) {
  return sub.add_flag_callback(
      "--enforce-eager", [] { setenv("SPECSERVE_CUDA_GRAPHS", "0", 1); },
      "CUDA: launch every op as it comes, without CUDA graphs (vLLM's flag; same outputs, more launch "
      "overhead per decode step); sets SPECSERVE_CUDA_GRAPHS=0");
}

CLI::Option* add_dtype_option(CLI::App& sub, std::string* value) {
  CLI::Validator names(
      [](std::string& text) {
        return parse_compute_dtype(text, "--dtype").ok()
                   ? std::string()
                   : "'" + text + "' is not one of auto, float32, float, bfloat16, float16, half";
      },
      "auto|float32|bfloat16|float16");
  return sub
      .add_option("--dtype", *value,
                  "Matmul arithmetic (vLLM's --dtype): auto (CPU: fp32, or SPECSERVE_CPU_MATMUL's kernel; CUDA: bf16 "
                  "weights), float32 (fp32; float), bfloat16 (CPU: Intel AMX bf16 tiles with fp32 sums, an error where "
                  "the CPU lacks AMX; CUDA: bf16 weights), float16 (CUDA only; half). Norms, attention, sampling and "
                  "the KV cache stay fp32")
      ->check(names)
      ->capture_default_str();
}

Status apply_dtype_option(const std::string& value, const std::string& device) {
  auto d = parse_compute_dtype(value, "--dtype");
  if (!d.ok()) return d.status();
  return apply_compute_dtype(*d, device, "--dtype");
}

CLI::Validator seconds_validator(const std::string& flag) {
  return CLI::Validator([flag](std::string& text) { return seconds_error(flag, text); }, "SECONDS in [0, 1e6]");
}

}  // namespace specserve::cli
