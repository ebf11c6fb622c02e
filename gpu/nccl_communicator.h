// specserve gpu: the tensor-parallel Communicator (model/communicator.h) over NCCL, for ranks
// whose buffers live on CUDA devices (one rank per GPU).
//
// Status: compiles and links against NCCL 2.28 (CUDA 13, /usr/local/cuda) and its tests skip on
// machines without a GPU; UNTESTED ON A GPU so far (tests/gpu/nccl_test.cpp, run by
// tools/gpu-check.sh, is the check).
//
// Rendezvous: rank 0 makes an ncclUniqueId (ncclGetUniqueId) and `set`s its 128 bytes in the
// RendezvousStore under "<prefix>/nccl_id"; the other ranks `get` it (waiting up to
// options.timeout); every rank then joins with ncclCommInitRankConfig in NCCL's non-blocking mode
// (ncclConfig_t::blocking = 0), so the join itself is bounded by options.timeout too.
// The store is the only seam (InProcessStore for ranks as threads, FileStore for processes on
// one host, an actor-backed store later: issue 9 exchanges the id through the actors).
// NOTE: a prefix names one incarnation of a group: rank 0 overwrites "<prefix>/nccl_id", but a
// rank that reads the key before that would join a previous group's id. After a failure, form
// the new group under a new prefix (e.g. with a generation number).
//
// Determinism: all_reduce_sum is NOT ncclAllReduce. NCCL's ring and tree algorithms add the
// ranks' values in an order that depends on the algorithm, the protocol and the chunking (and
// thus on the message size, the number of GPUs and NCCL's tuning), so its bits are not the
// rank-order sum that Communicator promises. Here every rank ncclAllGather's the ranks' data
// into a [size, n] device buffer (a copy: bits preserved) and a small kernel sums each element
// in rank order, ((d_0 + d_1) + d_2) + ... with IEEE fp32 adds (__fadd_rn, no FMA contraction,
// no flush to zero), so every rank ends with the same bits, equal to the CPU's rank-order sum
// (and to the Gloo communicator's, cpu/gloo_communicator.h).
// NOTE: the price is bandwidth: each rank receives (size - 1) x n floats instead of the ring's
// 2 (size - 1) / size x n — the same at size 2, 2x at size 4, 4x at size 8. For the decode-time
// all-reduces of a tensor-parallel replica (n = batch x hidden floats, a few hundred KiB) latency
// dominates, not bandwidth; a faster non-rank-order mode would be an explicit option that gives
// up bitwise parity with the CPU, and does not exist yet.
//
// Failure: every wait (rendezvous, each collective) polls cudaStreamQuery and
// ncclCommGetAsyncError instead of blocking; past options.timeout, or on an asynchronous NCCL
// error (a peer died, a network error), the communicator calls ncclCommAbort (which stops NCCL
// kernels still waiting for the peer) and answers kDeadlineExceeded / kUnavailable: a dead or
// stalled peer never hangs a rank. After that the communicator is broken (every later call
// answers kUnavailable); form a new group.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "core/status.h"
#include "model/communicator.h"

namespace specserve {

/// How an NCCL rank joins its group (the communicator and the KV channel, gpu/nccl_kv_channel.h).
struct NcclOptions {
  /// Key namespace in the store: the unique id is "<prefix>/nccl_id". One prefix per group
  /// incarnation (see the NOTE above); also NCCL's commName in its logs.
  std::string prefix = "tp";
  /// Bound of each wait: for the unique id in the store, for the group to form, and for each
  /// collective (or send / recv of the KV channel without its own deadline).
  std::chrono::milliseconds timeout{60000};
};

/// NCCL_VERSION_CODE of the NCCL library this process loaded (e.g. 22809 for 2.28.9); 0 in a
/// build without NCCL (the factories then answer kUnsupported).
int nccl_version();

/// Joins rank `rank` of a `size`-rank NCCL group on CUDA device `cuda_device` (one rank per
/// device: NCCL refuses two ranks of one group on one GPU). Every rank calls this at the same
/// time, from its own thread or process, with a store they share and the same options.prefix;
/// it returns when the group has formed.
///
/// The communicator's collectives take device memory of `cuda_device` (CudaBackend buffers:
/// Buffer::f32()); host memory is accepted too and staged through a device buffer (two extra
/// copies). The caller must have finished writing the data (Backend::synchronize, as
/// model/transformer.cpp does before each all_reduce_sum); each collective returns when its
/// result is in `data` (it waits for the communicator's own CUDA stream). Collectives run NCCL
/// even for size 1 (a copy), so a one-GPU group exercises the same path as a larger one.
/// Thread-safety: one thread at a time (any thread: every call makes `cuda_device` current).
/// Errors of the collectives: those of Communicator, plus kInvalidArgument for memory of another
/// device and kResourceExhausted when a device buffer (the [size, n] gather, a staging copy)
/// cannot be allocated; the communicator stays usable after these two.
/// Teardown: destroying the communicator finalises it (ncclCommFinalize, bounded by
/// options.timeout), or aborts it when it failed or finalising does not end in time.
///
/// Errors of the factory: kInvalidArgument naming rank, size, store or device (size < 1, rank outside
/// [0, size), a null store, a device that does not exist); kUnavailable when no CUDA device is
/// present or NCCL fails (the message names the prefix, rank and device and carries
/// ncclGetErrorString and ncclGetLastError); kDeadlineExceeded when the id or a peer does not
/// show up within options.timeout; kCorruptData when the stored id is not 128 bytes;
/// kUnsupported when this build has no NCCL (the message says how to get it).
Expected<std::unique_ptr<Communicator>> make_nccl_communicator(int rank, int size, int cuda_device,
                                                               std::shared_ptr<RendezvousStore> store,
                                                               const NcclOptions& options = {});

}  // namespace specserve
