// specserve actors: what the target-shard actor's .cpp files share (not part of the public API).
//
// target_shard.cpp (the actor's behavior: work, aborts, drafts, drains, rebalance, KV offers'
// lifetime, retirement), target_shard_load.cpp (loading, warm-up and the WorkerHello it reports),
// target_shard_step.cpp (engine steps, their events to request actors and the load to the
// scheduler) and target_shard_migration.cpp (work arriving, new or migrated with its KV fetched on a
// thread; sequences leaving with a KV offer; quitting once drained) all work on ShardState, defined
// here. Include only from actors/target_shard*.cpp.
#pragma once

#include <caf/all.hpp>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "actors/kv_data_plane.h"
#include "actors/messages.h"
#include "actors/remote_proposer.h"
#include "actors/tp_group.h"
#include "actors/worker_config.h"
#include "model/communicator.h"
#include "model/model_loader.h"
#include "spec/engine.h"

namespace specserve {
namespace target_shard_internal {

using Clock = std::chrono::steady_clock;

struct Running {
  int64_t seq_id = 0;
  int32_t attempt = 0;
  caf::actor request_actor;
  int64_t num_tokens = 0;  // prompt + output so far
  int32_t top_n = 0;       // top logprobs per token: sampling.logprobs, at most the vocabulary
  int64_t end_tokens = 0;  // prompt + max_tokens: num_tokens when it finishes by length
};

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

/// True for a prefill worker (disaggregated prefill): it hands every request over after its first token.
bool prefill_only(const ShardState& s);

using Self = caf::stateful_actor<ShardState>*;

// ---------------------------------------------------------------- start-up (target_shard_load.cpp)

/// This worker's registration with the scheduler in `state` ("loading", "warming", "ready", "failed"
/// with `error`): its limits, KV blocks, timings and data-plane address.
WorkerHello hello(Self self, const std::string& state, const std::string& error = "");

/// Loads the model and proposer, runs a warm-up request through the engine, and rebuilds the
/// engine so that counters start at zero.
Status load_and_warm(Self self);

// ---------------------------------------------------------------- steps (target_shard_step.cpp)

/// Sends the actor one step_atom unless one is pending already (one step per message, so new work
/// and aborts interleave with steps).
void schedule_step(Self self);

/// The shard's load for the scheduler (ShardLoad): engine counts and KV blocks, with the migrated
/// requests still fetching their KV counted as waiting.
ShardLoad load_of(ShardState& s);

/// Runs one engine step and sends its events: accepted tokens to each request actor, the load to
/// the scheduler; a failed step fails its longest request (or stops the shard when the
/// tensor-parallel group is broken).
void do_step(Self self);

// ---------------------------------------------------------------- work in and out (target_shard_migration.cpp)

/// Quits once a drained or retired shard has nothing left: no sequence, no fetch, no KV offer.
void maybe_quit(Self self);

/// Arms the 5 s timer that frees expired KV offers (tick_atom), when offers are out and none is armed.
void schedule_expiry(Self self);

/// Moves one request's sequence off this shard: its state and (when it has a data plane) a KV
/// offer go to the scheduler, which hands them to another replica. Its events so far were sent
/// before this, on the same connection, so the request actor has them all.
void migrate_out(Self self, int64_t rid, const std::string& reason);

/// A WorkItem arrives. A migrated request whose KV can be fetched gets a fetch thread (the step
/// loop goes on meanwhile) and is added when kv_fetched_atom comes back; everything else is added
/// now.
void receive_work(Self self, WorkItem w);

/// The fetch `serial` ended (its bytes are in host memory, or it failed): the request joins the
/// engine, with its KV when the transfer worked.
void kv_fetched(Self self, int64_t serial);

}  // namespace target_shard_internal
}  // namespace specserve
