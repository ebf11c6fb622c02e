// specserve actors: the only actor a network port exposes.
//
// A published actor can be sent anything by anyone who reaches the port, exit messages
// included (CAF 0.17 has no connection-level authentication). So the head and the draft
// workers publish a gateway instead of the actor that does the work: it answers
// `(connect_atom, token)` with the real actor's handle when the token is the cluster's, and
// refuses (and logs) anything else. Only peers that presented the token ever learn the
// scheduler's or a draft worker's handle. The gateway ignores exit messages and lives as long as
// its target.
// NOTE: CAF 0.17 delivers `exit_reason::kill` from a remote peer and it cannot be trapped: a
// peer without the token can stop the gateway. A keeper (publish_with_gateway) notices within
// 100 ms and publishes a fresh gateway on the same port, so new peers can connect again and
// those already connected never notice; the attacker learns nothing. Authentication below the
// actor layer (TLS with libcaf_openssl) would refuse such a peer outright; not built.
#pragma once

#include <caf/all.hpp>

#include <string>

#include "core/status.h"

namespace specserve {

using connect_atom = caf::atom_constant<caf::atom("connect")>;

/// Spawns a gateway for `target`. `what` names the target in logs ("head", "draft worker").
caf::actor spawn_gateway(caf::actor_system& sys, caf::actor target, std::string token, std::string what);

/// Asks the gateway at host:port for its actor, presenting `token`. Errors: kUnavailable (the
/// port cannot be reached), kInvalidArgument ("refused: wrong cluster token").
Expected<caf::actor> connect_through_gateway(caf::actor_system& sys, const std::string& host, uint16_t port,
                                             const std::string& token, std::chrono::milliseconds timeout);

/// Publishes a gateway for `target` on host:port (0: any free port) and keeps it published:
/// a killed gateway is replaced within about 100 ms, on the same port, for as long as
/// `target` lives (then the port is closed). Returns the bound port.
Expected<uint16_t> publish_with_gateway(caf::actor_system& sys, caf::actor target, const std::string& token,
                                        const std::string& host, uint16_t port, const std::string& what);

}  // namespace specserve
