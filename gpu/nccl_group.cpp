#include "gpu/nccl_group.h"

#include <algorithm>
#include <cstring>
#include <thread>
#include <vector>

#include "gpu/cuda_backend.h"

namespace specserve::gpu {
namespace {

using Clock = std::chrono::steady_clock;

// Polling: spin (yielding) for the first 200 us of a wait — an all-reduce of a decode step takes
// tens of microseconds, and a sleep would cost more than that — then sleep 50 us per round.
void pause_after(Clock::time_point started) {
  if (Clock::now() - started < std::chrono::microseconds(200)) {
    std::this_thread::yield();
  } else {
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

std::string ms_text(std::chrono::milliseconds ms) { return std::to_string(ms.count()) + " ms"; }

}  // namespace

DeviceScratch::~DeviceScratch() {
  if (ptr_) cudaFree(ptr_);
}

Expected<void*> DeviceScratch::get(size_t bytes, const char* what) {
  if (bytes <= bytes_ && ptr_) return ptr_;
  if (ptr_) cudaFree(ptr_);
  ptr_ = nullptr;
  bytes_ = 0;
  const size_t want = std::max<size_t>(bytes, 256);
  const cudaError_t e = cudaMalloc(&ptr_, want);
  if (e != cudaSuccess) {
    ptr_ = nullptr;
    cudaGetLastError();  // clear the sticky-free error so later calls do not see it
    return resource_exhausted(std::string("cudaMalloc of ") + std::to_string(want) + " bytes for " + what + ": " +
                              cudaGetErrorString(e));
  }
  bytes_ = want;
  return ptr_;
}

std::string NcclGroup::nccl_error(ncclResult_t r) const {
  std::string s = ncclGetErrorString(r);
  const char* last = ncclGetLastError(comm_);
  if (last && *last) s += std::string(" (") + last + ")";
  return s;
}

Expected<std::unique_ptr<NcclGroup>> NcclGroup::create(const char* kind, int rank, int size, int device,
                                                       std::shared_ptr<RendezvousStore> store,
                                                       const NcclOptions& options) {
  if (size < 1) return invalid_argument(std::string(kind) + ": size = " + std::to_string(size) + " < 1");
  if (rank < 0 || rank >= size) {
    return invalid_argument(std::string(kind) + ": rank = " + std::to_string(rank) + " is outside [0, " +
                            std::to_string(size) + ")");
  }
  if (!store) return invalid_argument(std::string(kind) + ": store is null");
  if (options.timeout.count() <= 0) {
    return invalid_argument(std::string(kind) + ": options.timeout = " + ms_text(options.timeout) + " is not positive");
  }
  std::unique_ptr<NcclGroup> g(new NcclGroup());
  g->rank_ = rank;
  g->size_ = size;
  g->device_ = device;
  g->timeout_ = options.timeout;
  g->name_ = std::string(kind) + " '" + options.prefix + "' rank " + std::to_string(rank) + "/" + std::to_string(size) +
             " on cuda:" + std::to_string(device);
  if (auto info = cuda_device_info(device); !info.ok()) {
    return Status(info.status().code(), g->name_ + ": " + info.status().message());
  }
  if (const cudaError_t e = cudaSetDevice(device); e != cudaSuccess) {
    return unavailable(g->name_ + ": cudaSetDevice: " + cudaGetErrorString(e));
  }
  if (const cudaError_t e = cudaStreamCreateWithFlags(&g->stream_, cudaStreamNonBlocking); e != cudaSuccess) {
    g->stream_ = nullptr;
    return unavailable(g->name_ + ": cudaStreamCreateWithFlags: " + cudaGetErrorString(e));
  }

  // Rendezvous: rank 0's unique id through the store.
  const std::string key = options.prefix + "/nccl_id";
  ncclUniqueId id;
  std::memset(&id, 0, sizeof(id));
  if (rank == 0) {
    if (const ncclResult_t r = ncclGetUniqueId(&id); r != ncclSuccess) {
      return unavailable(g->name_ + ": ncclGetUniqueId: " + ncclGetErrorString(r));
    }
    const char* b = reinterpret_cast<const char*>(&id);
    Status st = store->set(key, std::vector<char>(b, b + sizeof(id)));
    if (!st.ok()) return unavailable(g->name_ + ": rendezvous: storing '" + key + "': " + st.message());
  } else {
    auto v = store->get(key, options.timeout);
    if (!v.ok()) {
      const std::string why = g->name_ + ": rendezvous: waiting " + ms_text(options.timeout) + " for rank 0's id: " +
                              v.status().message();
      return v.status().code() == StatusCode::kDeadlineExceeded ? deadline_exceeded(why) : unavailable(why);
    }
    if (v->size() != sizeof(id)) {
      return corrupt_data(g->name_ + ": rendezvous: '" + key + "' holds " + std::to_string(v->size()) +
                          " bytes, an ncclUniqueId has " + std::to_string(sizeof(id)));
    }
    std::memcpy(&id, v->data(), sizeof(id));
  }

  // Join, non-blocking so that a peer that never joins cannot hold this thread: poll, abort at
  // the deadline.
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  g->prefix_ = options.prefix;  // NCCL may read commName while the non-blocking init runs
  config.commName = g->prefix_.c_str();
  const Clock::time_point started = Clock::now();
  const Clock::time_point deadline = started + options.timeout;
  ncclResult_t r = ncclCommInitRankConfig(&g->comm_, size, id, rank, &config);
  if (r != ncclSuccess && r != ncclInProgress) {
    const std::string why = g->name_ + ": ncclCommInitRankConfig: " + g->nccl_error(r);
    if (g->comm_) ncclCommAbort(g->comm_);
    g->comm_ = nullptr;
    return unavailable(why);
  }
  for (;;) {
    ncclResult_t state = ncclSuccess;
    r = ncclCommGetAsyncError(g->comm_, &state);
    if (r == ncclSuccess && state == ncclSuccess) break;
    if (r != ncclSuccess || state != ncclInProgress) {
      const std::string why = g->name_ + ": joining the group: " + g->nccl_error(r != ncclSuccess ? r : state);
      ncclCommAbort(g->comm_);
      g->comm_ = nullptr;
      return unavailable(why);
    }
    if (Clock::now() >= deadline) {
      ncclCommAbort(g->comm_);
      g->comm_ = nullptr;
      return deadline_exceeded(g->name_ + ": the group did not form within " + ms_text(options.timeout) +
                               " (a peer did not join; aborted)");
    }
    pause_after(started);
  }
  return g;
}

NcclGroup::~NcclGroup() {
  // Nothing to release when creation failed before the stream (e.g. no such device): touching
  // CUDA then would leave an error for cudaGetLastError in this thread.
  if (!stream_ && !comm_) return;
  cudaSetDevice(device_);
  if (comm_ && !aborted_) {
    // Finalise (flushes, then waits for the group to be quiescent), bounded: abort if it hangs.
    bool clean = false;
    const ncclResult_t fr = ncclCommFinalize(comm_);
    if (fr == ncclSuccess || fr == ncclInProgress) {
      const Clock::time_point started = Clock::now(), deadline = started + timeout_;
      for (;;) {
        ncclResult_t state = ncclSuccess;
        if (ncclCommGetAsyncError(comm_, &state) != ncclSuccess) break;
        if (state == ncclSuccess) {
          clean = true;
          break;
        }
        if (state != ncclInProgress || Clock::now() >= deadline) break;
        pause_after(started);
      }
    }
    if (clean) {
      ncclCommDestroy(comm_);
    } else {
      ncclCommAbort(comm_);
    }
  }
  if (stream_) cudaStreamDestroy(stream_);
}

Status NcclGroup::fail(Status st) {
  if (comm_ && !aborted_) {
    cudaSetDevice(device_);
    ncclCommAbort(comm_);  // stops NCCL kernels still waiting for a peer
    aborted_ = true;
    // Drain, bounded: work queued behind the aborted NCCL kernel (the rank-order sum) finishes
    // now, so it does not write into the caller's buffer after the call has returned. Best
    // effort: after 1 s the stream is left to finish on its own.
    const Clock::time_point started = Clock::now();
    while (cudaStreamQuery(stream_) == cudaErrorNotReady && Clock::now() - started < std::chrono::seconds(1)) {
      pause_after(started);
    }
  }
  cudaGetLastError();  // a failed call's (non-sticky) error must not surface in a later launch check
  broken_ = st.to_string();
  return st;
}

Status NcclGroup::begin(const char* op) {
  if (!broken_.empty()) return unavailable(name_ + ": " + op + ": failed earlier: " + broken_);
  if (const cudaError_t e = cudaSetDevice(device_); e != cudaSuccess) {
    return fail(unavailable(name_ + ": " + op + ": cudaSetDevice: " + cudaGetErrorString(e)));
  }
  return Status();
}

Status NcclGroup::check_nccl(ncclResult_t r, const char* op, const char* call) {
  if (r == ncclSuccess || r == ncclInProgress) return Status();
  const std::string why = name_ + ": " + op + ": " + call + ": " + nccl_error(r);
  if (r == ncclInvalidArgument || r == ncclInvalidUsage) return fail(invalid_argument(why));
  return fail(unavailable(why));
}

Status NcclGroup::check_cuda(cudaError_t e, const char* op, const char* call) {
  if (e == cudaSuccess) return Status();
  return fail(unavailable(name_ + ": " + op + ": " + call + ": " + cudaGetErrorString(e)));
}

Status NcclGroup::wait(const char* op, NcclDeadline deadline) {
  const Clock::time_point started = Clock::now();
  for (;;) {
    ncclResult_t state = ncclSuccess;
    const ncclResult_t r = ncclCommGetAsyncError(comm_, &state);
    if (r != ncclSuccess) return fail(unavailable(name_ + ": " + op + ": ncclCommGetAsyncError: " + nccl_error(r)));
    if (state != ncclSuccess && state != ncclInProgress) {
      return fail(unavailable(name_ + ": " + op + ": " + nccl_error(state) + " (a peer failed?)"));
    }
    // While the non-blocking enqueue is in progress the stream may not hold the work yet: only
    // once the state is ncclSuccess does an idle stream mean "done".
    if (state == ncclSuccess) {
      const cudaError_t q = cudaStreamQuery(stream_);
      if (q == cudaSuccess) return Status();
      if (q != cudaErrorNotReady) return fail(unavailable(name_ + ": " + op + ": cudaStreamQuery: " + cudaGetErrorString(q)));
    }
    if (Clock::now() >= deadline) {
      const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - started);
      return fail(deadline_exceeded(name_ + ": " + op + ": not done after " + ms_text(waited) +
                                    " (a peer did not take part or stalled; the group is aborted)"));
    }
    pause_after(started);
  }
}

Status NcclGroup::wait_enqueued(const char* op, NcclDeadline deadline) {
  const Clock::time_point started = Clock::now();
  for (;;) {
    ncclResult_t state = ncclSuccess;
    const ncclResult_t r = ncclCommGetAsyncError(comm_, &state);
    if (r != ncclSuccess) return fail(unavailable(name_ + ": " + op + ": ncclCommGetAsyncError: " + nccl_error(r)));
    if (state == ncclSuccess) return Status();
    if (state != ncclInProgress) return fail(unavailable(name_ + ": " + op + ": " + nccl_error(state) + " (a peer failed?)"));
    if (Clock::now() >= deadline) {
      return fail(deadline_exceeded(name_ + ": " + op + ": NCCL did not enqueue the operation within the deadline (a peer "
                                    "did not connect? the group is aborted)"));
    }
    pause_after(started);
  }
}

Expected<bool> NcclGroup::on_device(const void* p, const char* what) const {
  cudaPointerAttributes a{};
  const cudaError_t e = cudaPointerGetAttributes(&a, p);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return false;  // not a pointer CUDA knows: plain host memory
  }
  if (a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged) {
    if (a.type == cudaMemoryTypeDevice && a.device != device_) {
      return invalid_argument(name_ + ": " + what + " is memory of cuda:" + std::to_string(a.device) +
                              ", not of this rank's device");
    }
    return true;
  }
  return false;  // unregistered or page-locked host memory
}

}  // namespace specserve::gpu
