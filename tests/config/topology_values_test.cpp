// Topology YAML values and the world around them: byte sizes, devices, loopback names, `~` and
// relative paths, and the ports a topology asks for (in use, free, unresolvable host).
#include "config/topology.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "tests/config/topology_test_util.h"
#include "tests/test_util.h"

namespace specserve {
namespace {

using namespace topology_testing;

TEST(ByteSize, ParsesUnitsAndRejectsGarbage) {
  const std::pair<const char*, int64_t> ok[] = {
      {"0", 0},          {"1073741824", 1073741824}, {"1GiB", 1LL << 30},   {"512MiB", 512LL << 20},
      {"512 MiB", 512LL << 20}, {"64KiB", 64LL << 10}, {"2TiB", 2LL << 40}, {"1Gi", 1LL << 30},
      {"1gib", 1LL << 30}, {"1GB", 1000000000},      {"1.5GiB", 3LL << 29}, {"100B", 100},
      {"2k", 2000},      {"0.5KiB", 512},            {"8388607TiB", int64_t{8388607} << 40},  // 2^63 - 2^40
  };
  for (const auto& [text, want] : ok) {
    auto got = parse_byte_size(text);
    ASSERT_TRUE(got.ok()) << text << ": " << got.status().to_string();
    EXPECT_EQ(*got, want) << text;
  }
  for (const char* bad : {"", "GiB", "1 GiB extra", "1GiBs", "-1", "-1GiB", "1e9", "0x10", "9223372036854775808",
                          "8388608TiB" /* 2^63 */, "1..5GiB", "."}) {
    auto got = parse_byte_size(bad);
    EXPECT_FALSE(got.ok()) << "'" << bad << "' parsed as " << (got.ok() ? *got : 0);
    if (!got.ok()) EXPECT_NE(got.status().message().find(std::string("'") + bad + "'"), std::string::npos);
  }
}

TEST(Device, ParsesCpuAndCuda) {
  EXPECT_EQ(*parse_device("cpu"), (DeviceSpec{DeviceKind::kCpu, 0}));
  EXPECT_EQ(*parse_device("cuda:3"), (DeviceSpec{DeviceKind::kCuda, 3}));
  EXPECT_EQ(parse_device("cuda:3")->to_string(), "cuda:3");
  for (const char* bad : {"", "gpu", "cuda", "cuda:", "cuda:-1", "cuda:+1", "cuda:1x", "CPU"}) {
    EXPECT_FALSE(parse_device(bad).ok()) << bad;
  }
}

TEST(Loopback, RecognisesLoopbackSpellings) {
  for (const char* h : {"127.0.0.1", "127.1.2.3", "localhost", "LOCALHOST", "::1"}) EXPECT_TRUE(is_loopback_host(h)) << h;
  for (const char* h : {"0.0.0.0", "10.0.0.1", "node-a.example", "::"}) EXPECT_FALSE(is_loopback_host(h)) << h;
}

// Sets $HOME for one test and restores it.
class ScopedHome {
 public:
  explicit ScopedHome(const std::string& home) {
    if (const char* h = std::getenv("HOME")) old_ = h;
    setenv("HOME", home.c_str(), 1);
  }
  ~ScopedHome() {
    if (old_) {
      setenv("HOME", old_->c_str(), 1);
    } else {
      unsetenv("HOME");
    }
  }

 private:
  std::optional<std::string> old_;
};

TEST(Tilde, ExpandsHomeInTokenFileAndModelPath) {
  const fs::path home = fs::temp_directory_path() / ("specserve-home-" + std::to_string(::getpid()));
  fs::create_directories(home / "models");
  const fs::path link = home / "models" / "m.gguf";
  fs::remove(link);
  fs::create_symlink(fs::absolute(testing::default_model_path()), link);
  {
    ScopedHome scoped(home.string());
    EXPECT_EQ(*expand_user_path("~"), home.string());
    EXPECT_EQ(*expand_user_path("~/a/b"), (home / "a/b").string());
    EXPECT_EQ(*expand_user_path("/abs/~x"), "/abs/~x");
    EXPECT_EQ(*expand_user_path("rel/x"), "rel/x");
    auto root = expand_user_path("~root/x");  // another user's home, from the password database
    ASSERT_TRUE(root.ok()) << root.status().to_string();
    EXPECT_EQ(root->substr(root->size() - 2), "/x");
    EXPECT_FALSE(expand_user_path("~no-such-user-specserve/x").ok());

    const std::string y = R"(cluster: {token_file: ~/.config/specserve/token}
models: {target: {path: ~/models/m.gguf}}
nodes: [{name: n, devices: [cpu], workers: [{role: target_shard, device: cpu}]}]
)";
    auto t = parse_topology(y, "h.yaml", "/somewhere/else");
    ASSERT_TRUE(t.ok()) << t.status().to_string();
    EXPECT_EQ(t->cluster.token_file, (home / ".config/specserve/token").string());
    EXPECT_EQ(t->models.target.path, link.string());

    // The default token file is under ~ as well.
    auto d = parse_topology(replace_once(y, "cluster: {token_file: ~/.config/specserve/token}\n", ""), "h.yaml");
    ASSERT_TRUE(d.ok()) << d.status().to_string();
    EXPECT_EQ(d->cluster.token_file, (home / ".config/specserve/token").string());
  }
  fs::remove_all(home);
}

TEST(Paths, RelativeModelPathResolvesFromTheYamlFolder) {
  const fs::path dir = fs::temp_directory_path() / ("specserve-rel-" + std::to_string(::getpid()));
  fs::create_directories(dir / "conf");
  fs::remove(dir / "m.gguf");
  fs::create_symlink(fs::absolute(testing::default_model_path()), dir / "m.gguf");
  {
    std::ofstream out(dir / "conf" / "c.yaml");
    out << "models: {target: {path: ../m.gguf}}\n"
           "nodes: [{name: n, devices: [cpu], workers: [{role: target_shard, device: cpu}]}]\n";
  }
  auto t = load_topology_file((dir / "conf" / "c.yaml").string());
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  EXPECT_EQ(t->models.target.path, (dir / "m.gguf").string());
  // From another folder the same text does not find the model, and says where it looked.
  auto elsewhere = parse_topology("models: {target: {path: ../m.gguf}}\n"
                                  "nodes: [{name: n, devices: [cpu], workers: [{role: target_shard, device: cpu}]}]\n",
                                  "c.yaml", "/");
  ASSERT_FALSE(elsewhere.ok());
  EXPECT_NE(elsewhere.status().message().find("c.yaml:1:25: models.target.path: '../m.gguf' (resolved to '/m.gguf')"),
            std::string::npos)
      << elsewhere.status().message();
  fs::remove_all(dir);
}

// ---------------------------------------------------------------- ports

// A listening socket on 127.0.0.1 at a kernel-chosen port.
struct Listener {
  int fd = -1;
  int port = 0;
  Listener() {
    fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    EXPECT_EQ(::listen(fd, 1), 0);
    socklen_t len = sizeof(a);
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    port = ntohs(a.sin_port);
  }
  ~Listener() { ::close(fd); }
};

TEST(Ports, InUseIsReportedWithFieldAndLocation) {
  Listener taken;
  auto t = parse(replace_once(base_yaml(), "actor_port: 7420", "actor_port: " + std::to_string(taken.port)));
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  {
    Listener free_probe;  // a port that is free once this probe closes
    t->head.http_port = free_probe.port;
  }
  Status st = check_ports_free(*t);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), StatusCode::kUnavailable);
  EXPECT_NE(st.message().find("t.yaml:2:37: head.actor_port: '" + std::to_string(taken.port) + "' on 127.0.0.1"),
            std::string::npos)
      << st.message();
  EXPECT_NE(st.message().find("EADDRINUSE"), std::string::npos) << st.message();
  EXPECT_EQ(st.message().find("head.http_port"), std::string::npos) << st.message();

  // Both taken: both named.
  Listener taken2;
  t->head.http_port = taken2.port;
  st = check_ports_free(*t);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("head.http_port: '" + std::to_string(taken2.port) + "'"), std::string::npos) << st.message();
}

TEST(Ports, FreePortsPass) {
  auto t = parse(base_yaml());
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  {
    Listener a, b;
    t->head.actor_port = a.port;
    t->head.http_port = b.port;
  }
  Status st = check_ports_free(*t);
  EXPECT_TRUE(st.ok()) << st.to_string();
}

TEST(Ports, UnresolvableHostIsInvalidArgument) {
  auto t = parse(base_yaml());
  ASSERT_TRUE(t.ok());
  t->head.host = "no-such-host.invalid";
  Status st = check_ports_free(*t);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("'no-such-host.invalid'"), std::string::npos) << st.message();
}

}  // namespace
}  // namespace specserve
