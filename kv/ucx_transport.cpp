#include "kv/ucx_transport.h"

#include <poll.h>
#include <ucp/api/ucp.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>

#include "core/logging.h"

namespace specserve {

// The UCP context and worker shared by an agent, its regions and its endpoints; the last owner
// destroys them. `mu` serialises every UCP call (the worker is UCS_THREAD_MODE_SERIALIZED).
struct UcxCore {
  std::mutex mu;
  ucp_context_h context = nullptr;
  ucp_worker_h worker = nullptr;
  int event_fd = -1;  // >= 0 when UCP_FEATURE_WAKEUP was granted
  // Set once an endpoint with UCP_ERR_HANDLING_MODE_PEER was refused (no transport in UCX_TLS
  // handles peer failure, e.g. UCX 1.13's shared memory): later endpoints go straight to NONE.
  bool peer_errors_unsupported = false;
  std::string name, transports;
  int64_t chunk_bytes = int64_t{4} << 20;  // UcxAgentOptions::chunk_bytes
  size_t max_in_flight = 8;                // UcxAgentOptions::max_in_flight
  // Registered regions of this agent (base, length) -> memh, to pass UCP_OP_ATTR_FIELD_MEMH when
  // a transfer's local buffer lies inside one.
  std::map<uintptr_t, std::pair<uint64_t, ucp_mem_h>> regions;
  std::thread progress_thread;
  std::atomic<bool> stop{false};
  // Threads waiting in acquire(): a transfer, which holds `mu` between its progress calls, hands
  // it over to them (hand_over) instead of keeping it until its last byte or its deadline.
  std::atomic<int> waiting{0};

  // Takes `mu` as a waiter a running transfer lets in at its next progress call.
  std::unique_lock<std::mutex> acquire() {
    waiting.fetch_add(1);
    std::unique_lock<std::mutex> lock(mu);
    waiting.fetch_sub(1);
    return lock;
  }
  // Called by a transfer holding `lock` between progress calls: when threads wait in acquire(),
  // lets them in (each takes the lock before this one takes it back, again as a waiter).
  // NOTE: without it a transfer to a stalled peer would hold every other call on this agent
  // (a target shard exporting or releasing a region, another fetch) until its deadline.
  void hand_over(std::unique_lock<std::mutex>& lock) {
    if (waiting.load(std::memory_order_relaxed) == 0) return;
    lock.unlock();
    while (waiting.load() > 0) std::this_thread::yield();
    lock = acquire();
  }

  ~UcxCore() {
    if (worker != nullptr) ucp_worker_destroy(worker);
    if (context != nullptr) ucp_cleanup(context);
  }
  ucp_mem_h find_memh(const void* p, uint64_t bytes) const {
    const auto a = reinterpret_cast<uintptr_t>(p);
    auto it = regions.upper_bound(a);
    if (it == regions.begin()) return nullptr;
    --it;
    return a + bytes <= it->first + it->second.first ? it->second.second : nullptr;
  }
};

namespace {

std::string ucs(ucs_status_t s) { return ucs_status_string(s); }

int64_t ms_past(KvDeadline since) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - since).count();
}

// Progress loop of a request (nullptr = done at once; an error pointer = failed at once) until it
// completes or `deadline` passes. Returns UCS_INPROGRESS on timeout (the request is still live).
// Caller holds core.mu.
ucs_status_t wait_request(UcxCore& core, void* req, KvDeadline deadline) {
  if (req == nullptr) return UCS_OK;
  if (UCS_PTR_IS_ERR(req)) return UCS_PTR_STATUS(req);
  for (uint32_t spins = 0;; ++spins) {
    ucp_worker_progress(core.worker);
    const ucs_status_t st = ucp_request_check_status(req);
    if (st != UCS_INPROGRESS) {
      ucp_request_free(req);
      return st;
    }
    // The clock is read every 64 spins: a progress call costs well under a microsecond idle.
    if ((spins & 63) == 0 && std::chrono::steady_clock::now() >= deadline) return UCS_INPROGRESS;
  }
}

// Reaps the completed requests of `live` (freeing them and removing them from it); returns the
// first error among them, UCS_OK otherwise. Caller holds core.mu.
ucs_status_t reap_requests(std::vector<void*>& live) {
  ucs_status_t first = UCS_OK;
  for (size_t i = 0; i < live.size();) {
    const ucs_status_t st = ucp_request_check_status(live[i]);
    if (st == UCS_INPROGRESS) {
      ++i;
      continue;
    }
    ucp_request_free(live[i]);
    live[i] = live.back();
    live.pop_back();
    if (first == UCS_OK && st != UCS_OK) first = st;
  }
  return first;
}

// Progresses until every request in `live` completed (returns the first error, or UCS_OK) or
// `deadline` passes (UCS_INPROGRESS; the rest stay in `live`). Caller holds core.mu.
ucs_status_t wait_requests(UcxCore& core, std::vector<void*>& live, KvDeadline deadline) {
  ucs_status_t first = UCS_OK;
  for (uint32_t spins = 0; !live.empty(); ++spins) {
    ucp_worker_progress(core.worker);
    if (const ucs_status_t st = reap_requests(live); first == UCS_OK) first = st;
    if (!live.empty() && (spins & 63) == 0 && std::chrono::steady_clock::now() >= deadline) return UCS_INPROGRESS;
  }
  return first;
}

class UcxEndpoint final : public KvEndpoint {
 public:
  UcxEndpoint(std::shared_ptr<UcxCore> core, std::string peer) : core_(std::move(core)), peer_(std::move(peer)) {}

  ~UcxEndpoint() override {
    auto lock = core_->acquire();
    close_locked(failed_ ? UCP_EP_CLOSE_FLAG_FORCE : 0);
  }

  // Called by UCX (inside ucp_worker_progress, under core.mu) when the peer fails.
  static void on_error(void* arg, ucp_ep_h, ucs_status_t status) {
    auto* self = static_cast<UcxEndpoint*>(arg);
    self->failed_ = true;
    self->error_ = status;
  }

  // Creates the endpoint, with peer failure handling when a transport in UCX_TLS offers it.
  // Caller holds core.mu.
  Status create(const std::vector<uint8_t>& address) {
    ucp_ep_params_t p{};
    p.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_NAME;
    p.address = reinterpret_cast<const ucp_address_t*>(address.data());
    p.name = peer_.c_str();
    ucs_status_t st = UCS_ERR_UNREACHABLE;
    if (!core_->peer_errors_unsupported) {
      p.field_mask |= UCP_EP_PARAM_FIELD_ERR_HANDLER;
      p.err_mode = UCP_ERR_HANDLING_MODE_PEER;
      p.err_handler.cb = &UcxEndpoint::on_error;
      p.err_handler.arg = this;
      st = ucp_ep_create(core_->worker, &p, &ep_);
      detects_peer_failure_ = st == UCS_OK;
      if (st == UCS_ERR_UNREACHABLE) {
        // NOTE: UCX 1.13's shared-memory transports (sysv, posix; cma lacks active messages) do
        // not handle peer failure, and UCX refuses PEER mode with UCX_TLS=sm. Rather than give up
        // shared memory, such endpoints run without it: a transfer is still bounded by its
        // deadline, and over shared memory the target's CPU takes no part in a get or put, so a
        // stalled peer cannot stall it (a dead one's mapped pages stay readable).
        // A dead peer answers UNREACHABLE too (tcp: connection refused): only when an endpoint
        // without PEER mode can be created is PEER mode what failed; otherwise the agent keeps
        // trying PEER mode for later peers.
        p.field_mask &= ~static_cast<uint64_t>(UCP_EP_PARAM_FIELD_ERR_HANDLER);
        p.err_mode = UCP_ERR_HANDLING_MODE_NONE;
        st = ucp_ep_create(core_->worker, &p, &ep_);
        if (st != UCS_OK) {
          ep_ = nullptr;
          return unavailable("ucx: connecting " + core_->name + " to peer " + peer_ + ": " + ucs(st));
        }
        core_->peer_errors_unsupported = true;
        get_logger("kv")->warn("ucx: no transport in UCX_TLS={} handles peer failure; endpoints of {} rely on "
                               "transfer deadlines alone (the UCX ERROR above is this probe)",
                               core_->transports, core_->name);
        return Status();
      }
    }
    if (core_->peer_errors_unsupported) {
      p.field_mask &= ~static_cast<uint64_t>(UCP_EP_PARAM_FIELD_ERR_HANDLER);
      p.err_mode = UCP_ERR_HANDLING_MODE_NONE;
      st = ucp_ep_create(core_->worker, &p, &ep_);
      detects_peer_failure_ = false;
    }
    if (st != UCS_OK) {
      ep_ = nullptr;
      return unavailable("ucx: connecting " + core_->name + " to peer " + peer_ + ": " + ucs(st));
    }
    return Status();
  }

  // Completes the wire-up (and any outstanding operation) by `deadline`. Caller holds core.mu.
  Status flush_locked(KvDeadline deadline, const char* what, int64_t bytes) {
    ucp_request_param_t rp{};
    return finish_locked(ucp_ep_flush_nbx(ep_, &rp), deadline, what, bytes);
  }

  Status get(void* dst, int64_t bytes, const KvRemoteRegion& remote, int64_t off, KvDeadline deadline) override {
    return transfer(false, dst, bytes, remote, off, deadline);
  }
  Status put(const void* src, int64_t bytes, const KvRemoteRegion& remote, int64_t off, KvDeadline deadline) override {
    return transfer(true, const_cast<void*>(src), bytes, remote, off, deadline);
  }
  bool failed() const override { return failed_; }
  std::string describe() const override {
    return "ucx peer " + peer_ + (detects_peer_failure_ ? "" : " (no peer failure handling: deadlines only)");
  }

  std::unique_lock<std::mutex> acquire() { return core_->acquire(); }

 private:
  Status transfer(bool is_put, void* local, int64_t bytes, const KvRemoteRegion& remote, int64_t off,
                  KvDeadline deadline) {
    SPECSERVE_RETURN_IF_ERROR(check_region_range(remote, off, bytes));
    const char* what = is_put ? "put" : "get";
    auto lock = core_->acquire();
    if (failed_ || ep_ == nullptr) {
      return unavailable("ucx " + std::string(what) + " with peer " + peer_ + ": endpoint failed earlier (" +
                         ucs(error_) + "); connect again or use another path");
    }
    if (bytes == 0) return Status();
    auto rkey = unpack_rkey_locked(remote.rkey);
    if (!rkey.ok()) return rkey.status();
    ucp_request_param_t rp{};
    if (ucp_mem_h memh = core_->find_memh(local, static_cast<uint64_t>(bytes)); memh != nullptr) {
      rp.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
      rp.memh = memh;
    }
    const uint64_t raddr = remote.base + static_cast<uint64_t>(off);
    auto* bytes_at = static_cast<uint8_t*>(local);
    const auto start = std::chrono::steady_clock::now();
    // The pipeline: chunks posted while fewer than max_in_flight are outstanding, all progressed
    // together; the first error or the deadline ends it (the rest are cancelled by the forced
    // close in fail_locked).
    std::vector<void*> live;
    live.reserve(core_->max_in_flight);
    int64_t posted = 0;
    ucs_status_t st = UCS_OK;
    ++active_;
    for (uint32_t spins = 0;; ++spins) {
      while (st == UCS_OK && posted < bytes && live.size() < core_->max_in_flight) {
        const int64_t n = std::min(core_->chunk_bytes, bytes - posted);
        void* req = is_put ? ucp_put_nbx(ep_, bytes_at + posted, static_cast<size_t>(n), raddr + posted, *rkey, &rp)
                           : ucp_get_nbx(ep_, bytes_at + posted, static_cast<size_t>(n), raddr + posted, *rkey, &rp);
        posted += n;
        if (UCS_PTR_IS_ERR(req)) {
          st = UCS_PTR_STATUS(req);
        } else if (req != nullptr) {
          live.push_back(req);
        }
      }
      if (st != UCS_OK || (posted == bytes && live.empty())) break;
      ucp_worker_progress(core_->worker);
      st = reap_requests(live);
      // The clock is read every 64 spins: a progress call costs well under a microsecond idle.
      if (st == UCS_OK && !live.empty() && (spins & 63) == 0 && std::chrono::steady_clock::now() >= deadline) {
        st = UCS_INPROGRESS;
        break;
      }
      if (st != UCS_OK) break;
      core_->hand_over(lock);
      if (ep_ == nullptr) {
        // Another transfer on this endpoint failed meanwhile and force-closed it, which completed
        // our requests too: reap them (bounded) and give up.
        --active_;
        if (wait_requests(*core_, live, kv_deadline_after(std::chrono::milliseconds(5000))) == UCS_INPROGRESS) {
          get_logger("kv")->warn("ucx: {} request(s) with peer {} did not complete after a forced close", live.size(), peer_);
        }
        return unavailable("ucx " + std::string(what) + " of " + std::to_string(bytes) + " bytes with peer " + peer_ +
                           ": the endpoint was closed by a failed transfer (" + ucs(error_) + ")");
      }
    }
    --active_;
    if (st != UCS_OK) return fail_locked(st, live, start, what, bytes);
    // A put's completion only frees the source buffer; the flush makes it visible remotely.
    // NOTE: a get's completion already means the bytes are here; no flush needed.
    if (is_put) return flush_locked(deadline, what, bytes);
    return Status();
  }

  Status finish_locked(void* req, KvDeadline deadline, const char* what, int64_t bytes) {
    const auto start = std::chrono::steady_clock::now();
    std::vector<void*> live;
    if (UCS_PTR_IS_ERR(req)) return fail_locked(UCS_PTR_STATUS(req), live, start, what, bytes);
    if (req != nullptr) live.push_back(req);
    const ucs_status_t st = wait_requests(*core_, live, deadline);
    if (st == UCS_OK) return Status();
    return fail_locked(st, live, start, what, bytes);
  }

  // Ends a transfer that failed with `st` (UCS_INPROGRESS: its deadline passed) while the
  // requests in `live` are still outstanding: marks the endpoint failed, force-closes it (which
  // completes them, so nothing writes into the caller's buffer after we return) and returns
  // kDeadlineExceeded or kUnavailable. Caller holds core.mu.
  Status fail_locked(ucs_status_t st, std::vector<void*>& live, std::chrono::steady_clock::time_point start,
                     const char* what, int64_t bytes) {
    const std::string op = bytes > 0 ? std::string(what) + " of " + std::to_string(bytes) + " bytes" : std::string(what);
    failed_ = true;
    if (st == UCS_INPROGRESS) {
      // The peer stalled.
      error_ = UCS_ERR_TIMED_OUT;
      close_locked(UCP_EP_CLOSE_FLAG_FORCE, live);
      return deadline_exceeded("ucx " + op + " with peer " + peer_ + ": not done by its deadline (" +
                               std::to_string(ms_past(start)) + " ms waited); endpoint closed");
    }
    if (error_ == UCS_OK) error_ = st;
    close_locked(UCP_EP_CLOSE_FLAG_FORCE, live);
    return unavailable("ucx " + op + " with peer " + peer_ + ": " + ucs(st) +
                       (error_ != st ? " (peer error: " + ucs(error_) + ")" : "") + "; endpoint closed");
  }

  Expected<ucp_rkey_h> unpack_rkey_locked(const std::vector<uint8_t>& packed) {
    if (packed.empty()) return invalid_argument("ucx transfer with peer " + peer_ + ": remote region has no rkey");
    if (auto it = rkeys_.find(packed); it != rkeys_.end()) return it->second;
    if (rkeys_.size() >= kMaxRkeys && active_ == 0) {
      // NOTE: every region a peer registers brings a new rkey (unpacking one may map the peer's
      // shared memory segment); without a bound the cache would hold one per region ever read.
      // Only when no other transfer of this endpoint is between progress calls with one of them.
      for (auto& [bytes, rkey] : rkeys_) ucp_rkey_destroy(rkey);
      rkeys_.clear();
    }
    ucp_rkey_h rkey = nullptr;
    const ucs_status_t st = ucp_ep_rkey_unpack(ep_, packed.data(), &rkey);
    if (st != UCS_OK) return invalid_argument("ucx: rkey of peer " + peer_ + " does not unpack: " + ucs(st));
    rkeys_.emplace(packed, rkey);
    return rkey;
  }

  // Closes the endpoint (once) and waits, bounded, for the close and for `pending` (requests
  // still in flight, completed by a forced close). Caller holds core.mu.
  void close_locked(uint32_t flags) {
    std::vector<void*> none;
    close_locked(flags, none);
  }
  void close_locked(uint32_t flags, std::vector<void*>& pending) {
    for (auto& [bytes, rkey] : rkeys_) ucp_rkey_destroy(rkey);
    rkeys_.clear();
    if (ep_ == nullptr) {
      // Closed already (by another transfer's failure): its forced close completes `pending` too.
      if (!pending.empty() && wait_requests(*core_, pending, kv_deadline_after(std::chrono::milliseconds(5000))) == UCS_INPROGRESS) {
        get_logger("kv")->warn("ucx: {} request(s) with peer {} did not complete after a forced close", pending.size(), peer_);
      }
      return;
    }
    ucp_request_param_t rp{};
    rp.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    rp.flags = flags;
    void* close_req = ucp_ep_close_nbx(ep_, &rp);
    ep_ = nullptr;
    // NOTE: a graceful close flushes towards the peer; a dead peer could hold it for the transport
    // timeout, so it gets 1 s here before we give up on it (the request leaks; the worker frees it).
    const KvDeadline limit = kv_deadline_after(std::chrono::milliseconds(flags != 0 ? 5000 : 1000));
    if (wait_requests(*core_, pending, limit) == UCS_INPROGRESS) {
      get_logger("kv")->warn("ucx: {} request(s) with peer {} did not complete after a forced close", pending.size(),
                             peer_);
    }
    if (wait_request(*core_, close_req, limit) == UCS_INPROGRESS) {
      get_logger("kv")->warn("ucx: closing the endpoint to peer {} did not complete", peer_);
    }
  }

  std::shared_ptr<UcxCore> core_;
  std::string peer_;
  ucp_ep_h ep_ = nullptr;
  std::atomic<bool> failed_{false};  // read by fetch threads (actors/kv_data_plane.h) without the lock
  bool detects_peer_failure_ = false;
  ucs_status_t error_ = UCS_OK;
  static constexpr size_t kMaxRkeys = 64;  // unpacked rkeys kept per endpoint
  int active_ = 0;                         // transfers of this endpoint under way (under core.mu)
  std::map<std::vector<uint8_t>, ucp_rkey_h> rkeys_;
};

}  // namespace

UcxRegion::~UcxRegion() {
  if (core_ == nullptr || memh_ == nullptr) return;
  auto lock = core_->acquire();
  core_->regions.erase(reinterpret_cast<uintptr_t>(base_));
  ucp_mem_unmap(core_->context, static_cast<ucp_mem_h>(memh_));
}

Expected<std::unique_ptr<UcxAgent>> UcxAgent::create(const UcxAgentOptions& options) {
  std::unique_ptr<UcxAgent> agent(new UcxAgent());
  agent->core_ = std::make_shared<UcxCore>();
  UcxCore& core = *agent->core_;
  core.name = options.name;
  agent->name_ = options.name;
  const char* env_tls = std::getenv("UCX_TLS");
  agent->transports_ = !options.transports.empty() ? options.transports : env_tls != nullptr ? env_tls : "default";
  core.transports = agent->transports_;
  const char* env_dev = std::getenv("UCX_NET_DEVICES");
  agent->net_devices_ = !options.net_devices.empty() ? options.net_devices : env_dev != nullptr ? env_dev : "all";
  if (options.chunk_bytes <= 0 || options.max_in_flight < 1) {
    return invalid_argument("ucx: chunk_bytes " + std::to_string(options.chunk_bytes) + " and max_in_flight " +
                            std::to_string(options.max_in_flight) + " must be positive");
  }
  core.chunk_bytes = options.chunk_bytes;
  core.max_in_flight = static_cast<size_t>(options.max_in_flight);

  ucp_config_t* config = nullptr;
  ucs_status_t st = ucp_config_read(nullptr, nullptr, &config);
  if (st != UCS_OK) return unavailable("ucx: reading the configuration: " + ucs(st));
  if (!options.transports.empty()) {
    st = ucp_config_modify(config, "TLS", options.transports.c_str());
    if (st != UCS_OK) {
      ucp_config_release(config);
      return invalid_argument("ucx: transports '" + options.transports + "': " + ucs(st));
    }
  }
  if (!options.net_devices.empty()) {
    st = ucp_config_modify(config, "NET_DEVICES", options.net_devices.c_str());
    if (st != UCS_OK) {
      ucp_config_release(config);
      return invalid_argument("ucx: net_devices '" + options.net_devices + "': " + ucs(st));
    }
  }
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED | UCP_PARAM_FIELD_NAME;
  params.features = UCP_FEATURE_RMA | (options.progress_thread ? UCP_FEATURE_WAKEUP : 0);
  params.mt_workers_shared = 0;
  params.name = options.name.c_str();
  st = ucp_init(&params, config, &core.context);
  ucp_config_release(config);
  if (st != UCS_OK) {
    core.context = nullptr;
    return unavailable("ucx: ucp_init with transports " + agent->transports_ + " on network devices " +
                       agent->net_devices_ + ": " + ucs(st));
  }
  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SERIALIZED;
  st = ucp_worker_create(core.context, &wp, &core.worker);
  if (st != UCS_OK) {
    core.worker = nullptr;
    return unavailable("ucx: creating the worker with transports " + agent->transports_ + " on network devices " +
                       agent->net_devices_ + ": " + ucs(st));
  }
  ucp_address_t* addr = nullptr;
  size_t addr_len = 0;
  st = ucp_worker_get_address(core.worker, &addr, &addr_len);
  if (st != UCS_OK) return unavailable("ucx: worker address: " + ucs(st));
  const auto* a = reinterpret_cast<const uint8_t*>(addr);
  agent->address_.assign(a, a + addr_len);
  ucp_worker_release_address(core.worker, addr);
  if (options.progress_thread) SPECSERVE_RETURN_IF_ERROR(agent->start_progress_thread());
  return agent;
}

Status UcxAgent::start_progress_thread() {
  UcxCore* core = core_.get();
  {
    std::lock_guard<std::mutex> lock(core->mu);
    int fd = -1;
    if (ucp_worker_get_efd(core->worker, &fd) == UCS_OK) core->event_fd = fd;
  }
  core->progress_thread = std::thread([core] {
    while (!core->stop.load(std::memory_order_relaxed)) {
      ucs_status_t armed = UCS_ERR_UNSUPPORTED;
      {
        std::lock_guard<std::mutex> lock(core->mu);
        while (ucp_worker_progress(core->worker) != 0) {
        }
        if (core->event_fd >= 0) armed = ucp_worker_arm(core->worker);
      }
      if (armed == UCS_ERR_BUSY) continue;  // events arrived meanwhile: progress again
      if (armed == UCS_OK) {
        // NOTE: a 10 ms poll bounds how long stop() waits; incoming work wakes it at once.
        pollfd pfd{core->event_fd, POLLIN, 0};
        ::poll(&pfd, 1, 10);
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(100));
      }
    }
  });
  return Status();
}

UcxAgent::~UcxAgent() {
  if (core_ != nullptr && core_->progress_thread.joinable()) {
    core_->stop = true;
    core_->progress_thread.join();
  }
}

Expected<std::unique_ptr<UcxRegion>> UcxAgent::allocate_region(int64_t bytes) { return register_region(nullptr, bytes); }

Expected<std::unique_ptr<UcxRegion>> UcxAgent::register_region(void* base, int64_t bytes) {
  if (bytes <= 0) return invalid_argument("ucx: region of " + std::to_string(bytes) + " bytes");
  auto lock = core_->acquire();
  ucp_mem_map_params_t mp{};
  mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH | UCP_MEM_MAP_PARAM_FIELD_FLAGS;
  mp.address = base;
  mp.length = static_cast<size_t>(bytes);
  mp.flags = base == nullptr ? UCP_MEM_MAP_ALLOCATE : 0;
  ucp_mem_h memh = nullptr;
  ucs_status_t st = ucp_mem_map(core_->context, &mp, &memh);
  if (st != UCS_OK) return resource_exhausted("ucx: mapping " + std::to_string(bytes) + " bytes: " + ucs(st));
  ucp_mem_attr_t attr{};
  attr.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS | UCP_MEM_ATTR_FIELD_LENGTH;
  st = ucp_mem_query(memh, &attr);
  void* packed = nullptr;
  size_t packed_len = 0;
  if (st == UCS_OK) st = ucp_rkey_pack(core_->context, memh, &packed, &packed_len);
  if (st != UCS_OK) {
    ucp_mem_unmap(core_->context, memh);
    return resource_exhausted("ucx: registering " + std::to_string(bytes) + " bytes: " + ucs(st));
  }
  std::unique_ptr<UcxRegion> r(new UcxRegion());
  r->core_ = core_;
  r->memh_ = memh;
  r->base_ = attr.address;
  r->bytes_ = bytes;
  r->remote_.base = reinterpret_cast<uint64_t>(attr.address);
  r->remote_.bytes = static_cast<uint64_t>(bytes);
  const auto* p = static_cast<const uint8_t*>(packed);
  r->remote_.rkey.assign(p, p + packed_len);
  ucp_rkey_buffer_release(packed);
  core_->regions[reinterpret_cast<uintptr_t>(attr.address)] = {static_cast<uint64_t>(bytes), memh};
  return r;
}

Expected<std::unique_ptr<KvEndpoint>> UcxAgent::connect(const std::vector<uint8_t>& peer_address,
                                                        const std::string& peer_name, KvDeadline deadline) {
  if (peer_address.empty()) return invalid_argument("ucx: empty worker address for peer " + peer_name);
  auto ep = std::make_unique<UcxEndpoint>(core_, peer_name);
  Status st;
  {
    // The lock is released before `ep` can be destroyed (its destructor takes it).
    auto lock = ep->acquire();
    st = ep->create(peer_address);
    if (st.ok()) st = ep->flush_locked(deadline, "connect", 0);
  }
  if (!st.ok()) return st;
  return std::unique_ptr<KvEndpoint>(std::move(ep));
}

int UcxAgent::progress() {
  auto lock = core_->acquire();
  int n = 0;
  while (ucp_worker_progress(core_->worker) != 0) ++n;
  return n;
}

bool UcxAgent::progress_until(KvDeadline deadline, const std::function<bool()>& done) {
  for (uint32_t spins = 0;; ++spins) {
    if (done && done()) return true;
    {
      std::lock_guard<std::mutex> lock(core_->mu);
      ucp_worker_progress(core_->worker);
    }
    if ((spins & 63) == 0 && std::chrono::steady_clock::now() >= deadline) return false;
  }
}

}  // namespace specserve
