// specserve actors: the head — the scheduler actor and one request actor per request.
//
// Scheduler actor: registers workers (WorkerHello; the cluster token is checked, a wrong one is
// refused and logged), monitors them, keeps the global queue, and on every change runs the
// dispatch policy (scheduler/dispatch.h: priorities with aging, head-of-line blocking, KV
// admission, least-loaded ready replica) to hand requests to ready replicas. Each replica's
// engine then runs the per-step policy (continuous batching, chunked prefill, token budget with
// draft tokens counted, recompute preemption, k per sequence: spec/engine.h) next to its logits.
// When a replica's target shard goes down, its requests are re-queued first in line and resume
// on another replica from the tokens already streamed (GenerateParams::resume_output), so the
// client sees no error and greedy output is unchanged. When a draft worker goes down, its
// replica keeps serving without drafts.
//
// Request actor: owns one request — its tokens so far, streaming to the client's sink
// (StreamChunk), cancellation, deadline (finish reason "timeout"), and the client going away
// (cancel). It drops events of an attempt that is no longer current.
#pragma once

#include <caf/all.hpp>

#include <memory>
#include <string>

#include "config/topology.h"
#include "model/gguf.h"
#include "model/tokenizer.h"

namespace specserve {

struct SchedulerConfig {
  Topology topology;
  std::string token;
  /// The target's GGUF (chat template) and tokenizer: the head tokenizes prompts; only token ids
  /// travel to replicas.
  std::shared_ptr<const GgufFile> gguf;
  std::shared_ptr<const Tokenizer> tokenizer;
  double aging_s = 10.0;  ///< see DispatchOptions
};

caf::actor spawn_scheduler(caf::actor_system& sys, SchedulerConfig config);

}  // namespace specserve
