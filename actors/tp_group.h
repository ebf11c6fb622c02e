// specserve actors: a tensor-parallel target model whose ranks are target-shard actors (issue 9).
//
// A replica with models.target.tensor_parallel_size N has N target_shard workers, ranks 0..N-1,
// each in its own process (or thread of `specserve serve`), possibly on different hosts. Rank 0
// is the replica's shard as the scheduler sees it: it owns the Engine, and its Transformer is
// an ordinary one to the engine and proposers. Ranks 1..N-1 are followers (actors/tp_rank.h):
// they hold their shard of the weights and KV and run what rank 0 tells them. The split is
// Megatron-LM's (model/communicator.h); the ranks meet in each layer's all-reduce over Gloo.
//
// How a group forms:
//   1. every rank sends TpJoinMsg to the scheduler, which answers each once all N ranks of the
//      replica joined (TpGroupMsg: a key prefix unique to this incarnation, every rank's actor);
//   2. every rank connects its communicator (Gloo on the CPU, NCCL on GPUs) through
//      ActorRendezvousStore — a key-value store kept by the scheduler, reached with actor
//      messages (so Gloo's addresses and NCCL's unique id travel through the actors and their
//      cluster-token gate);
//   3. every rank loads its shard; rank 0 drives the others with ActorTensorParallelPeers
//      (TpCommand messages: create a KV store, run a forward batch, copy KV slots; only token
//      ids and block tables travel — never activations).
// A rank that dies breaks the group: rank 0 quits (its requests are re-queued by the scheduler
// and recomputed on another replica), the followers quit when rank 0 goes down.
#pragma once

#include <caf/all.hpp>

#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "actors/messages.h"
#include "actors/worker_config.h"
#include "core/status.h"
#include "model/communicator.h"
#include "model/transformer.h"

namespace specserve {

/// A RendezvousStore (model/communicator.h) kept by the scheduler actor: set and get are
/// requests to it ((rdv_set_atom, key, value), (rdv_get_atom, key)). Callable from any thread
/// that may block (each call uses its own scoped actor).
class ActorRendezvousStore final : public RendezvousStore {
 public:
  ActorRendezvousStore(caf::actor_system& sys, caf::actor scheduler) : sys_(sys), scheduler_(std::move(scheduler)) {}
  /// Errors: kUnavailable naming the key when the scheduler does not answer within 10 s.
  Status set(const std::string& key, const std::vector<char>& value) override;
  /// Errors: kDeadlineExceeded naming the key when no rank set it within `timeout`;
  /// kUnavailable when the scheduler is unreachable.
  Expected<std::vector<char>> get(const std::string& key, std::chrono::milliseconds timeout) override;

 private:
  caf::actor_system& sys_;
  caf::actor scheduler_;
};

/// Blocks until every rank of `replica` joined (TpJoinMsg to `scheduler`); returns the group.
/// Errors: kDeadlineExceeded naming the replica and tensor_parallel_size when the other ranks do
/// not join within `timeout` (a rank's process did not start, or failed to load); kInvalidArgument
/// with the scheduler's reason when it refuses the join (wrong token, another rank count).
Expected<TpGroupMsg> join_tp_group(caf::actor_system& sys, const caf::actor& scheduler, const TpJoinMsg& join,
                                   std::chrono::milliseconds timeout);

/// A rank's place in its group once connected.
struct TpConnection {
  TpGroupMsg group;                     ///< every rank's actor
  /// Gloo over cfg.tp_host (loopback when empty) on the CPU; NCCL on cfg.device for cuda:N
  /// (gpu/nccl_communicator.h; untested on a GPU so far).
  std::unique_ptr<Communicator> comm;
};

/// Steps 1 and 2 above for the worker `cfg` (rank cfg.rank of cfg.replica, whose actor is
/// `self`): joins the group, then connects its communicator through the scheduler's store: Gloo
/// when the worker's device is the CPU, NCCL (one GPU per rank) when it is cuda:N.
/// Waits at most tp_join_timeout(cfg.topology) for the other ranks. Errors: those of
/// join_tp_group and make_gloo_communicator (naming the replica and rank).
Expected<TpConnection> connect_tp_group(caf::actor_system& sys, const WorkerConfig& cfg, const caf::actor& self);

/// Whether the target model splits over models.target.tensor_parallel_size ranks (reads the
/// GGUF header only): checked before any rank joins or connects, so an impossible size fails at
/// once on every rank (and in `serve` / `up` before anything starts) instead of leaving ranks
/// waiting for peers. OK for tensor_parallel_size 1. Errors: kInvalidArgument naming the field
/// (where it was given) and the value, e.g. more ranks than the model's kv heads; those of
/// opening the model, naming models.target.path.
Status check_tensor_parallel_size(const Topology& topology);

/// How long a rank waits for the other ranks of its group: the topology's
/// autoscale.start_timeout_s (default 300 s; also without an autoscale section).
std::chrono::milliseconds tp_join_timeout(const Topology& topology);

/// Rank 0's TensorParallelPeers (model/transformer.h) over actors: each call sends a TpCommand
/// to every follower and (for create_kv, kv_copy_slots, finish_forward) waits for their
/// (tp_done_atom, ...) answers. Followers are monitored, so a follower that dies fails the wait at
/// once instead of at the deadline. After any failure broken() is true and every later call
/// fails: the group cannot be repaired, the replica must restart.
/// Thread-safety: one thread (rank 0's actor thread), as the Transformer it serves.
class ActorTensorParallelPeers final : public TensorParallelPeers {
 public:
  /// `followers[i]` is rank i + 1. `timeout`: longest wait for one command's answers;
  /// `load_timeout`: for create_kv, the first command, which waits for followers still loading
  /// their shard.
  ActorTensorParallelPeers(caf::actor_system& sys, std::vector<caf::actor> followers, std::chrono::milliseconds timeout,
                           std::chrono::milliseconds load_timeout);
  ~ActorTensorParallelPeers() override;

  Status create_kv(int32_t kv_id, int64_t num_blocks, int64_t block_size, int64_t num_layers) override;
  void start_forward(int32_t kv_id, const ForwardBatch& batch) override;
  Status finish_forward() override;
  /// Waits at most 2 s for the followers' answers, then the group is broken (a follower whose
  /// process died answers never, and its down message may not reach this process at all).
  Status finish_forward_after_failure(const Status& own) override;
  Status kv_copy_slots(int32_t kv_id, const int32_t* src, const int32_t* dst, int64_t n) override;

  /// The actor the answers come to. (tp_abort_atom, why) sent to it breaks the group: a wait in
  /// progress or the next one returns kUnavailable with `why` at once (the scheduler sends it when
  /// it sees a follower go down; tp_messages.h).
  caf::actor waiter() const { return caf::actor_cast<caf::actor>(waiter_); }

  /// A command failed, timed out or a follower went down.
  bool broken() const { return !broken_.ok(); }
  /// Why (empty status when not broken).
  const Status& why_broken() const { return broken_; }

 private:
  void send_all(TpCommand cmd);
  Status wait_all(int64_t serial, std::chrono::milliseconds timeout);

  std::vector<caf::actor> followers_;
  std::chrono::milliseconds timeout_, load_timeout_;
  caf::scoped_actor waiter_;
  int64_t next_serial_ = 1;
  int64_t in_flight_ = 0;  // serial of the forward started and not finished; 0: none
  Status broken_;
};

/// The scheduler's side: the rendezvous store's keys and the groups being formed. Plain data
/// (no actor), driven by the scheduler's handlers.
class TpRegistry {
 public:
  /// The value of `key`, when set.
  std::optional<std::string> value(const std::string& key) const;
  /// Stores `value` and returns the promises of gets that waited for `key` (to deliver it to).
  std::vector<caf::typed_response_promise<std::string>> set(const std::string& key, std::string value);
  /// Parks a get of a key not set yet.
  void wait(const std::string& key, caf::typed_response_promise<std::string> rp) { waiting_.emplace(key, std::move(rp)); }

  /// A join; when it completes its replica's group, returns every joined rank's promise with the
  /// TpGroupMsg to deliver (one per rank). A second join of the same rank replaces the first
  /// (its promise answered with an error). A join whose tp_size differs from the topology's is
  /// answered with an error at once.
  std::vector<std::pair<caf::typed_response_promise<TpGroupMsg>, TpGroupMsg>> join(
      const TpJoinMsg& m, int32_t tp_size, caf::typed_response_promise<TpGroupMsg> rp);
  /// A joined rank went down before its group completed: forgotten.
  void forget(const caf::actor_addr& who);

 private:
  struct Joined {
    caf::actor self;
    caf::typed_response_promise<TpGroupMsg> rp;
  };
  std::map<std::string, std::string> values_;
  std::multimap<std::string, caf::typed_response_promise<std::string>> waiting_;
  std::map<int32_t, std::map<int32_t, Joined>> joins_;  // replica -> rank -> join
  std::map<int32_t, int64_t> incarnations_;             // replica -> groups formed so far
};

}  // namespace specserve
