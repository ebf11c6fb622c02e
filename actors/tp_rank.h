// specserve actors: a tensor-parallel rank > 0 of a replica's target model (actors/tp_group.h).
//
// It registers with the scheduler like any worker (WorkerHello, role target_shard, its rank:
// loading -> ready, or failed with the reason), joins its replica's group, connects its Gloo
// communicator through the scheduler's rendezvous store, loads its shard of the weights
// (model/transformer.h, TensorParallelShard) and then runs the TpCommands rank 0 sends: create
// a KV store, run a forward batch (meeting rank 0 in every all-reduce), copy KV slots. It holds
// no engine and takes no requests. It quits when rank 0 or the scheduler goes down, or when
// the scheduler retires it. The actor runs detached: a forward blocks in collectives.
#pragma once

#include <caf/all.hpp>

#include "actors/worker_config.h"

namespace specserve {

/// Spawns the follower rank `config.rank` (>= 1) of replica `config.replica`; loading happens on
/// its own thread after this returns.
caf::actor spawn_tp_rank(caf::actor_system& sys, WorkerConfig config);

}  // namespace specserve
