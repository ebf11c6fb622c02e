// specserve actors: the draft-worker actor — a proposer and its own KV cache, serving "propose
// for these sequences" (ProposeMsg -> ProposeReply) for the target shard of its replica.
//
// It keeps each sequence's token list (messages carry only new tokens) and lets the proposer
// roll its KV back to the accepted prefix on the next call (spec/model_drafter.h). When
// sampling, a model drafter draws from a truncated q (see ProposerBuildOptions) so that q
// travels sparse and speculative sampling stays exactly lossless. Like the shard it loads,
// warms up, and reports loading -> warming -> ready; in its own process it also opens a port on
// `WorkerConfig::listen_host` for the shard to connect to directly. Requests without the cluster
// token are refused. Runs detached; quits when the scheduler goes down.
#pragma once

#include <caf/all.hpp>

#include "actors/worker_config.h"

namespace specserve {

caf::actor spawn_draft_worker(caf::actor_system& sys, WorkerConfig config);

}  // namespace specserve
