// specserve actors: the target-shard actor — one tensor-parallel rank of a replica's target
// model (today every replica has one rank: tensor_parallel_size 1; NCCL ranks come with the
// CUDA backend, issue 9).
//
// It loads the model, allocates its KV cache and runs a warm-up pass before it reports
// "ready" to the scheduler (WorkerHello: loading -> warming -> ready, with load and warm-up
// times). It then owns an Engine: WorkItems become sequences; it steps while it has work (one
// self-message per step, so new work and aborts interleave with steps), verifies drafts where
// the logits are, and sends each request actor only the accepted tokens (ShardEvent) and the
// scheduler its load (ShardLoad). Drafts come from a local proposer or, when the replica has a
// draft worker, from that worker (AttachDraftMsg; RemoteProposer).
// The actor runs detached (its own thread): a forward pass blocks for milliseconds.
// It quits when the scheduler goes down.
#pragma once

#include <caf/all.hpp>

#include "actors/worker_config.h"

namespace specserve {

/// Spawns the actor; loading happens on its own thread after this returns.
caf::actor spawn_target_shard(caf::actor_system& sys, WorkerConfig config);

}  // namespace specserve
