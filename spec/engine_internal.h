// specserve spec: what the engine's .cpp files share (not part of the public API).
//
// engine.cpp (construction, requests, migration, the queues as the step policy sees them),
// engine_step.cpp (Engine::step: plan, drafts, one target forward, then per sequence the KV
// bookkeeping) and engine_verify.cpp (verification of chains and trees, emission of accepted
// tokens with the stop rules, KV compaction) all work on Engine::Seq, defined here.
// Include only from spec/engine*.cpp.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "spec/engine.h"

namespace specserve {

/// A request's state in the engine: its tokens, KV blocks, sampler, stop-string decoding and
/// speculation; owned by Engine::waiting_ or Engine::running_.
struct Engine::Seq {
  int64_t id = 0;
  GenerateParams params;
  std::optional<Sampler> sampler;
  std::vector<int32_t> tokens;  // prompt + output
  int32_t prompt_len = 0;
  int32_t num_cached = 0;       // tokens whose KV is in the cache (always < tokens.size() while running)
  BlockTable blocks;
  std::vector<BlockHash> block_hashes;  // chain hashes of the full blocks of `tokens` (prefix caching)
  std::optional<StreamDecoder> decoder;
  std::string text;             // output text decoded so far (whole UTF-8)
  size_t sent = 0;              // bytes of text already emitted
  size_t max_stop_len = 0;
  // Bytes of text from the output tokens before min_tokens: a stop string must end after them.
  size_t stop_floor = 0;
  int32_t num_generated = 0;
  // What stopped it (SeqEvent::stop_token / stop_string).
  int32_t stop_token = -1;
  std::string stop_string;
  int32_t k = 0;                // current speculation length (adaptive), within [1, max_k] once it drafted
  int32_t max_k = 0;            // this request's cap: min(GenerateParams::num_speculative_tokens, the engine's); 0: never drafts
  int64_t num_steps_waited = 0; // steps spent in waiting_ since it arrived (StepLimits aging)
  // disable_by_goodput (spec/goodput.h): per step it was asked to draft, its accepted draft
  // tokens and its draft rows (moving averages, -1: not asked yet), and the decode steps in a
  // row the policy left it out of.
  double gp_accepted = -1;
  double gp_drafted = -1;
  int32_t gp_skipped = 0;
  int32_t gp_explore_after = kGoodputExploreEvery;  // doubles after each exploration, up to 64
  // Hidden hand-over (a proposer with needs_hidden(); spec/proposer.h): the target's final-norm
  // hidden states [n, hidden_size] of positions [hidden_begin, hidden_begin + n) not yet handed
  // to the proposer. While it runs, hidden_begin + n == num_cached.
  std::vector<float> hidden;
  int32_t hidden_begin = 0;
  // Finished by a stop or its length with a proposer that wants every hidden row: the last
  // step's rows are still to be handed over, and release() is due after that (Engine::step).
  bool release_after_handover = false;
  FinishReason finish = FinishReason::kNone;
  SpecStats spec;
  // A migrated sequence waiting for admission with its KV outside the cache (add_migrated):
  // writes the KV of the first import_cached tokens when the step policy admits it.
  std::function<Status(KvStorage&, std::span<const int32_t>)> import_kv;
  int32_t import_cached = 0;
  std::span<const int32_t> prompt() const { return {tokens.data(), static_cast<size_t>(prompt_len)}; }
  std::span<const int32_t> output() const {
    return {tokens.data() + prompt_len, tokens.size() - static_cast<size_t>(prompt_len)};
  }
};

namespace engine_internal {

/// log_softmax of raw logits `row` [vocab] at `token`, plus the top_n largest (vLLM's default
/// raw logprobs; ties go to the lower token id). top_n <= 0: no top list.
SampleResult raw_logprobs(const float* row, int32_t vocab, int32_t token, int32_t top_n);

/// The first match in `text` of any of `stops` that starts at or after `from` and ends after
/// byte `floor` (output before min_tokens never stops a request): its start, with the index of
/// the stop string in *which; npos when none.
size_t find_stop_string(const std::string& text, const std::vector<std::string>& stops, size_t from, size_t floor,
                        size_t* which);

/// How many bytes of a sequence's `text` may be sent while the last `hold` bytes wait for a
/// possible stop string: text.size() - hold, moved back (at most 3 bytes) to the start of the
/// character it falls in, so a stream never splits a multi-byte character between two events
/// (each event's text is valid UTF-8 on its own when `text` is). Where no character starts
/// within those 3 bytes (bytes that are not UTF-8), text.size() - hold. Non-decreasing as text
/// grows by appending, so a resumed sequence's sent position is the uninterrupted one's.
size_t sendable_prefix(const std::string& text, size_t hold);

}  // namespace engine_internal
}  // namespace specserve
