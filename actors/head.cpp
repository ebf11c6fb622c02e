#include "actors/head.h"

#include <algorithm>

#include "actors/gateway.h"
#include "actors/messages.h"
#include "core/logging.h"

namespace specserve {

Expected<std::unique_ptr<Head>> Head::start(ActorRuntime& runtime, const Topology& topology, std::string token,
                                            bool publish, std::function<Status(int32_t replica)> start_replica) {
  std::unique_ptr<Head> h(new Head(runtime));
  h->token_ = token;
  auto f = GgufFile::open(topology.models.target.path);
  if (!f.ok()) return Status(f.status().code(), topology.where("models.target.path") + ": models.target.path: " + f.status().message());
  auto gguf = std::make_shared<GgufFile>(std::move(*f));
  auto tok = Tokenizer::from_gguf(*gguf);
  if (!tok.ok()) return Status(tok.status().code(), topology.where("models.target.path") + ": models.target.path: " + tok.status().message());
  h->gguf_ = gguf;
  h->tokenizer_ = std::make_shared<Tokenizer>(std::move(*tok));
  SchedulerConfig sc;
  sc.topology = topology;
  sc.token = std::move(token);
  sc.gguf = h->gguf_;
  sc.tokenizer = h->tokenizer_;
  sc.start_replica = std::move(start_replica);
  h->scheduler_ = spawn_scheduler(runtime.system(), std::move(sc));
  if (publish) {
    auto port = publish_with_gateway(runtime.system(), h->scheduler_, h->token_, topology.head.host,
                                     static_cast<uint16_t>(topology.head.actor_port), "head");
    if (!port.ok()) {
      caf::anon_send_exit(h->scheduler_, caf::exit_reason::user_shutdown);
      return unavailable(topology.where("head.actor_port") + ": head.actor_port: cannot listen on " + topology.head.host +
                         ":" + std::to_string(topology.head.actor_port) + ": " + port.status().message());
    }
    h->port_ = *port;
    get_logger("actors")->info("head: actor port {}:{} (cluster '{}'; peers must present the cluster token)",
                               topology.head.host, h->port_, topology.cluster.name);
  }
  return h;
}

Head::~Head() { stop(); }

Status Head::drain(std::chrono::milliseconds timeout, const std::function<bool()>& give_up) {
  caf::scoped_actor self{runtime_.system()};
  const auto end = std::chrono::steady_clock::now() + timeout;
  // In slices when `give_up` is set: each asks again (the scheduler answers every drain request
  // once the cluster has drained; a timed-out one's answer goes nowhere).
  while (true) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end - std::chrono::steady_clock::now());
    const auto slice = give_up ? std::min(left, std::chrono::milliseconds(200)) : left;
    bool done = false, timed_out = false;
    Status st;
    self->request(scheduler_, std::max(slice, std::chrono::milliseconds(1)), drain_atom::value, token_)
        .receive([&](bool) { done = true; },
                 [&](caf::error& e) {
                   timed_out = e == caf::sec::request_timeout;
                   st = deadline_exceeded("drain: " + runtime_.system().render(e));
                 });
    if (done) return Status();
    if (!timed_out || std::chrono::steady_clock::now() >= end) return st;
    if (give_up && give_up()) return cancelled("drain: cut short");
  }
}

void Head::forget_restarts() {
  if (scheduler_) caf::anon_send(scheduler_, no_restart_atom::value, token_);
}

void Head::stop() {
  if (!scheduler_) return;
  caf::anon_send_exit(scheduler_, caf::exit_reason::user_shutdown);
  scheduler_ = caf::actor{};
}

}  // namespace specserve
