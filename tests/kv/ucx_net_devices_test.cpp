// UCX network devices (kv/ucx_transport.h): a worker whose node is on loopback gives its UCX
// agent UCX_NET_DEVICES=lo, so UCX's tcp transport listens on 127.0.0.1 only (the project's
// rule: listen on loopback unless configured) and still moves bytes between two agents.
#include <arpa/inet.h>
#include <dirent.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "actors/kv_data_plane.h"
#include "kv/ucx_transport.h"

namespace specserve {
namespace {

// Inodes of the sockets this process holds (/proc/self/fd -> "socket:[N]").
std::set<std::string> own_socket_inodes() {
  std::set<std::string> out;
  DIR* d = ::opendir("/proc/self/fd");
  if (d == nullptr) return out;
  while (dirent* e = ::readdir(d)) {
    char buf[64] = {};
    const std::string p = std::string("/proc/self/fd/") + e->d_name;
    const ssize_t n = ::readlink(p.c_str(), buf, sizeof buf - 1);
    if (n > 9 && std::strncmp(buf, "socket:[", 8) == 0) out.insert(std::string(buf + 8, buf + n - 1));
  }
  ::closedir(d);
  return out;
}

// Local addresses ("hex-ip:hex-port" as /proc/net/tcp{,6} write them) of this process's
// listening TCP sockets, with the family ("4" or "6") in front.
std::vector<std::string> own_listening_addresses() {
  const std::set<std::string> mine = own_socket_inodes();
  std::vector<std::string> out;
  for (const char* f : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(f);
    std::string line;
    std::getline(in, line);  // header
    while (std::getline(in, line)) {
      std::istringstream ls(line);
      std::string sl, local, remote, state, queues, tr, retr, uid, timeout, inode;
      ls >> sl >> local >> remote >> state >> queues >> tr >> retr >> uid >> timeout >> inode;
      if (state == "0A" && mine.count(inode) != 0) out.push_back(std::string(f[13] == '6' ? "6 " : "4 ") + local);
    }
  }
  return out;
}

// True when a /proc/net/tcp{,6} local address is a loopback address (127.0.0.0/8 or ::1).
bool is_loopback_proc_address(const std::string& entry) {
  const std::string ip = entry.substr(2, entry.find(':') - 2);
  if (entry[0] == '4') {
    const uint32_t raw = static_cast<uint32_t>(std::stoul(ip, nullptr, 16));  // network order, read as host
    in_addr a{};
    a.s_addr = raw;
    return (ntohl(a.s_addr) >> 24) == 127;
  }
  return ip == "00000000000000000000000001000000";  // ::1 as /proc writes it (4 host-order words)
}

TEST(UcxNetDevices, HostMapsToTheInterfaceThatHoldsIt) {
  EXPECT_EQ(ucx_net_device_for_host("127.0.0.1"), "lo");
  EXPECT_EQ(ucx_net_device_for_host("127.0.0.2"), "lo");  // 127.0.0.0/8 is loopback
  EXPECT_EQ(ucx_net_device_for_host("localhost"), "lo");
  EXPECT_EQ(ucx_net_device_for_host("::1"), "lo");
  EXPECT_EQ(ucx_net_device_for_host(""), "");
  EXPECT_EQ(ucx_net_device_for_host("0.0.0.0"), "") << "a wildcard names no one interface";
  EXPECT_EQ(ucx_net_device_for_host("::"), "");
  EXPECT_EQ(ucx_net_device_for_host("203.0.113.77"), "") << "TEST-NET-3: on no interface here";
  EXPECT_EQ(ucx_net_device_for_host("no-such-host.invalid"), "");
  // This machine's own name: "lo" never, whatever /etc/hosts maps it to (Debian: 127.0.1.1),
  // since other hosts may reach the machine by that name.
  char name[256] = {};
  ASSERT_EQ(::gethostname(name, sizeof name - 1), 0);
  EXPECT_NE(ucx_net_device_for_host(name), "lo") << name;
  // Every non-loopback IPv4 address of this machine maps back to its own interface.
  ifaddrs* ifs = nullptr;
  ASSERT_EQ(::getifaddrs(&ifs), 0);
  int checked = 0;
  for (ifaddrs* i = ifs; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET || (i->ifa_flags & IFF_LOOPBACK) != 0 ||
        (i->ifa_flags & IFF_UP) == 0) {
      continue;
    }
    char ip[INET_ADDRSTRLEN] = {};
    ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(i->ifa_addr)->sin_addr, ip, sizeof ip);
    EXPECT_EQ(ucx_net_device_for_host(ip), i->ifa_name) << ip;
    ++checked;
  }
  ::freeifaddrs(ifs);
  std::printf("[ info ] checked %d non-loopback IPv4 address(es) of this machine\n", checked);
}

TEST(UcxNetDevices, LoopbackAgentListensOnLoopbackOnlyAndMovesBytes) {
  const auto before = own_listening_addresses();
  UcxAgentOptions o;
  o.name = "owner";
  o.transports = "tcp";
  o.net_devices = ucx_net_device_for_host("127.0.0.1");
  o.progress_thread = true;
  auto owner = UcxAgent::create(o);
  ASSERT_TRUE(owner.ok()) << owner.status().to_string();
  EXPECT_EQ((*owner)->net_devices(), "lo");
  o.name = "reader";
  o.progress_thread = false;
  auto reader = UcxAgent::create(o);
  ASSERT_TRUE(reader.ok()) << reader.status().to_string();

  auto after = own_listening_addresses();
  std::vector<std::string> added;
  for (const auto& a : after) {
    if (std::find(before.begin(), before.end(), a) == before.end()) added.push_back(a);
  }
  ASSERT_FALSE(added.empty()) << "UCX's tcp transport opened no listening socket: nothing was checked";
  for (const auto& a : added) EXPECT_TRUE(is_loopback_proc_address(a)) << "UCX listens on a non-loopback address: " << a;

  // The bytes still move over tcp on lo.
  auto region = (*owner)->allocate_region(1 << 20);
  ASSERT_TRUE(region.ok()) << region.status().to_string();
  auto* src = static_cast<uint8_t*>((*region)->data());
  for (int i = 0; i < (1 << 20); ++i) src[i] = static_cast<uint8_t>(i * 31 + 7);
  auto ep = (*reader)->connect((*owner)->address(), "owner", kv_deadline_after(std::chrono::seconds(10)));
  ASSERT_TRUE(ep.ok()) << ep.status().to_string();
  std::vector<uint8_t> got(1 << 20);
  const Status st = (*ep)->get(got.data(), 1 << 20, (*region)->remote(), 0, kv_deadline_after(std::chrono::seconds(10)));
  ASSERT_TRUE(st.ok()) << st.to_string();
  EXPECT_EQ(std::memcmp(got.data(), src, got.size()), 0);
}

TEST(UcxNetDevices, KvDataPlaneOfALoopbackNodeUsesLoUnlessTheEnvironmentChooses) {
  ::unsetenv("UCX_NET_DEVICES");
  const auto before = own_listening_addresses();
  KvPlaneOptions po;
  po.host = "127.0.0.1";
  auto p = KvDataPlane::create("netdev/0", po);
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  EXPECT_EQ((*p)->net_devices(), "lo");
  for (const auto& a : own_listening_addresses()) {
    if (std::find(before.begin(), before.end(), a) == before.end()) {
      EXPECT_TRUE(is_loopback_proc_address(a)) << "the data plane listens on a non-loopback address: " << a;
    }
  }
  // A host on no interface here leaves UCX its default; a UCX_NET_DEVICES the user set wins.
  po.host = "203.0.113.77";
  p = KvDataPlane::create("netdev/1", po);
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  EXPECT_EQ((*p)->net_devices(), "all");
  ::setenv("UCX_NET_DEVICES", "all", 1);
  po.host = "127.0.0.1";
  p = KvDataPlane::create("netdev/2", po);
  ::unsetenv("UCX_NET_DEVICES");
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  EXPECT_EQ((*p)->net_devices(), "all");
}

TEST(UcxNetDevices, OnlyAClusterWhollyOnLoopbackIsPinned) {
  // One process (no nodes) or every node on loopback: the node's host, lo.
  EXPECT_EQ(kv_plane_host({}, ""), "127.0.0.1");
  EXPECT_EQ(kv_plane_host({"127.0.0.1", "localhost", "::1"}, "127.0.0.1"), "127.0.0.1");
  EXPECT_EQ(ucx_net_device_for_host(kv_plane_host({"127.0.0.1"}, "")), "lo");
  // A node on another host: the node left at the default 127.0.0.1 must stay reachable from it,
  // and a real interface is not pinned either (RDMA devices would be dropped).
  EXPECT_EQ(kv_plane_host({"127.0.0.1", "10.1.2.3"}, "127.0.0.1"), "");
  EXPECT_EQ(kv_plane_host({"10.1.2.3", "10.1.2.4"}, "10.1.2.3"), "");
  EXPECT_EQ(kv_plane_host({"gpu-node-7"}, "gpu-node-7"), "") << "a name is not known to be loopback";
}

}  // namespace
}  // namespace specserve
