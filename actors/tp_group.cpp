#include "actors/tp_group.h"

#include <utility>

#include "cpu/gloo_communicator.h"
#include "model/gguf.h"
#include "model/model_config.h"
#ifdef SPECSERVE_WITH_CUDA
#include "gpu/nccl_communicator.h"
#endif

namespace specserve {

// ---------------------------------------------------------------- ActorRendezvousStore

Status ActorRendezvousStore::set(const std::string& key, const std::vector<char>& value) {
  caf::scoped_actor self{sys_};
  Status st;
  self->request(scheduler_, std::chrono::seconds(10), rdv_set_atom::value, key, std::string(value.begin(), value.end()))
      .receive([&](bool) {}, [&](caf::error& e) { st = unavailable("rendezvous set '" + key + "': " + sys_.render(e)); });
  return st;
}

Expected<std::vector<char>> ActorRendezvousStore::get(const std::string& key, std::chrono::milliseconds timeout) {
  caf::scoped_actor self{sys_};
  Expected<std::vector<char>> out = unavailable("rendezvous get '" + key + "': no answer");
  self->request(scheduler_, timeout, rdv_get_atom::value, key)
      .receive([&](std::string& v) { out = std::vector<char>(v.begin(), v.end()); },
               [&](caf::error& e) {
                 if (e == caf::sec::request_timeout) {
                   out = deadline_exceeded("rendezvous key '" + key + "' was not set within " +
                                           std::to_string(timeout.count()) + " ms (a rank of the group is missing)");
                 } else {
                   out = unavailable("rendezvous get '" + key + "': " + sys_.render(e));
                 }
               });
  return out;
}

// ---------------------------------------------------------------- join

Expected<TpGroupMsg> join_tp_group(caf::actor_system& sys, const caf::actor& scheduler, const TpJoinMsg& join,
                                   std::chrono::milliseconds timeout) {
  caf::scoped_actor self{sys};
  Expected<TpGroupMsg> out = unavailable("tensor-parallel join: no answer");
  const std::string who = "replica " + std::to_string(join.replica) + " rank " + std::to_string(join.rank);
  self->request(scheduler, timeout, join)
      .receive(
          [&](TpGroupMsg& g) {
            if (!g.error.empty()) {
              out = invalid_argument(who + ": the scheduler refused the tensor-parallel join: " + g.error);
            } else if (static_cast<int32_t>(g.ranks.size()) != join.tp_size) {
              out = internal_error(who + ": a group of " + std::to_string(g.ranks.size()) + " ranks for tensor_parallel_size " +
                                   std::to_string(join.tp_size));
            } else {
              out = std::move(g);
            }
          },
          [&](caf::error& e) {
            if (e == caf::sec::request_timeout) {
              out = deadline_exceeded(who + ": the other ranks of models.target.tensor_parallel_size = " +
                                      std::to_string(join.tp_size) + " did not join within " +
                                      std::to_string(timeout.count() / 1000) +
                                      " s (is every target_shard rank of the replica declared and started?)");
            } else {
              out = unavailable(who + ": tensor-parallel join: " + sys.render(e));
            }
          });
  return out;
}

std::chrono::milliseconds tp_join_timeout(const Topology& topology) {
  return std::chrono::milliseconds(static_cast<int64_t>(topology.autoscale.start_timeout_s * 1000));
}

Status check_tensor_parallel_size(const Topology& t) {
  const int32_t tp = t.models.target.tensor_parallel_size;
  if (tp == 1) return Status();
  const std::string field = "models.target.tensor_parallel_size";
  auto f = GgufFile::open(t.models.target.path);
  if (!f.ok()) return Status(f.status().code(), t.where("models.target.path") + ": models.target.path: " + f.status().message());
  auto c = ModelConfig::from_gguf(*f);
  if (!c.ok()) return Status(c.status().code(), t.where("models.target.path") + ": models.target.path: " + c.status().message());
  auto shard = tensor_parallel_shard(*c, 0, tp);
  if (!shard.ok()) return invalid_argument(t.where(field) + ": " + field + ": " + shard.status().message());
  return Status();
}

Expected<TpConnection> connect_tp_group(caf::actor_system& sys, const WorkerConfig& cfg, const caf::actor& self) {
  const int32_t tp = cfg.topology.models.target.tensor_parallel_size;
  SPECSERVE_RETURN_IF_ERROR(check_tensor_parallel_size(cfg.topology));
  const auto timeout = tp_join_timeout(cfg.topology);
  TpJoinMsg join;
  join.token = cfg.token;
  join.replica = cfg.replica;
  join.rank = cfg.rank;
  join.tp_size = tp;
  join.self = self;
  auto group = join_tp_group(sys, cfg.scheduler, join, timeout);
  if (!group.ok()) return group.status();
  TpConnection c;
  c.group = std::move(*group);
  auto store = std::make_shared<ActorRendezvousStore>(sys, cfg.scheduler);
  Expected<std::unique_ptr<Communicator>> comm = unsupported("no communicator");
  if (cfg.device.kind == DeviceKind::kCuda) {
    // Device buffers: NCCL, its unique id exchanged through the same store (gpu/nccl_communicator.h).
#ifdef SPECSERVE_WITH_CUDA
    NcclOptions no;
    no.prefix = c.group.prefix;
    comm = make_nccl_communicator(cfg.rank, tp, cfg.device.index, store, no);
#else
    comm = unavailable("device " + cfg.device.to_string() + ": this specserve was built without the CUDA backend");
#endif
  } else {
    GlooOptions go;
    if (!cfg.tp_host.empty()) go.hostname = cfg.tp_host;
    go.prefix = c.group.prefix;
    // The group has formed: every rank is about to connect, so Gloo's default timeout (60 s, also
    // the bound on one collective) applies, not the join's.
    comm = make_gloo_communicator(cfg.rank, tp, store, go);
  }
  if (!comm.ok()) {
    return Status(comm.status().code(), "replica " + std::to_string(cfg.replica) + " rank " + std::to_string(cfg.rank) +
                                            ": tensor-parallel communicator: " + comm.status().message());
  }
  c.comm = std::move(*comm);
  return c;
}

// ---------------------------------------------------------------- ActorTensorParallelPeers

ActorTensorParallelPeers::ActorTensorParallelPeers(caf::actor_system& sys, std::vector<caf::actor> followers,
                                                   std::chrono::milliseconds timeout, std::chrono::milliseconds load_timeout)
    : followers_(std::move(followers)), timeout_(timeout), load_timeout_(std::max(timeout, load_timeout)), waiter_(sys) {
  for (const auto& f : followers_) waiter_->monitor(f);
}

ActorTensorParallelPeers::~ActorTensorParallelPeers() {
  for (const auto& f : followers_) waiter_->demonitor(f);
}

void ActorTensorParallelPeers::send_all(TpCommand cmd) {
  cmd.reply_to = caf::actor_cast<caf::actor>(waiter_);
  for (const auto& f : followers_) waiter_->send(f, cmd);
}

Status ActorTensorParallelPeers::wait_all(int64_t serial, std::chrono::milliseconds timeout) {
  std::set<int32_t> missing;
  for (size_t i = 0; i < followers_.size(); ++i) missing.insert(static_cast<int32_t>(i + 1));
  Status first;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!missing.empty() && broken_.ok()) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    bool timed_out = false;
    waiter_->receive(
        [&](tp_done_atom, int64_t s, int32_t rank, const std::string& error) {
          if (s != serial) return;  // an answer to a command that failed earlier
          missing.erase(rank);
          if (!error.empty() && first.ok()) first = unavailable("tensor parallel rank " + std::to_string(rank) + ": " + error);
        },
        [&](tp_abort_atom, const std::string& why) { broken_ = unavailable(why); },
        [&](caf::down_msg& m) {
          for (size_t i = 0; i < followers_.size(); ++i) {
            if (followers_[i].address() == m.source) {
              broken_ = unavailable("tensor parallel rank " + std::to_string(i + 1) + " went down (" +
                                    waiter_->system().render(m.reason) + ")");
            }
          }
        },
        caf::after(std::max(left, std::chrono::milliseconds(0))) >> [&] { timed_out = true; });
    if (timed_out) {
      std::string ranks;
      for (int32_t r : missing) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
      broken_ = deadline_exceeded("tensor parallel rank(s) " + ranks + " did not answer within " +
                                  std::to_string(timeout.count()) + " ms");
    }
  }
  if (!broken_.ok()) return broken_;
  if (!first.ok()) broken_ = first;
  return first;
}

Status ActorTensorParallelPeers::create_kv(int32_t kv_id, int64_t num_blocks, int64_t block_size, int64_t num_layers) {
  if (!broken_.ok()) return broken_;
  TpCommand c;
  c.serial = next_serial_++;
  c.op = TpCommand::kCreateKv;
  c.kv_id = kv_id;
  c.num_blocks = num_blocks;
  c.block_size = block_size;
  c.num_layers = num_layers;
  send_all(std::move(c));
  return wait_all(next_serial_ - 1, load_timeout_);
}

void ActorTensorParallelPeers::start_forward(int32_t kv_id, const ForwardBatch& batch) {
  if (!broken_.ok()) return;
  TpCommand c;
  c.serial = next_serial_++;
  c.op = TpCommand::kForward;
  c.kv_id = kv_id;
  c.batch = batch;
  in_flight_ = c.serial;
  send_all(std::move(c));
}

Status ActorTensorParallelPeers::finish_forward() {
  if (!broken_.ok()) return broken_;
  const int64_t serial = in_flight_;
  in_flight_ = 0;
  if (serial == 0) return internal_error("finish_forward without start_forward");
  return wait_all(serial, timeout_);
}

Status ActorTensorParallelPeers::finish_forward_after_failure(const Status& own) {
  if (!broken_.ok()) return broken_;
  const int64_t serial = in_flight_;
  in_flight_ = 0;
  if (serial == 0) return internal_error("finish_forward without start_forward");
  Status st = wait_all(serial, std::min(timeout_, std::chrono::milliseconds(2000)));
  // Rank 0's own collective failed (Gloo / NCCL answer kUnavailable or kDeadlineExceeded):
  // whatever the followers answered, the group is unusable. Other errors (a batch every rank
  // refuses before its first collective) leave it as the followers' answers say.
  const bool comm = own.code() == StatusCode::kUnavailable || own.code() == StatusCode::kDeadlineExceeded;
  if (broken_.ok() && comm) broken_ = Status(own.code(), "tensor parallel rank 0: " + own.message());
  return st;
}

Status ActorTensorParallelPeers::kv_copy_slots(int32_t kv_id, const int32_t* src, const int32_t* dst, int64_t n) {
  if (!broken_.ok()) return broken_;
  TpCommand c;
  c.serial = next_serial_++;
  c.op = TpCommand::kCopySlots;
  c.kv_id = kv_id;
  c.src.assign(src, src + n);
  c.dst.assign(dst, dst + n);
  send_all(std::move(c));
  return wait_all(next_serial_ - 1, timeout_);
}

// ---------------------------------------------------------------- TpRegistry

std::optional<std::string> TpRegistry::value(const std::string& key) const {
  auto it = values_.find(key);
  if (it == values_.end()) return std::nullopt;
  return it->second;
}

std::vector<caf::typed_response_promise<std::string>> TpRegistry::set(const std::string& key, std::string value) {
  values_[key] = std::move(value);
  std::vector<caf::typed_response_promise<std::string>> out;
  auto [b, e] = waiting_.equal_range(key);
  for (auto it = b; it != e; ++it) out.push_back(std::move(it->second));
  waiting_.erase(b, e);
  return out;
}

std::vector<std::pair<caf::typed_response_promise<TpGroupMsg>, TpGroupMsg>> TpRegistry::join(
    const TpJoinMsg& m, int32_t tp_size, caf::typed_response_promise<TpGroupMsg> rp) {
  std::vector<std::pair<caf::typed_response_promise<TpGroupMsg>, TpGroupMsg>> out;
  auto refuse = [&](caf::typed_response_promise<TpGroupMsg> p, std::string why) {
    TpGroupMsg g;
    g.error = std::move(why);
    out.emplace_back(std::move(p), std::move(g));
  };
  if (m.tp_size != tp_size || m.rank < 0 || m.rank >= tp_size || !m.self) {
    refuse(std::move(rp), "rank " + std::to_string(m.rank) + " of tensor_parallel_size " + std::to_string(m.tp_size) +
                              " does not fit the topology's models.target.tensor_parallel_size = " + std::to_string(tp_size));
    return out;
  }
  auto& ranks = joins_[m.replica];
  if (auto it = ranks.find(m.rank); it != ranks.end() && it->second.self != m.self) {
    refuse(std::move(it->second.rp), "rank " + std::to_string(m.rank) + " of replica " + std::to_string(m.replica) +
                                         " joined again from another worker");
  }
  ranks[m.rank] = Joined{m.self, std::move(rp)};
  if (static_cast<int32_t>(ranks.size()) < tp_size) return out;
  const int64_t n = ++incarnations_[m.replica];
  const std::string replica_prefix = "tp/replica-" + std::to_string(m.replica) + "/";
  TpGroupMsg g;
  g.prefix = replica_prefix + "group-" + std::to_string(n);
  for (auto& [rank, j] : ranks) g.ranks.push_back(j.self);
  for (auto& [rank, j] : ranks) out.emplace_back(std::move(j.rp), g);
  joins_.erase(m.replica);
  // Keys of the replica's earlier groups are dead: dropped.
  for (auto it = values_.begin(); it != values_.end();) {
    const bool old = it->first.compare(0, replica_prefix.size(), replica_prefix) == 0 &&
                     it->first.compare(0, g.prefix.size() + 1, g.prefix + "/") != 0;
    it = old ? values_.erase(it) : std::next(it);
  }
  return out;
}

void TpRegistry::forget(const caf::actor_addr& who) {
  for (auto rit = joins_.begin(); rit != joins_.end();) {
    for (auto it = rit->second.begin(); it != rit->second.end();) {
      it = it->second.self.address() == who ? rit->second.erase(it) : std::next(it);
    }
    rit = rit->second.empty() ? joins_.erase(rit) : std::next(rit);
  }
}

}  // namespace specserve
