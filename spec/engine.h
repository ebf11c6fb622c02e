// specserve spec: the generation engine — continuous batching over one target model, with
// optional speculative decoding through a Proposer.
//
// Each step() runs one target forward pass over every running sequence: prefill chunks,
// plain decode tokens, and, for sequences with drafts, the last token plus its draft tokens,
// which are verified in the same pass (greedy: longest matching prefix plus the bonus token;
// sampling: lossless speculative sampling, Leviathan et al. 2023 / Chen et al. 2023). A draft
// may be a token tree (DraftTree::parents): the pass then uses tree attention, greedy takes the
// longest matching path, sampling uses multi-candidate recursive rejection sampling over each
// node's children (SpecInfer / EAGLE; spec/tree_verify.h), and the accepted path's KV is
// compacted into consecutive slots before the rest is released.
// Greedy output is token-for-token identical with and without speculation because every
// backend op is batch-invariant (model/backend.h). Which sequences run, how many rows and
// draft tokens each gets, and which are preempted is decided by the pure step policy
// (spec/step_policy.h): priorities, aging, the token budget, KV blocks.
// Thread-safety: one thread drives an Engine.
#pragma once

#include <chrono>
#include <array>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "kv/block_pool.h"
#include "model/sampling.h"
#include "model/tokenizer.h"
#include "model/transformer.h"
#include "spec/goodput.h"
#include "spec/proposer.h"
#include "spec/step_policy.h"

namespace specserve {

/// Engine limits and speculation settings (vLLM's names).
struct EngineOptions {
  int32_t max_num_seqs = 64;             ///< sequences running at once
  int32_t max_num_batched_tokens = 2048; ///< tokens per forward pass (prefill chunks + decode + draft tokens)
  int32_t block_size = 16;               ///< KV block size in tokens
  int64_t num_kv_blocks = 0;             ///< 0: enough for max_model_len * 4 tokens
  int32_t max_model_len = 0;             ///< 0: the model's context length
  int32_t num_speculative_tokens = 0;    ///< k; 0 turns speculation off (a request may only lower it: GenerateParams)
  int32_t disable_by_batch_size = 0;     ///< > 0: no speculation while more sequences run
  /// Per-sequence k follows observed acceptance (see engine_step.cpp); only for proposers that
  /// draft chains: a tree proposer's k is its node budget and stays.
  bool adaptive_k = true;
  /// Per step, only the decode sequences whose drafts raise the step's tokens per second draft
  /// (spec/goodput.h: SmartSpec's goodput, with the step time fitted online as a + b * rows and
  /// each sequence's acceptance so far); the others decode plainly. A left-out one explores
  /// after 8 steps (backing off to 64) when a draft as good as the best lately would pay.
  /// Greedy output is unchanged; seeded sampled output then repeats in distribution only (which
  /// steps draft depends on measured times). Off by default.
  bool disable_by_goodput = false;
  /// > 0: a waiting request's priority improves by one level per this many steps it waited
  /// (spec/step_policy.h), so low priorities are not starved forever; 0: no aging.
  int32_t priority_aging_steps = 100;
  /// Automatic prefix caching (vLLM V1's, on by default as there): full KV blocks are named by
  /// a chain hash of their tokens (kv/block_hash.h), registered once their KV is valid, shared
  /// between sequences by reference count and kept after use until evicted in LRU order. A
  /// sequence admitted with a cached prefix skips computing it (at most every whole block
  /// before its last known token). Output is identical either way (the backend is
  /// batch-invariant); only prefill work drops.
  bool enable_prefix_caching = true;
  /// Medusa's typical acceptance (Cai et al. 2024, section 2.3.1) for SAMPLED requests
  /// (temperature > 0): a draft token passes when the target gives it probability above
  /// min(posterior_threshold, posterior_alpha * exp(-entropy)), the longest passing path of the
  /// tree (or chain) is kept, and the token after it is sampled from the target.
  /// NOTE: LOSSY — the output no longer follows the target's distribution (it favours the
  /// draft's likely tokens and raises acceptance). Off by default; greedy requests are
  /// unaffected (they stay token-for-token equal to plain decoding).
  bool typical_acceptance = false;
  float posterior_threshold = 0.09f;  ///< Medusa's epsilon, in (0, 1]
  float posterior_alpha = 0.3f;       ///< Medusa's delta (weight of exp(-entropy)), in [0, 1]
  /// A greedy request without penalties or top logprobs takes its tokens and logprobs from the
  /// backend's argmax_rows (SequenceInput::argmax_only) instead of whole logit rows: on a GPU
  /// 8 bytes per row reach the host instead of 4 * vocab. So does the plain (undrafted) step of
  /// a request with only a temperature (no top-k, top-p, min-p, penalties, top logprobs): the
  /// backend draws its token (sample_rows) with the uniform its Sampler would have used. Same
  /// tokens and logprobs either way (model/sampling.h greedy_pick, temperature_pick); off only
  /// to compare (the environment variable SPECSERVE_ARGMAX_ON_DEVICE=0 also turns it off;
  /// argmax_on_device_from_env).
  bool argmax_on_device = true;
  /// Validates: every field in range (kInvalidArgument naming field and value).
  Status validate() const;
};

/// EngineOptions::argmax_on_device from the environment variable SPECSERVE_ARGMAX_ON_DEVICE:
/// unset or empty: `fallback`; "1": true; "0": false; anything else: kInvalidArgument naming the
/// variable and its value (Engine::create applies it).
Expected<bool> argmax_on_device_from_env(bool fallback);

/// One generation request.
struct GenerateParams {
  std::vector<int32_t> prompt;        ///< token ids, at least one
  SamplingParams sampling;
  int32_t max_tokens = 256;           ///< >= 1; counts resume_output
  std::vector<std::string> stop;      ///< stop strings: output ends before the first match
  bool include_stop_str = false;
  /// Output tokens this request already produced on another replica (failover): they follow
  /// the prompt as OUTPUT — they count toward max_tokens and the context, take part in the
  /// presence/frequency/repetition penalties as output, and their text is fed to the stream
  /// decoder so that a stop string may start inside it. They are never emitted again: their
  /// text counts as sent exactly as far as the uninterrupted request had sent it after these
  /// tokens (a tail that may begin a stop string is still held back and comes in a later
  /// SeqEvent), so the first replica's events followed by this one's equal the uninterrupted
  /// request's. Greedy output continues exactly as without the interruption (the sampler's
  /// random stream of a seeded sampling request restarts, so sampled output does not).
  std::vector<int32_t> resume_output;
  /// Scheduling priority: a lower value is admitted first and preempted last (vLLM's meaning);
  /// first come first served within a priority. A waiting request gains one level per
  /// EngineOptions::priority_aging_steps steps waited (spec/step_policy.h).
  int32_t priority = 0;
  /// Speculation for this request (vLLM's num_speculative_tokens, set per request):
  ///  -1     the engine's setting: up to EngineOptions::num_speculative_tokens draft tokens per
  ///         step, adaptive k as EngineOptions::adaptive_k says (the default; as before).
  ///   0     this request never speculates: plain decoding, and the proposer never sees it (no
  ///         propose() nor release() call for its sequence). Greedy output is the same either way.
  ///  1..64  at most this many draft tokens per step, and never more than the engine's
  ///         num_speculative_tokens: the request's cap is min(this, engine's). Adaptive k starts at
  ///         the cap and moves within [1, cap] (a chain proposer's; a tree proposer's k is its node
  ///         budget and stays at the cap); without adaptive_k every step asks for the cap.
  /// The cap also sizes SpecStats::accepted_per_pos. On an engine without a proposer (or with
  /// num_speculative_tokens 0) a value > 0 is accepted and drafts nothing: there is nothing to
  /// draft with. Batch-level rules still apply on top (disable_by_batch_size, the token budget,
  /// KV blocks, max_tokens and the context, spec/step_policy.h). Other values: kInvalidArgument.
  int32_t num_speculative_tokens = -1;
};

/// kError: the sequence cannot go on (its logits hold NaN or +inf: corrupt weights or a kernel
/// bug); SeqEvent::error says why. Other sequences are not affected.
enum class FinishReason { kNone, kStop, kLength, kAbort, kError };
const char* finish_reason_name(FinishReason r);  ///< "stop", "length", "abort", "error", ""

/// Speculative counters with vLLM's meanings.
struct SpecStats {
  int64_t num_drafts = 0;           ///< steps where the sequence had >= 1 draft token
  int64_t num_draft_tokens = 0;     ///< draft tokens proposed
  int64_t num_accepted_tokens = 0;  ///< draft tokens accepted (a rejection ends the count for that draft)
  /// [k]: drafts whose token at position i was accepted; for a tree draft, position i is depth
  /// i + 1 (the accepted path holds one node per depth). num_draft_tokens counts every tree node.
  std::vector<int64_t> accepted_per_pos;
  /// [k]: drafts that reached position i (a chain of more than i tokens; a tree with a node at
  /// depth i + 1). accepted_per_pos[i] / drafted_per_pos[i] is the acceptance at depth i + 1 of
  /// the drafts that went that deep (adaptive k and draft_p_min draft shorter than k). Counted in
  /// the engine; a migrated sequence brings accepted_per_pos only.
  std::vector<int64_t> drafted_per_pos;
  double acceptance_rate() const { return num_draft_tokens ? double(num_accepted_tokens) / num_draft_tokens : 0.0; }
  /// 1 + accepted / drafts: tokens emitted per verification step.
  double mean_acceptance_length() const { return num_drafts ? 1.0 + double(num_accepted_tokens) / num_drafts : 1.0; }
  void add(const SpecStats& o);
};

/// What one step produced for one sequence.
struct SeqEvent {
  int64_t seq_id = 0;
  std::vector<int32_t> tokens;      ///< newly emitted tokens (after stop rules)
  std::vector<SampleResult> logprobs;  ///< per emitted token when sampling.logprobs > 0 or always for token logprob
  std::string text;                 ///< newly complete text (stop strings cut, partial UTF-8 held back)
  FinishReason finish = FinishReason::kNone;
  std::string error;                ///< finish == kError: why
  /// finish == kStop: what stopped it (vLLM's stop_reason): the stop_token_ids id (stop_token),
  /// or the stop string (stop_string); neither (-1, "") for EOS.
  int32_t stop_token = -1;
  std::string stop_string;
};

/// The speculative counters of one DraftSource (EngineStats::by_source).
struct DraftSourceStats {
  int64_t num_drafts = 0;           ///< verification steps with a draft from this source
  int64_t num_draft_tokens = 0;
  int64_t num_accepted_tokens = 0;
};

/// Engine-wide counters.
struct EngineStats {
  SpecStats spec;
  /// [DraftSource]: every verified draft by who drafted it (spec/proposer.h), counted at each
  /// verification step. spec is counted when a sequence finishes, with what a migrated sequence
  /// brought from its earlier engine; so the two agree only once no sequence runs and none came
  /// from (or left for) another engine.
  std::array<DraftSourceStats, kNumDraftSources> by_source{};
  int64_t num_steps = 0;
  /// Prompt tokens of the requests queued by add_request (vLLM's prompt_tokens): a request that
  /// came from another engine (add_migrated) was counted there, so engines that hand requests
  /// to each other sum to each prompt once. Prefill work, recomputes included: prefill_tokens.
  int64_t prompt_tokens = 0;
  /// Output tokens this engine generated (a migrated request's resume_output not included).
  int64_t generated_tokens = 0;
  double draft_seconds = 0;   ///< time in Proposer::propose
  double forward_seconds = 0; ///< time in target forward passes (verify included)
  /// Tokens the target computed in prefill chunks (entries with more than one uncached token:
  /// prompts, resumed output, recomputes after preemption); a prefix-cache hit skips its tokens.
  int64_t prefill_tokens = 0;
  /// Prefix cache (vLLM V1's prefix_cache_queries / prefix_cache_hits), counted at each
  /// admission (re-admissions after preemption included) while enable_prefix_caching is on:
  /// tokens the admitted sequence knew, and how many of them were found cached.
  int64_t prefix_cache_queries = 0;
  int64_t prefix_cache_hits = 0;
  /// Sequences preempted for lack of KV blocks (their KV released, recomputed when re-admitted;
  /// vLLM's num_preemptions), each preemption counted.
  int64_t num_preemptions = 0;
  /// Target logit rows of which the host got only the argmax and its logprob
  /// (EngineOptions::argmax_on_device), not the row itself.
  int64_t argmax_rows = 0;
  /// disable_by_goodput: decode steps of sequences that could draft (counted per sequence) in
  /// which the policy asked the proposer for a draft / left the sequence out.
  int64_t goodput_drafting = 0;
  int64_t goodput_skipped = 0;
};

/// A sequence's state for continuing it on another engine (KV migration when a worker drains,
/// disaggregated prefill): everything but the KV bytes, which travel on the data plane
/// (kv/transfer.h) from the blocks named here.
struct SequenceExport {
  int64_t seq_id = 0;
  std::vector<int32_t> prompt;  ///< its prompt tokens
  std::vector<int32_t> output;  ///< output tokens so far: the next engine's GenerateParams::resume_output
  std::string rng_state;        ///< Sampler::rng_state(): a seeded request continues its random stream
  int32_t num_cached = 0;       ///< tokens (prompt + output, from the start) whose KV is valid; < their count
  std::vector<int32_t> blocks;  ///< the block ids holding them, in order: ceil(num_cached / block_size) ids
  int32_t k = 0;                ///< its adaptive k now (0: it never drafts)
  SpecStats spec;               ///< its speculative counters so far
};

/// What Engine::add_migrated needs besides the request.
struct SequenceImport {
  std::string rng_state;  ///< Sampler::rng_state() of the exporter; "" keeps the sampler's own seeding
  int32_t num_cached = 0; ///< tokens whose KV load_kv writes; 0: none (the sequence recomputes)
  /// Writes the KV of the first num_cached tokens into `blocks` (this engine's block ids,
  /// ceil(num_cached / block_size) of them, in order) of `kv`. An error (transfer failed, checksum
  /// mismatch) makes the sequence recompute its KV instead; it is not a request error.
  std::function<Status(KvStorage& kv, std::span<const int32_t> blocks)> load_kv;
  int32_t k = -1;         ///< adaptive k to continue with; -1: the request's cap
  SpecStats spec;         ///< counters carried over (reported when the sequence finishes)
};

class Engine {
 public:
  /// Builds an engine around a loaded target. `tokenizer` may be null (then stop strings are
  /// refused and no text is produced). `proposer` may be null (no speculation). Both, and
  /// `target`, must outlive the engine. Errors: invalid options, KV allocation failure.
  static Expected<std::unique_ptr<Engine>> create(Transformer& target, const Tokenizer* tokenizer,
                                                  Proposer* proposer, EngineOptions options);

  ~Engine();

  /// Queues a request; returns its sequence id. Errors (kInvalidArgument / kOutOfRange naming
  /// the field): empty prompt, token outside the vocabulary (prompt or resume_output), prompt
  /// (plus resume_output) leaving no room in max_model_len or needing more KV blocks than the
  /// cache holds, max_tokens < 1, resume_output.size() >= max_tokens, resume_output holding a
  /// stop token, EOS (unless ignore_eos) or a complete stop string (the request would already
  /// have finished), invalid sampling params, stop strings without a tokenizer,
  /// num_speculative_tokens outside -1..64.
  Expected<int64_t> add_request(GenerateParams params);
  /// Queues a request that ran elsewhere (migration): `params.resume_output` holds its output
  /// so far (SequenceExport::output), validated as add_request does. With import.num_cached > 0
  /// it goes through the step policy's admission (spec/step_policy.h rule 2, plan_admission) as
  /// any waiting sequence does: when admitted now it starts running at once with its KV written
  /// by import.load_kv and import.num_cached tokens cached; otherwise it waits in the queue
  /// holding import.load_kv (its KV stays wherever load_kv reads it from, outside the cache) and
  /// is loaded at the start of the step whose admission admits it. When load_kv fails, or
  /// without it, it recomputes its KV (same tokens, same random stream). `*kv_loaded` (when
  /// given) says whether the KV was loaded during this call; load_kv is called at most once,
  /// on the engine's thread, and is dropped unused when the sequence is aborted, removed or
  /// exported while it waits.
  /// NOTE: greedy output is identical either way. Seeded sampling is identical to the
  /// uninterrupted run when the KV loads; after a recompute, the first step is a prefill that
  /// samples without drafts, so with a proposer it consumes the stream differently there. With a
  /// proposer that needs hidden states (Proposer::needs_hidden) a sequence that may draft always
  /// recomputes (the hidden states of its cached positions are not carried). Errors: those of
  /// add_request; kInvalidArgument for a bad rng_state or num_cached outside [0, tokens).
  Expected<int64_t> add_migrated(GenerateParams params, SequenceImport import, bool* kv_loaded = nullptr);
  /// The state of a running or waiting sequence for migration (a waiting one has nothing
  /// cached). kNotFound when the id is not live (finished, aborted, unknown).
  Expected<SequenceExport> export_sequence(int64_t seq_id) const;
  /// Drops a live sequence without any event (it continues elsewhere): its KV blocks are freed,
  /// the proposer forgets it. Unknown ids are ignored.
  void remove_sequence(int64_t seq_id);
  /// Ids of every live sequence: running first (in running order), then waiting.
  std::vector<int64_t> live_sequences() const;
  /// The paged KV storage (for exporting and importing blocks).
  KvStorage& kv_storage() { return *kv_; }

  /// Finishes a sequence now (FinishReason::kAbort reported on the next step); frees its KV.
  void abort(int64_t seq_id);
  /// True while any request is queued or running.
  bool has_work() const { return !waiting_.empty() || !running_.empty() || !aborted_.empty(); }
  /// Plans the step (spec/step_policy.h: admission, preemption, rows and draft tokens per
  /// sequence), asks the proposer for drafts, runs one target forward pass over every scheduled
  /// sequence, verifies and appends what it produced to *events (aborts first). Errors:
  /// kResourceExhausted when one sequence alone no longer fits in the KV cache (num_kv_blocks
  /// smaller than its tokens); the target's forward errors. A proposer error is not an error:
  /// the step decodes without drafts.
  Status step(std::vector<SeqEvent>* events);

  /// Per-sequence speculative counters (available until the sequence is released by
  /// `take_finished_stats`), and engine totals.
  const EngineStats& stats() const { return stats_; }
  /// Counters of a finished sequence (erased after the call); nullopt if unknown.
  std::optional<SpecStats> take_finished_stats(int64_t seq_id);
  /// Sequences in the running batch that have not finished. A sequence that finished in the
  /// last step stays in the batch until the next step starts (its blocks already free); it is
  /// not counted (a load report right after a request's last step showed it still running).
  int32_t num_running() const;
  int32_t num_waiting() const { return static_cast<int32_t>(waiting_.size()); }
  const BlockPool& block_pool() const { return *pool_; }
  const EngineOptions& options() const { return opts_; }
  Transformer& target() { return target_; }

 private:
  struct Seq;
  Engine(Transformer& t, const Tokenizer* tok, Proposer* p, EngineOptions o);
  /// A waiting migrated sequence with its KV outside the cache (Seq::import_kv): when the step
  /// policy's admission (plan_admission) admits it now, reserves its blocks, writes its KV and
  /// moves it to running; returns whether it did. A failed load drops the import (it
  /// recomputes); otherwise it keeps waiting with import_kv unless admission passed.
  bool admit_import(Seq& s);
  /// The engine's queues as the step policy sees them (spec/step_policy.h).
  StepState step_state() const;
  StepLimits step_limits() const;
  void finish(Seq& s, FinishReason r);
  /// Appends `token` to s (stop rules); returns false when the sequence finished.
  bool emit(Seq& s, int32_t token, const SampleResult* lp, SeqEvent* ev);
  /// Verifies tree draft `d` (or a chain under typical acceptance) of s against its logit rows
  /// `seq` of `out` (row 0 the last known token, row i + 1 node i) and emits the accepted
  /// tokens plus the bonus / recovered token (spec/tree_verify.h). Returns the accepted nodes
  /// from depth 1 on; s may have finished on one of them.
  /// `picks`: the rows of `seq` are argmax_only (out.argmax_of: greedy picks, picks_suffice; or
  /// the token drawn on the backend for a plain step, draws_on_device).
  std::vector<int32_t> verify_tree(Seq& s, const DraftTree& d, const ForwardOutput& out, int32_t seq, bool picks, SeqEvent* ev);
  /// Verifies chain draft `d` (no parents; k = d.tokens.size() >= 0 tokens, k == 0 a plain
  /// decode) of s against its logit rows `seq` of `out` (row 0 the last known token, row r + 1
  /// draft token r) and emits the accepted tokens plus the recovered / bonus token. Greedy keeps
  /// the longest prefix that matches the target's argmax; sampling accepts draft token x with
  /// probability min(1, p(x) / q(x)) and on a rejection samples from norm(max(0, p - q))
  /// (Leviathan et al. 2023, Algorithm 1; without d.probs q is one-hot at x). Returns the number
  /// of draft tokens accepted; s may have finished on one of them.
  int32_t verify_chain(Seq& s, const DraftTree& d, const ForwardOutput& out, int32_t seq, bool picks, SeqEvent* ev);
  /// True when s needs of the target's logit rows only their argmax and its raw logprob
  /// (EngineOptions::argmax_on_device; greedy, no penalties, no top logprobs).
  bool picks_suffice(const Seq& s) const;
  /// True when a plain step of s may draw its token on the backend (EngineOptions::
  /// argmax_on_device; a temperature only: no top-k, top-p, min-p, penalties, top logprobs).
  bool draws_on_device(const Seq& s) const;
  /// Moves the KV of the accepted `path` (tree nodes computed at rows path[j] + 1 after the
  /// last known token at position `base`) to positions base + 1 + j (Backend::kv_copy_slots).
  Status compact_path(Seq& s, int32_t base, std::span<const int32_t> path);
  /// True when `token` ends the output of a request with params `sp` (stop_token_ids; EOS
  /// unless ignore_eos, known only with a tokenizer).
  bool is_stop_token(const SamplingParams& sp, int32_t token) const;
  /// True while s has fewer than min_tokens output tokens (SamplingParams::min_tokens): no stop
  /// counts and its stop tokens are masked (gated_row).
  static bool below_min_tokens(const Seq& s, int32_t ahead = 0);
  /// `row` as the sampler must see it for s's next output token (`ahead` tokens after those
  /// emitted): below min_tokens, a copy in min_tokens_row_ with the stop tokens (is_stop_token)
  /// at -inf (vLLM's MinTokensLogitsProcessor); otherwise `row` itself.
  const float* gated_row(const Seq& s, const float* row, int32_t vocab, int32_t ahead = 0);
  /// True when the proposer may be asked for drafts for s (then it may hold state for s, and
  /// release() is due when s finishes or is preempted).
  bool may_draft(const Seq& s) const;
  /// True when s may draft with a proposer that needs the target's hidden states: the target
  /// returns them for s's rows and s keeps them until the next propose() (spec/proposer.h).
  bool wants_hidden(const Seq& s) const;
  /// True when wants_hidden(s) and the proposer wants every computed row
  /// (Proposer::needs_every_hidden_row): hand-overs without a draft budget and after finishing.
  bool wants_every_hidden_row(const Seq& s) const;
  /// Prefix caching: hashes s's new full blocks and registers the blocks wholly within its
  /// valid KV (num_cached) in the pool. No-op when caching is off.
  void cache_full_blocks(Seq& s);
  /// The whole blocks of s's known tokens that a prefix-cache hit may cover: every one before
  /// the last known token, which must be computed to give logits.
  std::span<const BlockHash> hit_candidates(const Seq& s) const;

  Transformer& target_;
  const Tokenizer* tokenizer_;
  Proposer* proposer_;
  EngineOptions opts_;
  std::unique_ptr<KvStorage> kv_;
  std::unique_ptr<BlockPool> pool_;
  int64_t next_id_ = 1;
  std::deque<std::unique_ptr<Seq>> waiting_;
  std::vector<std::unique_ptr<Seq>> running_;
  std::vector<int64_t> aborted_;
  std::map<int64_t, SpecStats> finished_stats_;
  EngineStats stats_;
  GoodputModel goodput_;  // disable_by_goodput's step-time fit and averages (spec/goodput.h)
  std::vector<float> min_tokens_row_;  // gated_row's copy of a logit row
};

}  // namespace specserve
