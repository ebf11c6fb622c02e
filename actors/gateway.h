// specserve actors: the only actor a network port exposes.
//
// A published actor can be sent anything by anyone who reaches the port, exit messages
// included (CAF 0.17 has no connection-level authentication). So the head and the draft
// workers publish a gateway instead of the actor that does the work: it answers
// `(connect_atom, token)` with the real actor's handle when the token is the cluster's, and
// refuses (and logs) anything else. Only peers that presented the token ever learn the
// scheduler's or a draft worker's handle. The gateway ignores exit messages and lives as long as
// its target.
// Below the actors, the port itself is a token gate (actors/token_gate.h): a connection must
// present the token before any byte reaches CAF, whose own reader crashes on a malformed
// header; CAF listens on 127.0.0.1 only, behind it.
// NOTE: CAF 0.17 delivers `exit_reason::kill` from a remote peer and it cannot be trapped: a
// peer that got through the gate (it had the token), or a process on the same host reaching
// CAF's loopback port, can stop the gateway. A keeper (publish_with_gateway) notices within
// 100 ms and publishes a fresh gateway on the same port, so new peers can connect again and
// those already connected never notice. TLS is not built: the token travels in clear text.
#pragma once

#include <caf/all.hpp>

#include <string>

#include "core/status.h"

namespace specserve {

using connect_atom = caf::atom_constant<caf::atom("connect")>;

/// Spawns a gateway for `target`. `what` names the target in logs ("head", "draft worker").
caf::actor spawn_gateway(caf::actor_system& sys, caf::actor target, std::string token, std::string what);

/// Presents `token` to the token gate at host:port, then asks the gateway behind it for its
/// actor. Errors: kUnavailable (the port cannot be reached, or is not a specserve actor port),
/// kInvalidArgument ("host:port: refused: wrong cluster token").
Expected<caf::actor> connect_through_gateway(caf::actor_system& sys, const std::string& host, uint16_t port,
                                             const std::string& token, std::chrono::milliseconds timeout);

/// Publishes a gateway for `target` behind a token gate on host:port (0: any free port) and
/// keeps it published: a killed gateway is replaced within about 100 ms, for as long as
/// `target` lives (then the port is closed). Returns the bound public port. Errors:
/// kUnavailable (CAF cannot listen on 127.0.0.1, or host:port cannot be bound).
Expected<uint16_t> publish_with_gateway(caf::actor_system& sys, caf::actor target, const std::string& token,
                                        const std::string& host, uint16_t port, const std::string& what);

}  // namespace specserve
