#include "kv/net_device.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstring>
#include <vector>

namespace specserve {

std::string ucx_net_device_for_host(const std::string& host) {
  if (host.empty()) return {};
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (::getaddrinfo(host.c_str(), nullptr, &hints, &res) != 0 || res == nullptr) return {};
  // A loopback literal or "localhost" means this machine only. A name that resolves to
  // loopback here (Debian maps the hostname to 127.0.1.1) may name the machine to other hosts:
  // UCX keeps every interface for it.
  in6_addr numeric{};
  const bool literal = host == "localhost" || ::inet_pton(AF_INET, host.c_str(), &numeric) == 1 ||
                       ::inet_pton(AF_INET6, host.c_str(), &numeric) == 1;
  std::vector<sockaddr_storage> wanted;
  bool loopback = false;
  for (addrinfo* r = res; r != nullptr; r = r->ai_next) {
    if (r->ai_family == AF_INET) {
      const auto* a = reinterpret_cast<const sockaddr_in*>(r->ai_addr);
      const uint32_t ip = ntohl(a->sin_addr.s_addr);
      if (ip == INADDR_ANY) continue;  // a wildcard names no one interface
      loopback |= (ip >> 24) == 127;
    } else if (r->ai_family == AF_INET6) {
      const auto* a = reinterpret_cast<const sockaddr_in6*>(r->ai_addr);
      if (IN6_IS_ADDR_UNSPECIFIED(&a->sin6_addr)) continue;
      loopback |= IN6_IS_ADDR_LOOPBACK(&a->sin6_addr) != 0;
    } else {
      continue;
    }
    sockaddr_storage ss{};
    std::memcpy(&ss, r->ai_addr, std::min<size_t>(r->ai_addrlen, sizeof ss));
    wanted.push_back(ss);
  }
  ::freeaddrinfo(res);
  if (loopback && !literal) return {};
  ifaddrs* ifs = nullptr;
  if (wanted.empty() || ::getifaddrs(&ifs) != 0) return {};
  std::string found;
  for (ifaddrs* i = ifs; i != nullptr && found.empty(); i = i->ifa_next) {
    if (i->ifa_addr == nullptr || (i->ifa_flags & IFF_UP) == 0) continue;
    if (loopback) {
      if ((i->ifa_flags & IFF_LOOPBACK) != 0) found = i->ifa_name;
      continue;
    }
    for (const sockaddr_storage& w : wanted) {
      if (w.ss_family != i->ifa_addr->sa_family) continue;
      const bool same =
          w.ss_family == AF_INET
              ? reinterpret_cast<const sockaddr_in*>(&w)->sin_addr.s_addr ==
                    reinterpret_cast<const sockaddr_in*>(i->ifa_addr)->sin_addr.s_addr
              : std::memcmp(&reinterpret_cast<const sockaddr_in6*>(&w)->sin6_addr,
                            &reinterpret_cast<const sockaddr_in6*>(i->ifa_addr)->sin6_addr, sizeof(in6_addr)) == 0;
      if (same) {
        found = i->ifa_name;
        break;
      }
    }
  }
  ::freeifaddrs(ifs);
  return found;
}

}  // namespace specserve
