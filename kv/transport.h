// specserve kv: transports that move KV exports (kv/transfer.h) between workers.
//
// One-sided model: the exporting worker writes an export into a registered region of its own
// memory and announces it (region descriptor + offset + length) in an actor message; the
// importing worker `get`s the bytes with a deadline, checks and imports them. `put` is the
// mirror image (the exporter writes into the importer's region). Only control data (addresses,
// keys, offsets) travels in actor messages; KV bytes travel here.
//
// Implementations:
//   - in-process (this file): plain memcpy; a region is a pointer of this process.
//   - UCX (kv/ucx_transport.h): put/get into memory registered with ucp_mem_map, over whatever
//     transport UCX selects (UCX_TLS: tcp, shared memory, RDMA).
//   - NCCL between two GPUs (gpu/nccl_kv_channel.h, NcclKvChannel; builds with CUDA and NCCL
//     only): NOT a KvEndpoint, because NCCL point-to-point is two-sided — the exporter posts
//     send(src, bytes, importer_rank, deadline) and the importer the matching recv(dst, ...),
//     after an actor message announced the export's size (no regions, no rkeys: the channel's
//     group is formed up front through a RendezvousStore, model/communicator.h). Buffers are
//     device memory (zero copy) or host memory (staged); today's Backend::kv_export_blocks
//     writes host memory, so a device-side export is the missing piece for zero copy. Same
//     failure contract as below (deadline, kUnavailable / kDeadlineExceeded, failed()).
//     Wired into migration by actors/kv_nccl_links.h (channels per GPU peer, joined at worker
//     start) and actors/kv_data_plane.h (a failed NCCL fetch is retried over UCX).
//     Compiles and skips without a GPU; untested on a GPU (tests/gpu/nccl_test.cpp,
//     tests/gpu/kv_nccl_migration_test.cpp).
// choose_kv_transport (below) is the rule between the three.
//
// Failure contract (every implementation): a transfer ends by its deadline; a peer that dies or
// stalls mid-transfer yields kUnavailable or kDeadlineExceeded for that request — never a hang or
// a crash — and the endpoint reports failed(): the caller retries on another path (another peer,
// or recompute by prefill) and may connect again.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"

namespace specserve {

/// When a transfer must have finished, on the steady clock.
using KvDeadline = std::chrono::steady_clock::time_point;
inline KvDeadline kv_deadline_after(std::chrono::milliseconds d) { return std::chrono::steady_clock::now() + d; }

/// A peer's registered memory region: what an actor message carries so that another worker can
/// reach it. Plain bytes, copyable, no transport headers.
struct KvRemoteRegion {
  uint64_t base = 0;          ///< the region's address in its owner's process
  uint64_t bytes = 0;         ///< its length
  std::vector<uint8_t> rkey;  ///< remote key (UCX: ucp_rkey_pack's bytes); empty for in-process
};

/// A connection to one peer worker. Used by one thread at a time.
class KvEndpoint {
 public:
  virtual ~KvEndpoint() = default;

  /// Copies `bytes` bytes from the peer's `remote` region at `remote_offset` into `dst` (this
  /// process's memory; faster when inside a region this side registered). Returns when the bytes
  /// are in `dst`. Errors: kInvalidArgument (range outside the region, bytes < 0);
  /// kDeadlineExceeded (not done by `deadline`: the peer stalled; the endpoint is closed and
  /// failed() is true); kUnavailable (the peer is gone or the endpoint failed earlier).
  /// After an error `dst` holds unspecified bytes, and nothing writes into it any more.
  virtual Status get(void* dst, int64_t bytes, const KvRemoteRegion& remote, int64_t remote_offset,
                     KvDeadline deadline) = 0;
  /// Copies `bytes` bytes from `src` into the peer's `remote` region at `remote_offset`; returns
  /// when they are visible there (remote completion). Errors as for get.
  virtual Status put(const void* src, int64_t bytes, const KvRemoteRegion& remote, int64_t remote_offset,
                     KvDeadline deadline) = 0;
  /// True once a transfer failed or timed out: every later transfer answers kUnavailable.
  virtual bool failed() const = 0;
  /// For logs: "in-process", "ucx peer <name>".
  virtual std::string describe() const = 0;
};

/// The endpoint of plain copies inside one process (both workers in one address space). Never
/// fails except on ranges outside the region.
std::unique_ptr<KvEndpoint> make_in_process_endpoint();
/// A region of this process's memory, for the in-process endpoint (no key).
KvRemoteRegion in_process_region(void* base, int64_t bytes);

/// Whether [offset, offset + bytes) lies inside `region`; kInvalidArgument naming both otherwise.
Status check_region_range(const KvRemoteRegion& region, int64_t offset, int64_t bytes);

/// How the bytes of one KV transfer travel (the three transports above).
enum class KvTransport : int32_t { kInProcess = 1, kUcx = 2, kNccl = 3 };
/// "in-process", "ucx", "nccl" (for logs and status); "unknown" otherwise.
const char* kv_transport_name(KvTransport t);

/// Where one end of a KV transfer runs, as far as choosing a transport goes.
struct KvPlace {
  std::string node;         ///< the node (host) it runs on, as the topology names it
  uint64_t process = 0;     ///< a random id of its process (actors/kv_data_plane.h's kv_process_id)
  int32_t cuda_device = -1; ///< the CUDA device ordinal its KV cache lives on; -1: host memory (cpu)
  bool nccl = false;        ///< its build has NCCL and it joined KV channels (gpu/nccl_kv_channel.h)
  std::string machine;      ///< the machine's hostname (gethostname) where known; empty: unknown
};

/// The transport for moving KV from `src` to `dst` (pure; the KV data plane's rule):
///   - the same process (equal, non-zero `process`): kInProcess (a plain copy; cheapest while
///     exports are host memory, even between two GPUs);
///   - both on CUDA devices, both with NCCL, and not the same GPU: kNccl;
///   - otherwise kUcx (one end on the CPU, a build without NCCL, or both ends on one GPU).
/// NOTE: "the same GPU" is the same machine (hostname, where both ends know it, else the same
/// node: two topology nodes may be one machine) and the same ordinal: NCCL refuses a group whose two
/// ranks share a GPU ("Duplicate GPU detected", ncclInvalidUsage), so two workers on one GPU move
/// KV over UCX. Ordinals are compared as the topology gives them (CUDA_VISIBLE_DEVICES is assumed
/// the same for the workers of one node).
KvTransport choose_kv_transport(const KvPlace& src, const KvPlace& dst);

}  // namespace specserve
