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
// Replica lifecycle and autoscaling (scheduler/autoscale_policy.h): each replica the topology
// declares is starting -> loading -> warming -> ready (routed) -> draining -> standby (loaded and
// warm, not routed) -> stopped, with the time spent in each state. Without an `autoscale:`
// section that enables it, every replica that reports ready is routed (static serving). With
// one, a timer (every 100 ms) runs the policy: a replica that finishes its warm-up parks in
// standby; promotion is a state flip here, so the promoted replica gets queued work at once, and
// a routed replica with requests waiting in its engine (beyond its batch) while another routed
// replica has a free batch slot hands the waiting ones back (reclaim_atom: rebalance);
// a cold start asks SchedulerConfig::start_replica for the replica's processes; a drained replica
// stops receiving work and finishes its in-flight requests (their streams go on) before it parks
// in standby or is stopped (retire_atom: its workers quit normally). A replica's draft worker
// shares its fate: parked with it in standby, told to quit when its target shard is stopped or
// lost, and told to quit when it registers for a start the head already gave up.
//
// Request actor: one per request (actors/request_actor.h).
#pragma once

#include <caf/all.hpp>

#include <functional>
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
  /// Starts the worker processes of replica `replica` (a cold start for the autoscaler). Called
  /// on the scheduler's thread; must return quickly (spawn, do not wait). Null: the head cannot
  /// start processes; the autoscaler then only promotes, drains and parks replicas that register.
  /// Errors (e.g. the replica's workers are on another host) mark the replica as not startable.
  std::function<Status(int32_t replica)> start_replica;
};

caf::actor spawn_scheduler(caf::actor_system& sys, SchedulerConfig config);

}  // namespace specserve
