// specserve actors: the target shard's start-up: backend, model (and its tensor-parallel group),
// proposer and engine, a warm-up request, the KV data plane; the WorkerHello it reports
// (actors/target_shard.h).
#include <unistd.h>

#include <chrono>
#include <string>
#include <utility>
#include <vector>

#include "actors/backend_factory.h"
#include "actors/gpu_memory_plan.h"
#include "actors/proposer_factory.h"
#include "actors/target_shard_internal.h"
#include "core/logging.h"
#include "model/model_fingerprint.h"

namespace specserve {
namespace target_shard_internal {
namespace {

Status build_engine(ShardState& s) {
  Proposer* p = s.local_proposer ? s.local_proposer.get() : s.slot.get();
  // The old engine's KV goes first: a pool planned to fill this worker's share of a GPU fits once.
  s.engine.reset();
  auto e = Engine::create(*s.model.model, s.model.tokenizer.get(), p, s.engine_options);
  if (!e.ok()) return e.status();
  s.engine = std::move(*e);
  return Status();
}

}  // namespace

bool prefill_only(const ShardState& s) { return s.cfg.role == WorkerRole::kPrefillWorker; }

WorkerHello hello(Self self, const std::string& state, const std::string& error) {
  const auto& s = self->state;
  WorkerHello h = worker_hello(s.cfg, caf::actor_cast<caf::actor>(self), state, error);
  h.load_seconds = s.load_s;
  h.warmup_seconds = s.warmup_s;
  h.total_kv_blocks = static_cast<int32_t>(s.engine_options.num_kv_blocks);
  h.block_size = s.engine_options.block_size;
  h.max_num_seqs = s.engine_options.max_num_seqs;
  h.max_model_len = s.engine ? s.engine->options().max_model_len : 0;
  h.kv_address = s.plane ? s.plane->address() : "";
  if (s.plane) {
    h.kv_process = s.plane->place().process;
    h.kv_cuda_device = s.plane->place().cuda_device;
    h.kv_nccl = s.plane->place().nccl;
    h.kv_machine = s.plane->place().machine;
  }
  h.prefill_only = prefill_only(s);
  return h;
}

namespace {

// Where this worker's data plane runs. On cuda:N the plane joins NCCL KV channels with GPU peers
// (actors/kv_nccl_links.h), their unique ids exchanged through the scheduler's rendezvous store
// as the tensor-parallel group's are (actors/tp_group.h).
KvPlaneOptions plane_options(Self self) {
  const auto& s = self->state;
  KvPlaneOptions o;
  o.node = s.cfg.node;
  // Pinned to lo only when the whole cluster is on loopback (kv_plane_host says why).
  std::vector<std::string> hosts;
  for (const NodeSpec& n : s.cfg.topology.nodes) hosts.push_back(n.host);
  o.host = kv_plane_host(hosts, s.cfg.tp_host);
  if (s.cfg.device.kind == DeviceKind::kCuda) {
    o.cuda_device = s.cfg.device.index;
    o.nccl_store = std::make_shared<ActorRendezvousStore>(self->system(), s.cfg.scheduler);
    // NOTE: every ready worker gets KvPeersMsg at once, so both ends of a channel join together;
    // the bound matters only for a peer that never joins (a leaving worker waits for it).
    o.nccl_join_timeout = std::chrono::seconds(30);
  }
  return o;
}

}  // namespace

Status load_and_warm(Self self) {
  auto& s = self->state;
  const Topology& t = s.cfg.topology;
  // cuda:N: its KV pools are sized from gpu_memory_utilization once the weights are loaded (gpu_memory_plan.h).
  DeviceMemoryBudget memory(s.cfg.device.to_string(), s.cfg.gpu_memory_utilization, s.cfg.gpu_memory_utilization_field);
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
    // The head tells the waiter when a follower goes down (tp_messages.h: tp_abort_atom).
    self->send(s.cfg.scheduler, tp_waiter_atom::value, s.cfg.token, s.cfg.replica, s.tp_peers->waiter());
    lo.tp_rank = 0;
    lo.tp_size = tp;
    lo.communicator = s.tp_comm.get();
  }
  auto m = load_model(t.models.target.path, *s.backend, /*quiet=*/true, lo);
  if (!m.ok()) return Status(m.status().code(), t.where("models.target.path") + ": models.target.path: " + m.status().message());
  s.model = std::move(*m);
  if (s.tp_peers) s.model.model->set_tensor_parallel_peers(s.tp_peers.get());
  s.load_s = s.model.load_seconds;
  memory.target_loaded(*s.backend);
  auto eo = engine_options_for(t, s.model.model->config());
  if (!eo.ok()) return eo.status();
  s.engine_options = *eo;
  // NOTE: on cuda:N the KV pools come from gpu_memory_utilization, not scheduler.kv_cache_bytes
  // (a host-memory budget); on the CPU nothing here changes them.
  GpuMemoryInputs target_mem = engine_memory_inputs(s.model.model->config(), s.engine_options, tp);
  target_mem.max_model_len_field = "models.target.max_model_len";
  if (memory.active()) s.engine_options.num_kv_blocks = 0;
  EngineKvPlanner kv_plan(memory, target_mem, &s.engine_options);
  // NOTE: a prefill worker emits one token per request, so it has nothing to speculate on.
  if (t.models.speculative && !prefill_only(s)) {
    s.method = speculative_method_name(t.models.speculative->method);
    if (s.cfg.remote_draft) {
      s.slot = std::make_unique<ProposerSlot>(s.method);
    } else {
      ProposerBuildOptions bo;
      bo.max_model_len = s.engine_options.max_model_len;
      bo.plan_kv = kv_plan.draft_planner();
      bo.block_size = s.engine_options.block_size;
      bo.max_num_batched_tokens = s.engine_options.max_num_batched_tokens;
      auto p = build_proposer(*t.models.speculative, s.model, *s.backend, bo);
      if (!p.ok()) return Status(p.status().code(), t.where("models.speculative") + ": models.speculative: " + p.status().message());
      s.local_proposer = std::move(*p);
    }
  }
  SPECSERVE_RETURN_IF_ERROR(kv_plan.finish());
  if (!memory.active()) SPECSERVE_RETURN_IF_ERROR(check_kv_fits_memory(t));
  if (!kv_plan.summary().empty()) get_logger("actors")->info("replica {} rank {}: {}", s.cfg.replica, s.cfg.rank, kv_plan.summary());
  SPECSERVE_RETURN_IF_ERROR(build_engine(s));
  self->send(s.cfg.scheduler, hello(self, "warming"));
  const auto t0 = Clock::now();
  GenerateParams warm;
  warm.prompt = s.model.tokenizer->encode("Warm-up: the quick brown fox jumps over the lazy dog. The quick brown fox", true, false);
  // A context shorter than the warm-up text (max_model_len 16) still warms up, on its first tokens.
  const int64_t room = std::max<int64_t>(1, s.engine->options().max_model_len - 1);
  if (static_cast<int64_t>(warm.prompt.size()) > room) warm.prompt.resize(static_cast<size_t>(room));
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
                      : KvDataPlane::create(kv_peer_name(worker_role_name(s.cfg.role), s.cfg.replica), plane_options(self));
  if (plane.ok()) {
    s.plane = std::move(*plane);
    s.kv_format = kv_export_format(s.engine->kv_storage(), model_fingerprint(*s.model.file));
  } else if (tp > 1) {
    // Expected, not a fault: the replica's KV is split over its ranks.
    get_logger("actors")->info("replica {}: tensor-parallel ({} ranks): sequences moving to or from it recompute their KV "
                               "(no KV transfer of blocks split over ranks)", s.cfg.replica, tp);
  } else {
    get_logger("actors")->warn("replica {}: no KV data plane ({}); sequences that migrate here recompute their KV",
                               s.cfg.replica, plane.status().to_string());
  }
  return Status();
}

}  // namespace target_shard_internal
}  // namespace specserve
