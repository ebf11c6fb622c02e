#include "actors/draft_worker.h"

#include <unistd.h>

#include <chrono>
#include <map>

#include <caf/io/all.hpp>

#include "actors/backend_factory.h"
#include "actors/gateway.h"
#include "actors/gpu_memory_plan.h"
#include "actors/messages.h"
#include "actors/proposer_factory.h"
#include "actors/runtime.h"
#include "core/logging.h"
#include "model/model_loader.h"

namespace specserve {
namespace {

using Clock = std::chrono::steady_clock;

struct DraftSeqState {
  std::vector<int32_t> tokens;
  int32_t prompt_len = 0;
};

struct DraftState {
  WorkerConfig cfg;
  std::unique_ptr<Backend> backend;
  LoadedModel target;  // tokenizer (vocabulary check) and, for layer_skip, the weights
  std::unique_ptr<Proposer> proposer;
  std::map<int64_t, DraftSeqState> seqs;
  double load_s = 0, warmup_s = 0;
  std::string host;
  int32_t port = 0;
};

using Self = caf::stateful_actor<DraftState>*;

WorkerHello hello(Self self, const std::string& state, const std::string& error = "") {
  const auto& s = self->state;
  WorkerHello h = worker_hello(s.cfg, caf::actor_cast<caf::actor>(self), state, error);
  h.role = worker_role_name(WorkerRole::kDraftWorker);
  h.rank = 0;
  h.load_seconds = s.load_s;
  h.warmup_seconds = s.warmup_s;
  h.draft_host = s.host;
  h.draft_port = s.port;
  return h;
}

Status load_and_warm(Self self) {
  auto& s = self->state;
  const Topology& t = s.cfg.topology;
  if (!t.models.speculative) return invalid_argument("models.speculative: a draft_worker needs a speculative method");
  if (t.models.speculative->method == SpeculativeMethod::kMedusa || t.models.speculative->method == SpeculativeMethod::kEagle) {
    // Heads read the target's hidden states every step: only the target_shard can run them.
    return invalid_argument(t.where("models.speculative.method") + ": models.speculative.method = '" +
                            speculative_method_name(t.models.speculative->method) +
                            "': a draft_worker cannot run it (its heads need the target's hidden states in-process); "
                            "remove the draft_worker and the target_shard runs the heads");
  }
  const auto t0 = Clock::now();
  // cuda:N: its draft KV pool is sized from gpu_memory_utilization once the weights are loaded (gpu_memory_plan.h).
  DeviceMemoryBudget memory(s.cfg.device.to_string(), s.cfg.gpu_memory_utilization, s.cfg.gpu_memory_utilization_field);
  auto backend = make_backend_for_device(std::string("the ") + worker_role_name(s.cfg.role) + "'s device",
                                         s.cfg.device.to_string(), s.cfg.threads);
  if (!backend.ok()) return backend.status();
  s.backend = std::move(*backend);
  auto m = load_model(t.models.target.path, *s.backend, /*quiet=*/true);
  if (!m.ok()) return Status(m.status().code(), "models.target.path: " + m.status().message());
  s.target = std::move(*m);
  memory.target_loaded(*s.backend);
  ProposerBuildOptions bo;
  if (t.models.target.max_model_len) bo.max_model_len = *t.models.target.max_model_len;
  // The draft's KV (draft_model, layer_skip) on cuda:N: as many blocks as max_num_seqs sequences
  // of max_model_len need, within this worker's own gpu_memory_utilization. No target KV here.
  EngineOptions limits;
  limits.max_num_seqs = t.scheduler.max_num_seqs;
  limits.max_num_batched_tokens = t.scheduler.max_num_batched_tokens;
  limits.block_size = t.scheduler.block_size;
  limits.max_model_len = bo.max_model_len;
  GpuMemoryInputs draft_mem = engine_memory_inputs(s.target.model->config(), limits);
  draft_mem.target_block_bytes = 0;
  draft_mem.activation_bytes = 0;  // the draft's own, passed by the proposer
  draft_mem.max_model_len_field = "models.target.max_model_len";
  EngineKvPlanner kv_plan(memory, draft_mem, &limits);
  bo.plan_kv = kv_plan.draft_planner();
  bo.block_size = limits.block_size;
  bo.max_num_batched_tokens = limits.max_num_batched_tokens;
  // q crosses a process boundary: sample drafts from a truncated q (99.9% of the mass, at most
  // 512 ids) — exact for the verifier, since the token really is drawn from what is sent.
  bo.sparse_keep_mass = 0.999;
  bo.sparse_max_entries = 512;
  auto p = build_proposer(*t.models.speculative, s.target, *s.backend, bo);
  if (!p.ok()) return Status(p.status().code(), t.where("models.speculative") + ": models.speculative: " + p.status().message());
  if ((*p)->needs_hidden()) {
    // NOTE: propose messages carry token ids only; a proposer that drafts from the target's
    // hidden states would silently draft nothing here. The topology validation refuses this
    // too; this guards a proposer that needs them under another method name.
    return invalid_argument(t.where("models.speculative") + ": models.speculative.method " +
                            "'" + std::string(speculative_method_name(t.models.speculative->method)) + "' (proposer " + (*p)->name() +
                            ") drafts from the target's hidden states, which a draft_worker does not receive; "
                            "remove the draft_worker so that the target_shard runs the proposer itself");
  }
  s.proposer = std::move(*p);
  if (!kv_plan.summary().empty()) get_logger("actors")->info("replica {} draft worker: {}", s.cfg.replica, kv_plan.summary());
  s.load_s = std::chrono::duration<double>(Clock::now() - t0).count();
  self->send(s.cfg.scheduler, hello(self, "warming"));
  const auto t1 = Clock::now();
  std::vector<int32_t> warm = s.target.tokenizer->encode("Warm-up: the quick brown fox jumps over the lazy dog. The quick brown fox", true, false);
  SamplingParams greedy;
  greedy.temperature = 0;
  DraftRequest r;
  r.seq_id = -1;
  r.tokens = warm;
  r.prompt_len = static_cast<int32_t>(warm.size());
  r.num_tokens = t.models.speculative->num_speculative_tokens;
  r.sampling = &greedy;
  std::vector<DraftTree> out(1);
  SPECSERVE_RETURN_IF_ERROR(s.proposer->propose({r}, &out));
  s.proposer->release(-1);
  s.warmup_s = std::chrono::duration<double>(Clock::now() - t1).count();
  return Status();
}

ProposeReply propose(Self self, ProposeMsg& m) {
  auto& s = self->state;
  ProposeReply reply;
  if (!token_matches(m.token, s.cfg.token)) {
    get_logger("actors")->warn("draft worker: refused a propose request without the cluster token");
    reply.error = "refused: wrong cluster token";
    return reply;
  }
  reply.seqs.resize(m.seqs.size());
  std::vector<DraftRequest> reqs;
  std::vector<size_t> idx;
  for (size_t i = 0; i < m.seqs.size(); ++i) {
    DraftSeq& d = m.seqs[i];
    DraftSeqState& st = s.seqs[d.seq_id];
    if (d.offset == 0) {
      st.tokens = std::move(d.new_tokens);
    } else if (d.offset == static_cast<int32_t>(st.tokens.size())) {
      st.tokens.insert(st.tokens.end(), d.new_tokens.begin(), d.new_tokens.end());
    } else {
      reply.seqs[i].resync = true;
      s.seqs.erase(d.seq_id);
      continue;
    }
    st.prompt_len = d.prompt_len;
    DraftRequest r;
    r.seq_id = d.seq_id;
    r.tokens = st.tokens;
    r.prompt_len = d.prompt_len;
    r.num_tokens = d.num_tokens;
    r.sampling = &d.sampling;
    reqs.push_back(r);
    idx.push_back(i);
  }
  if (reqs.empty()) return reply;
  std::vector<DraftTree> out(reqs.size());
  Status st = s.proposer->propose(reqs, &out);
  if (!st.ok()) {
    reply.error = st.to_string();
    return reply;
  }
  for (size_t j = 0; j < reqs.size(); ++j) {
    DraftReplySeq& r = reply.seqs[idx[j]];
    DraftTree& d = out[j];
    r.tokens = std::move(d.tokens);
    r.parents = std::move(d.parents);
    r.source = static_cast<int32_t>(d.source);
    for (const auto& q : d.probs) {
      std::vector<int32_t> ids;
      std::vector<float> vals;
      for (size_t t = 0; t < q.size(); ++t) {
        if (q[t] > 0.0f) {
          ids.push_back(static_cast<int32_t>(t));
          vals.push_back(q[t]);
        }
      }
      r.prob_ids.push_back(std::move(ids));
      r.prob_values.push_back(std::move(vals));
    }
  }
  return reply;
}

caf::behavior draft_worker(Self self, WorkerConfig cfg) {
  auto& s = self->state;
  s.cfg = std::move(cfg);
  auto log = get_logger("actors");
  self->monitor(s.cfg.scheduler);
  self->set_down_handler([self, log](caf::down_msg& m) {
    if (m.source == self->state.cfg.scheduler.address()) {
      log->log(scheduler_down_level(m), "replica {}: the scheduler went away; the draft worker stops", self->state.cfg.replica);
      quit_after_scheduler_down(self, m);
    }
  });
  if (!s.cfg.listen_host.empty()) {
    auto port = publish_with_gateway(self->system(), caf::actor_cast<caf::actor>(self), s.cfg.token, s.cfg.listen_host, 0,
                                     "draft worker");
    if (!port.ok()) {
      self->send(s.cfg.scheduler, hello(self, "failed", "cannot open a port on " + s.cfg.listen_host + ": " +
                                                            port.status().message()));
      self->quit(caf::exit_reason::user_shutdown);
      return {};
    }
    s.host = s.cfg.listen_host;
    s.port = *port;
  }
  self->send(s.cfg.scheduler, hello(self, "loading"));
  Status st = load_and_warm(self);
  if (!st.ok()) {
    log->error("replica {} draft worker: {}", s.cfg.replica, st.to_string());
    self->send(s.cfg.scheduler, hello(self, "failed", st.to_string()));
    self->quit(caf::exit_reason::user_shutdown);
    return {};
  }
  log->info("replica {} draft worker ({}) ready: loaded in {:.2f} s, warmed up in {:.2f} s", s.cfg.replica,
            s.proposer->name(), s.load_s, s.warmup_s);
  self->send(s.cfg.scheduler, hello(self, "ready"));
  return {
      [self](ProposeMsg& m) -> ProposeReply { return propose(self, m); },
      [self](const ReleaseMsg& m) {
        auto& s = self->state;
        if (!token_matches(m.token, s.cfg.token)) return;
        for (int64_t id : m.seq_ids) {
          s.seqs.erase(id);
          s.proposer->release(id);
        }
      },
      [self](drop_seqs_atom) {
        // Only the head may say so: it does when this replica's target shard died.
        if (self->current_sender() != caf::actor_cast<caf::strong_actor_ptr>(self->state.cfg.scheduler)) return;
        auto& s = self->state;
        get_logger("actors")->info("replica {}: draft worker drops {} sequence(s) of its dead target shard", s.cfg.replica,
                                   s.seqs.size());
        for (const auto& [id, st] : s.seqs) s.proposer->release(id);
        s.seqs.clear();
      },
      [self](retire_atom, const std::string& why) {
        // Refused by the head (another draft worker holds its slot): it fails, saying why.
        if (self->current_sender() != caf::actor_cast<caf::strong_actor_ptr>(self->state.cfg.scheduler)) return;
        get_logger("actors")->error("replica {}: draft worker refused by the head: {}", self->state.cfg.replica, why);
        self->quit(caf::exit_reason::user_shutdown);
      },
      [self](retire_atom) {
        // The autoscaler stopped this replica (or gave up the start it belongs to): quit
        // normally; the process exits 0. Only the head may say so.
        if (self->current_sender() != caf::actor_cast<caf::strong_actor_ptr>(self->state.cfg.scheduler)) return;
        get_logger("actors")->info("replica {}: draft worker retired by the head (its replica was scaled down or stopped)", self->state.cfg.replica);
        self->quit();
      },
  };
}

}  // namespace

caf::actor spawn_draft_worker(caf::actor_system& sys, WorkerConfig config) {
  return sys.spawn<caf::detached>(draft_worker, std::move(config));
}

}  // namespace specserve
