#include "actors/target_shard.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <map>
#include <thread>

#include <caf/io/all.hpp>

#include "actors/backend_factory.h"
#include "actors/gateway.h"
#include "actors/kv_data_plane.h"
#include "actors/messages.h"
#include "actors/proposer_factory.h"
#include "actors/remote_proposer.h"
#include "actors/tp_group.h"
#include "core/logging.h"
#include "model/model_fingerprint.h"
#include "model/model_loader.h"
#include "scheduler/dispatch.h"

namespace specserve {
namespace {

using Clock = std::chrono::steady_clock;

struct Running {
  int64_t seq_id = 0;
  int32_t attempt = 0;
  caf::actor request_actor;
  int64_t num_tokens = 0;  // prompt + output so far
  int32_t top_n = 0;       // top logprobs per token: sampling.logprobs, at most the vocabulary
  int64_t end_tokens = 0;  // prompt + max_tokens: num_tokens when it finishes by length
};

// A running sequence with fewer tokens than this left to generate is not moved to balance load
// (reclaim_atom): moving it (export, KV offer, fetch, re-admission) costs about as much as
// finishing it here.
constexpr int64_t kMinTokensLeftToRebalance = 16;

// A migrated request whose KV is being fetched on a thread of its own (KvFetch::run), so that
// the shard keeps stepping its other sequences meanwhile.
struct PendingImport {
  WorkItem item;
  std::shared_ptr<KvFetch> fetch;
  std::thread thread;
  bool aborted = false;  // aborted meanwhile: answered already, dropped when the fetch returns
  bool drain = false;    // the shard drained meanwhile: it leaves again as soon as it is added
};

struct ShardState {
  WorkerConfig cfg;
  std::unique_ptr<Backend> backend;
  // Tensor parallelism (tensor_parallel_size > 1, actors/tp_group.h): this rank 0's communicator
  // and its link to the other ranks. Declared before the model, which uses both.
  std::unique_ptr<Communicator> tp_comm;
  std::unique_ptr<ActorTensorParallelPeers> tp_peers;
  LoadedModel model;
  std::unique_ptr<Proposer> local_proposer;  // built here (no draft worker)
  std::unique_ptr<ProposerSlot> slot;        // filled by AttachDraftMsg
  std::unique_ptr<Engine> engine;
  EngineOptions engine_options;
  std::map<int64_t, Running> by_request;
  std::map<int64_t, int64_t> by_seq;  // seq id -> request id
  bool step_pending = false;
  int64_t received = 0;  // WorkItems received
  double load_s = 0, warmup_s = 0;
  std::string method;
  // The KV data plane (actors/kv_data_plane.h); null when UCX is unusable here (migrations then
  // recompute).
  std::unique_ptr<KvDataPlane> plane;
  KvExportFormat kv_format;
  int64_t kv_imported_tokens = 0;    // tokens of migrated sequences whose KV arrived
  int64_t kv_recomputed_tokens = 0;  // tokens of migrated sequences that recompute
  bool quit_when_empty = false;      // drained before the worker stops: quit once nothing is left
  bool expiry_pending = false;
  int64_t num_reclaims = 0;          // reclaim_atom messages handled (ShardLoad::num_reclaims)
  std::map<int64_t, PendingImport> fetching;  // by fetch serial
  int64_t next_fetch = 1;

  // NOTE: a fetch thread ends by its transfer's deadline; joining here (the actor's exit) waits
  // for it at most that long, and keeps it from outliving the data plane it reads through.
  ~ShardState() {
    for (auto& [serial, p] : fetching) {
      if (p.thread.joinable()) p.thread.join();
    }
  }
};

bool prefill_only(const ShardState& s) { return s.cfg.role == WorkerRole::kPrefillWorker; }

using Self = caf::stateful_actor<ShardState>*;

WorkerHello hello(Self self, const std::string& state, const std::string& error = "") {
  const auto& s = self->state;
  WorkerHello h;
  h.token = s.cfg.token;
  h.node = s.cfg.node;
  h.role = worker_role_name(s.cfg.role);
  h.replica = s.cfg.replica;
  h.rank = s.cfg.rank;
  h.pid = static_cast<int32_t>(::getpid());
  h.state = state;
  h.error = error;
  h.load_seconds = s.load_s;
  h.warmup_seconds = s.warmup_s;
  h.total_kv_blocks = static_cast<int32_t>(s.engine_options.num_kv_blocks);
  h.block_size = s.engine_options.block_size;
  h.max_num_seqs = s.engine_options.max_num_seqs;
  h.max_model_len = s.engine ? s.engine->options().max_model_len : 0;
  h.self = caf::actor_cast<caf::actor>(self);
  h.kv_address = s.plane ? s.plane->address() : "";
  h.prefill_only = prefill_only(s);
  return h;
}

Status build_engine(ShardState& s) {
  Proposer* p = s.local_proposer ? s.local_proposer.get() : s.slot.get();
  auto e = Engine::create(*s.model.model, s.model.tokenizer.get(), p, s.engine_options);
  if (!e.ok()) return e.status();
  s.engine = std::move(*e);
  return Status();
}

// Loads the model and proposer, runs a warm-up request through the engine, and rebuilds the
// engine so that counters start at zero.
Status load_and_warm(Self self) {
  auto& s = self->state;
  const Topology& t = s.cfg.topology;
  auto backend = make_backend_for_device(std::string("the ") + worker_role_name(s.cfg.role) + "'s device",
                                         s.cfg.device.to_string(), s.cfg.threads);
  if (!backend.ok()) return backend.status();
  s.backend = std::move(*backend);
  const int32_t tp = t.models.target.tensor_parallel_size;
  LoadOptions lo;
  if (tp > 1) {
    // Rank 0 of a tensor-parallel group: the other ranks are actors of their own (tp_rank.h).
    auto conn = connect_tp_group(self->system(), s.cfg, caf::actor_cast<caf::actor>(self));
    if (!conn.ok()) return conn.status();
    s.tp_comm = std::move(conn->comm);
    std::vector<caf::actor> followers(conn->group.ranks.begin() + 1, conn->group.ranks.end());
    for (const auto& f : followers) self->monitor(f);
    // A forward ends within Gloo's 60 s collective timeout on every rank; the first command
    // (create_kv, at warm-up) may wait for ranks still loading their shard.
    s.tp_peers = std::make_unique<ActorTensorParallelPeers>(self->system(), std::move(followers), std::chrono::seconds(90),
                                                            tp_join_timeout(t));
    lo.tp_rank = 0;
    lo.tp_size = tp;
    lo.communicator = s.tp_comm.get();
  }
  auto m = load_model(t.models.target.path, *s.backend, /*quiet=*/true, lo);
  if (!m.ok()) return Status(m.status().code(), t.where("models.target.path") + ": models.target.path: " + m.status().message());
  s.model = std::move(*m);
  if (s.tp_peers) s.model.model->set_tensor_parallel_peers(s.tp_peers.get());
  s.load_s = s.model.load_seconds;
  auto eo = engine_options_for(t, s.model.model->config());
  if (!eo.ok()) return eo.status();
  s.engine_options = *eo;
  // NOTE: a prefill worker emits one token per request, so it has nothing to speculate on.
  if (t.models.speculative && !prefill_only(s)) {
    s.method = speculative_method_name(t.models.speculative->method);
    if (s.cfg.remote_draft) {
      s.slot = std::make_unique<ProposerSlot>(s.method);
    } else {
      ProposerBuildOptions bo;
      bo.max_model_len = s.engine_options.max_model_len;
      auto p = build_proposer(*t.models.speculative, s.model, *s.backend, bo);
      if (!p.ok()) return Status(p.status().code(), t.where("models.speculative") + ": models.speculative: " + p.status().message());
      s.local_proposer = std::move(*p);
    }
  }
  SPECSERVE_RETURN_IF_ERROR(build_engine(s));
  self->send(s.cfg.scheduler, hello(self, "warming"));
  const auto t0 = Clock::now();
  GenerateParams warm;
  warm.prompt = s.model.tokenizer->encode("Warm-up: the quick brown fox jumps over the lazy dog. The quick brown fox", true, false);
  warm.max_tokens = 8;
  warm.sampling.temperature = 0;
  warm.sampling.ignore_eos = true;
  auto id = s.engine->add_request(warm);
  if (!id.ok()) return id.status();
  std::vector<SeqEvent> events;
  while (s.engine->has_work()) SPECSERVE_RETURN_IF_ERROR(s.engine->step(&events));
  SPECSERVE_RETURN_IF_ERROR(build_engine(s));
  s.warmup_s = std::chrono::duration<double>(Clock::now() - t0).count();
  // NOTE: a tensor-parallel rank 0 holds only its shard of each block's KV heads: its sequences
  // cannot be exported whole, so they recompute where they move (no data plane).
  auto plane = tp > 1 ? Expected<std::unique_ptr<KvDataPlane>>(unsupported("tensor_parallel_size > 1: KV export of sharded blocks is not built"))
                      : KvDataPlane::create(kv_peer_name(worker_role_name(s.cfg.role), s.cfg.replica));
  if (plane.ok()) {
    s.plane = std::move(*plane);
    s.kv_format = kv_export_format(s.engine->kv_storage(), model_fingerprint(*s.model.file));
  } else {
    get_logger("actors")->warn("replica {}: no KV data plane ({}); sequences that migrate here recompute their KV",
                               s.cfg.replica, plane.status().to_string());
  }
  return Status();
}

void schedule_step(Self self) {
  if (self->state.step_pending) return;
  self->state.step_pending = true;
  self->send(self, step_atom::value);
}

ShardLoad load_of(ShardState& s) {
  ShardLoad l;
  l.replica = s.cfg.replica;
  const BlockPool& pool = s.engine->block_pool();
  l.total_kv_blocks = pool.num_blocks();
  l.num_running = s.engine->num_running();
  l.num_waiting = s.engine->num_waiting();
  // Migrated requests whose KV is being fetched are not in the engine yet, but will be: they
  // count as waiting, and the blocks they need as taken (else the head would place work on
  // room they are about to fill).
  int64_t fetching_blocks = 0;
  for (const auto& [serial, p] : s.fetching) {
    if (p.aborted) continue;
    ++l.num_waiting;
    fetching_blocks += blocks_needed(static_cast<int64_t>(p.item.prompt.size() + p.item.resume_output.size()), pool.block_size());
  }
  l.free_kv_blocks = static_cast<int32_t>(std::max<int64_t>(0, pool.num_free() - fetching_blocks));
  const EngineStats& st = s.engine->stats();
  l.num_steps = st.num_steps;
  l.generated_tokens = st.generated_tokens;
  l.num_drafts = st.spec.num_drafts;
  l.num_draft_tokens = st.spec.num_draft_tokens;
  l.num_accepted_tokens = st.spec.num_accepted_tokens;
  l.forward_seconds = st.forward_seconds;
  l.draft_seconds = st.draft_seconds;
  l.received = s.received;
  l.prompt_tokens = st.prompt_tokens;
  l.accepted_per_pos = st.spec.accepted_per_pos;
  l.prefix_cache_queries = st.prefix_cache_queries;
  l.prefix_cache_hits = st.prefix_cache_hits;
  l.kv_imported_tokens = s.kv_imported_tokens;
  l.kv_recomputed_tokens = s.kv_recomputed_tokens;
  l.num_reclaims = s.num_reclaims;
  return l;
}

// Offers older than this are freed even if no receiver answered (it died or recomputed).
constexpr auto kOfferLifetime = std::chrono::seconds(60);

// Control messages of the data plane and the lifecycle come from the scheduler only.
bool from_scheduler(Self self) {
  return self->current_sender() == caf::actor_cast<caf::strong_actor_ptr>(self->state.cfg.scheduler);
}

void maybe_quit(Self self) {
  auto& s = self->state;
  if (!s.quit_when_empty || !s.by_request.empty() || !s.fetching.empty() || (s.plane && s.plane->num_offers() > 0)) return;
  get_logger("actors")->info("replica {}: drained (every sequence moved away); the worker stops", s.cfg.replica);
  self->quit();
}

void schedule_expiry(Self self) {
  auto& s = self->state;
  if (s.expiry_pending || !s.plane || s.plane->num_offers() == 0) return;
  s.expiry_pending = true;
  self->delayed_send(self, std::chrono::seconds(5), tick_atom::value);
}

// Moves one request's sequence off this shard: its state and (when it has a data plane) a KV
// offer go to the scheduler, which hands them to another replica. Its events so far were sent
// before this, on the same connection, so the request actor has them all.
void migrate_out(Self self, int64_t rid, const std::string& reason) {
  auto& s = self->state;
  auto it = s.by_request.find(rid);
  if (it == s.by_request.end()) return;
  const Running r = it->second;
  auto ex = s.engine->export_sequence(r.seq_id);
  if (!ex.ok()) return;
  MigratedSeq m;
  m.request_id = rid;
  m.attempt = r.attempt;
  m.replica = s.cfg.replica;
  m.rng_state = ex->rng_state;
  m.spec_k = ex->k;
  m.reason = reason;
  m.num_drafts = ex->spec.num_drafts;
  m.num_draft_tokens = ex->spec.num_draft_tokens;
  m.num_accepted_tokens = ex->spec.num_accepted_tokens;
  m.accepted_per_pos = ex->spec.accepted_per_pos;
  if (s.plane && ex->num_cached > 0) {
    std::vector<int32_t> tokens = ex->prompt;
    tokens.insert(tokens.end(), ex->output.begin(), ex->output.end());
    tokens.resize(static_cast<size_t>(ex->num_cached));
    auto o = s.plane->offer(*s.backend, s.engine->kv_storage(), s.kv_format, ex->blocks, ex->num_cached, kv_tokens_hash(tokens));
    if (o.ok()) {
      m.kv = std::move(*o);
    } else {
      get_logger("actors")->warn("replica {}: request {}: KV export failed, the receiver recomputes: {}", s.cfg.replica, rid,
                                 o.status().to_string());
    }
  }
  s.engine->remove_sequence(r.seq_id);
  s.by_seq.erase(r.seq_id);
  s.by_request.erase(it);
  get_logger("actors")->info("replica {}: request {} leaves ({}) with {} tokens of KV", s.cfg.replica, rid, reason,
                             m.kv.source.empty() ? 0 : m.kv.num_cached);
  self->send(s.cfg.scheduler, std::move(m));
  schedule_expiry(self);
}

// The engine's per-token SampleResults into the event's flat arrays: logprobs [n], and
// top_logprob_ids / top_logprob_values [n * top_n] row-major, highest first. The engine returns
// exactly min(sampling.logprobs, vocab) = top_n entries per token and one SampleResult per
// emitted token; anything else is a bug.
void fill_logprobs(const std::vector<SampleResult>& lps, int32_t top_n, ShardEvent* ev) {
  SPECSERVE_CHECK(lps.size() == ev->tokens.size(),
                  "engine returned " + std::to_string(lps.size()) + " logprobs for " + std::to_string(ev->tokens.size()) + " tokens");
  ev->top_n = top_n;
  ev->logprobs.reserve(lps.size());
  ev->top_logprob_ids.reserve(lps.size() * static_cast<size_t>(top_n));
  ev->top_logprob_values.reserve(lps.size() * static_cast<size_t>(top_n));
  for (const SampleResult& lp : lps) {
    ev->logprobs.push_back(lp.logprob);
    if (top_n == 0) continue;
    SPECSERVE_CHECK(lp.top_logprobs.size() == static_cast<size_t>(top_n),
                    "engine returned " + std::to_string(lp.top_logprobs.size()) + " top logprobs, expected " + std::to_string(top_n));
    for (const TokenLogprob& t : lp.top_logprobs) {
      ev->top_logprob_ids.push_back(t.token);
      ev->top_logprob_values.push_back(t.logprob);
    }
  }
}

void do_step(Self self) {
  auto& s = self->state;
  s.step_pending = false;
  std::vector<SeqEvent> events;
  Status st = s.engine->step(&events);
  ShardLoad load;
  std::vector<int64_t> handover;
  if (!st.ok() && s.tp_peers && s.tp_peers->broken()) {
    // Not this batch's fault: the tensor-parallel group is broken (a rank died or stalled). The
    // shard stops and the scheduler re-queues every request it held.
    get_logger("actors")->error("replica {}: step failed: {}; the tensor-parallel group is broken, the replica stops",
                                s.cfg.replica, st.to_string());
    self->quit(caf::exit_reason::user_shutdown);
    return;
  }
  if (!st.ok() && !s.by_request.empty()) {
    // NOTE: a failed step (one sequence outgrew the whole KV cache) fails the longest request,
    // not its batch-mates nor the shard; the next step runs without it.
    auto victim = std::max_element(s.by_request.begin(), s.by_request.end(), [](const auto& a, const auto& b) {
      return a.second.num_tokens < b.second.num_tokens;
    });
    const int64_t rid = victim->first;
    Running r = victim->second;
    get_logger("actors")->error("replica {}: step failed: {}; failing request {} ({} tokens)", s.cfg.replica,
                                st.to_string(), rid, r.num_tokens);
    ShardEvent ev;
    ev.request_id = rid;
    ev.attempt = r.attempt;
    ev.finish_reason = "error";
    ev.error = st.to_string() + " (request of " + std::to_string(r.num_tokens) + " tokens)";
    self->send(r.request_actor, std::move(ev));
    s.engine->abort(r.seq_id);
    load.finished.push_back(rid);
    s.by_request.erase(rid);
    s.by_seq.erase(r.seq_id);
  }
  for (SeqEvent& e : events) {
    auto it = s.by_seq.find(e.seq_id);
    if (it == s.by_seq.end()) continue;
    const int64_t rid = it->second;
    Running& r = s.by_request[rid];
    r.num_tokens += static_cast<int64_t>(e.tokens.size());
    const bool emitted = !e.tokens.empty();
    ShardEvent ev;
    ev.request_id = rid;
    ev.attempt = r.attempt;
    ev.tokens = std::move(e.tokens);
    fill_logprobs(e.logprobs, r.top_n, &ev);
    ev.text = std::move(e.text);
    if (e.finish != FinishReason::kNone) {
      ev.finish_reason = finish_reason_name(e.finish);
      if (e.finish == FinishReason::kError) {
        ev.error = e.error;
        get_logger("actors")->error("replica {}: request {} failed: {}", s.cfg.replica, rid, e.error);
      }
      if (auto sp = s.engine->take_finished_stats(e.seq_id)) {
        ev.num_drafts = sp->num_drafts;
        ev.num_draft_tokens = sp->num_draft_tokens;
        ev.num_accepted_tokens = sp->num_accepted_tokens;
      }
    }
    if (!ev.tokens.empty() || !ev.text.empty() || !ev.finish_reason.empty()) self->send(r.request_actor, std::move(ev));
    if (e.finish != FinishReason::kNone) {
      load.finished.push_back(rid);
      s.by_request.erase(rid);
      s.by_seq.erase(it);
    } else if (prefill_only(s) && emitted) {
      handover.push_back(rid);
    }
  }
  // A prefill worker hands every request over once its prompt is in the KV cache and its first
  // token is out (disaggregated prefill): a decode replica continues from the shipped KV.
  for (int64_t rid : handover) migrate_out(self, rid, "prefill");
  ShardLoad l = load_of(s);
  l.finished = std::move(load.finished);
  self->send(s.cfg.scheduler, std::move(l));
  if (s.engine->has_work()) schedule_step(self);
  maybe_quit(self);
}

// Adds a request to the engine: a new one, or a migrated one (`fetched`: its KV in host memory,
// fetched already; null: none to load, it recomputes). Answers an error to the request actor.
void add_work(Self self, WorkItem& w, std::shared_ptr<KvFetch> fetched) {
  auto& s = self->state;
  const auto known = static_cast<int64_t>(w.prompt.size() + w.resume_output.size());
  const int64_t end_tokens = static_cast<int64_t>(w.prompt.size()) + w.max_tokens;
  const int32_t top_n = w.sampling.logprobs;
  GenerateParams p;
  p.prompt = std::move(w.prompt);
  p.resume_output = std::move(w.resume_output);
  p.sampling = std::move(w.sampling);
  p.max_tokens = w.max_tokens;
  p.stop = std::move(w.stop);
  p.include_stop_str = w.include_stop_str;
  p.priority = w.priority;
  p.num_speculative_tokens = w.num_speculative_tokens;
  const bool migrated = !w.rng_state.empty() || !w.kv.source.empty();
  Expected<int64_t> id = 0;
  if (!migrated) {
    id = s.engine->add_request(std::move(p));
  } else {
    SequenceImport imp;
    imp.rng_state = w.rng_state;
    imp.k = w.spec_k;
    imp.spec.num_drafts = w.num_drafts;
    imp.spec.num_draft_tokens = w.num_draft_tokens;
    imp.spec.num_accepted_tokens = w.num_accepted_tokens;
    imp.spec.accepted_per_pos = w.accepted_per_pos;
    const int64_t num_tokens = static_cast<int64_t>(p.prompt.size() + p.resume_output.size());
    const KvOffer offer = w.kv;
    const int64_t rid = w.request_id;
    if (fetched != nullptr) {
      imp.num_cached = offer.num_cached;
      // NOTE: called by the engine when its step policy admits the sequence (now, or at a later
      // step while it waits with these bytes): the import itself (checksums, copy into the
      // blocks) is a memcpy-speed pass on this thread; the transfer is done already.
      imp.load_kv = [self, fetched, num_tokens, rid](KvStorage& kv, std::span<const int32_t> blocks) {
        auto& st = self->state;
        Status r = st.plane->finish_fetch(*fetched, *st.backend, kv, st.kv_format, blocks);
        st.plane->end_fetch(*fetched);
        if (r.ok()) {
          st.kv_imported_tokens += fetched->offer.num_cached;
        } else {
          st.kv_recomputed_tokens += num_tokens;
          get_logger("actors")->warn("replica {}: request {}: migrated KV refused, recomputing: {}", st.cfg.replica, rid,
                                     r.to_string());
        }
        return r;
      };
    } else {
      s.kv_recomputed_tokens += num_tokens;
    }
    bool loaded = false;
    id = s.engine->add_migrated(std::move(p), std::move(imp), &loaded);
    if (id.ok()) {
      get_logger("actors")->info("replica {}: request {} arrives from {}: {} tokens, KV {}", s.cfg.replica, rid,
                                 offer.source.empty() ? "elsewhere" : offer.source, num_tokens,
                                 fetched == nullptr ? std::string("recomputed")
                                 : loaded          ? "moved (" + std::to_string(offer.num_cached) + " tokens)"
                                                   : "fetched; it waits for admission");
    }
  }
  if (!id.ok()) {
    ShardEvent ev;
    ev.request_id = w.request_id;
    ev.attempt = w.attempt;
    ev.finish_reason = "error";
    ev.error = id.status().to_string();
    self->send(w.request_actor, std::move(ev));
    ShardLoad l = load_of(s);
    l.finished.push_back(w.request_id);
    self->send(s.cfg.scheduler, std::move(l));
    return;
  }
  const int32_t vocab = static_cast<int32_t>(s.model.model->config().vocab_size);
  s.by_request[w.request_id] = Running{*id, w.attempt, w.request_actor, known, std::min(top_n, vocab), end_tokens};
  s.by_seq[*id] = w.request_id;
  schedule_step(self);
}

// A WorkItem arrives. A migrated request whose KV can be fetched gets a fetch thread (the step
// loop goes on meanwhile) and is added when kv_fetched_atom comes back; everything else is added
// now.
void receive_work(Self self, WorkItem w) {
  auto& s = self->state;
  const bool migrated = !w.rng_state.empty() || !w.kv.source.empty();
  if (!migrated) return add_work(self, w, nullptr);
  std::vector<int32_t> tokens = w.prompt;
  tokens.insert(tokens.end(), w.resume_output.begin(), w.resume_output.end());
  const KvOffer& offer = w.kv;
  // NOTE: the offer must describe a prefix of exactly these tokens; anything else (a request
  // actor that saw other tokens than the source engine had) recomputes.
  const bool usable = s.plane && !offer.source.empty() && offer.num_cached > 0 &&
                      offer.num_cached < static_cast<int32_t>(tokens.size()) &&
                      kv_tokens_hash(std::span<const int32_t>(tokens.data(), static_cast<size_t>(offer.num_cached))) ==
                          offer.tokens_hash;
  if (!usable) {
    if (!offer.source.empty()) self->send(s.cfg.scheduler, KvReleaseMsg{offer.source, offer.offer_id});
    return add_work(self, w, nullptr);
  }
  const int64_t num_blocks = (offer.num_cached + s.kv_format.block_size - 1) / s.kv_format.block_size;
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(s.cfg.kv_transfer_timeout_s * 1000));
  int64_t delay_ms = 0;
  if (const char* d = std::getenv("SPECSERVE_TEST_KV_FETCH_DELAY_MS")) {
    // NOTE: fault injection for tests only: the window in which a test kills the source
    // mid-transfer (on the fetch thread, before the transfer's deadline starts). Unset in production.
    delay_ms = std::atoi(d);
  }
  auto f = s.plane->start_fetch(offer, s.kv_format, num_blocks, kv_deadline_after(timeout + std::chrono::milliseconds(delay_ms)));
  if (!f.ok()) {
    get_logger("actors")->warn("replica {}: request {}: cannot fetch its KV, recomputing: {}", s.cfg.replica, w.request_id,
                               f.status().to_string());
    self->send(s.cfg.scheduler, KvReleaseMsg{offer.source, offer.offer_id});
    return add_work(self, w, nullptr);
  }
  const int64_t serial = s.next_fetch++;
  PendingImport& p = s.fetching[serial];
  p.item = std::move(w);
  p.fetch = *f;
  p.thread = std::thread([fetch = *f, to = caf::actor_cast<caf::actor>(self), serial, delay_ms] {
    if (delay_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
    fetch->run();
    caf::anon_send(to, kv_fetched_atom::value, serial);
  });
}

// The fetch `serial` ended (its bytes are in host memory, or it failed): the request joins the
// engine, with its KV when the transfer worked.
void kv_fetched(Self self, int64_t serial) {
  auto& s = self->state;
  auto it = s.fetching.find(serial);
  if (it == s.fetching.end()) return;
  PendingImport p = std::move(it->second);
  s.fetching.erase(it);
  if (p.thread.joinable()) p.thread.join();  // it has sent its message: it is returning
  const KvOffer offer = p.item.kv;
  self->send(s.cfg.scheduler, KvReleaseMsg{offer.source, offer.offer_id});
  std::shared_ptr<KvFetch> fetched = p.fetch;
  if (!fetched->status.ok()) {
    get_logger("actors")->warn("replica {}: request {}: KV transfer from {} failed, recomputing: {}", s.cfg.replica,
                               p.item.request_id, offer.source, fetched->status.to_string());
    s.plane->end_fetch(*fetched);
    fetched = nullptr;
  }
  if (p.aborted) {
    if (fetched) s.plane->end_fetch(*fetched);
    maybe_quit(self);
    return;
  }
  const int64_t rid = p.item.request_id;
  add_work(self, p.item, std::move(fetched));
  if (p.drain && s.by_request.count(rid)) {
    migrate_out(self, rid, "drain");
    self->send(s.cfg.scheduler, load_of(s));
  }
  maybe_quit(self);
}

caf::behavior target_shard(Self self, WorkerConfig cfg) {
  auto& s = self->state;
  s.cfg = std::move(cfg);
  auto log = get_logger("actors");
  self->monitor(s.cfg.scheduler);
  self->set_down_handler([self, log](caf::down_msg& m) {
    if (m.source == self->state.cfg.scheduler.address()) {
      log->warn("replica {}: the scheduler went away; the shard stops", self->state.cfg.replica);
      self->quit();
    } else if (self->state.tp_peers && self->state.quit_when_empty) {
      // Retired: the scheduler told the other ranks to quit too.
      log->info("replica {}: a tensor-parallel rank stopped (retired); the shard stops", self->state.cfg.replica);
      self->quit();
    } else if (self->state.tp_peers) {
      // A tensor-parallel rank went down: the group is broken and the replica cannot step. The
      // shard stops; the scheduler re-queues its requests (recomputed on another replica).
      log->error("replica {}: a tensor-parallel rank went down ({}); the replica stops", self->state.cfg.replica,
                 self->system().render(m.reason));
      self->quit(caf::exit_reason::user_shutdown);
    }
  });
  self->send(s.cfg.scheduler, hello(self, "loading"));
  Status st = load_and_warm(self);
  if (!st.ok()) {
    log->error("replica {} target shard: {}", s.cfg.replica, st.to_string());
    self->send(s.cfg.scheduler, hello(self, "failed", st.to_string()));
    self->quit(caf::exit_reason::user_shutdown);
    return {};
  }
  log->info("replica {} target shard ready: loaded in {:.2f} s, warmed up in {:.2f} s, {} KV blocks of {} tokens",
            s.cfg.replica, s.load_s, s.warmup_s, s.engine_options.num_kv_blocks, s.engine_options.block_size);
  self->send(s.cfg.scheduler, hello(self, "ready"));
  return {
      [self](WorkItem& w) {
        ++self->state.received;
        receive_work(self, std::move(w));
      },
      [self](kv_fetched_atom, int64_t serial) { kv_fetched(self, serial); },
      [self](const AbortMsg& a) {
        auto& s = self->state;
        for (auto& [serial, p] : s.fetching) {
          if (p.item.request_id != a.request_id || p.aborted) continue;
          // Not in the engine yet: answered now; the fetch's bytes are dropped when it returns.
          p.aborted = true;
          ShardEvent ev;
          ev.request_id = a.request_id;
          ev.attempt = p.item.attempt;
          ev.finish_reason = finish_reason_name(FinishReason::kAbort);
          self->send(p.item.request_actor, std::move(ev));
          ShardLoad l = load_of(s);
          l.finished.push_back(a.request_id);
          self->send(s.cfg.scheduler, std::move(l));
          return;
        }
        auto it = s.by_request.find(a.request_id);
        if (it == s.by_request.end()) return;
        s.engine->abort(it->second.seq_id);
        schedule_step(self);
      },
      [self](const AttachDraftMsg& a) {
        auto& s = self->state;
        if (!s.slot) return;
        if (!a.draft && a.draft_port == 0) {
          s.slot->attach(nullptr);
          get_logger("actors")->warn("replica {}: draft worker gone; decoding without drafts", s.cfg.replica);
          return;
        }
        caf::actor draft = a.draft;
        if (a.draft_port != 0) {
          auto h = connect_through_gateway(self->system(), a.draft_host, static_cast<uint16_t>(a.draft_port), s.cfg.token,
                                           std::chrono::seconds(10));
          if (!h.ok()) {
            get_logger("actors")->warn("replica {}: cannot reach the draft worker: {}; decoding without drafts",
                                       s.cfg.replica, h.status().message());
            return;
          }
          draft = *h;
        }
        const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(s.cfg.draft_timeout_s * 1000));
        s.slot->attach(std::make_unique<RemoteProposer>(self->system(), draft, s.cfg.token, s.method,
                                                        static_cast<int32_t>(s.model.model->config().vocab_size), timeout));
        get_logger("actors")->info("replica {}: draft worker attached ({})", s.cfg.replica,
                                   a.draft_port ? a.draft_host + ":" + std::to_string(a.draft_port) : "in process");
      },
      [self](step_atom) { do_step(self); },
      [self](const KvPeersMsg& m) {
        auto& s = self->state;
        if (!from_scheduler(self)) return;
        if (s.plane) s.plane->connect_peers(m.peers, std::chrono::milliseconds(5000));
      },
      [self](migrate_atom, bool then_quit) {
        // The replica drains: every sequence moves to another replica with its KV.
        auto& s = self->state;
        if (!from_scheduler(self)) return;
        std::vector<int64_t> ids;
        for (const auto& [rid, r] : s.by_request) ids.push_back(rid);
        for (int64_t rid : ids) migrate_out(self, rid, "drain");
        for (auto& [serial, p] : s.fetching) p.drain = true;  // they leave once their KV is here
        self->send(s.cfg.scheduler, load_of(s));
        s.quit_when_empty = s.quit_when_empty || then_quit;
        maybe_quit(self);
      },
      [self](reclaim_atom, int32_t n, bool running) {
        // Another routed replica has room (often one just promoted from standby) while this one
        // holds more than its share (scheduler/rebalance.h): up to n requests go back to the head
        // as MigratedSeq "rebalance". First those still waiting in the engine, from the back of
        // its waiting queue (the most recently queued, or a sequence preempted back into it);
        // with `running`, then running sequences from the back of the running order (the most
        // recently admitted: likely the most tokens left), skipping any with fewer than
        // kMinTokensLeftToRebalance tokens left (moving it would cost more than finishing it here).
        // NOTE: not the step policy's (priority, arrival) order: a younger request handed back
        // may start on the free replica before older ones still waiting here.
        // NOTE: a waiting sequence has no KV in the cache (a migrated one waiting for admission
        // holds its imported KV in host memory, which is dropped here: it recomputes where it
        // lands); it leaves with its sampler state, so output stays the same. A running one
        // leaves with its KV offered on the data plane, as in a drain.
        auto& s = self->state;
        if (!from_scheduler(self)) return;
        ++s.num_reclaims;
        if (prefill_only(s)) {  // the head sends it to decode shards only
          self->send(s.cfg.scheduler, load_of(s));
          return;
        }
        const std::vector<int64_t> live = s.engine->live_sequences();  // running first, then the waiting ones
        const size_t first_waiting = live.size() - std::min(live.size(), static_cast<size_t>(s.engine->num_waiting()));
        const size_t lowest = running ? 0 : first_waiting;
        std::vector<int64_t> give;
        for (size_t i = live.size(); i > lowest && static_cast<int32_t>(give.size()) < n; --i) {
          auto it = s.by_seq.find(live[i - 1]);
          if (it == s.by_seq.end()) continue;
          if (i - 1 < first_waiting) {
            const Running& r = s.by_request.at(it->second);
            if (r.end_tokens - r.num_tokens < kMinTokensLeftToRebalance) continue;
          }
          give.push_back(it->second);
        }
        for (int64_t rid : give) migrate_out(self, rid, "rebalance");
        self->send(s.cfg.scheduler, load_of(s));
      },
      [self](const KvReleaseMsg& m) {
        auto& s = self->state;
        if (!from_scheduler(self)) return;
        if (s.plane) s.plane->release(m.offer_id);
        maybe_quit(self);
      },
      [self](tick_atom) {
        auto& s = self->state;
        s.expiry_pending = false;
        if (s.plane && s.plane->expire(kOfferLifetime) > 0) {
          get_logger("actors")->warn("replica {}: freed KV offers nobody fetched within {} s", s.cfg.replica,
                                     std::chrono::seconds(kOfferLifetime).count());
        }
        schedule_expiry(self);
        maybe_quit(self);
      },
      [self](retire_atom) {
        // The autoscaler stopped this replica (after draining it): quit normally (the process
        // exits 0) once receivers have read the KV of the sequences that moved away.
        if (!from_scheduler(self)) return;
        get_logger("actors")->info("replica {}: retired by the autoscaler", self->state.cfg.replica);
        self->state.quit_when_empty = true;
        maybe_quit(self);
      },
  };
}

}  // namespace

caf::actor spawn_target_shard(caf::actor_system& sys, WorkerConfig config) {
  return sys.spawn<caf::detached>(target_shard, std::move(config));
}

}  // namespace specserve
