// The speculative-decoding flags' meaning, as pure functions (no CLI11, no model): the raw flag
// values -> a `models.speculative` entry (config/topology.h) and the engine's options. Part of
// specserve_cli_lib so that tests/tools/spec_config_test.cpp checks the parser without a binary.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "config/topology.h"
#include "core/status.h"
#include "spec/engine.h"

namespace specserve::cli {

/// Raw flag values: --speculative-model, --num-speculative-tokens, --speculative-config.
struct SpecArgs {
  std::string speculative_model;
  int num_speculative_tokens = -1;  ///< -1: not given
  std::string speculative_config;  ///< JSON object with vLLM's keys
};

/// Turns the flags into a `models.speculative` entry (nullopt: no speculation) and sets the
/// engine's num_speculative_tokens / disable_by_batch_size / adaptive_k.
/// JSON keys: method (ngram | draft_model | layer_skip | medusa | eagle), model,
/// num_speculative_tokens, prompt_lookup_min/max (ngram; with another method they set
/// SpeculativeSpec::lookup_first: prompt lookup first), num_layers (layer_skip),
/// speculative_token_tree (medusa, eagle: vLLM's tree string, parsed when the proposer is
/// built), eagle_topk / eagle_depth (eagle's dynamic tree, 1..64, not with a static tree),
/// draft_vocab_size (medusa, eagle: score only ids below it; 0: all), draft_p_min (not ngram: in
/// [0, 1], the least path probability of a drafted token, EagleOptions::draft_p_min),
/// disable_by_batch_size, max_model_len (the DRAFT's maximum length, as in vLLM: sets
/// SpeculativeSpec::max_model_len, never the engine's max_model_len, which is the target's and
/// comes from --max-model-len), draft_tensor_parallel_size (1), adaptive_k.
/// k may come from --num-speculative-tokens or the JSON key or both when they are equal.
/// Errors (kInvalidArgument) name the flag or JSON key and the value: malformed JSON, unknown
/// key or method, a value of the wrong type or out of range, a key for another method, a
/// method that needs a model (draft_model, medusa, eagle) without one, --num-speculative-tokens
/// and the JSON num_speculative_tokens given with different values (both named), and so
/// --speculative-model and the JSON model naming different paths.
Expected<std::optional<SpeculativeSpec>> parse_spec_args(const SpecArgs& args, EngineOptions* engine_options);

/// What to put before a proposer error `message` so that it names its source: the flag that gave
/// the draft / head file when the message is about that file (starts with spec.model's path):
/// "--speculative-model " or "--speculative-config \"model\" "; else "--speculative-config: ".
std::string proposer_error_prefix(const SpecArgs& args, const SpeculativeSpec& spec, const std::string& message);

/// "field: message", or `message` alone when it already starts with "field:" (the tree parser's
/// errors do), so a problem reads "--speculative-config speculative_token_tree: expected ..." once.
std::string with_field(const std::string& field, const std::string& message);

/// The "accepted per position" line of generate's speculative summary, without its "--- "
/// prefix: a chain prints one count per position up to `max_depth` ("accepted per position: 10 7 3"); a tree
/// (`tree`) one per depth up to `max_depth` (the proposer's Proposer::max_draft_depth(k)),
/// labelled as depths ("accepted per tree depth: d1 10 | d2 7"), not k columns of which those
/// past the tree's depth would always read 0. `accepted_per_pos`: SpecStats::accepted_per_pos.
std::string accepted_per_position_line(const std::vector<int64_t>& accepted_per_pos, bool tree, int32_t max_depth);

/// Checks a --gpu-memory-utilization value as typed (vLLM's flag: the fraction of a GPU's total
/// memory a process may use). Returns "" when `text` is a number in (0, 1], else the error
/// naming `flag` and the value ("not a number"; "must be in (0, 1]" for 0, negatives, > 1, NaN).
std::string gpu_memory_utilization_error(const std::string& flag, const std::string& text);

/// Checks a number of seconds as typed (--drain-timeout). Returns "" for a finite number in
/// [0, 1e6], else the error naming `flag` and the value. NOTE: CLI11's Range lets NaN through,
/// and --drain-timeout nan / -5 were taken ("draining in-flight requests (up to nan s)").
std::string seconds_error(const std::string& flag, const std::string& text);

}  // namespace specserve::cli
