// specserve server: noticing that an HTTP client went away while its request runs.
//
// cpp-httplib 0.11 gives a handler no access to its connection, and a non-streamed request
// writes nothing until it is done, so a client that disconnected would go unnoticed until the
// end (vLLM aborts such requests). DisconnectWatch finds the connection's socket by its
// addresses (in /proc/self/fd, Linux) and polls it for a closed peer.
#pragma once

#include <httplib.h>

#include <chrono>

namespace specserve {

/// Watches the connection of one request, from the request's own handler thread (only that
/// thread closes the connection, so the descriptor stays valid while the handler runs).
/// NOTE: the socket is looked up at construction, while the peer is surely connected: once the
/// server wrote to a gone client, the peer's reset leaves the socket without a peer address to
/// match. The look-up reads /proc/self/fd: a few dozen descriptors, microseconds.
class DisconnectWatch {
 public:
  explicit DisconnectWatch(const httplib::Request& req);
  /// True when the peer closed the connection or shut down its sending side (uvicorn, vLLM's
  /// server, takes that as a disconnect too); polls at most once a second, false in between
  /// and when the socket was not found.
  bool gone();
  /// Ends reading from the connection: after this answer cpp-httplib closes it instead of
  /// waiting (keep-alive, up to 5 s) for another request.
  void stop_reading();

 private:
  int fd_;  // -1: not found
  std::chrono::steady_clock::time_point last_;
};

}  // namespace specserve
