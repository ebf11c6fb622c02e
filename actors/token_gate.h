// specserve actors: the cluster token checked on the TCP connection itself, before a single byte
// reaches CAF.
//
// CAF 0.17's BASP reader trusts its peer: a 40-byte garbage header crashes the process
// (SIGSEGV in caf::io::basp::instance::handle) and a 32-byte header with a 4 GiB payload size
// makes it allocate 4 GiB, both before any actor (and so before the gateway's token check,
// actors/gateway.h) sees a message. So no outside peer talks to CAF directly:
// - the server side (TokenGate) listens on the public actor port; a connection must first send
//   a preamble holding the cluster token, within 5 s; only then is it spliced, byte for byte, to
//   CAF's middleman, which listens on 127.0.0.1 on a port of its own. Anything else is closed
//   and logged; at most 64 connections may be in their handshake at once, and at most 16 from
//   one peer address (more are closed at once), so a flood costs threads only briefly and one
//   flooding address cannot hold every handshake slot from the cluster's other hosts.
// - the client side (connect_token_gate) connects, sends the preamble, reads the verdict, and
//   hands CAF a one-shot forwarder on 127.0.0.1 that splices to the authenticated connection.
// Preamble (client -> gate): 8 bytes "SSGATE01", u32 little-endian token length (1..4096),
// the token bytes. Verdict (gate -> client): one byte, 'Y' (spliced from now on) or 'N'
// (wrong token; the gate closes).
// - CAF's internal port is guarded too (Linux): a BPF socket filter on its listening socket lets
//   a connection in only from 127.0.0.1 and the source port of one of the gate's own inner
//   connections, so another local process cannot reach CAF behind the gate (a trial crashed
//   `up` that way); a client's forwarder splices only a connection from its own process.
// NOTE: the token travels in clear text, as it did before inside the CAF message; TLS is not
// built for the actor port.
// Thread-safety: a TokenGate is made and destroyed on one thread; its threads are its own.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#include "core/status.h"

namespace specserve {

/// The public side of an actor port: accepts on host:port, checks the token preamble, splices
/// accepted connections to 127.0.0.1:`inner_port` (CAF). Stops (closing the listening socket,
/// not the spliced connections) when destroyed.
class TokenGate {
 public:
  /// Binds host:port (0: a free port) and starts accepting. `what` names it in logs ("head").
  /// Errors: kUnavailable (cannot resolve or bind, naming host:port and errno's text).
  static Expected<std::unique_ptr<TokenGate>> start(const std::string& host, uint16_t port, uint16_t inner_port,
                                                    std::string token, std::string what);
  ~TokenGate();
  TokenGate(const TokenGate&) = delete;
  TokenGate& operator=(const TokenGate&) = delete;

  uint16_t port() const { return port_; }  ///< the bound public port
  int64_t refused() const;  ///< connections closed without a valid preamble so far

  /// What the handshake threads share (they may outlive the gate by up to 5 s).
  struct Shared {
    std::string token, what;
    uint16_t inner_port = 0;
    std::atomic<int> pending{0};
    std::mutex peers_mu;
    std::map<std::string, int> pending_by_peer;  // peer address -> its connections in handshake (guarded by peers_mu)
    std::atomic<int64_t> refused{0};
    std::atomic<int64_t> last_warn_ms{-1000000};  // steady-clock ms of the last warning (one per second at most)
    std::atomic<int64_t> unwarned{0};             // refusals since it
    /// CAF's listening socket (found at start; -1: not found, unguarded) and the source ports
    /// its filter lets through: those of the gate's live inner connections (token_gate.cpp).
    int inner_listener = -1;
    std::mutex filter_mu;
    std::multiset<uint16_t> inner_allowed;  // guarded by filter_mu
  };

 private:
  TokenGate() = default;
  void accept_loop();

  int listen_fd_ = -1;
  int wake_[2] = {-1, -1};  // a pipe: the destructor wakes the accept loop
  uint16_t port_ = 0;
  std::shared_ptr<Shared> shared_;
  std::thread acceptor_;
};

/// Connects to the gate at host:port, presents `token`, and on acceptance returns a port on
/// 127.0.0.1 whose first connection (within `timeout`) is spliced to the gate (for CAF's
/// remote_actor). Errors: kUnavailable (cannot resolve or connect, no verdict within `timeout` or
/// 12 s, whichever is shorter: a gate answers within its two 5 s handshake bounds;
/// not a specserve actor port), kInvalidArgument ("refused: wrong cluster token").
Expected<uint16_t> connect_token_gate(const std::string& host, uint16_t port, const std::string& token,
                                      std::chrono::milliseconds timeout);

/// The preamble a client sends for `token` (for tests).
std::string token_gate_preamble(const std::string& token);

}  // namespace specserve
