// specserve gpu: one rank's NCCL communicator with its stream, rendezvous, bounded waits and
// abort — the part the tensor-parallel communicator (gpu/nccl_communicator.cpp) and the KV
// channel (gpu/nccl_kv_channel.cpp) share.
//
// Internal to gpu/ (names NCCL and CUDA types): included by gpu/nccl_*.cpp only, and only in
// builds with NCCL (gpu/CMakeLists.txt).
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <chrono>
#include <memory>
#include <string>

#include "core/status.h"
#include "gpu/nccl_communicator.h"
#include "model/communicator.h"

namespace specserve::gpu {

using NcclDeadline = std::chrono::steady_clock::time_point;

/// A device buffer that grows on demand (never shrinks); freed with the group.
class DeviceScratch {
 public:
  ~DeviceScratch();
  /// At least `bytes` bytes of device memory of the current device (cudaMalloc when it grows).
  /// Errors: kResourceExhausted naming `what` and the size.
  Expected<void*> get(size_t bytes, const char* what);

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

class NcclGroup {
 public:
  /// Validates the arguments, checks the device, exchanges the unique id through `store`
  /// ("<prefix>/nccl_id") and joins the group (non-blocking init, bounded by options.timeout).
  /// `kind` names the user in messages ("nccl group", "nccl kv channel"). Errors: those of
  /// make_nccl_communicator (gpu/nccl_communicator.h).
  static Expected<std::unique_ptr<NcclGroup>> create(const char* kind, int rank, int size, int device,
                                                     std::shared_ptr<RendezvousStore> store, const NcclOptions& options);
  /// Finalises and destroys the communicator (ncclCommFinalize, bounded by options.timeout, then
  /// ncclCommDestroy); aborts it instead when it failed or finalising does not end in time.
  ~NcclGroup();
  NcclGroup(const NcclGroup&) = delete;
  NcclGroup& operator=(const NcclGroup&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  int device() const { return device_; }
  /// "nccl group 'tp' rank 0/2 on cuda:0".
  const std::string& name() const { return name_; }
  ncclComm_t comm() const { return comm_; }
  cudaStream_t stream() const { return stream_; }
  NcclDeadline default_deadline() const { return std::chrono::steady_clock::now() + timeout_; }
  bool failed() const { return !broken_.empty(); }

  /// Start of an operation: kUnavailable when the group failed earlier; else makes the device
  /// current for this thread.
  Status begin(const char* op);
  /// The result of an NCCL call that enqueues work: ok for ncclSuccess and ncclInProgress (the
  /// non-blocking enqueue goes on; wait() waits for it); otherwise the group fails (abort) and
  /// the error names `op`, the call and NCCL's strings.
  Status check_nccl(ncclResult_t r, const char* op, const char* call);
  /// The result of a CUDA runtime call: on error the group fails and the error names the call.
  Status check_cuda(cudaError_t e, const char* op, const char* call);
  /// Waits until a non-blocking NCCL enqueue has reached the stream (ncclCommGetAsyncError leaves
  /// ncclInProgress): needed before enqueueing other work that must run after it on stream().
  /// Failure as wait().
  Status wait_enqueued(const char* op, NcclDeadline deadline);
  /// Waits until everything enqueued on stream() is done: polls ncclCommGetAsyncError (for the
  /// non-blocking enqueue and asynchronous errors) and cudaStreamQuery, never blocking in CUDA or
  /// NCCL. Past `deadline` the group fails with kDeadlineExceeded (ncclCommAbort); an NCCL error
  /// fails it with kUnavailable.
  Status wait(const char* op, NcclDeadline deadline);

  /// Where `p` points: true for device memory of this group's device (or managed memory),
  /// false for host memory (to be staged). kInvalidArgument naming `what` for memory of another
  /// device.
  Expected<bool> on_device(const void* p, const char* what) const;
  /// Scratch buffers (device memory), indexed 0..2.
  DeviceScratch& scratch(int i) { return scratch_[i]; }

 private:
  NcclGroup() = default;
  /// Marks the group failed with `st` (its message is kept for later calls) and aborts the
  /// communicator; returns `st`.
  Status fail(Status st);
  std::string nccl_error(ncclResult_t r) const;

  int rank_ = 0, size_ = 1, device_ = 0;
  std::string name_, prefix_;
  std::chrono::milliseconds timeout_{0};
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  bool aborted_ = false;
  std::string broken_;  // why the group failed; empty while it works
  DeviceScratch scratch_[3];
};

}  // namespace specserve::gpu
