// specserve gpu: KV bytes between GPUs over NCCL point-to-point (ncclSend / ncclRecv), the
// GPU-to-GPU transport of the KV data plane (issue 7; kv/transport.h lists the transports).
//
// Status: compiles and links against NCCL 2.28 and its tests skip on machines without a GPU;
// UNTESTED ON A GPU so far (tests/gpu/nccl_test.cpp, run by tools/gpu-check.sh, is the check).
//
// NOTE: not a KvEndpoint. KvEndpoint is one-sided (get / put into a peer's registered region,
// the peer's code takes no part); NCCL point-to-point is two-sided: the exporter posts send and
// the importer posts the matching recv, each on its own rank. The control flow the actors follow
// (actors/kv_nccl_links.h and actors/kv_data_plane.h):
//   1. when the workers start, each pair of GPU workers joins two channel groups, one per
//      direction (make_nccl_kv_channel, the unique id exchanged through the scheduler's store as
//      for the communicator): connected up front, not on first use;
//   2. the exporter packs the blocks (kv/transfer.h) into a staging region and announces the
//      KvOffer {bytes, ...} in an actor message, as for UCX;
//   3. the importer posts recv(dst, bytes, exporter_rank, deadline) and asks the exporter
//      (KvSendMsg) to post send(src, bytes, importer_rank, deadline); it imports (checksums are
//      checked by import_kv_blocks, as over UCX), or retries over UCX when the recv fails.
// Sends and receives between the same two ranks are matched in the order they are posted
// (NCCL's rule), so both sides must agree on the order of transfers; a size mismatch is an NCCL
// error or a deadline.
//
// Memory: `src` / `dst` are device memory of the channel's device (zero copy), or host memory,
// which is staged through a device buffer. NOTE: Backend::kv_export_blocks / kv_import_blocks
// (model/backend.h) take host memory today, so a KV transfer between two CudaBackends over this
// channel is device -> host (export) -> device (staging) -> NCCL -> device -> host -> device
// (import); a device-side export into device memory is the missing piece for zero copy.
//
// Failure contract (kv/transport.h's): a transfer ends by its deadline; a peer that dies, stalls
// or never posts the matching call yields kUnavailable / kDeadlineExceeded, the group is aborted
// (ncclCommAbort stops the waiting NCCL kernel), failed() becomes true and every later call
// answers kUnavailable; the caller retries on another path (UCX through host memory, or recompute
// by prefill) and may form a new channel group under a new prefix.
// Thread-safety: one thread at a time (any thread: every call makes the device current).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "core/status.h"
#include "gpu/nccl_communicator.h"
#include "model/communicator.h"

namespace specserve {

/// One rank's end of an NCCL point-to-point group for KV bytes.
class NcclKvChannel {
 public:
  /// The steady-clock time point by which a transfer must end (the same type as kv/transport.h's
  /// KvDeadline; gpu/ does not include kv/).
  using Deadline = std::chrono::steady_clock::time_point;

  virtual ~NcclKvChannel() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  /// Sends `bytes` bytes at `src` to rank `peer` (which must post the matching recv). Returns when
  /// `src` may be reused: the bytes have left it (NCCL has them in flight or the peer has them).
  /// Errors: kInvalidArgument (bytes < 0, peer outside the group or this rank, src on another
  /// device); kDeadlineExceeded (not done by `deadline`: the peer did not post its recv or
  /// stalled; the channel is aborted and failed()); kUnavailable (an NCCL error, or the channel
  /// failed earlier). Zero bytes return at once.
  virtual Status send(const void* src, int64_t bytes, int peer, Deadline deadline) = 0;
  /// Receives `bytes` bytes from rank `peer` into `dst`. Returns when they are in `dst`.
  /// Errors as send; after an error `dst` holds unspecified bytes and nothing writes into it any
  /// more.
  virtual Status recv(void* dst, int64_t bytes, int peer, Deadline deadline) = 0;
  /// True once a transfer failed or timed out: every later transfer answers kUnavailable.
  virtual bool failed() const = 0;
  /// For logs: "nccl kv channel 'kv' rank 0/2 on cuda:0".
  virtual std::string describe() const = 0;
};

/// Joins rank `rank` of a `size`-rank channel group on CUDA device `cuda_device` (one rank per
/// device), as make_nccl_communicator does (same rendezvous, options and errors; use another
/// prefix than the tensor-parallel group's, e.g. "kv").
Expected<std::unique_ptr<NcclKvChannel>> make_nccl_kv_channel(int rank, int size, int cuda_device,
                                                              std::shared_ptr<RendezvousStore> store,
                                                              const NcclOptions& options = {});

}  // namespace specserve
