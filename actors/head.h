// specserve actors: the head of a cluster in one object — the scheduler actor, the target's
// tokenizer, and the actor port (published on head.host:head.actor_port).
#pragma once

#include <caf/all.hpp>

#include <memory>
#include <string>

#include "actors/runtime.h"
#include "actors/scheduler.h"
#include "config/topology.h"

namespace specserve {

class Head {
 public:
  /// Opens the target GGUF (tokenizer and chat template only; weights stay with the workers),
  /// spawns the scheduler and, when `publish`, opens the actor port (head.host, head.actor_port;
  /// port 0 picks a free one). Errors name the field: an unreadable model, a port in use.
  /// `start_replica`: see SchedulerConfig::start_replica (the autoscaler's cold starts); null
  /// when this head cannot start processes.
  static Expected<std::unique_ptr<Head>> start(ActorRuntime& runtime, const Topology& topology, std::string token,
                                               bool publish = true,
                                               std::function<Status(int32_t replica)> start_replica = {});
  ~Head();

  caf::actor scheduler() const { return scheduler_; }
  /// The actor port actually bound (0 when not published).
  uint16_t actor_port() const { return port_; }
  const Tokenizer& tokenizer() const { return *tokenizer_; }
  /// The target's GGUF metadata (chat template, vocabulary); valid while the Head lives.
  const GgufFile& gguf() const { return *gguf_; }
  /// Stops accepting requests and waits for the in-flight ones (at most `timeout`).
  /// `give_up`, when set, is asked about every 200 ms while the drain waits; true ends the wait
  /// with kCancelled (a second Ctrl-C: cluster/launch_lifecycle.cpp shut_down).
  Status drain(std::chrono::milliseconds timeout, const std::function<bool()>& give_up = {});
  /// Tells the scheduler that no worker will be restarted (every node process is gone): requests
  /// that wait for a restart (scheduler.worker_restarts) fail now unless another replica serves.
  void forget_restarts();
  /// Stops the scheduler (workers watching it quit).
  void stop();

 private:
  Head(ActorRuntime& rt) : runtime_(rt) {}
  ActorRuntime& runtime_;
  std::string token_;
  std::shared_ptr<const GgufFile> gguf_;
  std::shared_ptr<const Tokenizer> tokenizer_;
  caf::actor scheduler_;
  uint16_t port_ = 0;
};

}  // namespace specserve
