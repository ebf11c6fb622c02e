// specserve actors: the NCCL side of a worker's KV data plane (actors/kv_data_plane.h) — the
// NCCL KV channels (gpu/nccl_kv_channel.h) it holds with each GPU peer that
// choose_kv_transport (kv/transport.h) sends over NCCL.
//
// Two channels per peer, one per direction: a 2-rank group in which the sender is rank 0 and the
// receiver rank 1, under the prefix "kv/<sender>><receiver>/<hash of the sender's UCX
// address>-<hash of the receiver's>" (one incarnation of each worker: a restarted peer has a new
// address, so a new group). NOTE: one direction per group because NCCL matches a pair's sends
// and receives in the order they are posted: with both directions on one channel, two workers
// sending to each other at once would each wait for a recv queued behind its own send. Per
// direction, the receiver runs one NCCL transfer at a time (try_take_recv; a second fetch meanwhile
// goes over UCX), so the source's sends come in the order of its recvs.
//
// Joining: connect() starts the two joins on threads of their own (the unique id through the
// RendezvousStore, in a worker the scheduler's: actors/tp_group.h's ActorRendezvousStore), so a
// worker's actor never waits for a peer, and peers joining in different orders cannot wait on one
// another; the channels are there when KvPeersMsg has been handled, not on first use.
// Failure: a join that fails or times out leaves that direction unused (UCX carries its
// transfers); a transfer that fails aborts its channel (NcclKvChannel's contract) and that
// direction stays down until one of the two workers restarts (new address, new group): the
// caller retries the transfer over UCX.
// Thread-safety: the methods are called from the data plane's thread; Direction's channel is
// used by one transfer thread at a time (its mutex).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/status.h"
#include "gpu/nccl_kv_channel.h"
#include "kv/transport.h"
#include "model/communicator.h"

namespace specserve {

/// One direction of a pair's NCCL KV channels (this worker sends, or receives).
/// NOTE: two locks: `mu` guards the small state the data plane's thread reads (never held during
/// a transfer, so that thread never waits for one), `transfer_mu` serialises the transfers.
struct KvNcclDirection {
  std::mutex mu;                          ///< guards channel (set once), joining, join_status, busy
  std::condition_variable joined_cv;      ///< signalled when the join ends
  std::unique_ptr<NcclKvChannel> channel; ///< set once joined; null while joining or after a failed join
  bool joining = true;
  Status join_status;                     ///< why the join failed (ok while joining or joined)
  bool busy = false;                      ///< receive side: a fetch holds it (try_take_recv .. give_back_recv)
  int peer_rank = 0;                      ///< the other end's rank in the 2-rank group
  std::mutex transfer_mu;                 ///< one transfer at a time (NcclKvChannel's thread rule)
  std::atomic<bool> failed{false};        ///< a transfer failed: the channel is aborted for good

  /// Receives `bytes` bytes from the sender into `dst` (host memory) by `deadline` (the channel's
  /// recv). Errors: kUnavailable when the direction is not joined or failed; NcclKvChannel::recv's.
  Status recv(void* dst, int64_t bytes, KvDeadline deadline);
  /// Sends `bytes` bytes at `src` by `deadline`, first waiting (until the deadline) for a join
  /// still running. Errors: kUnavailable (the join failed, the channel failed), NcclKvChannel::send's.
  Status send(const void* src, int64_t bytes, KvDeadline deadline);
  /// Joined and not failed.
  bool usable();
};

class KvNcclLinks {
 public:
  struct Options {
    std::string self_name;                   ///< this worker's kv_peer_name
    int32_t cuda_device = 0;                 ///< the device its channels use
    std::shared_ptr<RendezvousStore> store;  ///< where unique ids are exchanged
    std::chrono::milliseconds join_timeout{60000};  ///< bound of one join (NcclOptions::timeout)
  };

  /// Whether this build can make NCCL KV channels: the CUDA backend is built in and NCCL loaded
  /// (nccl_version() > 0). False in a CPU-only build.
  static bool available();

  explicit KvNcclLinks(Options o) : o_(std::move(o)) {}
  /// Waits for the join and send threads (each ends by its own deadline), then finalises the channels.
  ~KvNcclLinks();

  /// Starts joining both directions with `peer` whose UCX address is `peer_address` (this worker's
  /// is `self_address`), unless they were started for that address already. Returns at once.
  void connect(const std::string& peer, const std::string& self_address, const std::string& peer_address);
  /// Whether the direction from `peer` to this worker is joined and not failed.
  bool can_receive_from(const std::string& peer);
  /// The direction from `peer`, marked busy, when it is joined, not failed and not busy; null
  /// otherwise (the caller uses UCX). Give it back with give_back_recv.
  std::shared_ptr<KvNcclDirection> try_take_recv(const std::string& peer);
  void give_back_recv(const std::shared_ptr<KvNcclDirection>& d);

  /// Sends `bytes` at `data` to `peer` on a thread of its own, by `deadline`; `hold` keeps `data`
  /// alive until the thread ends. Errors (at once): kUnavailable when no channel to `peer` was
  /// started. A send that fails later is logged (the receiver's recv fails by its deadline and it
  /// retries over UCX).
  Status send_async(const std::string& peer, std::shared_ptr<const void> hold, const void* data, int64_t bytes,
                    KvDeadline deadline);

  /// For logs: "nccl kv channels to 2 peers (cuda:0)".
  std::string describe() const;

 private:
  struct Pair {
    std::string peer_address;
    std::shared_ptr<KvNcclDirection> out, in;  // this worker sends on `out`, receives on `in`
  };
  // Starts the join of `d` as `rank` of the group `prefix` on a thread.
  void start_join(std::shared_ptr<KvNcclDirection> d, int rank, const std::string& prefix);
  // Joins the threads that have ended.
  void reap();

  Options o_;
  std::map<std::string, Pair> pairs_;  // by peer name
  struct Worker {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;  // set by the thread as it ends
  };
  std::vector<Worker> threads_;
};

}  // namespace specserve
