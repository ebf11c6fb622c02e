// UCX transport (kv/ucx_transport.h) between two processes on loopback: a forked peer owns a
// registered region, sends its worker address and the region's descriptor over a socketpair
// (the actors carry them in messages in production), and this process gets / puts 1 block, many
// blocks and > 1 MiB with UCX_TLS=tcp and UCX_TLS=sm, bytes compared exactly; a whole KV export
// is moved and imported; a peer that stalls gives kDeadlineExceeded by the deadline, and a peer
// SIGKILLed in the middle of a 64 MiB get gives kUnavailable before its deadline — never a hang
// or a crash, and the agent then serves another peer. Pipelined transfers (many small chunks in
// flight) move every byte, and a peer SIGSTOPped mid-pipeline gives kDeadlineExceeded with no
// chunk writing into the buffer afterwards.
// Several processes each: labelled "multiprocess" and run alone (tests/CMakeLists.txt).
#include "kv/ucx_transport.h"

#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "cpu/cpu_backend.h"
#include "kv/transfer.h"
#include "model/backend.h"

namespace specserve {
namespace {

// ---- a length-prefixed byte channel over a socketpair ----
bool write_all(int fd, const void* p, size_t n) {
  const char* c = static_cast<const char*>(p);
  while (n > 0) {
    ssize_t w = ::write(fd, c, n);
    if (w <= 0) return false;
    c += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}
bool read_all(int fd, void* p, size_t n) {
  char* c = static_cast<char*>(p);
  while (n > 0) {
    ssize_t r = ::read(fd, c, n);
    if (r <= 0) return false;
    c += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}
bool send_bytes(int fd, const std::vector<uint8_t>& v) {
  const uint64_t n = v.size();
  return write_all(fd, &n, 8) && write_all(fd, v.data(), v.size());
}
bool recv_bytes(int fd, std::vector<uint8_t>& v) {
  uint64_t n = 0;
  if (!read_all(fd, &n, 8) || n > (1u << 20)) return false;
  v.resize(n);
  return read_all(fd, v.data(), n);
}

// Deterministic content of the peer's region.
uint8_t pattern(uint64_t i) { return static_cast<uint8_t>((i * 2654435761u) >> 13); }

enum class PeerMode : uint8_t { kServe, kExport };

// The peer process: an agent with `tls`, a region of `bytes` filled with pattern() (or, in
// kExport mode, a KV export of 3 blocks), its address + region sent to the parent; then it
// progresses until the parent writes 'q' (exit) or 's' (stall: stop progressing, sleep).
[[noreturn]] void run_peer(int fd, const std::string& tls, int64_t bytes, PeerMode mode) {
  UcxAgentOptions opt;
  opt.name = "peer";
  opt.transports = tls;
  auto agent = UcxAgent::create(opt);
  if (!agent.ok()) {
    std::fprintf(stderr, "peer: %s\n", agent.status().to_string().c_str());
    _exit(2);
  }
  auto region = (*agent)->allocate_region(bytes);
  if (!region.ok()) _exit(3);
  auto* data = static_cast<uint8_t*>((*region)->data());
  uint64_t export_bytes = 0;
  if (mode == PeerMode::kServe) {
    for (int64_t i = 0; i < bytes; ++i) data[i] = pattern(static_cast<uint64_t>(i));
  } else {
    auto be = make_cpu_backend(1);
    auto kv = be->create_kv_storage(2, 8, 4, 16);
    std::vector<float> k(8 * 4 * 16), v(k.size());
    for (size_t i = 0; i < k.size(); ++i) k[i] = static_cast<float>(i) * 0.5f, v[i] = -static_cast<float>(i);
    std::vector<int32_t> slots(32);
    std::iota(slots.begin(), slots.end(), 0);
    for (int l = 0; l < 2; ++l) be->kv_write(**kv, l, k.data(), v.data(), slots.data(), 32);
    const int32_t blocks[3] = {6, 1, 3};
    auto h = export_kv_blocks(*be, **kv, kv_export_format(**kv, 77), blocks, 3, 11, data, bytes);
    if (!h.ok()) _exit(4);
    export_bytes = static_cast<uint64_t>(kv_export_bytes(h->format, 3));
  }
  const KvRemoteRegion& r = (*region)->remote();
  if (!send_bytes(fd, (*agent)->address()) || !write_all(fd, &r.base, 8) || !write_all(fd, &r.bytes, 8) ||
      !send_bytes(fd, r.rkey) || !write_all(fd, &export_bytes, 8)) {
    _exit(5);
  }
  char cmd = 0;
  (*agent)->progress_until(KvDeadline::max(), [&] {
    pollfd p{fd, POLLIN, 0};
    return ::poll(&p, 1, 0) > 0 && ::read(fd, &cmd, 1) == 1;
  });
  if (cmd == 's') {
    for (;;) ::pause();  // alive, never progresses again: the parent kills it
  }
  _exit(0);
}

struct Peer {
  pid_t pid = -1;
  int fd = -1;
  std::vector<uint8_t> address;
  KvRemoteRegion region;
  uint64_t export_bytes = 0;

  void command(char c) const { ASSERT_TRUE(write_all(fd, &c, 1)); }
  // Asks the peer to exit ('q'), or kills it (0), and reaps it; returns its exit status (or
  // -signal).
  int finish(char c = 'q') {
    if (pid < 0) return 0;
    if (c != 0) (void)write_all(fd, &c, 1);
    if (c == 0) ::kill(pid, SIGKILL);
    int status = 0;
    ::waitpid(pid, &status, 0);
    ::close(fd);
    pid = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
  }
  ~Peer() {
    if (pid > 0) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
      ::close(fd);
    }
  }
};

// Forks a peer and reads its announcement.
void start_peer(Peer& peer, const std::string& tls, int64_t bytes, PeerMode mode = PeerMode::kServe) {
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::close(sv[0]);
    run_peer(sv[1], tls, bytes, mode);
  }
  ::close(sv[1]);
  peer.pid = pid;
  peer.fd = sv[0];
  ASSERT_TRUE(recv_bytes(peer.fd, peer.address)) << "peer exited before announcing itself";
  ASSERT_TRUE(read_all(peer.fd, &peer.region.base, 8));
  ASSERT_TRUE(read_all(peer.fd, &peer.region.bytes, 8));
  ASSERT_TRUE(recv_bytes(peer.fd, peer.region.rkey));
  ASSERT_TRUE(read_all(peer.fd, &peer.export_bytes, 8));
  ASSERT_EQ(peer.region.bytes, static_cast<uint64_t>(bytes));
  ASSERT_FALSE(peer.region.rkey.empty());
}

std::unique_ptr<UcxAgent> make_agent(const std::string& tls, bool progress_thread = false, int64_t chunk_bytes = 0,
                                     int max_in_flight = 0) {
  UcxAgentOptions opt;
  opt.name = "importer";
  opt.transports = tls;
  opt.progress_thread = progress_thread;
  if (chunk_bytes > 0) opt.chunk_bytes = chunk_bytes;
  if (max_in_flight > 0) opt.max_in_flight = max_in_flight;
  auto a = UcxAgent::create(opt);
  EXPECT_TRUE(a.ok()) << a.status().to_string();
  return a.ok() ? std::move(*a) : nullptr;
}

class UcxLoopback : public ::testing::TestWithParam<std::string> {};

TEST_P(UcxLoopback, GetAndPutOneBlockManyBlocksAndMoreThanOneMebibyte) {
  const std::string tls = GetParam();
  const int64_t region_bytes = 3 << 20;  // 3 MiB
  Peer peer;
  ASSERT_NO_FATAL_FAILURE(start_peer(peer, tls, region_bytes));
  auto agent = make_agent(tls);
  ASSERT_NE(agent, nullptr);
  EXPECT_EQ(agent->transports(), tls);
  auto ep = agent->connect(peer.address, "peer", kv_deadline_after(std::chrono::seconds(10)));
  ASSERT_TRUE(ep.ok()) << ep.status().to_string();
  // UCX 1.13 has no peer failure handling on shared memory: the endpoint says it runs on
  // deadlines alone there (kv/ucx_transport.h), and keeps it over tcp.
  EXPECT_EQ((*ep)->describe().find("deadlines only") != std::string::npos, tls == "sm") << (*ep)->describe();
  auto local = agent->allocate_region(region_bytes);  // registered: the fast path
  ASSERT_TRUE(local.ok()) << local.status().to_string();
  auto* dst = static_cast<uint8_t*>((*local)->data());
  std::vector<uint8_t> unregistered(static_cast<size_t>(region_bytes));

  // A KV block of a 135M-class model: 30 layers x K,V x 16 tokens x 192 floats = 720 KiB; use
  // sizes around it: one 4 KiB block, 64 blocks of 4 KiB, 2.5 MiB at an odd offset.
  struct Case {
    int64_t offset, bytes;
    bool registered;
  };
  for (const Case& c : {Case{0, 4096, true}, Case{4096, 64 * 4096, true}, Case{12345, (5 << 20) / 2, true},
                        Case{777, (3 << 20) / 2, false}}) {
    SCOPED_TRACE(tls + ": get " + std::to_string(c.bytes) + " bytes at " + std::to_string(c.offset));
    uint8_t* out = c.registered ? dst : unregistered.data();
    std::memset(out, 0, static_cast<size_t>(c.bytes));
    const Status st = (*ep)->get(out, c.bytes, peer.region, c.offset, kv_deadline_after(std::chrono::seconds(10)));
    ASSERT_TRUE(st.ok()) << st.to_string();
    int64_t wrong = 0;
    for (int64_t i = 0; i < c.bytes; ++i) wrong += out[i] != pattern(static_cast<uint64_t>(c.offset + i));
    EXPECT_EQ(wrong, 0);
  }

  // put: new bytes into the peer's region at an offset, read back with a get.
  const int64_t put_bytes = (3 << 20) / 2, put_off = 1 << 20;
  for (int64_t i = 0; i < put_bytes; ++i) dst[i] = static_cast<uint8_t>(i * 7 + 3);
  Status st = (*ep)->put(dst, put_bytes, peer.region, put_off, kv_deadline_after(std::chrono::seconds(10)));
  ASSERT_TRUE(st.ok()) << st.to_string();
  std::vector<uint8_t> back(static_cast<size_t>(put_bytes + 2));
  st = (*ep)->get(back.data(), put_bytes + 2, peer.region, put_off - 1, kv_deadline_after(std::chrono::seconds(10)));
  ASSERT_TRUE(st.ok()) << st.to_string();
  EXPECT_EQ(back[0], pattern(static_cast<uint64_t>(put_off - 1))) << "byte before the put changed";
  EXPECT_EQ(std::memcmp(back.data() + 1, dst, static_cast<size_t>(put_bytes)), 0);
  EXPECT_EQ(back[static_cast<size_t>(put_bytes + 1)], pattern(static_cast<uint64_t>(put_off + put_bytes)));

  // Out of the region: refused before anything is sent; the endpoint stays usable.
  st = (*ep)->get(dst, 16, peer.region, region_bytes - 8, kv_deadline_after(std::chrono::seconds(1)));
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE((*ep)->failed());
  EXPECT_EQ(peer.finish(), 0);
}

TEST_P(UcxLoopback, MovesAKvExportBetweenProcessesAndImportsIt) {
  const std::string tls = GetParam();
  Peer peer;
  ASSERT_NO_FATAL_FAILURE(start_peer(peer, tls, 1 << 20, PeerMode::kExport));
  ASSERT_GT(peer.export_bytes, 0u);
  auto agent = make_agent(tls);
  ASSERT_NE(agent, nullptr);
  auto ep = agent->connect(peer.address, "exporter", kv_deadline_after(std::chrono::seconds(10)));
  ASSERT_TRUE(ep.ok()) << ep.status().to_string();
  std::vector<uint8_t> wire(peer.export_bytes);
  Status st = (*ep)->get(wire.data(), static_cast<int64_t>(wire.size()), peer.region, 0,
                         kv_deadline_after(std::chrono::seconds(10)));
  ASSERT_TRUE(st.ok()) << st.to_string();
  EXPECT_EQ(peer.finish(), 0);

  // Same KV values as the exporter wrote (block b, token t, layer l: K = (b*4+t)*16+e times 0.5).
  auto be = make_cpu_backend(1);
  auto kv = be->create_kv_storage(2, 8, 4, 16);
  ASSERT_TRUE(kv.ok());
  const int32_t dst[3] = {0, 2, 5};
  auto h = import_kv_blocks(*be, **kv, kv_export_format(**kv, 77), wire.data(), static_cast<int64_t>(wire.size()), dst, 3);
  ASSERT_TRUE(h.ok()) << h.status().to_string();
  EXPECT_EQ(h->num_tokens, 11);
  std::vector<float> got(static_cast<size_t>(kv_block_bytes(**kv, 0, 2) / 4));
  const int32_t src_blocks[3] = {6, 1, 3};
  for (int i = 0; i < 3; ++i) {
    be->kv_export_blocks(**kv, 0, 2, &dst[i], 1, got.data());
    for (int l = 0; l < 2; ++l)
      for (int e = 0; e < 4 * 16; ++e) {
        const float slot_val = static_cast<float>(src_blocks[i] * 4 * 16 + e);
        ASSERT_EQ(got[static_cast<size_t>(l * 128 + e)], slot_val * 0.5f) << "K block " << i << " layer " << l;
        ASSERT_EQ(got[static_cast<size_t>(l * 128 + 64 + e)], -slot_val) << "V block " << i << " layer " << l;
      }
  }
}

TEST_P(UcxLoopback, PipelinedGetAndPutOfManyChunksMoveEveryByte) {
  // 64 KiB chunks, 3 in flight: a 2.5 MiB get at an odd offset is 40 chunks, the last one short,
  // so the window refills many times; same for a put read back with a get.
  const std::string tls = GetParam();
  const int64_t region_bytes = 3 << 20;
  Peer peer;
  ASSERT_NO_FATAL_FAILURE(start_peer(peer, tls, region_bytes));
  auto agent = make_agent(tls, false, /*chunk_bytes=*/64 << 10, /*max_in_flight=*/3);
  ASSERT_NE(agent, nullptr);
  auto ep = agent->connect(peer.address, "peer", kv_deadline_after(std::chrono::seconds(10)));
  ASSERT_TRUE(ep.ok()) << ep.status().to_string();
  auto local = agent->allocate_region(region_bytes);
  ASSERT_TRUE(local.ok()) << local.status().to_string();
  auto* dst = static_cast<uint8_t*>((*local)->data());
  std::vector<uint8_t> unregistered(static_cast<size_t>(region_bytes));
  for (const bool registered : {true, false}) {
    const int64_t off = 4097, bytes = (5 << 20) / 2 + 1234;
    SCOPED_TRACE(tls + (registered ? ": registered" : ": unregistered"));
    uint8_t* out = registered ? dst : unregistered.data();
    std::memset(out, 0, static_cast<size_t>(bytes));
    const Status st = (*ep)->get(out, bytes, peer.region, off, kv_deadline_after(std::chrono::seconds(10)));
    ASSERT_TRUE(st.ok()) << st.to_string();
    int64_t wrong = 0;
    for (int64_t i = 0; i < bytes; ++i) wrong += out[i] != pattern(static_cast<uint64_t>(off + i));
    EXPECT_EQ(wrong, 0);
  }
  const int64_t put_bytes = (1 << 20) + 333, put_off = 100;
  for (int64_t i = 0; i < put_bytes; ++i) dst[i] = static_cast<uint8_t>(i * 13 + 1);
  Status st = (*ep)->put(dst, put_bytes, peer.region, put_off, kv_deadline_after(std::chrono::seconds(10)));
  ASSERT_TRUE(st.ok()) << st.to_string();
  std::vector<uint8_t> back(static_cast<size_t>(put_bytes + 2));
  st = (*ep)->get(back.data(), put_bytes + 2, peer.region, put_off - 1, kv_deadline_after(std::chrono::seconds(10)));
  ASSERT_TRUE(st.ok()) << st.to_string();
  EXPECT_EQ(back[0], pattern(static_cast<uint64_t>(put_off - 1))) << "byte before the put changed";
  EXPECT_EQ(std::memcmp(back.data() + 1, dst, static_cast<size_t>(put_bytes)), 0);
  EXPECT_EQ(back[static_cast<size_t>(put_bytes + 1)], pattern(static_cast<uint64_t>(put_off + put_bytes)));
  EXPECT_FALSE((*ep)->failed());
  EXPECT_EQ(peer.finish(), 0);
}

TEST(UcxAgentOptionsCheck, RefusesNonPositiveChunksAndWindow) {
  UcxAgentOptions o;
  o.transports = "tcp";
  o.chunk_bytes = 0;
  auto a = UcxAgent::create(o);
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(a.status().message().find("chunk_bytes 0"), std::string::npos) << a.status().to_string();
  o.chunk_bytes = 4096;
  o.max_in_flight = 0;
  a = UcxAgent::create(o);
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().code(), StatusCode::kInvalidArgument);
}

INSTANTIATE_TEST_SUITE_P(Transports, UcxLoopback, ::testing::Values("tcp", "sm"),
                         [](const auto& info) { return info.param; });

TEST(UcxPeerFailure, StalledPeerGivesDeadlineExceededThenUnavailable) {
  // Over tcp the target answers gets: a peer that stops progressing stalls the transfer.
  Peer peer;
  ASSERT_NO_FATAL_FAILURE(start_peer(peer, "tcp", 16 << 20));
  auto agent = make_agent("tcp");
  ASSERT_NE(agent, nullptr);
  auto ep = agent->connect(peer.address, "staller", kv_deadline_after(std::chrono::seconds(10)));
  ASSERT_TRUE(ep.ok()) << ep.status().to_string();
  peer.command('s');
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the peer reads 's' and stops
  std::vector<uint8_t> buf(16 << 20);
  Status st = (*ep)->get(buf.data(), 16 << 20, peer.region, 0, kv_deadline_after(std::chrono::milliseconds(500)));
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), StatusCode::kDeadlineExceeded) << st.to_string();
  EXPECT_NE(st.message().find("staller"), std::string::npos) << st.to_string();
  EXPECT_TRUE((*ep)->failed());
  st = (*ep)->get(buf.data(), 16, peer.region, 0, kv_deadline_after(std::chrono::seconds(1)));
  EXPECT_EQ(st.code(), StatusCode::kUnavailable) << st.to_string();
  ep->reset();
  EXPECT_EQ(peer.finish(0), -SIGKILL) << "the stalled peer was still alive";
}

// A get waiting on a stalled peer holds the agent's lock only between its progress calls: other
// calls on the agent from other threads (registering a region, a second get on the same endpoint)
// go ahead meanwhile instead of waiting for the first get's deadline. The second get, on the same
// endpoint, ends when the first one's failure closes it.
TEST(UcxPeerFailure, StalledGetDoesNotHoldTheAgentFromOtherThreads) {
  Peer peer;
  ASSERT_NO_FATAL_FAILURE(start_peer(peer, "tcp", 16 << 20));
  auto agent = make_agent("tcp");
  ASSERT_NE(agent, nullptr);
  auto ep = agent->connect(peer.address, "staller", kv_deadline_after(std::chrono::seconds(10)));
  ASSERT_TRUE(ep.ok()) << ep.status().to_string();
  peer.command('s');
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the peer reads 's' and stops
  std::vector<uint8_t> buf(16 << 20), buf2(1 << 20);
  const auto t0 = std::chrono::steady_clock::now();
  Status first, second;
  std::thread getter([&] {
    first = (*ep)->get(buf.data(), 16 << 20, peer.region, 0, kv_deadline_after(std::chrono::milliseconds(3000)));
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the first get is waiting now
  const auto t1 = std::chrono::steady_clock::now();
  auto region = agent->allocate_region(4 << 20);
  const auto took = std::chrono::steady_clock::now() - t1;
  ASSERT_TRUE(region.ok()) << region.status().to_string();
  EXPECT_LT(took, std::chrono::milliseconds(1000)) << "allocate_region waited for the stalled get's deadline";
  std::thread getter2([&] {
    second = (*ep)->get(buf2.data(), 1 << 20, peer.region, 0, kv_deadline_after(std::chrono::milliseconds(20000)));
  });
  region->reset();  // unregistering takes the lock too
  EXPECT_LT(std::chrono::steady_clock::now() - t1, std::chrono::milliseconds(1500));
  getter.join();
  getter2.join();
  EXPECT_EQ(first.code(), StatusCode::kDeadlineExceeded) << first.to_string();
  EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(2900));
  EXPECT_FALSE(second.ok()) << "the second get cannot succeed from a stalled peer";
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(15000))
      << "the second get must end with the endpoint, not at its own deadline";
  EXPECT_TRUE((*ep)->failed());
  ep->reset();
  EXPECT_EQ(peer.finish(0), -SIGKILL);
}

TEST(UcxPeerFailure, PeerKilledMidTransferGivesUnavailableBeforeTheDeadlineAndAgentSurvives) {
  Peer peer, other;
  ASSERT_NO_FATAL_FAILURE(start_peer(peer, "tcp", 64 << 20));
  // NOTE: peers are forked before this process initialises UCX: a child forked from a process
  // with a live UCX context inherits its async-thread state without the thread, and then never
  // accepts tcp connections (UCX is not fork-safe after ucp_init).
  ASSERT_NO_FATAL_FAILURE(start_peer(other, "tcp", 1 << 20));
  auto agent = make_agent("tcp");
  ASSERT_NE(agent, nullptr);
  auto ep = agent->connect(peer.address, "victim", kv_deadline_after(std::chrono::seconds(10)));
  ASSERT_TRUE(ep.ok()) << ep.status().to_string();
  // The peer stops serving, so the 64 MiB get is certainly in flight when SIGKILL lands.
  peer.command('s');
  const pid_t victim = peer.pid;
  std::thread killer([victim] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    ::kill(victim, SIGKILL);
  });
  std::vector<uint8_t> buf(64 << 20);
  const Status st = (*ep)->get(buf.data(), 64 << 20, peer.region, 0, kv_deadline_after(std::chrono::seconds(30)));
  killer.join();
  ASSERT_FALSE(st.ok());
  // kUnavailable (not kDeadlineExceeded): the death was noticed, not waited out.
  EXPECT_EQ(st.code(), StatusCode::kUnavailable) << st.to_string();
  EXPECT_NE(st.message().find("victim"), std::string::npos) << st.to_string();
  EXPECT_TRUE((*ep)->failed());
  ep->reset();
  EXPECT_EQ(peer.finish(0), -SIGKILL);

  // The worker goes on: a healthy peer is reachable from the same agent ("retry on another path").
  auto ep2 = agent->connect(other.address, "healthy", kv_deadline_after(std::chrono::seconds(10)));
  ASSERT_TRUE(ep2.ok()) << ep2.status().to_string();
  std::vector<uint8_t> small(4096);
  ASSERT_TRUE((*ep2)->get(small.data(), 4096, other.region, 0, kv_deadline_after(std::chrono::seconds(10))).ok());
  EXPECT_EQ(small[100], pattern(100));
  ep2->reset();
  EXPECT_EQ(other.finish(), 0);
}

TEST(UcxPeerFailure, PeerStoppedMidPipelineGivesDeadlineExceededAndNoLateWrites) {
  // Over tcp the target answers each chunk's get: SIGSTOP lands while a 64 MiB get runs as 1 MiB
  // chunks, 4 in flight — as soon as the first chunk's last byte has arrived, so chunks are done,
  // others in flight and most not yet posted. After the deadline every chunk must be cancelled:
  // once the peer runs again and this side progresses, nothing changes in the buffer any more.
  Peer peer;
  ASSERT_NO_FATAL_FAILURE(start_peer(peer, "tcp", 64 << 20));
  auto agent = make_agent("tcp", false, /*chunk_bytes=*/1 << 20, /*max_in_flight=*/4);
  ASSERT_NE(agent, nullptr);
  auto ep = agent->connect(peer.address, "sleeper", kv_deadline_after(std::chrono::seconds(10)));
  ASSERT_TRUE(ep.ok()) << ep.status().to_string();
  std::vector<uint8_t> buf(64 << 20, 0);
  uint64_t watch = (1 << 20) - 1;  // the last byte of chunk 0 whose pattern is not 0
  while (pattern(watch) == 0) --watch;
  const pid_t sleeper = peer.pid;
  std::atomic<bool> stopped{false}, give_up{false};
  std::thread stopper([&] {
    const auto limit = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!give_up.load() && std::atomic_ref<uint8_t>(buf[watch]).load(std::memory_order_relaxed) == 0 &&
           std::chrono::steady_clock::now() < limit) {
    }
    if (!give_up.load()) stopped = ::kill(sleeper, SIGSTOP) == 0;
  });
  const auto t0 = std::chrono::steady_clock::now();
  // NOTE: 3 s, not 1 s: on a loaded 2-core machine the first 1 MiB chunk once took longer than 1 s
  // (the peer process starved), so the stop never happened within the transfer.
  Status st = (*ep)->get(buf.data(), 64 << 20, peer.region, 0, kv_deadline_after(std::chrono::milliseconds(3000)));
  const auto waited = std::chrono::steady_clock::now() - t0;
  give_up = true;
  stopper.join();
  ASSERT_TRUE(stopped) << "the peer was not stopped; get: " << st.to_string();
  ASSERT_FALSE(st.ok()) << "63 MiB arrived between the first chunk and SIGSTOP";
  EXPECT_EQ(buf[watch], pattern(watch)) << "chunk 0 had arrived before the stop";
  EXPECT_EQ(st.code(), StatusCode::kDeadlineExceeded) << st.to_string();
  EXPECT_NE(st.message().find("sleeper"), std::string::npos) << st.to_string();
  EXPECT_LT(waited, std::chrono::seconds(9)) << "deadline 3 s + at most 5 s for the forced close";
  EXPECT_TRUE((*ep)->failed());
  const std::vector<uint8_t> at_return = buf;
  ::kill(sleeper, SIGCONT);  // the peer answers whatever it still holds
  agent->progress_until(kv_deadline_after(std::chrono::milliseconds(300)));
  EXPECT_EQ(std::memcmp(at_return.data(), buf.data(), buf.size()), 0) << "a chunk wrote after get() returned";
  st = (*ep)->get(buf.data(), 16, peer.region, 0, kv_deadline_after(std::chrono::seconds(1)));
  EXPECT_EQ(st.code(), StatusCode::kUnavailable) << st.to_string();
  ep->reset();
  EXPECT_EQ(peer.finish(), 0) << "the resumed peer did not exit on 'q'";
}

TEST(UcxPeerFailure, ConnectToADeadPeerFailsWithinTheDeadline) {
  Peer peer, alive;
  ASSERT_NO_FATAL_FAILURE(start_peer(peer, "tcp", 4096));
  ASSERT_NO_FATAL_FAILURE(start_peer(alive, "tcp", 4096));  // forked before this process's ucp_init
  ::kill(peer.pid, SIGKILL);
  EXPECT_EQ(peer.finish(0), -SIGKILL);
  auto agent = make_agent("tcp");
  ASSERT_NE(agent, nullptr);
  auto ep = agent->connect(peer.address, "ghost", kv_deadline_after(std::chrono::seconds(5)));
  ASSERT_FALSE(ep.ok());
  EXPECT_TRUE(ep.status().code() == StatusCode::kUnavailable || ep.status().code() == StatusCode::kDeadlineExceeded)
      << ep.status().to_string();
  EXPECT_NE(ep.status().message().find("ghost"), std::string::npos) << ep.status().to_string();
  // A dead peer is not "no transport handles peer failure": the next endpoint over tcp still
  // detects peer failure (it once lost it for the agent's lifetime).
  auto ep2 = agent->connect(alive.address, "alive", kv_deadline_after(std::chrono::seconds(10)));
  ASSERT_TRUE(ep2.ok()) << ep2.status().to_string();
  EXPECT_EQ((*ep2)->describe().find("deadlines only"), std::string::npos) << (*ep2)->describe();
  ep2->reset();
  EXPECT_EQ(alive.finish(), 0);
}

// An endpoint keeps at most 64 unpacked remote keys (kv/ucx_transport.cpp, kMaxRkeys) and drops
// them all when a new one would exceed that: reading 100 regions of one peer twice over crosses
// that bound several times, and every read stays correct. Over shared memory a flush that
// destroyed the keys but kept them in the cache crashes this test (checked); over tcp it would not.
// Both agents are in this process; the owner answers from its progress thread.
class UcxRkeyCache : public ::testing::TestWithParam<std::string> {};

TEST_P(UcxRkeyCache, ReadsFromManyRegionsStayCorrectAcrossCacheFlushes) {
  const std::string tls = GetParam();
  auto owner = make_agent(tls, /*progress_thread=*/true);
  ASSERT_NE(owner, nullptr);
  constexpr int kRegions = 100;
  constexpr int64_t kBytes = 4096;
  std::vector<std::unique_ptr<UcxRegion>> regions;
  for (int r = 0; r < kRegions; ++r) {
    auto reg = owner->allocate_region(kBytes);
    ASSERT_TRUE(reg.ok()) << reg.status().to_string();
    auto* d = static_cast<uint8_t*>((*reg)->data());
    for (int64_t i = 0; i < kBytes; ++i) d[i] = pattern(static_cast<uint64_t>(r * kBytes + i));
    regions.push_back(std::move(*reg));
  }
  auto importer = make_agent(tls);
  ASSERT_NE(importer, nullptr);
  auto ep = importer->connect(owner->address(), "owner", kv_deadline_after(std::chrono::seconds(10)));
  ASSERT_TRUE(ep.ok()) << ep.status().to_string();
  std::vector<uint8_t> buf(static_cast<size_t>(kBytes));
  for (int round = 0; round < 2; ++round) {
    for (int r = 0; r < kRegions; ++r) {
      SCOPED_TRACE("round " + std::to_string(round) + ", region " + std::to_string(r));
      std::fill(buf.begin(), buf.end(), 0);
      const Status st = (*ep)->get(buf.data(), kBytes, regions[static_cast<size_t>(r)]->remote(), 0,
                                   kv_deadline_after(std::chrono::seconds(10)));
      ASSERT_TRUE(st.ok()) << st.to_string();
      int64_t wrong = 0;
      for (int64_t i = 0; i < kBytes; ++i) wrong += buf[static_cast<size_t>(i)] != pattern(static_cast<uint64_t>(r * kBytes + i));
      ASSERT_EQ(wrong, 0);
    }
  }
  EXPECT_FALSE((*ep)->failed());
}

INSTANTIATE_TEST_SUITE_P(Ucx, UcxRkeyCache, ::testing::Values("tcp", "sm"));

TEST(UcxProgressThread, ServesPeersWhileTheOwnerIsIdle) {
  // Roles swapped: this process owns the region and never calls progress(); its progress thread
  // answers the child's tcp gets. The child reports what it read over the socketpair. (Forked
  // after ucp_init, the child only connects out, which works; see the NOTE above.)
  auto agent = make_agent("tcp", /*progress_thread=*/true);
  ASSERT_NE(agent, nullptr);
  auto region = agent->allocate_region(1 << 20);
  ASSERT_TRUE(region.ok());
  auto* data = static_cast<uint8_t*>((*region)->data());
  for (int i = 0; i < (1 << 20); ++i) data[i] = pattern(static_cast<uint64_t>(i));
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  const std::vector<uint8_t> addr = agent->address();
  const KvRemoteRegion remote = (*region)->remote();
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // Child: connect, get 1 MiB, answer 1 when every byte matches. (No gtest macros here.)
    ::close(sv[0]);
    UcxAgentOptions opt;
    opt.transports = "tcp";
    auto a = UcxAgent::create(opt);
    if (!a.ok()) _exit(2);
    auto ep = (*a)->connect(addr, "owner", kv_deadline_after(std::chrono::seconds(10)));
    if (!ep.ok()) _exit(3);
    std::vector<uint8_t> buf(1 << 20);
    const Status st = (*ep)->get(buf.data(), 1 << 20, remote, 0, kv_deadline_after(std::chrono::seconds(10)));
    char ok = st.ok() ? 1 : 0;
    for (int i = 0; i < (1 << 20) && ok; ++i) ok = buf[static_cast<size_t>(i)] == pattern(static_cast<uint64_t>(i));
    (void)write_all(sv[1], &ok, 1);
    _exit(st.ok() ? 0 : 4);
  }
  ::close(sv[1]);
  char ok = 0;
  const bool answered = read_all(sv[0], &ok, 1);  // this thread only waits; it never progresses
  int status = 0;
  ::waitpid(pid, &status, 0);
  ::close(sv[0]);
  ASSERT_TRUE(answered);
  EXPECT_EQ(ok, 1);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child status " << status;
}

}  // namespace
}  // namespace specserve
