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

#include "actors/kv_messages.h"      // IWYU pragma: export
#include "actors/status_messages.h"  // IWYU pragma: export
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
/// Launcher -> scheduler (Head::forget_restarts): (no_restart_atom, token): no worker restart will
/// come (every node process of up's host is gone): requests stop waiting for one
/// (scheduler.worker_restarts).
using no_restart_atom = caf::atom_constant<caf::atom("norestart")>;
/// Scheduler -> draft worker: its target shard died; forget every sequence (a restarted shard
/// numbers its sequences afresh, and must not meet the old ones' state).
using drop_seqs_atom = caf::atom_constant<caf::atom("dropseqs")>;
/// Launcher -> scheduler (same process): (launch_err_atom, replica, why, permanent): a cold start
/// failed (spawn failed, a process of the replica is still alive, or a worker exited before
/// registering; `why` ends with the worker's own reason when it left one); `permanent`: the worker
/// exited kExitConfig (cluster/process.h), so a retry would fail the same way.
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
