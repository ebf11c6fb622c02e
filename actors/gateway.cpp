#include "actors/gateway.h"

#include <caf/io/all.hpp>

#include "core/logging.h"
#include "actors/messages.h"
#include "actors/runtime.h"
#include "actors/token_gate.h"

namespace specserve {
namespace {

caf::behavior gateway(caf::event_based_actor* self, caf::actor target, std::string token, std::string what) {
  self->set_exit_handler([](caf::exit_msg&) {});  // remote peers must not stop it
  // It lives as long as its target.
  self->monitor(target);
  self->set_down_handler([self, addr = target.address()](caf::down_msg& m) {
    if (m.source == addr) self->quit();
  });
  self->set_default_handler([what](caf::scheduled_actor*, caf::message_view&) -> caf::result<caf::message> {
    get_logger("actors")->warn("{} gateway: dropped a message that was not a connect request", what);
    return caf::make_error(caf::sec::unexpected_message);
  });
  return {
      [=](connect_atom, const std::string& presented) -> std::tuple<caf::actor, std::string> {
        if (!token_matches(presented, token)) {
          get_logger("actors")->warn("{}: refused a peer: wrong cluster token", what);
          return {caf::actor{}, "refused: wrong cluster token"};
        }
        return {target, ""};
      },
  };
}

// Watches a published gateway. CAF 0.17 delivers a remote `kill` exit message and no actor can
// trap it, so a peer without the token can stop the gateway; the keeper then closes the dead
// gateway's port and publishes a fresh gateway on the same port. Polling (every 100 ms), not
// a monitor: the keeper must notice even when the exit message races with the publish.
struct KeeperState {
  caf::actor gateway;
  uint16_t port = 0;  // CAF's own port, on 127.0.0.1 (the public one is the token gate's)
  int64_t reopened = 0;
  std::shared_ptr<TokenGate> gate;
};

caf::behavior gateway_keeper(caf::stateful_actor<KeeperState>* self, caf::actor target, caf::actor gateway,
                             std::shared_ptr<TokenGate> gate, std::string token, std::string host, uint16_t port,
                             std::string what) {
  self->state.gateway = std::move(gateway);
  self->state.port = port;
  self->state.gate = std::move(gate);
  self->set_exit_handler([](caf::exit_msg&) {});
  self->monitor(target);
  self->set_down_handler([self, addr = target.address()](caf::down_msg& m) {
    if (m.source != addr) return;
    // The target is gone: close the port for good.
    self->state.gate.reset();  // the public port closes first
    self->system().middleman().unpublish(self->state.gateway, self->state.port);
    self->quit();
  });
  self->delayed_send(self, std::chrono::milliseconds(100), tick_atom::value);
  return {
      [=](tick_atom) {
        auto& st = self->state;
        if (st.gateway && st.gateway->getf(caf::abstract_actor::is_terminated_flag)) {
          auto& mm = self->system().middleman();
          mm.unpublish(st.gateway, st.port);
          auto fresh = spawn_gateway(self->system(), target, token, what);
          auto p = mm.publish(fresh, st.port, host.c_str(), true);
          if (p) {
            ++st.reopened;
            get_logger("actors")->warn("{} gateway on port {} was killed by a peer; re-opened the port with a new gateway ({} time(s))",
                                       what, st.port, st.reopened);
            st.gateway = fresh;
          } else {
            // Try again on the next tick (the old socket may still be closing).
            caf::anon_send_exit(fresh, caf::exit_reason::kill);
            get_logger("actors")->warn("{} gateway on port {} was killed; re-opening failed ({}); retrying", what, st.port,
                                       self->system().render(p.error()));
          }
        }
        self->delayed_send(self, std::chrono::milliseconds(100), tick_atom::value);
      },
  };
}

}  // namespace

caf::actor spawn_gateway(caf::actor_system& sys, caf::actor target, std::string token, std::string what) {
  return sys.spawn(gateway, std::move(target), std::move(token), std::move(what));
}

Expected<caf::actor> connect_through_gateway(caf::actor_system& sys, const std::string& host, uint16_t port,
                                             const std::string& token, std::chrono::milliseconds timeout) {
  // The token first, on the connection itself (actors/token_gate.h); CAF then talks through a
  // forwarder on 127.0.0.1 spliced to the authenticated connection.
  auto local = connect_token_gate(host, port, token, timeout);
  if (!local.ok()) return local.status();
  auto g = sys.middleman().remote_actor("127.0.0.1", *local);
  if (!g) return unavailable("cannot connect to " + host + ":" + std::to_string(port) + ": " + sys.render(g.error()));
  caf::scoped_actor self{sys};
  Expected<caf::actor> out = unavailable("no answer from " + host + ":" + std::to_string(port));
  self->request(*g, timeout, connect_atom::value, token)
      .receive(
          [&](caf::actor& a, std::string& err) {
            if (a) out = a;
            else out = invalid_argument(host + ":" + std::to_string(port) + ": " + err);
          },
          [&](caf::error& e) { out = unavailable(host + ":" + std::to_string(port) + ": " + sys.render(e)); });
  return out;
}

Expected<uint16_t> publish_with_gateway(caf::actor_system& sys, caf::actor target, const std::string& token,
                                        const std::string& host, uint16_t port, const std::string& what) {
  // CAF listens on loopback only; the public host:port is the token gate's (actors/token_gate.h).
  auto g = spawn_gateway(sys, target, token, what);
  auto p = sys.middleman().publish(g, 0, "127.0.0.1", true);
  if (!p) {
    caf::anon_send_exit(g, caf::exit_reason::kill);
    return unavailable(sys.render(p.error()));
  }
  auto gate = TokenGate::start(host, port, *p, token, what);
  if (!gate.ok()) {
    sys.middleman().unpublish(g, *p);
    caf::anon_send_exit(g, caf::exit_reason::kill);
    return gate.status();
  }
  const uint16_t public_port = (*gate)->port();
  // Detached: the keeper calls the middleman's blocking publish API.
  sys.spawn<caf::detached>(gateway_keeper, target, g, std::shared_ptr<TokenGate>(std::move(*gate)), token,
                           std::string("127.0.0.1"), *p, what);
  return public_port;
}

}  // namespace specserve
