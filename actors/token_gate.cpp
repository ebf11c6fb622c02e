#include "actors/token_gate.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <linux/filter.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <functional>
#include <set>
#include <system_error>
#include <vector>

#include "actors/runtime.h"
#include "core/logging.h"
#include "core/own_fds.h"

namespace specserve {
namespace {

constexpr char kMagic[8] = {'S', 'S', 'G', 'A', 'T', 'E', '0', '1'};
constexpr uint32_t kMaxToken = 4096;
constexpr int kMaxPending = 64;
constexpr int kMaxPendingPerPeer = 16;
constexpr int kHandshakeMs = 5000;

using Clock = std::chrono::steady_clock;

std::string errno_text() { return std::strerror(errno); }

void set_nodelay(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

// Reads exactly n bytes before `deadline`; false on EOF, error or timeout.
bool read_full(int fd, void* buf, size_t n, Clock::time_point deadline) {
  auto* p = static_cast<char*>(buf);
  while (n > 0) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return false;
    pollfd pfd{fd, POLLIN, 0};
    const int r = ::poll(&pfd, 1, static_cast<int>(left));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    const ssize_t got = ::recv(fd, p, n, 0);
    if (got < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (got <= 0) return false;
    p += got;
    n -= static_cast<size_t>(got);
  }
  return true;
}

bool write_full(int fd, const void* buf, size_t n) {
  const auto* p = static_cast<const char*>(buf);
  while (n > 0) {
    const ssize_t put = ::send(fd, p, n, MSG_NOSIGNAL);
    if (put < 0 && errno == EINTR) continue;
    if (put <= 0) return false;
    p += put;
    n -= static_cast<size_t>(put);
  }
  return true;
}

// The sockets of one spliced connection; the last direction to finish closes them (and
// `extra`, a forwarder's listening socket held open so its port cannot be reused meanwhile).
struct SplicePair {
  int a = -1, b = -1, extra = -1;
  std::atomic<int> running{2};
  void finish() {
    if (running.fetch_sub(1) != 1) return;
    ::close(a);
    ::close(b);
    if (extra >= 0) ::close(extra);
  }
};

// Copies src -> dst until src ends or either fails; then shuts both sockets down, so the other
// direction's blocking recv or send returns too.
void pump(const std::shared_ptr<SplicePair>& p, int src, int dst) {
  std::vector<char> buf(1 << 16);
  for (;;) {
    const ssize_t got = ::recv(src, buf.data(), buf.size(), 0);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0 || !write_full(dst, buf.data(), static_cast<size_t>(got))) break;
  }
  ::shutdown(p->a, SHUT_RDWR);
  ::shutdown(p->b, SHUT_RDWR);
  p->finish();
}

// Copies bytes both ways, one thread per direction (a blocking send in one direction never
// stops the other from draining), until either side closes or fails; then closes both (and
// `extra`). Runs one direction on the calling thread.
void splice(int a, int b, int extra = -1) {
  auto p = std::make_shared<SplicePair>();
  p->a = a;
  p->b = b;
  p->extra = extra;
  try {
    std::thread([p] { pump(p, p->b, p->a); }).detach();
  } catch (const std::system_error&) {
    p->running.fetch_sub(1);  // no second direction: shut down and close here
    ::shutdown(a, SHUT_RDWR);
    ::shutdown(b, SHUT_RDWR);
    p->finish();
    return;
  }
  pump(p, a, b);
}

// Connects non-blocking socket `fd` to `to` within `timeout`; on success makes it blocking with
// TCP_NODELAY. False with errno set otherwise.
bool connect_within(int fd, const sockaddr* to, socklen_t len, std::chrono::milliseconds timeout) {
  int rc = ::connect(fd, to, len);
  if (rc < 0 && errno == EINPROGRESS) {
    pollfd pfd{fd, POLLOUT, 0};
    rc = ::poll(&pfd, 1, static_cast<int>(timeout.count())) == 1 ? 0 : -1;
    int err = rc == 0 ? 0 : ETIMEDOUT;
    socklen_t elen = sizeof err;
    if (rc == 0) ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &elen);
    if (err != 0) errno = err, rc = -1;
  }
  if (rc != 0) return false;
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  set_nodelay(fd);
  return true;
}

// A connected TCP socket to host:port, or an error naming them.
Expected<int> tcp_connect(const std::string& host, uint16_t port, std::chrono::milliseconds timeout) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const std::string where = host + ":" + std::to_string(port);
  if (int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res); rc != 0) {
    return unavailable("cannot resolve " + where + ": " + ::gai_strerror(rc));
  }
  std::string last = "no address";
  for (addrinfo* ai = res; ai; ai = ai->ai_next) {
    const int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
    if (fd < 0) continue;
    if (connect_within(fd, ai->ai_addr, ai->ai_addrlen, timeout)) {
      ::freeaddrinfo(res);
      return fd;
    }
    last = errno_text();
    ::close(fd);
  }
  ::freeaddrinfo(res);
  return unavailable("cannot connect to " + where + ": " + last);
}

// ---------------------------------------------------------------- CAF's loopback ports
// CAF listens on 127.0.0.1 behind the gate, and a client hands CAF a one-shot forwarder port on
// 127.0.0.1: without more, any process on the host could connect to either directly and crash
// CAF's reader (a trial did, with 40 bytes, killing `up`). So:
// - the gate guards CAF's listening socket with a classic BPF socket filter (Linux
//   SO_ATTACH_FILTER): a TCP segment reaches it only from 127.0.0.1 and a source port of one of
//   the gate's own inner connections, each bound before it connects (without SO_REUSEADDR, so
//   no other socket can take that port while it lives); accepted connections keep the filter
//   they were accepted under;
// - a forwarder splices only a connection whose other end is a socket of this process.

// IPv4 address and port of a socket's own (peer = false) or peer end; false when not IPv4.
bool inet_end(int fd, bool peer, uint32_t* addr, uint16_t* port) {
  sockaddr_in a{};
  socklen_t len = sizeof a;
  const int rc = peer ? ::getpeername(fd, reinterpret_cast<sockaddr*>(&a), &len)
                      : ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  if (rc != 0 || a.sin_family != AF_INET) return false;
  *addr = ntohl(a.sin_addr.s_addr);
  *port = ntohs(a.sin_port);
  return true;
}

// The first stream socket of this process satisfying `pred`; -1 when none.
int find_own_socket(const std::function<bool(int)>& pred) {
  return find_own_fd([&pred](int fd) {
    int type = 0;
    socklen_t len = sizeof type;
    return ::getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) == 0 && type == SOCK_STREAM && pred(fd);
  });
}

constexpr uint32_t kLoopback = 0x7f000001;

// True when `fd` is a socket listening on 127.0.0.1:port.
bool is_loopback_listener(int fd, uint16_t port) {
  int listening = 0;
  socklen_t len = sizeof listening;
  uint32_t a = 0;
  uint16_t p = 0;
  return ::getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) == 0 && listening && inet_end(fd, false, &a, &p) &&
         a == kLoopback && p == port;
}

// Lets TCP segments reach listening socket `fd` only from 127.0.0.1 and a source port in
// `allowed` (none: nothing). Offsets: SKF_NET_OFF + 12 is the IPv4 source address; a TCP
// socket's filter sees the TCP header at offset 0, its source port first. Accepting returns
// the largest length, so nothing of a segment is trimmed.
bool attach_source_filter(int fd, const std::multiset<uint16_t>& allowed) {
  const std::vector<uint16_t> ports(allowed.begin(), allowed.end());
  const auto n = static_cast<uint8_t>(std::min<size_t>(ports.size(), 200));
  std::vector<sock_filter> prog;
  prog.push_back(BPF_STMT(BPF_LD | BPF_W | BPF_ABS, static_cast<uint32_t>(SKF_NET_OFF + 12)));
  prog.push_back(BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, kLoopback, 0, static_cast<uint8_t>(n + 1)));  // else: reject
  prog.push_back(BPF_STMT(BPF_LD | BPF_H | BPF_ABS, 0));
  for (uint8_t i = 0; i < n; ++i) prog.push_back(BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, ports[i], static_cast<uint8_t>(n - i), 0));
  prog.push_back(BPF_STMT(BPF_RET | BPF_K, 0));           // reject
  prog.push_back(BPF_STMT(BPF_RET | BPF_K, 0xFFFFFFFFu));  // accept, whole
  sock_fprog fprog{static_cast<unsigned short>(prog.size()), prog.data()};
  return ::setsockopt(fd, SOL_SOCKET, SO_ATTACH_FILTER, &fprog, sizeof fprog) == 0;
}

// The filter of CAF's listener as `sh` wants it now (its allowed ports). Locked by the caller.
// The listener is looked at again each time: CAF owns the descriptor.
void refresh_inner_filter(TokenGate::Shared& sh) {
  if (sh.inner_listener >= 0 && is_loopback_listener(sh.inner_listener, sh.inner_port)) {
    attach_source_filter(sh.inner_listener, sh.inner_allowed);
  }
}

// A connection from this process to CAF at 127.0.0.1:inner_port through the guard: a socket
// bound to a free loopback port that the filter then lets through, connected within `timeout`.
// The port stays allowed (`*allowed_port`) until release_inner_port.
Expected<int> connect_inner(TokenGate::Shared& sh, std::chrono::milliseconds timeout, uint16_t* allowed_port) {
  *allowed_port = 0;
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return unavailable("socket: " + errno_text());
  sockaddr_in local{};
  local.sin_family = AF_INET;
  local.sin_addr.s_addr = htonl(kLoopback);
  uint32_t a = 0;
  uint16_t port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&local), sizeof local) != 0 || !inet_end(fd, false, &a, &port)) {
    const std::string e = errno_text();
    ::close(fd);
    return unavailable("cannot bind a loopback port: " + e);
  }
  {
    std::lock_guard<std::mutex> lock(sh.filter_mu);
    sh.inner_allowed.insert(port);
    refresh_inner_filter(sh);
  }
  *allowed_port = port;
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_addr.s_addr = htonl(kLoopback);
  to.sin_port = htons(sh.inner_port);
  if (!connect_within(fd, reinterpret_cast<sockaddr*>(&to), sizeof to, timeout)) {
    const std::string e = errno_text();
    ::close(fd);
    return unavailable("cannot connect to 127.0.0.1:" + std::to_string(sh.inner_port) + ": " + e);
  }
  return fd;
}

void release_inner_port(TokenGate::Shared& sh, uint16_t port) {
  if (port == 0) return;
  std::lock_guard<std::mutex> lock(sh.filter_mu);
  if (auto it = sh.inner_allowed.find(port); it != sh.inner_allowed.end()) sh.inner_allowed.erase(it);
  refresh_inner_filter(sh);
}

// True when the other end of accepted connection `c` (on our listening port `port`) is a
// socket of this process: one whose own end is c's peer and whose peer is 127.0.0.1:port.
bool peer_is_own_socket(int c, uint16_t port) {
  uint32_t pa = 0;
  uint16_t pp = 0;
  if (!inet_end(c, true, &pa, &pp) || pa != kLoopback) return false;
  return find_own_socket([&](int fd) {
           uint32_t a = 0, b = 0;
           uint16_t p = 0, q = 0;
           return fd != c && inet_end(fd, false, &a, &p) && a == pa && p == pp && inet_end(fd, true, &b, &q) &&
                  b == kLoopback && q == port;
         }) >= 0;
}

// A listening socket on host:port (host "" or "0.0.0.0": any IPv4 address); the bound port.
Expected<std::pair<int, uint16_t>> tcp_listen(const std::string& host, uint16_t port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* res = nullptr;
  const std::string where = host + ":" + std::to_string(port);
  if (int rc = ::getaddrinfo(host.empty() ? nullptr : host.c_str(), std::to_string(port).c_str(), &hints, &res); rc != 0) {
    return unavailable("cannot resolve " + where + ": " + ::gai_strerror(rc));
  }
  std::string last = "no address";
  for (addrinfo* ai = res; ai; ai = ai->ai_next) {
    const int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) continue;
    int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && ::listen(fd, 128) == 0) {
      sockaddr_storage ss{};
      socklen_t len = sizeof ss;
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len);
      const uint16_t bound = ss.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port)
                                                      : ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
      ::freeaddrinfo(res);
      return std::make_pair(fd, bound);
    }
    last = errno_text();
    ::close(fd);
  }
  ::freeaddrinfo(res);
  return unavailable("cannot listen on " + where + ": " + last);
}

}  // namespace

static void gate_handshake(TokenGate::Shared& sh, int fd, const std::string& peer);

// The numeric address of an accepted peer ("" when it has none: counted together).
static std::string peer_address(const sockaddr_storage& a) {
  char text[INET6_ADDRSTRLEN] = {};
  if (a.ss_family == AF_INET) {
    ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(&a)->sin_addr, text, sizeof text);
  } else if (a.ss_family == AF_INET6) {
    ::inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(&a)->sin6_addr, text, sizeof text);
  }
  return text;
}

// Takes a handshake slot for `peer`: false when 64 handshakes are in flight, or 16 from `peer`.
static bool take_slot(TokenGate::Shared& sh, const std::string& peer, const char** why) {
  if (sh.pending.fetch_add(1) >= kMaxPending) {
    sh.pending.fetch_sub(1);
    *why = "closed a connection: 64 others are in their token handshake";
    return false;
  }
  std::lock_guard<std::mutex> lock(sh.peers_mu);
  int& mine = sh.pending_by_peer[peer];
  if (mine >= kMaxPendingPerPeer) {
    sh.pending.fetch_sub(1);
    *why = "closed a connection: 16 others from its address are in their token handshake";
    return false;
  }
  ++mine;
  return true;
}

// Gives back the slot take_slot gave.
static void release_slot(TokenGate::Shared& sh, const std::string& peer) {
  {
    std::lock_guard<std::mutex> lock(sh.peers_mu);
    auto it = sh.pending_by_peer.find(peer);
    if (it != sh.pending_by_peer.end() && --it->second <= 0) sh.pending_by_peer.erase(it);
  }
  sh.pending.fetch_sub(1);
}

static void warn_refused(TokenGate::Shared& sh, const char* why);

std::string token_gate_preamble(const std::string& token) {
  std::string p(kMagic, sizeof kMagic);
  const uint32_t n = static_cast<uint32_t>(token.size());
  for (int i = 0; i < 4; ++i) p.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  return p + token;
}

Expected<std::unique_ptr<TokenGate>> TokenGate::start(const std::string& host, uint16_t port, uint16_t inner_port,
                                                      std::string token, std::string what) {
  auto l = tcp_listen(host, port);
  if (!l.ok()) return l.status();
  std::unique_ptr<TokenGate> g(new TokenGate());
  g->listen_fd_ = l->first;
  g->port_ = l->second;
  g->shared_ = std::make_shared<Shared>();
  g->shared_->inner_port = inner_port;
  g->shared_->token = std::move(token);
  g->shared_->what = std::move(what);
  // CAF's listener, guarded from now on (see connect_inner). Not found (another library layout):
  // said once; the gate works as before, CAF's port unguarded.
  g->shared_->inner_listener = find_own_socket([inner_port](int fd) { return is_loopback_listener(fd, inner_port); });
  if (g->shared_->inner_listener < 0 || !attach_source_filter(g->shared_->inner_listener, {})) {
    get_logger("actors")->warn("{} actor port: could not guard its actor system's port 127.0.0.1:{} ({}): local processes "
                               "can reach it directly", g->shared_->what, inner_port,
                               g->shared_->inner_listener < 0 ? "its listening socket was not found" : errno_text());
    g->shared_->inner_listener = -1;
  }
  if (::pipe2(g->wake_, O_CLOEXEC) != 0) return unavailable("pipe: " + errno_text());
  g->acceptor_ = std::thread([gp = g.get()] { gp->accept_loop(); });
  return g;
}

TokenGate::~TokenGate() {
  if (wake_[1] >= 0) {
    const char c = 'x';
    (void)!::write(wake_[1], &c, 1);
  }
  if (acceptor_.joinable()) acceptor_.join();
  for (int fd : {listen_fd_, wake_[0], wake_[1]}) {
    if (fd >= 0) ::close(fd);
  }
}

void TokenGate::accept_loop() {
  pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_[0], POLLIN, 0}};
  for (;;) {
    if (::poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[1].revents) return;  // stopping
    if (!(fds[0].revents & POLLIN)) continue;
    sockaddr_storage from{};
    socklen_t from_len = sizeof from;
    const int fd = ::accept4(listen_fd_, reinterpret_cast<sockaddr*>(&from), &from_len, SOCK_CLOEXEC);
    if (fd < 0) {
      // Out of descriptors or memory: the connection stays queued and poll reports it again at
      // once; back off instead of spinning.
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        warn_refused(*shared_, "cannot accept a connection (out of file descriptors or memory)");
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
      continue;
    }
    const std::string peer = peer_address(from);
    if (const char* why = nullptr; !take_slot(*shared_, peer, &why)) {
      warn_refused(*shared_, why);
      ::close(fd);
      continue;
    }
    // Detached: the handshake ends within kHandshakeMs; a splice ends when either side closes.
    try {
      std::thread([sh = shared_, fd, peer] { gate_handshake(*sh, fd, peer); }).detach();
    } catch (const std::system_error&) {  // out of threads: refuse this one, keep serving
      release_slot(*shared_, peer);
      warn_refused(*shared_, "closed a connection: cannot start a thread for it");
      ::close(fd);
    }
  }
}

int64_t TokenGate::refused() const { return shared_->refused.load(); }

// A refused connection, logged at most once a second (a flood must not flood the log).
static void warn_refused(TokenGate::Shared& sh, const char* why) {
  ++sh.refused;
  const int64_t now =
      std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now().time_since_epoch()).count();
  int64_t last = sh.last_warn_ms.load();
  if (now - last < 1000 || !sh.last_warn_ms.compare_exchange_strong(last, now)) {
    ++sh.unwarned;
    return;
  }
  const int64_t more = sh.unwarned.exchange(0);
  get_logger("actors")->warn("{} actor port: {}{}", sh.what, why,
                             more ? " (and " + std::to_string(more) + " more refused since the last warning)" : "");
}

static void gate_handshake(TokenGate::Shared& sh, int fd, const std::string& peer) {
  const auto deadline = Clock::now() + std::chrono::milliseconds(kHandshakeMs);
  char head[12];
  bool ok = read_full(fd, head, sizeof head, deadline) && std::memcmp(head, kMagic, sizeof kMagic) == 0;
  uint32_t n = 0;
  if (ok) {
    for (int i = 0; i < 4; ++i) n |= static_cast<uint32_t>(static_cast<unsigned char>(head[8 + i])) << (8 * i);
    ok = n >= 1 && n <= kMaxToken;
  }
  std::string presented(ok ? n : 0, '\0');
  if (ok) ok = read_full(fd, presented.data(), n, deadline);
  const auto log = get_logger("actors");
  if (!ok) {
    warn_refused(sh, "closed a connection that did not start with the cluster token preamble");
    release_slot(sh, peer);
    ::close(fd);
    return;
  }
  if (!token_matches(presented, sh.token)) {
    warn_refused(sh, "refused a peer: wrong cluster token");
    write_full(fd, "N", 1);
    release_slot(sh, peer);
    ::close(fd);
    return;
  }
  uint16_t allowed_port = 0;
  auto inner = connect_inner(sh, std::chrono::milliseconds(kHandshakeMs), &allowed_port);
  const std::string& what = sh.what;
  release_slot(sh, peer);
  if (!inner.ok()) {
    log->warn("{} actor port: cannot reach its actor system: {}", what, inner.status().message());
    release_inner_port(sh, allowed_port);
    ::close(fd);
    return;
  }
  set_nodelay(fd);
  if (!write_full(fd, "Y", 1)) {
    ::close(fd);
    ::close(*inner);
    release_inner_port(sh, allowed_port);
    return;
  }
  splice(fd, *inner);
  release_inner_port(sh, allowed_port);
}

Expected<uint16_t> connect_token_gate(const std::string& host, uint16_t port, const std::string& token,
                                      std::chrono::milliseconds timeout) {
  const std::string where = host + ":" + std::to_string(port);
  auto remote = tcp_connect(host, port, timeout);
  if (!remote.ok()) return remote.status();
  const int fd = *remote;
  const std::string pre = token_gate_preamble(token);
  char verdict = 0;
  // A gate answers within two handshake bounds (reading the preamble, then reaching its actor
  // system, kHandshakeMs each): waiting the caller's whole timeout only delayed the error for a
  // port that is not a gate (an HTTP port given by mistake waited 30 s).
  const auto verdict_wait = std::min<std::chrono::milliseconds>(timeout, std::chrono::milliseconds(2 * kHandshakeMs + 2000));
  if (!write_full(fd, pre.data(), pre.size()) ||
      !read_full(fd, &verdict, 1, Clock::now() + verdict_wait)) {
    ::close(fd);
    return unavailable(where + ": no answer to the token preamble (not a specserve actor port, or it is stopping)");
  }
  if (verdict != 'Y') {
    ::close(fd);
    return verdict == 'N' ? invalid_argument(where + ": refused: wrong cluster token")
                          : unavailable(where + ": not a specserve actor port");
  }
  auto local = tcp_listen("127.0.0.1", 0);
  if (!local.ok()) {
    ::close(fd);
    return local.status();
  }
  const int lfd = local->first;
  const auto deadline_ms = static_cast<int>(std::min<int64_t>(timeout.count(), 600000));
  // NOTE: the listening socket stays open (accepting nothing more) until the splice ends: CAF
  // caches remote_actor results by host and port, so the port must not be reused by another
  // forwarder while this connection lives.
  const uint16_t lport = local->second;
  try {
    std::thread([fd, lfd, deadline_ms, lport] {
      const auto deadline = Clock::now() + std::chrono::milliseconds(deadline_ms);
      for (;;) {
        pollfd pfd{lfd, POLLIN, 0};
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
        const int r = left > 0 ? ::poll(&pfd, 1, static_cast<int>(left)) : 0;
        if (r < 0 && errno == EINTR) continue;
        const int c = r == 1 ? ::accept4(lfd, nullptr, nullptr, SOCK_CLOEXEC) : -1;
        if (c < 0) {
          ::close(lfd);
          ::close(fd);
          return;
        }
        // Only this process's CAF may have the authenticated connection: another local
        // process that raced it to the port is closed, and the forwarder waits on.
        if (!peer_is_own_socket(c, lport)) {
          get_logger("actors")->warn("closed a connection to a forwarder port from another process (127.0.0.1:{})", lport);
          ::close(c);
          continue;
        }
        set_nodelay(c);
        splice(c, fd, lfd);
        return;
      }
    }).detach();
  } catch (const std::system_error& e) {
    ::close(lfd);
    ::close(fd);
    return unavailable(where + ": cannot start the connection's thread: " + e.what());
  }
  return local->second;
}

}  // namespace specserve
