#include "server/connection_watch.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>

#include <cstdlib>
#include <string>

#include "core/own_fds.h"

namespace specserve {
namespace {

// The addresses of the connection a request arrived on.
struct ConnectionAddress {
  std::string remote_addr, local_addr;
  int remote_port = -1, local_port = -1;
  explicit ConnectionAddress(const httplib::Request& r)
      : remote_addr(r.remote_addr), local_addr(r.local_addr), remote_port(r.remote_port), local_port(r.local_port) {}
};

// The socket of the connection at `req`, found by its addresses; -1 when not found.
// NOTE: cpp-httplib 0.11 gives a handler no way to see its connection, and a non-streamed
// request never writes until it is done, so this is how it notices a client that went away
// (vLLM aborts those too). Only this connection's own thread closes it, so the descriptor
// stays valid for the handler's whole run.
int connection_socket(const ConnectionAddress& req) {
  auto endpoint = [](const sockaddr_storage& a, socklen_t len, std::string* ip, int* port) {
    if (a.ss_family != AF_INET && a.ss_family != AF_INET6) return false;
    char host[NI_MAXHOST];
    // The same rendering cpp-httplib uses for Request::remote_addr / local_addr.
    if (getnameinfo(reinterpret_cast<const sockaddr*>(&a), len, host, sizeof host, nullptr, 0, NI_NUMERICHOST) != 0) {
      return false;
    }
    *ip = host;
    *port = ntohs(a.ss_family == AF_INET ? reinterpret_cast<const sockaddr_in*>(&a)->sin_port
                                         : reinterpret_cast<const sockaddr_in6*>(&a)->sin6_port);
    return true;
  };
  return find_own_fd([&](int fd) {
    sockaddr_storage a{};
    socklen_t len = sizeof a;
    std::string ip;
    int port = 0;
    if (getpeername(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0 || !endpoint(a, len, &ip, &port) ||
        port != req.remote_port || ip != req.remote_addr) {
      return false;
    }
    len = sizeof a;
    return getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0 && endpoint(a, len, &ip, &port) &&
           port == req.local_port && (req.local_addr.empty() || ip == req.local_addr);
  });
}

// True when the peer of `fd` closed the connection (or shut down its sending side, which
// uvicorn, vLLM's server, also takes as a disconnect).
bool peer_closed(int fd) {
  pollfd p{fd, static_cast<short>(POLLIN | POLLRDHUP), 0};
  if (poll(&p, 1, 0) <= 0) return false;
  return (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
}

}  // namespace

DisconnectWatch::DisconnectWatch(const httplib::Request& req)
    : fd_(connection_socket(ConnectionAddress(req))), last_(std::chrono::steady_clock::now()) {}

bool DisconnectWatch::gone() {
  const auto now = std::chrono::steady_clock::now();
  if (fd_ < 0 || std::chrono::duration<double>(now - last_).count() < 1.0) return false;
  last_ = now;
  return peer_closed(fd_);
}

void DisconnectWatch::stop_reading() {
  if (fd_ >= 0) ::shutdown(fd_, SHUT_RD);
}

}  // namespace specserve
