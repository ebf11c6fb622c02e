// specserve CLI: the speculative-decoding flags, named as vLLM names them.
#pragma once

#include <CLI/CLI.hpp>

#include <array>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "actors/gpu_memory_plan.h"
#include "config/topology.h"
#include "core/status.h"
#include "model/backend.h"
#include "model/gguf.h"
#include "spec/engine.h"
#include "spec/proposer.h"
#include "tools/cli/common.h"
#include "tools/cli/spec_config_lib.h"

namespace specserve::cli {

/// Registers the flags on `sub`.
void add_spec_options(CLI::App& sub, SpecArgs* args);

/// Builds the proposer the flags ask for (nullptr when none) and sets the engine's
/// num_speculative_tokens / disable_by_batch_size (the JSON max_model_len is the draft's limit,
/// SpeculativeSpec::max_model_len; the engine's max_model_len is the target's). Errors name the flag or JSON
/// key and value: malformed JSON, unknown key or method, k out of range, prompt_lookup_min >
/// prompt_lookup_max, a method that needs a model without one. `plan_kv` (set on a GPU,
/// EngineKvPlanner::draft_planner) sizes a draft's KV with engine_options' block_size; its
/// errors pass through.
Expected<std::unique_ptr<Proposer>> make_proposer(const SpecArgs& args, LoadedModel& target, Backend& backend,
                                                 EngineOptions* engine_options, DraftKvPlanner plan_kv = {});

/// The problems actors/proposer_factory.h check_speculative_files() finds in `spec`'s files, each
/// message starting with the flag that gave the value ("--speculative-model PATH: ...",
/// "--speculative-config \"model\" PATH: ...", "--speculative-config speculative_token_tree: ...").
/// `target_file`: the opened target, or nullptr (then the fingerprint is not compared).
std::vector<Status> speculative_file_problems(const SpecArgs& args, const SpeculativeSpec& spec, const GgufFile* target_file);

/// What make_proposer() would refuse that can be found before the target loads (seconds of
/// work saved on a CPU, minutes on a big model): the flags (parse_spec_args) and the files they
/// name (speculative_file_problems; the fingerprint against the target at `target_path` when it
/// opens, else left to the load, which reports the target itself). Every problem, joined by
/// "\n<command>: "; the status code is the first problem's. OK also when no speculation is asked for.
Status check_spec_args_before_load(const SpecArgs& args, const std::string& target_path, const std::string& command);

/// Registers --gpu-memory-utilization (vLLM's flag: the fraction of each GPU's total memory the
/// process may use, in (0, 1]; NaN, 0 and text are refused naming the flag and the value) on
/// `sub`, bound to *value. `help` describes what the fraction covers for this command.
CLI::Option* add_gpu_memory_utilization_option(CLI::App& sub, double* value, const std::string& help);

/// Registers vLLM's --enforce-eager on `sub`: CUDA backends run every op as it comes, without
/// CUDA graphs (gpu/cuda_graphs.h; outputs are the same). Sets $SPECSERVE_CUDA_GRAPHS=0 for this
/// process and the workers it starts. No effect on the CPU.
CLI::Option* add_enforce_eager_flag(CLI::App& sub);

/// Registers vLLM's --dtype on `sub` (core/dtype.h: auto, float32, float, bfloat16, float16,
/// half; default auto), bound to *value; another name is refused naming the flag and the value.
CLI::Option* add_dtype_option(CLI::App& sub, std::string* value);

/// Applies --dtype `value` for models on `device` ("cpu", "cuda:N") before anything loads
/// (actors/backend_factory.h apply_compute_dtype). Errors: kInvalidArgument naming --dtype, the
/// value and why (bfloat16 where the CPU or Linux refuses AMX, float16 on the CPU).
Status apply_dtype_option(const std::string& value, const std::string& device);

/// A CLI11 validator for a number of seconds in [0, 1e6] named `flag` (seconds_error).
CLI::Validator seconds_validator(const std::string& flag);

/// Prints a sequence's speculative counters (vLLM's meanings) to stderr; accepted counts per
/// position for a chain, per tree depth (up to proposer.max_draft_depth(k)) for a tree.
/// `k`: the engine's num_speculative_tokens.
void print_spec_stats(const SpecStats& s, const Proposer& proposer, int32_t k, const EngineStats& totals);

/// EngineStats::by_source (ShardLoad's *_by_source vectors), indexed by DraftSource.
using DraftSourceCounts = std::array<DraftSourceStats, kNumDraftSources>;

/// "model (eagle)" for the model source with model_name "eagle"; else draft_source_name().
std::string draft_source_label(DraftSource source, const std::string& model_name);

/// The sources that drafted, one clause each, "model (eagle) 300 drafts, 120 of 310 tokens
/// accepted (0.387), 1.40 tokens per step | prompt_lookup 120 drafts, ..." (labels:
/// draft_source_label; tokens per step: 1 + accepted / drafts). "" when nothing drafted.
std::string draft_sources_text(const DraftSourceCounts& c, const std::string& model_name);
/// The same as a JSON object keyed by draft_source_name(): {"prompt_lookup": {"num_drafts": N,
/// "num_draft_tokens": N, "num_accepted_tokens": N}, ...}; only sources that drafted; "{}" for none.
std::string draft_sources_json(const DraftSourceCounts& c);

}  // namespace specserve::cli
