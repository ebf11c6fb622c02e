// `specserve bench-kv-transfer`: bandwidth of the KV data plane (kv/ucx_transport.h) between two
// processes on this host, to set beside `ucx_perftest -t ucp_put_bw|ucp_get_bw` on the same
// transport (bench/run_kv_transfer_bench.sh runs both).
//
// A forked peer owns a registered region of the largest size and progresses its worker (as
// ucx_perftest's server does); this process connects up front, then times back-to-back
// KvEndpoint::get / put calls of each size into its own registered region. Each call is
// synchronous (a put includes the flush that makes it visible remotely), exactly what an
// importer pays per transfer; inside a call the transfer is pipelined in chunks
// (UcxAgentOptions::chunk_bytes / max_in_flight, --chunk-kib / --in-flight). Transports: --transports, else the environment's UCX_TLS.
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kv/ucx_transport.h"
#include "tools/cli/registry.h"
#include "tools/cli/subcommands.h"

namespace specserve::cli {
namespace {

struct Args {
  std::string transports, output;
  std::vector<int64_t> sizes_mib = {1, 4, 16, 64};
  std::vector<std::string> ops = {"put", "get"};
  int64_t min_bytes_per_point = int64_t{1} << 30;  // iterations: at least this many bytes, >= 10
  int repeats = 3;                                  // the best of these runs is reported
  int64_t chunk_kib = 0;                            // 0: UcxAgentOptions' default
  int in_flight = 0;                                // 0: UcxAgentOptions' default
  std::string memory = "ucx";                       // ucx: allocate_region; heap: register_region(aligned_alloc)
  std::string peer_progress = "spin";               // spin: the peer polls its worker; thread: UcxAgent's progress thread
};

// Both sides' regions: UCX-allocated (ucp_mem_map ALLOCATE: shared memory under UCX_TLS=sm) or
// page-aligned heap memory registered with ucp_mem_map (what ucx_perftest and most callers use).
Expected<std::unique_ptr<UcxRegion>> make_region(UcxAgent& agent, const std::string& memory, int64_t bytes) {
  if (memory == "ucx") return agent.allocate_region(bytes);
  // NOTE: leaked on purpose: it lives as long as the process (the region must not outlive it).
  void* p = std::aligned_alloc(4096, static_cast<size_t>((bytes + 4095) / 4096 * 4096));
  if (p == nullptr) return resource_exhausted("bench-kv-transfer: no memory for " + std::to_string(bytes) + " bytes");
  return agent.register_region(p, bytes);
}

bool write_all(int fd, const void* p, size_t n) {
  const char* c = static_cast<const char*>(p);
  while (n > 0) {
    const ssize_t w = ::write(fd, c, n);
    if (w <= 0) return false;
    c += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}
bool read_all(int fd, void* p, size_t n) {
  char* c = static_cast<char*>(p);
  while (n > 0) {
    const ssize_t r = ::read(fd, c, n);
    if (r <= 0) return false;
    c += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

// The peer: announces its worker address and region, progresses until a byte arrives on fd:
// spinning on its worker (as ucx_perftest's responder does), or, with peer_progress "thread", with
// UcxAgentOptions::progress_thread while it sleeps in read() (as a worker's KV data plane does:
// actors/kv_data_plane.h), so it takes no CPU from the reader when the transport needs none.
[[noreturn]] void serve(int fd, const std::string& transports, const std::string& memory, const std::string& peer_progress,
                        int64_t bytes) {
  UcxAgentOptions opt;
  opt.name = "bench-peer";
  opt.transports = transports;
  opt.progress_thread = peer_progress == "thread";
  auto agent = UcxAgent::create(opt);
  if (!agent.ok()) {
    std::fprintf(stderr, "bench-kv-transfer peer: %s\n", agent.status().to_string().c_str());
    _exit(2);
  }
  auto region = make_region(**agent, memory, bytes);
  if (!region.ok()) {
    std::fprintf(stderr, "bench-kv-transfer peer: %s\n", region.status().to_string().c_str());
    _exit(3);
  }
  std::memset((*region)->data(), 0x5a, static_cast<size_t>(bytes));
  const auto& addr = (*agent)->address();
  const KvRemoteRegion& r = (*region)->remote();
  const uint64_t addr_len = addr.size(), rkey_len = r.rkey.size();
  if (!write_all(fd, &addr_len, 8) || !write_all(fd, addr.data(), addr_len) || !write_all(fd, &r.base, 8) ||
      !write_all(fd, &r.bytes, 8) || !write_all(fd, &rkey_len, 8) || !write_all(fd, r.rkey.data(), rkey_len)) {
    _exit(4);
  }
  if (opt.progress_thread) {
    char c = 0;
    (void)!::read(fd, &c, 1);
    _exit(0);
  }
  uint32_t spins = 0;
  (*agent)->progress_until(KvDeadline::max(), [&] {
    if ((++spins & 1023) != 0) return false;  // a poll() per 1024 progress calls
    pollfd p{fd, POLLIN, 0};
    return ::poll(&p, 1, 0) > 0;
  });
  _exit(0);
}

int run(const Args& a) {
  if (a.sizes_mib.empty()) return 1;
  const int64_t max_bytes = *std::max_element(a.sizes_mib.begin(), a.sizes_mib.end()) << 20;
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) return 1;
  const pid_t pid = ::fork();
  if (pid < 0) return 1;
  if (pid == 0) {
    ::close(sv[0]);
    serve(sv[1], a.transports, a.memory, a.peer_progress, max_bytes);
  }
  ::close(sv[1]);
  const int fd = sv[0];
  auto fail = [&](const std::string& m) {
    std::fprintf(stderr, "specserve bench-kv-transfer: %s\n", m.c_str());
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
    return 1;
  };
  std::vector<uint8_t> address;
  KvRemoteRegion remote;
  uint64_t n = 0;
  if (!read_all(fd, &n, 8)) return fail("the peer exited before announcing itself");
  address.resize(n);
  if (!read_all(fd, address.data(), n) || !read_all(fd, &remote.base, 8) || !read_all(fd, &remote.bytes, 8) ||
      !read_all(fd, &n, 8)) {
    return fail("short announcement from the peer");
  }
  remote.rkey.resize(n);
  if (!read_all(fd, remote.rkey.data(), n)) return fail("short announcement from the peer");

  UcxAgentOptions opt;
  opt.name = "bench";
  opt.transports = a.transports;
  if (a.chunk_kib > 0) opt.chunk_bytes = a.chunk_kib << 10;
  if (a.in_flight > 0) opt.max_in_flight = a.in_flight;
  auto agent = UcxAgent::create(opt);
  if (!agent.ok()) return fail(agent.status().to_string());
  auto local = make_region(**agent, a.memory, max_bytes);
  if (!local.ok()) return fail(local.status().to_string());
  std::memset((*local)->data(), 0xa5, static_cast<size_t>(max_bytes));
  auto ep = (*agent)->connect(address, "bench-peer", kv_deadline_after(std::chrono::seconds(30)));
  if (!ep.ok()) return fail(ep.status().to_string());

  nlohmann::json results = nlohmann::json::array();
  std::printf("chunks of %lld KiB, %d in flight, %s memory, peer progress: %s\n", static_cast<long long>(opt.chunk_bytes >> 10),
              opt.max_in_flight, a.memory.c_str(), a.peer_progress.c_str());
  std::printf("| transports | op | size (MiB) | iterations | MiB/s (best of %d) |\n|---|---|---:|---:|---:|\n", a.repeats);
  for (const std::string& op : a.ops) {
    for (int64_t mib : a.sizes_mib) {
      const int64_t bytes = mib << 20;
      const int64_t iters = std::max<int64_t>(10, a.min_bytes_per_point / bytes);
      auto once = [&]() -> Status {
        const auto deadline = kv_deadline_after(std::chrono::seconds(30));
        return op == "put" ? (*ep)->put((*local)->data(), bytes, remote, 0, deadline)
                           : (*ep)->get((*local)->data(), bytes, remote, 0, deadline);
      };
      for (int w = 0; w < 2; ++w) {  // warm-up: registration caches, first-touch pages
        if (Status st = once(); !st.ok()) return fail(st.to_string());
      }
      std::vector<double> mibps;
      for (int r = 0; r < a.repeats; ++r) {
        const auto t0 = std::chrono::steady_clock::now();
        for (int64_t i = 0; i < iters; ++i) {
          if (Status st = once(); !st.ok()) return fail(st.to_string());
        }
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        mibps.push_back(static_cast<double>(bytes) * static_cast<double>(iters) / s / (1 << 20));
      }
      const double best = *std::max_element(mibps.begin(), mibps.end());
      std::printf("| %s | %s | %lld | %lld | %.0f |\n", (*agent)->transports().c_str(), op.c_str(),
                  static_cast<long long>(mib), static_cast<long long>(iters), best);
      std::fflush(stdout);
      results.push_back({{"transports", (*agent)->transports()},
                         {"op", op},
                         {"size_bytes", bytes},
                         {"iterations", iters},
                         {"chunk_bytes", opt.chunk_bytes},
                         {"max_in_flight", opt.max_in_flight},
                         {"memory", a.memory},
                         {"peer_progress", a.peer_progress},
                         {"mib_per_s", best},
                         {"mib_per_s_runs", mibps}});
    }
  }
  ep->reset();
  const char quit = 'q';
  (void)write_all(fd, &quit, 1);
  int status = 0;
  ::waitpid(pid, &status, 0);
  ::close(fd);
  if (!a.output.empty()) {
    std::ofstream out(a.output);
    out << nlohmann::json{{"tool", "specserve bench-kv-transfer"}, {"results", results}}.dump(2) << "\n";
    if (!out) {
      std::fprintf(stderr, "specserve bench-kv-transfer: cannot write %s\n", a.output.c_str());
      return 1;
    }
  }
  return 0;
}

}  // namespace

void add_bench_kv_transfer(CLI::App& app) {
  auto a = std::make_shared<Args>();
  auto* sub = app.add_subcommand("bench-kv-transfer",
                                 "KV block transfer bandwidth over UCX between two processes on this host (a benchmark)");
  sub->add_option("--transports", a->transports, "UCX_TLS for both processes (default: the environment's UCX_TLS)");
  sub->add_option("--sizes-mib", a->sizes_mib, "Transfer sizes in MiB")->check(CLI::Range(int64_t{1}, int64_t{4096}));
  sub->add_option("--ops", a->ops, "put and/or get")->check(CLI::IsMember({"put", "get"}));
  sub->add_option("--min-bytes", a->min_bytes_per_point, "Bytes moved per timed run and size (iterations >= 10)");
  sub->add_option("--repeats", a->repeats, "Timed runs per point; the best is reported")->check(CLI::Range(1, 100));
  sub->add_option("--chunk-kib", a->chunk_kib, "Pipeline chunk size in KiB (default: UcxAgentOptions' default)")
      ->check(CLI::Range(int64_t{4}, int64_t{1} << 22));
  sub->add_option("--in-flight", a->in_flight, "Chunks in flight per transfer (default: UcxAgentOptions' default)")
      ->check(CLI::Range(1, 256));
  sub->add_option("--memory", a->memory,
                  "Regions on both sides: ucx (UcxAgent::allocate_region) or heap (page-aligned heap, registered)")
      ->check(CLI::IsMember({"ucx", "heap"}));
  sub->add_option("--peer-progress", a->peer_progress,
                  "How the peer serves: spin (polls its worker, as ucx_perftest) or thread (UcxAgent's progress "
                  "thread, sleeping on its event fd: what a worker's KV data plane does)")
      ->check(CLI::IsMember({"spin", "thread"}));
  sub->add_option("--output", a->output, "Write the results as JSON here");
  register_command("bench-kv-transfer", [a] { return run(*a); });
}

}  // namespace specserve::cli
