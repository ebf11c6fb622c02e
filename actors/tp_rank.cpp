#include "actors/tp_rank.h"

#include <unistd.h>

#include <chrono>
#include <map>
#include <memory>

#include "actors/backend_factory.h"
#include "actors/messages.h"
#include "actors/tp_group.h"
#include "core/logging.h"
#include "model/gguf.h"
#include "model/transformer.h"

namespace specserve {
namespace {

struct TpRankState {
  WorkerConfig cfg;
  // Declared in construction order: destroyed model first, backend last.
  std::unique_ptr<Backend> backend;
  std::unique_ptr<GgufFile> file;
  std::unique_ptr<Communicator> comm;
  std::unique_ptr<Transformer> model;
  std::map<int32_t, std::unique_ptr<KvStorage>> kvs;  // by rank 0's kv id
  ForwardOutput out;
  caf::actor rank0;
  double load_s = 0;
};

using Self = caf::stateful_actor<TpRankState>*;

WorkerHello hello(Self self, const std::string& state, const std::string& error = "") {
  const auto& s = self->state;
  WorkerHello h = worker_hello(s.cfg, caf::actor_cast<caf::actor>(self), state, error);
  h.role = worker_role_name(WorkerRole::kTargetShard);
  h.load_seconds = s.load_s;
  return h;
}

Status load(Self self) {
  auto& s = self->state;
  const Topology& t = s.cfg.topology;
  const auto t0 = std::chrono::steady_clock::now();
  auto backend = make_backend_for_device("the target_shard's device", s.cfg.device.to_string(), s.cfg.threads);
  if (!backend.ok()) return backend.status();
  s.backend = std::move(*backend);
  auto f = GgufFile::open(t.models.target.path);
  if (!f.ok()) return Status(f.status().code(), t.where("models.target.path") + ": models.target.path: " + f.status().message());
  s.file = std::make_unique<GgufFile>(std::move(*f));
  auto conn = connect_tp_group(self->system(), s.cfg, caf::actor_cast<caf::actor>(self));
  if (!conn.ok()) return conn.status();
  s.comm = std::move(conn->comm);
  s.rank0 = conn->group.ranks.at(0);
  LoadOptions lo;
  lo.tp_rank = s.cfg.rank;
  lo.tp_size = t.models.target.tensor_parallel_size;
  lo.communicator = s.comm.get();
  auto m = Transformer::load(*s.file, *s.backend, lo);
  if (!m.ok()) return Status(m.status().code(), t.where("models.target.path") + ": models.target.path: " + m.status().message());
  s.model = std::move(*m);
  s.load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return Status();
}

Status run(TpRankState& s, const TpCommand& c) {
  switch (c.op) {
    case TpCommand::kCreateKv: {
      auto kv = s.model->create_kv(c.num_blocks, c.block_size, c.num_layers);
      if (!kv.ok()) return kv.status();
      s.kvs[c.kv_id] = std::move(*kv);
      return Status();
    }
    case TpCommand::kForward:
    case TpCommand::kCopySlots: {
      auto it = s.kvs.find(c.kv_id);
      if (it == s.kvs.end()) return invalid_argument("no KV store " + std::to_string(c.kv_id) + " on this rank");
      if (c.op == TpCommand::kForward) return s.model->forward(c.batch, *it->second, &s.out);
      if (c.src.size() != c.dst.size()) return invalid_argument("kv_copy_slots: src and dst differ in length");
      return s.model->kv_copy_slots(*it->second, c.src.data(), c.dst.data(), static_cast<int64_t>(c.src.size()));
    }
    default:
      return invalid_argument("unknown tensor-parallel command " + std::to_string(c.op));
  }
}

caf::behavior tp_rank(Self self, WorkerConfig cfg) {
  auto& s = self->state;
  s.cfg = std::move(cfg);
  auto log = get_logger("actors");
  self->monitor(s.cfg.scheduler);
  self->set_down_handler([self, log](caf::down_msg& m) {
    auto& st = self->state;
    if (m.source == st.cfg.scheduler.address()) {
      log->log(scheduler_down_level(m), "replica {} rank {}: the scheduler went away; the rank stops", st.cfg.replica, st.cfg.rank);
      quit_after_scheduler_down(self, m);
    } else if (st.rank0 && m.source == st.rank0.address()) {
      log->info("replica {} rank {}: rank 0 stopped; the rank stops", st.cfg.replica, st.cfg.rank);
      self->quit();
    }
  });
  self->send(s.cfg.scheduler, hello(self, "loading"));
  Status st = load(self);
  if (!st.ok()) {
    log->error("replica {} target shard rank {}: {}", s.cfg.replica, s.cfg.rank, st.to_string());
    self->send(s.cfg.scheduler, hello(self, "failed", st.to_string()));
    self->quit(caf::exit_reason::user_shutdown);
    return {};
  }
  self->monitor(s.rank0);
  log->info("replica {} target shard rank {} of {} ready: its shard loaded in {:.2f} s", s.cfg.replica, s.cfg.rank,
            s.cfg.topology.models.target.tensor_parallel_size, s.load_s);
  self->send(s.cfg.scheduler, hello(self, "ready"));
  return {
      [self](TpCommand& c) {
        // NOTE: from rank 0's waiter (ActorTensorParallelPeers); the actor port's cluster token
        // already keeps strangers out. A failure breaks the group: rank 0 quits, then this rank.
        auto& st = self->state;
        Status r = run(st, c);
        if (!r.ok()) {
          get_logger("actors")->error("replica {} rank {}: command {} failed: {}", st.cfg.replica, st.cfg.rank, c.op,
                                      r.to_string());
        }
        self->send(c.reply_to, tp_done_atom::value, c.serial, st.cfg.rank, r.ok() ? std::string() : r.to_string());
      },
      [self](retire_atom, const std::string& why) {
        if (self->current_sender() != caf::actor_cast<caf::strong_actor_ptr>(self->state.cfg.scheduler)) return;
        get_logger("actors")->error("replica {} rank {}: refused by the head: {}", self->state.cfg.replica, self->state.cfg.rank, why);
        self->quit(caf::exit_reason::user_shutdown);
      },
      [self](retire_atom) {
        if (self->current_sender() != caf::actor_cast<caf::strong_actor_ptr>(self->state.cfg.scheduler)) return;
        self->quit();
      },
  };
}

}  // namespace

caf::actor spawn_tp_rank(caf::actor_system& sys, WorkerConfig config) {
  return sys.spawn<caf::detached>(tp_rank, std::move(config));
}

}  // namespace specserve
