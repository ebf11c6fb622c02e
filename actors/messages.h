// specserve actors: every message that travels between actors, declared once.
//
// Only token ids, small index arrays, sparse probabilities and counters travel here
// (DESIGN.md section 2); activations and KV blocks never do. Each top-level message is a
// struct with a CAF type ID (CAF 0.17.6: CAF_BEGIN_TYPE_ID_BLOCK / CAF_ADD_TYPE_ID and the
// old-style `inspect`), registered on an actor_system_config by `add_message_types`.
//
// Who sends what:
//   client   -> scheduler : SubmitMsg (reply: int64 request id | error), CancelMsg, StatusQuery (reply: ClusterStatus)
//   scheduler-> request   : RequeueMsg (its replica died)
//   request  -> client    : StreamChunk (tokens, text, finish, counters)
//   scheduler-> shard     : WorkItem, AbortMsg, AttachDraftMsg
//   shard    -> request   : ShardEvent
//   shard    -> scheduler : ShardLoad (after every step)
//   worker   -> scheduler : WorkerHello (register and every state change; the token is checked)
//   scheduler-> workers   : retire_atom (the autoscaler stops the replica: quit normally); (retire_atom,
//                           why): refused, another worker holds its slot (quit failing, saying why)
//   shard    -> draft     : ProposeMsg (reply: ProposeReply), ReleaseMsg
//   scheduler-> shard     : KvPeersMsg, KvReleaseMsg, KvSendMsg (the KV data plane: actors/kv_messages.h),
//                           migrate_atom (move every sequence away: the replica drains)
//   shard    -> scheduler : MigratedSeq (a sequence left this shard; its KV waits in a staging region)
//   scheduler-> shard     : reclaim_atom (hand back up to N requests waiting in its engine, or running ones
//                           with their KV: another routed replica has room, e.g. one just promoted)
//   tp rank  -> scheduler : TpJoinMsg (reply, once every rank of the replica joined: TpGroupMsg),
//                           (rdv_set_atom, key, value) and (rdv_get_atom, key) (reply: value): the
//                           rendezvous store of a tensor-parallel group (actors/tp_group.h)
//   rank 0   -> rank r>0  : TpCommand (create a KV store, run a forward batch, copy KV slots)
//   rank r>0 -> rank 0    : (tp_done_atom, serial, rank, error) when the command is done
#pragma once

#include <caf/all.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "actors/kv_messages.h"  // IWYU pragma: export
#include "model/sampling.h"
#include "spec/proposer.h"

namespace specserve {

/// One chat turn ("system", "user", "assistant").
struct ChatTurn {
  std::string role;
  std::string content;
};

/// What a client asks for. Exactly one of `prompt`, `messages`, `prompt_token_ids` is set.
struct GenerateRequest {
  std::string prompt;                    ///< raw text, tokenized with the model's BOS rule
  std::vector<ChatTurn> messages;        ///< rendered with the model's chat template (generation prompt added)
  std::vector<int32_t> prompt_token_ids; ///< token ids, used as given
  SamplingParams sampling;               ///< temperature 0 = greedy (see model/sampling.h)
  int32_t max_tokens = 256;              ///< >= 1
  std::vector<std::string> stop;         ///< stop strings; output ends before the first match
  bool include_stop_str = false;
  int32_t priority = 0;                  ///< lower is served first (vLLM's meaning)
  double timeout_s = 0;                  ///< > 0: the request finishes with "timeout" after this long
  /// Speculation for this request: -1 the server's setting, 0 off, 1..64 at most this many
  /// draft tokens per step (capped by the server's num_speculative_tokens).
  int32_t num_speculative_tokens = -1;
};

/// Client -> scheduler. Reply: the request id (int64_t) or an error.
struct SubmitMsg {
  std::string token;      ///< the cluster token
  GenerateRequest request;
  caf::actor sink;        ///< receives StreamChunk messages
};

/// Client -> scheduler: finish a request now (finish reason "abort").
struct CancelMsg {
  std::string token;
  int64_t request_id = 0;
};

/// Request actor -> client: what the request produced since the last chunk.
struct StreamChunk {
  int64_t request_id = 0;
  std::vector<int32_t> tokens;      ///< new output token ids
  std::vector<float> logprobs;      ///< log-probability of each new token (raw logits, natural log)
  // Top-n logprobs of each new token under the same raw log_softmax, ties by lower id; the
  // arrays are empty when top_n == 0 (the request asked for none, or the chunk has no tokens).
  int32_t top_n = 0;                          ///< top logprobs per token (= sampling.logprobs)
  std::vector<int32_t> top_logprob_ids;       ///< [tokens.size() * top_n], row-major, highest first
  std::vector<float> top_logprob_values;      ///< same shape, natural log
  std::string text;                 ///< new complete text
  std::string finish_reason;        ///< "" while running; "stop", "length", "abort", "timeout", "error"
  std::string error;                ///< finish_reason "error": why
  /// finish_reason "stop": what stopped it (vLLM's stop_reason): a stop_token_ids id, or a stop
  /// string; neither (-1, "") for EOS.
  int32_t stop_token = -1;
  std::string stop_string;
  int32_t prompt_tokens = 0;        ///< set on the last chunk
  int32_t completion_tokens = 0;    ///< set on the last chunk
  int64_t num_drafts = 0;           ///< speculative counters (vLLM's meanings), set on the last chunk
  int64_t num_draft_tokens = 0;
  int64_t num_accepted_tokens = 0;
  int32_t num_requeues = 0;         ///< times the request moved to another replica after a failure
  int32_t num_migrations = 0;       ///< times it moved with its state (drain, prefill hand-over), set on the last chunk
};

/// What a replica runs for one request (prompt and sampling in token space).
struct WorkItem {
  int64_t request_id = 0;
  int32_t attempt = 0;                  ///< increases on every re-queue; stale events are dropped
  std::vector<int32_t> prompt;
  std::vector<int32_t> resume_output;   ///< output produced before a failover (not re-emitted)
  SamplingParams sampling;
  int32_t max_tokens = 256;
  std::vector<std::string> stop;
  bool include_stop_str = false;
  int32_t priority = 0;
  int32_t num_speculative_tokens = -1;  ///< see GenerateRequest
  caf::actor request_actor;             ///< receives ShardEvent messages
  // Migration (a drained replica, or a prefill worker handing over): the sampler's random stream
  // and adaptive k continue, and the KV is fetched from `kv` instead of recomputed when it can be.
  std::string rng_state;                ///< Sampler::rng_state() of the source; "" for a fresh request
  int32_t spec_k = -1;                  ///< adaptive k of the source; -1: start at the cap
  KvOffer kv;                           ///< kv.source empty: no KV to fetch
  int64_t num_drafts = 0;               ///< speculative counters of the source (SpecStats), carried on
  int64_t num_draft_tokens = 0;
  int64_t num_accepted_tokens = 0;
  std::vector<int64_t> accepted_per_pos;
};

/// Shard -> scheduler: a sequence left this shard (migration). Its events so far went to the
/// request actor before this message (same connection, so in order); the scheduler asks the
/// request actor for its WorkItem and dispatches it with this state to another replica.
struct MigratedSeq {
  int64_t request_id = 0;
  int32_t attempt = 0;
  int32_t replica = 0;          ///< the shard it left
  std::string rng_state;
  int32_t spec_k = -1;
  KvOffer kv;
  std::string reason;           ///< "drain", "prefill"
  int64_t num_drafts = 0;       ///< its speculative counters so far (SpecStats)
  int64_t num_draft_tokens = 0;
  int64_t num_accepted_tokens = 0;
  std::vector<int64_t> accepted_per_pos;
};

/// Scheduler -> shard: stop generating for a request.
struct AbortMsg {
  int64_t request_id = 0;
};

/// Shard -> request actor: one step's output for one request.
struct ShardEvent {
  int64_t request_id = 0;
  int32_t attempt = 0;
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;  ///< [tokens.size()]: the chosen token's raw logprob (natural log)
  int32_t top_n = 0;                          ///< top logprobs per token (= sampling.logprobs)
  std::vector<int32_t> top_logprob_ids;       ///< [tokens.size() * top_n], row-major, highest first
  std::vector<float> top_logprob_values;      ///< same shape, natural log
  std::string text;
  std::string finish_reason;  ///< "" while running
  std::string error;          ///< set when the shard refused the request
  int32_t stop_token = -1;    ///< see StreamChunk
  std::string stop_string;
  int64_t num_drafts = 0;     ///< counters, set when finished
  int64_t num_draft_tokens = 0;
  int64_t num_accepted_tokens = 0;
};

/// Shard -> scheduler after each step (and when it becomes idle): its load.
struct ShardLoad {
  int32_t replica = 0;
  int32_t free_kv_blocks = 0;  ///< free blocks of the cache, less those migrated requests being fetched need
  int32_t total_kv_blocks = 0;
  int32_t num_running = 0;
  int32_t num_waiting = 0;     ///< waiting in the engine, plus migrated requests whose KV is being fetched
  int32_t num_fetching = 0;    ///< of num_waiting: the migrated requests whose KV is being fetched
  int64_t num_steps = 0;
  int64_t generated_tokens = 0;
  int64_t num_drafts = 0;
  int64_t num_draft_tokens = 0;
  int64_t num_accepted_tokens = 0;
  double forward_seconds = 0;
  double draft_seconds = 0;
  std::vector<int64_t> finished;  ///< request ids that finished in this step
  int64_t received = 0;           ///< WorkItems received so far (the head's in-flight accounting)
  int64_t prompt_tokens = 0;      ///< prompt tokens of every request added (EngineStats::prompt_tokens)
  /// [k]: engine-wide totals of SpecStats::accepted_per_pos — drafts whose token at position i
  /// was accepted (vLLM's spec_decode_num_accepted_tokens_per_pos); sums to num_accepted_tokens.
  /// Counted when a sequence finishes, like the other speculative counters.
  std::vector<int64_t> accepted_per_pos;
  /// Prefix cache, engine-wide totals (EngineStats: vLLM V1's prefix_cache_queries /
  /// prefix_cache_hits): tokens looked up at admission, and tokens found cached.
  int64_t prefix_cache_queries = 0;
  int64_t prefix_cache_hits = 0;
  int64_t kv_imported_tokens = 0;    ///< tokens of migrated sequences whose KV arrived (totals)
  int64_t kv_recomputed_tokens = 0;  ///< tokens of migrated sequences that came without usable KV
  int64_t num_reclaims = 0;          ///< reclaim_atom messages handled so far (the head's in-flight accounting)
  int64_t num_preemptions = 0;       ///< EngineStats::num_preemptions (engine total)
  /// disable_by_goodput, engine totals (EngineStats): sequence-steps that could draft in which the
  /// policy let the sequence draft / left it out. Both 0 when the policy is off.
  int64_t goodput_drafting = 0;
  int64_t goodput_skipped = 0;
  /// [DraftSource] (spec/proposer.h): EngineStats::by_source, engine totals counted at each
  /// verification step. Empty from a worker that sent none.
  std::vector<int64_t> drafts_by_source, draft_tokens_by_source, accepted_by_source;
};

/// The `source` name of entry i of ShardLoad's *_by_source vectors (spec/proposer.h
/// draft_source_name: "model", "prompt_lookup", "cached_requests"); nullptr past the last source.
/// For the front ends, which may not include spec/ (../shared/DESIGN.md).
inline const char* load_source_name(size_t i) {
  return i < static_cast<size_t>(kNumDraftSources) ? draft_source_name(static_cast<DraftSource>(i)) : nullptr;
}

/// into[i] += from[i], into grown to from's size (summing ShardLoad's per-position and
/// per-source counters).
inline void add_counts(std::vector<int64_t>& into, const std::vector<int64_t>& from) {
  if (into.size() < from.size()) into.resize(from.size(), 0);
  for (size_t i = 0; i < from.size(); ++i) into[i] += from[i];
}

/// Worker -> scheduler: registration and every later state change.
struct WorkerHello {
  std::string token;
  std::string node;
  std::string role;       ///< "target_shard", "draft_worker"
  int32_t replica = 0;
  int32_t rank = 0;
  int32_t pid = 0;
  std::string state;      ///< "loading", "warming", "ready", "failed"
  std::string error;      ///< state "failed": why
  double load_seconds = 0;
  double warmup_seconds = 0;
  std::string draft_host; ///< draft_worker: where its own port listens (the shard connects there)
  int32_t draft_port = 0; ///< 0: same actor system, use `self` directly
  int32_t total_kv_blocks = 0;
  int32_t block_size = 0;
  int32_t max_num_seqs = 0;
  int32_t max_model_len = 0;
  caf::actor self;
  std::string kv_address;  ///< target shard: its UCX worker address (bytes); "" when it has no data plane
  uint64_t kv_process = 0;   ///< with kv_address: kv_process_id of its process (KvPeer::process)
  int32_t kv_cuda_device = -1;  ///< with kv_address: its CUDA device ordinal, -1 on the CPU (KvPeer::cuda_device)
  bool kv_nccl = false;      ///< with kv_address: it joins NCCL KV channels (KvPeer::nccl)
  std::string kv_machine;    ///< with kv_address: its machine's hostname (KvPeer::machine)
  bool prefill_only = false; ///< a prefill_worker: runs prompts to their first token, then hands them over
  /// Its matmul arithmetic (actors/backend_factory.h compute_description: "avx512 fp32",
  /// "amx bf16", "cuda bf16 weights"): shards that continue each other's sequences should agree.
  std::string compute;
};

/// Scheduler -> shard: the replica's draft worker is ready (in-process handle, or host:port);
/// both unset: it is gone, decode without drafts.
struct AttachDraftMsg {
  caf::actor draft;        ///< valid when draft_port == 0
  std::string draft_host;
  int32_t draft_port = 0;
};

/// One sequence in a propose request. The draft worker keeps each sequence's tokens; a message
/// carries only those past `offset` (the number it already holds).
struct DraftSeq {
  int64_t seq_id = 0;
  int32_t prompt_len = 0;
  int32_t offset = 0;                 ///< tokens the worker already has for this sequence
  std::vector<int32_t> new_tokens;    ///< tokens[offset:]
  int32_t num_tokens = 0;             ///< k
  SamplingParams sampling;
};

/// Shard -> draft worker. Reply: ProposeReply.
struct ProposeMsg {
  std::string token;
  std::vector<DraftSeq> seqs;
};

/// A draft for one sequence; probabilities are sparse (ids, values) per draft token.
struct DraftReplySeq {
  std::vector<int32_t> tokens;
  std::vector<int32_t> parents;
  std::vector<std::vector<int32_t>> prob_ids;
  std::vector<std::vector<float>> prob_values;
  bool resync = false;  ///< the worker's copy of the tokens did not match `offset`: send them all again
  int32_t source = 0;   ///< DraftTree::source (spec/proposer.h DraftSource), for the counters by source
};

struct ProposeReply {
  std::string error;  ///< non-empty: the worker failed (the step decodes without drafts)
  std::vector<DraftReplySeq> seqs;
};

/// Shard -> draft worker: drop these sequences' state.
struct ReleaseMsg {
  std::string token;
  std::vector<int64_t> seq_ids;
};

/// Anyone with the token -> scheduler. Reply: ClusterStatus.
struct StatusQuery {
  std::string token;
};

struct WorkerStatus {
  std::string node;
  std::string role;
  int32_t replica = 0;
  int32_t rank = 0;
  int32_t pid = 0;
  std::string state;
  std::string error;
  double load_seconds = 0;
  double warmup_seconds = 0;
  std::string compute;  ///< WorkerHello::compute
};

struct ReplicaStatus {
  int32_t replica = 0;
  bool ready = false;
  int32_t assigned = 0;       ///< requests on it now (those on its prefill worker included)
  ShardLoad load;             ///< its target shard's (the decode shard's, with a prefill worker)
  /// Disaggregated prefill: the replica's prefill worker's last load (its engine's totals: the
  /// prompts it took and their first tokens); all zero without one; before its first report,
  /// zero but its KV cache (from its hello: all free).
  bool has_prefill_worker = false;
  ShardLoad prefill_load;
  // Lifecycle (scheduler/autoscale_policy.h ReplicaState): "starting", "loading", "warming",
  // "ready" (routed), "draining", "standby" (loaded, warm, not routed), "stopped".
  std::string state;
  double state_seconds = 0;                 ///< time in the current state
  std::vector<double> state_seconds_total;  ///< [7]: time spent in each state, in the order above
  double cold_start_seconds = 0;            ///< last cold start: process start requested -> ready; 0: none
  /// Its last warm promotion, each measured from the autoscaler's decision (0: none):
  double promotion_routable_seconds = 0;    ///< -> routed (a state flip in the head)
  double promotion_dispatch_seconds = 0;    ///< -> the first request sent to it
  double promotion_seconds = 0;             ///< -> the first token of the first request sent to it with none yet
  int64_t num_promotions = 0;
  int64_t num_cold_starts = 0;
  int32_t num_start_failures = 0;  ///< failed starts in a row (0 once it is ready again)
  std::string last_start_error;    ///< why its last start failed; "" once it is ready
  /// The topology gives it a draft worker, which is down (or failed to load): its target shard
  /// serves without speculation (under an autoscaler, until a standby replica replaces it).
  bool draft_lost = false;
};

/// The head's autoscaler (all zero / empty when it does not run).
struct AutoscaleStatus {
  bool enabled = false;
  int32_t min_replicas = 0;
  int32_t max_replicas = 0;
  int32_t warm_pool = 0;
  int32_t target_ready = 0;        ///< the policy's desired ready replicas
  int32_t wanted = 0;              ///< what the load wants now (no hysteresis; AutoscaleDecision::wanted)
  /// Cold starts are held back (CPU-only host: until the promoted replica's first token, at most
  /// 5 s); afterwards only what the load then wants is started, so ready may stay below target.
  bool starts_held = false;
  int32_t ongoing = 0;             ///< queued + assigned at the last tick
  double ttft_p90_seconds = 0;     ///< over the look-back window, new replicas' grace excluded
  int64_t num_promotions = 0;
  int64_t num_cold_starts = 0;    ///< process starts requested (a failed start is one too)
  /// Starts that failed (the launcher's error, a target shard that failed to load, a start
  /// abandoned after start_timeout_s): never ready.
  int64_t num_failed_starts = 0;
  int64_t num_drains = 0;
  int64_t num_stops = 0;
  std::string last_reason;         ///< why the target last changed
  double last_change_seconds = 0;  ///< head uptime at that change
  std::vector<double> cold_start_seconds;  ///< the last 64 cold starts (process start requested -> ready)
  /// The last 64 warm promotions (the start-up promotion is not one), each measured from the
  /// autoscaler's decision on the head's clock:
  /// decision -> the replica is routed (the head's own share: a state flip, microseconds);
  std::vector<double> promotion_routable_seconds;
  /// decision -> the first request sent to it (queued at the head, or handed back by a busy
  /// replica's engine: reclaim_atom), only when that request had already arrived at the head at
  /// the decision; otherwise the promotion is not measured (num_promotions_without_waiting_work);
  std::vector<double> promotion_dispatch_seconds;
  /// decision -> the first token of that request made on the promoted replica (the rest is the
  /// replica's first engine step: one forward pass, plus the message hops shard -> request actor
  /// -> head); a request that already streamed tokens elsewhere (moved, or re-queued) counts with
  /// the first token it gets there.
  std::vector<double> promotion_seconds;
  /// The last 64 scale-ups covered by a cold start (not the pool): decision -> first token, to
  /// set beside promotion_seconds.
  std::vector<double> cold_scale_up_seconds;
  /// Scale-ups (warm or cold) not measured: the first request the replica got arrived after the
  /// decision (no work waited for it), or it left ready before getting any request.
  int64_t num_promotions_without_waiting_work = 0;
};

struct ClusterStatus {
  std::string cluster;
  std::string model;
  std::string speculative_method;  ///< "" when none
  /// The speculative settings in one line (config/topology.h describe_speculative: method, k,
  /// model, lookup bounds, history), "" when none.
  std::string speculative;
  std::vector<WorkerStatus> workers;
  std::vector<ReplicaStatus> replicas;
  int32_t queued = 0;
  int32_t running = 0;
  int64_t finished = 0;
  int64_t requeued = 0;
  bool draining = false;
  int32_t max_model_len = 0;  ///< smallest max_model_len among registered target shards (WorkerHello::max_model_len); 0 when none
  AutoscaleStatus autoscale;
  /// Sequences handed off their replica (drain, rebalance, KV pressure) with their state,
  /// counted at the hand-off: whether their KV arrived or was recomputed is in the kv_* counters.
  int64_t migrated = 0;
  int64_t kv_migrated_tokens = 0;    ///< tokens whose KV arrived with them (not recomputed)
  int64_t kv_recomputed_tokens = 0;  ///< tokens of migrated sequences whose KV had to be recomputed
  int32_t tensor_parallel_size = 1;  ///< ranks per replica (models.target.tensor_parallel_size)
  /// The counters (tokens, speculative and prefix-cache counters, seconds, accepted_per_pos,
  /// goodput decisions) of replica incarnations that ended: a replica's load starts again from 0
  /// when its shard stops, dies or is retired, and its last totals are added here. The cluster's
  /// totals are these plus every replica's load, and never go back. Gauge fields stay 0.
  ShardLoad ended;
};

// ---- inspect (CAF 0.17's serialization hook) ----

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, SamplingParams& x) {
  return f(caf::meta::type_name("SamplingParams"), x.temperature, x.top_k, x.top_p, x.min_p, x.seed, x.has_seed,
           x.presence_penalty, x.frequency_penalty, x.repetition_penalty, x.logprobs, x.stop_token_ids, x.ignore_eos,
           x.min_tokens);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, ChatTurn& x) {
  return f(caf::meta::type_name("ChatTurn"), x.role, x.content);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, GenerateRequest& x) {
  return f(caf::meta::type_name("GenerateRequest"), x.prompt, x.messages, x.prompt_token_ids, x.sampling, x.max_tokens,
           x.stop, x.include_stop_str, x.priority, x.timeout_s, x.num_speculative_tokens);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, SubmitMsg& x) {
  return f(caf::meta::type_name("SubmitMsg"), x.token, x.request, x.sink);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, CancelMsg& x) {
  return f(caf::meta::type_name("CancelMsg"), x.token, x.request_id);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, StreamChunk& x) {
  return f(caf::meta::type_name("StreamChunk"), x.request_id, x.tokens, x.logprobs, x.top_n, x.top_logprob_ids,
           x.top_logprob_values, x.text, x.finish_reason, x.error, x.stop_token, x.stop_string,
           x.prompt_tokens, x.completion_tokens, x.num_drafts, x.num_draft_tokens, x.num_accepted_tokens, x.num_requeues,
           x.num_migrations);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, WorkItem& x) {
  return f(caf::meta::type_name("WorkItem"), x.request_id, x.attempt, x.prompt, x.resume_output, x.sampling, x.max_tokens,
           x.stop, x.include_stop_str, x.priority, x.num_speculative_tokens, x.request_actor, x.rng_state, x.spec_k, x.kv,
           x.num_drafts, x.num_draft_tokens, x.num_accepted_tokens, x.accepted_per_pos);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, MigratedSeq& x) {
  return f(caf::meta::type_name("MigratedSeq"), x.request_id, x.attempt, x.replica, x.rng_state, x.spec_k, x.kv, x.reason,
           x.num_drafts, x.num_draft_tokens, x.num_accepted_tokens, x.accepted_per_pos);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, AbortMsg& x) {
  return f(caf::meta::type_name("AbortMsg"), x.request_id);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, ShardEvent& x) {
  return f(caf::meta::type_name("ShardEvent"), x.request_id, x.attempt, x.tokens, x.logprobs, x.top_n, x.top_logprob_ids,
           x.top_logprob_values, x.text, x.finish_reason, x.error, x.stop_token, x.stop_string, x.num_drafts,
           x.num_draft_tokens, x.num_accepted_tokens);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, ShardLoad& x) {
  return f(caf::meta::type_name("ShardLoad"), x.replica, x.free_kv_blocks, x.total_kv_blocks, x.num_running, x.num_waiting, x.num_fetching,
           x.num_steps, x.generated_tokens, x.num_drafts, x.num_draft_tokens, x.num_accepted_tokens, x.forward_seconds,
           x.draft_seconds, x.finished, x.received, x.prompt_tokens, x.accepted_per_pos, x.prefix_cache_queries,
           x.prefix_cache_hits, x.kv_imported_tokens, x.kv_recomputed_tokens, x.num_reclaims, x.num_preemptions,
           x.goodput_drafting, x.goodput_skipped, x.drafts_by_source, x.draft_tokens_by_source, x.accepted_by_source);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, WorkerHello& x) {
  return f(caf::meta::type_name("WorkerHello"), x.token, x.node, x.role, x.replica, x.rank, x.pid, x.state, x.error,
           x.load_seconds, x.warmup_seconds, x.draft_host, x.draft_port, x.total_kv_blocks, x.block_size, x.max_num_seqs,
           x.max_model_len, x.self, x.kv_address, x.prefill_only, x.kv_process, x.kv_cuda_device,
           x.kv_nccl, x.kv_machine, x.compute);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, AttachDraftMsg& x) {
  return f(caf::meta::type_name("AttachDraftMsg"), x.draft, x.draft_host, x.draft_port);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, DraftSeq& x) {
  return f(caf::meta::type_name("DraftSeq"), x.seq_id, x.prompt_len, x.offset, x.new_tokens, x.num_tokens, x.sampling);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, ProposeMsg& x) {
  return f(caf::meta::type_name("ProposeMsg"), x.token, x.seqs);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, DraftReplySeq& x) {
  return f(caf::meta::type_name("DraftReplySeq"), x.tokens, x.parents, x.prob_ids, x.prob_values, x.resync, x.source);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, ProposeReply& x) {
  return f(caf::meta::type_name("ProposeReply"), x.error, x.seqs);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, ReleaseMsg& x) {
  return f(caf::meta::type_name("ReleaseMsg"), x.token, x.seq_ids);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, StatusQuery& x) {
  return f(caf::meta::type_name("StatusQuery"), x.token);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, WorkerStatus& x) {
  return f(caf::meta::type_name("WorkerStatus"), x.node, x.role, x.replica, x.rank, x.pid, x.state, x.error,
           x.load_seconds, x.warmup_seconds, x.compute);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, ReplicaStatus& x) {
  return f(caf::meta::type_name("ReplicaStatus"), x.replica, x.ready, x.assigned, x.load, x.has_prefill_worker,
           x.prefill_load, x.state, x.state_seconds,
           x.state_seconds_total, x.cold_start_seconds, x.promotion_routable_seconds, x.promotion_dispatch_seconds,
           x.promotion_seconds, x.num_promotions, x.num_cold_starts, x.num_start_failures, x.last_start_error, x.draft_lost);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, AutoscaleStatus& x) {
  return f(caf::meta::type_name("AutoscaleStatus"), x.enabled, x.min_replicas, x.max_replicas, x.warm_pool, x.target_ready,
           x.wanted, x.starts_held, x.ongoing, x.ttft_p90_seconds, x.num_promotions, x.num_cold_starts, x.num_failed_starts, x.num_drains, x.num_stops, x.last_reason,
           x.last_change_seconds, x.cold_start_seconds, x.promotion_routable_seconds, x.promotion_dispatch_seconds,
           x.promotion_seconds, x.cold_scale_up_seconds, x.num_promotions_without_waiting_work);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, ClusterStatus& x) {
  return f(caf::meta::type_name("ClusterStatus"), x.cluster, x.model, x.speculative_method, x.speculative, x.workers, x.replicas, x.queued,
           x.running, x.finished, x.requeued, x.draining, x.max_model_len, x.autoscale, x.migrated, x.kv_migrated_tokens,
           x.kv_recomputed_tokens, x.tensor_parallel_size, x.ended);
}

// ---- atoms (CAF 0.17: at most 10 characters) ----
using step_atom = caf::atom_constant<caf::atom("step")>;
using requeue_atom = caf::atom_constant<caf::atom("requeue")>;
using timeout_atom = caf::atom_constant<caf::atom("timeout")>;
using drain_atom = caf::atom_constant<caf::atom("drain")>;
using tick_atom = caf::atom_constant<caf::atom("tick")>;
using cancel_atom = caf::atom_constant<caf::atom("cancel")>;
/// Scheduler -> target shard / draft worker: the autoscaler stops this replica; quit normally.
using retire_atom = caf::atom_constant<caf::atom("retire")>;
/// Scheduler -> itself: an autoscaler tick.
using autoscale_atom = caf::atom_constant<caf::atom("autoscale")>;
/// To the scheduler itself: a lost replica's wait for its restart is over (look at the queue).
using restart_due_atom = caf::atom_constant<caf::atom("restartdue")>;
/// Scheduler -> draft worker: its target shard died; forget every sequence (a restarted shard
/// numbers its sequences afresh, and must not meet the old ones' state).
using drop_seqs_atom = caf::atom_constant<caf::atom("dropseqs")>;
/// Launcher -> scheduler (same process): (launch_err_atom, replica, why): a cold start failed
/// (spawn failed, a process of the replica is still alive, or a worker exited before registering).
using launch_err_atom = caf::atom_constant<caf::atom("launch_err")>;
/// Request actor -> scheduler (same process): (first_tok_atom, request id, seconds since submission,
/// bool first of the request): the first token of each attempt (a moved request's next replica
/// reports again; only the request's very first token is a TTFT sample).
using first_tok_atom = caf::atom_constant<caf::atom("first_tok")>;
using migrate_atom = caf::atom_constant<caf::atom("migrate")>;
using drain_rep_atom = caf::atom_constant<caf::atom("drainrep")>;
using slot_check_atom = caf::atom_constant<caf::atom("slotcheck")>;  // head -> itself: a slot conflict's wait ended
/// Scheduler -> target shard: (reclaim_atom, int32 n, bool running): hand back up to n requests as
/// MigratedSeq (reason "rebalance"), then a ShardLoad: those still waiting in the engine first
/// (the last queued first); with `running`, then running sequences with their KV offered (the
/// last admitted first; none with fewer than 16 tokens left to generate). Sent when another
/// routed replica has room and the head's queue is empty (scheduler/rebalance.h).
using reclaim_atom = caf::atom_constant<caf::atom("reclaim")>;
/// Target shard's fetch thread -> the shard (same process): (kv_fetched_atom, fetch serial): the
/// KV of a migrated request has arrived in host memory, or its transfer failed
/// (actors/target_shard_migration.cpp).
using kv_fetched_atom = caf::atom_constant<caf::atom("kvfetched")>;

/// Registers the message types above (and CAF's I/O module) on `cfg`.
void add_message_types(caf::actor_system_config& cfg);

}  // namespace specserve

// The tensor-parallel group's messages (TpJoinMsg, TpGroupMsg, TpCommand, their atoms); their
// type IDs are in the block below.
#include "actors/tp_messages.h"  // IWYU pragma: export

CAF_BEGIN_TYPE_ID_BLOCK(specserve, caf::first_custom_type_id)
CAF_ADD_TYPE_ID(specserve, (specserve::SubmitMsg))
CAF_ADD_TYPE_ID(specserve, (specserve::CancelMsg))
CAF_ADD_TYPE_ID(specserve, (specserve::StreamChunk))
CAF_ADD_TYPE_ID(specserve, (specserve::WorkItem))
CAF_ADD_TYPE_ID(specserve, (specserve::AbortMsg))
CAF_ADD_TYPE_ID(specserve, (specserve::ShardEvent))
CAF_ADD_TYPE_ID(specserve, (specserve::ShardLoad))
CAF_ADD_TYPE_ID(specserve, (specserve::WorkerHello))
CAF_ADD_TYPE_ID(specserve, (specserve::AttachDraftMsg))
CAF_ADD_TYPE_ID(specserve, (specserve::ProposeMsg))
CAF_ADD_TYPE_ID(specserve, (specserve::ProposeReply))
CAF_ADD_TYPE_ID(specserve, (specserve::ReleaseMsg))
CAF_ADD_TYPE_ID(specserve, (specserve::StatusQuery))
CAF_ADD_TYPE_ID(specserve, (specserve::ClusterStatus))
CAF_ADD_TYPE_ID(specserve, (specserve::GenerateRequest))
CAF_ADD_TYPE_ID(specserve, (specserve::MigratedSeq))
CAF_ADD_TYPE_ID(specserve, (specserve::KvPeersMsg))
CAF_ADD_TYPE_ID(specserve, (specserve::KvReleaseMsg))
CAF_ADD_TYPE_ID(specserve, (specserve::TpJoinMsg))
CAF_ADD_TYPE_ID(specserve, (specserve::TpGroupMsg))
CAF_ADD_TYPE_ID(specserve, (specserve::TpCommand))
CAF_ADD_TYPE_ID(specserve, (specserve::KvSendMsg))
CAF_END_TYPE_ID_BLOCK(specserve)
