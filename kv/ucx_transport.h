// specserve kv: the UCX transport for KV exports (UCP one-sided put/get, UCX 1.13).
//
// A worker process owns one UcxAgent (a ucp_context + ucp_worker), created when the worker
// starts. What travels in actor messages is plain bytes:
//   - the agent's worker address (address()), published once;
//   - a registered region's descriptor (UcxRegion::remote(): base address, length, packed rkey)
//     plus the offset and length of an export inside it.
// Lifecycle an actor follows (tests/kv/ucx_transport_multiprocess_test.cpp does the same with a
// pipe instead of messages):
//   1. at start: agent = UcxAgent::create(); staging = agent->allocate_region(bytes);
//      publish agent->address() and staging->remote();
//   2. on learning a peer's address, up front: ep = agent->connect(peer_address, name, deadline)
//      (the wire-up completes here, not on first use);
//   3. exporter: export_kv_blocks(... staging->data() + off ...) (kv/transfer.h), send
//      {remote(), off, len} to the importer, keep the bytes until it answers;
//   4. importer: ep->get(local, len, remote, off, deadline) (into its own registered region when
//      it has one: faster), then import_kv_blocks(); on kUnavailable / kDeadlineExceeded it tries
//      another path (another peer, or recompute by prefill) and may connect() again.
// The transport is whatever UCX selects under UCX_TLS (tcp, sm = shared memory + CMA, rc/ud
// over RDMA); UcxAgentOptions::transports overrides the environment.
//
// Pipelining: a transfer larger than UcxAgentOptions::chunk_bytes is posted as several
// non-blocking requests (up to max_in_flight outstanding) progressed together until all complete
// or the deadline passes; the failure contract below covers every chunk (a dead or stalled peer
// mid-pipeline still ends the whole transfer with kUnavailable / kDeadlineExceeded, and once the
// call returns no chunk writes into the caller's buffer any more).
//
// Peer failure: endpoints are created with UCP_ERR_HANDLING_MODE_PEER; a dead peer's error (the
// error handler, or a request completing with an error) fails the transfer with kUnavailable,
// and a transfer past its deadline force-closes the endpoint (UCP_EP_CLOSE_FLAG_FORCE, which
// completes the outstanding request) and answers kDeadlineExceeded.
// NOTE: UCX 1.13 refuses PEER mode when UCX_TLS holds only shared memory (sysv/posix have no
// peer failure handler, cma no active messages); such endpoints fall back to
// UCP_ERR_HANDLING_MODE_NONE (logged once; describe() says so) and rely on the deadline alone.
// Over shared memory a get or put does not involve the peer's CPU, so a stalled peer cannot
// stall it; with UCX_TLS=sm,tcp UCX keeps PEER mode and carries everything over tcp.
//
// Progress: over tcp, UCX emulates get/put with messages the *target* answers, so the side that
// owns a region must progress its worker while peers read it: an owner thread that is busy
// elsewhere calls progress() or, simpler, sets UcxAgentOptions::progress_thread. Over shared
// memory (CMA) and RDMA the target's CPU is not involved.
//
// Thread-safety: every call on an agent, its regions and its endpoints takes the agent's lock
// (the UCP worker is created UCS_THREAD_MODE_SERIALIZED), so any threads may use them; calls
// on one agent run one at a time. A get or put holds the lock between its progress calls only:
// when another thread waits for it (another call on the agent, a second transfer) the transfer
// lets it in at its next progress call, so a transfer to a stalled peer delays other calls by
// one progress call, not until its deadline (the progress thread does not preempt transfers). Destroy regions and endpoints before or after the agent in
// any order (they keep the UCP context alive).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "kv/net_device.h"
#include "kv/transport.h"

namespace specserve {

struct UcxCore;  // the ucp_context / ucp_worker and the agent's lock (kv/ucx_transport.cpp)

struct UcxAgentOptions {
  std::string name = "specserve";  ///< worker name in UCX logs and in error messages
  /// UCX_TLS for this agent (e.g. "tcp", "sm", "rc,sm"); empty: the environment's UCX_TLS, or
  /// UCX's own choice when that is unset.
  std::string transports;
  /// UCX_NET_DEVICES for this agent: the network interfaces its network transports (tcp, RDMA)
  /// listen on and publish in address() (e.g. "lo", "eth0", "mlx5_0:1"); empty: the
  /// environment's UCX_NET_DEVICES, or every interface when that is unset.
  /// NOTE: UCX's tcp transport opens a listening socket on each interface it uses, so a worker
  /// whose node is on loopback sets "lo" (ucx_net_device_for_host) to listen on loopback only.
  std::string net_devices;
  /// Run a thread that progresses the worker while no call does (so peers' tcp gets are served
  /// without the owner calling progress()). Sleeps on the worker's event fd
  /// (UCP_FEATURE_WAKEUP) when the transports support it, else polls every 100 us.
  bool progress_thread = false;
  /// A get or put larger than this is split into chunks of this many bytes, posted as separate
  /// non-blocking requests with up to `max_in_flight` outstanding at once (a put is flushed once,
  /// after its last chunk). Must be > 0.
  /// NOTE: a single request of the whole size leaves the wire idle while UCX's tcp emulation
  /// turns each get round (the target answers one request at a time), and over shared memory one
  /// CMA call per request serialises page pinning and copying; several chunks in flight overlap
  /// them, as ucx_perftest's window does. Defaults measured in bench/results/kv_transfer_*.md.
  int64_t chunk_bytes = int64_t{4} << 20;
  /// Requests of one transfer outstanding at once (>= 1).
  int max_in_flight = 8;
};

/// Memory registered with the agent's context: a staging region peers put into / get from.
class UcxRegion {
 public:
  ~UcxRegion();  ///< unregisters (and frees, when allocated by the agent)
  UcxRegion(const UcxRegion&) = delete;
  UcxRegion& operator=(const UcxRegion&) = delete;

  void* data() const { return base_; }
  int64_t bytes() const { return bytes_; }
  /// Base address, length and packed rkey: what a peer needs to reach this region.
  const KvRemoteRegion& remote() const { return remote_; }

 private:
  friend class UcxAgent;
  UcxRegion() = default;
  std::shared_ptr<UcxCore> core_;
  void* memh_ = nullptr;  // ucp_mem_h
  void* base_ = nullptr;
  int64_t bytes_ = 0;
  KvRemoteRegion remote_;
};

class UcxAgent {
 public:
  /// Creates the context and worker (UCP_FEATURE_RMA). Errors: kUnavailable naming the UCX
  /// status (e.g. no transport in UCX_TLS usable here).
  static Expected<std::unique_ptr<UcxAgent>> create(const UcxAgentOptions& options = {});
  ~UcxAgent();  ///< stops the progress thread; the context lives on while regions/endpoints do
  UcxAgent(const UcxAgent&) = delete;
  UcxAgent& operator=(const UcxAgent&) = delete;

  /// The worker address (ucp_worker_get_address), to publish to peers.
  const std::vector<uint8_t>& address() const { return address_; }
  /// The UCX_TLS in effect ("tcp", "sm", ...; "default" when neither option nor environment set it).
  const std::string& transports() const { return transports_; }
  /// The UCX_NET_DEVICES in effect ("lo", ...; "all" when neither option nor environment set it).
  const std::string& net_devices() const { return net_devices_; }
  const std::string& name() const { return name_; }

  /// Allocates and registers `bytes` bytes (ucp_mem_map with UCP_MEM_MAP_ALLOCATE: UCX may use
  /// shared memory so that same-host peers reach it directly). Errors: kInvalidArgument for
  /// bytes <= 0, kResourceExhausted when UCX cannot map it.
  Expected<std::unique_ptr<UcxRegion>> allocate_region(int64_t bytes);
  /// Registers caller-owned memory [base, base + bytes) (it must outlive the region).
  Expected<std::unique_ptr<UcxRegion>> register_region(void* base, int64_t bytes);

  /// Connects to the peer whose worker address is `peer_address` and completes the wire-up
  /// before returning (an endpoint flush), so a transfer later does not pay for it. `peer_name`
  /// appears in errors. Errors: kInvalidArgument (empty address), kUnavailable (peer unreachable
  /// or gone), kDeadlineExceeded (wire-up not done by `deadline`: the peer does not progress).
  Expected<std::unique_ptr<KvEndpoint>> connect(const std::vector<uint8_t>& peer_address, const std::string& peer_name,
                                                KvDeadline deadline);

  /// Progresses the worker until it has nothing more to do; returns the number of events
  /// handled. Serves peers' tcp gets/puts into this agent's regions.
  int progress();
  /// Progresses until `done()` returns true or `deadline` passes; returns whether done() did.
  bool progress_until(KvDeadline deadline, const std::function<bool()>& done = {});

 private:
  UcxAgent() = default;
  Status start_progress_thread();
  std::shared_ptr<UcxCore> core_;
  std::vector<uint8_t> address_;
  std::string transports_, net_devices_, name_;
};

}  // namespace specserve
