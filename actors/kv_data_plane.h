// specserve actors: a target shard's end of the KV data plane — moving a sequence's KV blocks to
// another worker when it migrates (a draining replica, a prefill worker handing over).
//
// Built on kv/transfer.h (the checked export format), kv/ucx_transport.h (UCX one-sided get)
// and, between GPU workers, actors/kv_nccl_links.h (NCCL send/recv, gpu/nccl_kv_channel.h):
//   - at worker start the shard creates its UcxAgent (with a progress thread, so peers' tcp gets
//     are served while the shard computes) and publishes the agent's address and its place
//     (node, process, CUDA device, NCCL) in WorkerHello;
//   - the scheduler sends every ready shard the addresses and places of the others (KvPeersMsg)
//     and each connects its UCX endpoints then, not on first use; with the peers that
//     choose_kv_transport (kv/transport.h) sends over NCCL (both on GPUs, other GPUs, both with
//     NCCL) it also starts joining the NCCL KV channels (unique ids through the scheduler's
//     rendezvous store, as the tensor-parallel group's);
//   - a sequence that leaves is exported into a staging region of its own (offer()); the
//     KvOffer (address, rkey, size, token hash) travels in the actor messages;
//   - the receiver fetches it with a deadline (start_fetch() on the shard's thread, KvFetch::run()
//     on a thread of its own so the shard keeps stepping its other sequences meanwhile,
//     finish_fetch() back on the shard's thread; fetch() does all three in one call) over the
//     transport start_fetch chose (KvFetch::transport): a plain copy in-process, a UCX get, or an
//     NCCL recv — for which the receiver asks the source (KvSendMsg, through the scheduler) to
//     post the matching send (serve_send()). An NCCL transfer that fails or misses its deadline
//     is retried over UCX with a fresh deadline of the same length (the staging region is still
//     there). The receiver checks model, layout and per-block checksums (import_kv_blocks,
//     whatever the transport) and writes the KV into its own blocks; any failure — a dead or
//     stalled peer, a checksum mismatch, a model mismatch — is an error the caller answers by
//     recomputing the sequence's KV (Engine::add_migrated);
//   - the receiver's KvReleaseMsg, or the offer's expiry, ends the offer; its staging region is
//     kept for later offers (bounded), so a source does not register memory per migration and a
//     receiver reuses the rkey it unpacked for it.
// Inside one process (same kv_process_id, a random number drawn at start: pids repeat across
// hosts and containers) the bytes are copied from the source's live offer, looked up in a
// process-wide table under a lock — never through an address taken from a message.
// Thread-safety: one actor uses a KvDataPlane; the agent's own lock covers its progress thread.
// KvFetch::run() is the one call made from another thread: it touches only its KvFetch (the
// endpoint and receive region it holds, whose calls take the agent's lock; the NCCL direction it
// holds, under that direction's lock) and the process-wide offer table (under its lock). NCCL
// sends (serve_send) and channel joins run on threads of KvNcclLinks, joined when the plane ends.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "actors/messages.h"
#include "core/status.h"
#include "actors/kv_nccl_links.h"
#include "kv/transfer.h"
#include "kv/transport.h"
#include "kv/ucx_transport.h"
#include "model/communicator.h"

namespace specserve {

/// One fetch of an offer's export into host memory: made by KvDataPlane::start_fetch, run on any
/// thread (run()), imported by KvDataPlane::finish_fetch. Holds what the transfer needs so that
/// it outlives changes to the data plane meanwhile (a peer reconnected, the plane destroyed).
struct KvFetch {
  KvOffer offer;
  KvDeadline deadline;
  std::chrono::milliseconds budget{0};   ///< deadline - start: a retry over UCX gets as long again
  /// How the bytes travel: kInProcess (the source is in this process), kUcx (get through
  /// `endpoint`), kNccl (recv on `nccl`; the source sends when KvSendMsg reaches it). After
  /// run(): the transport that delivered them, or the last one tried.
  KvTransport transport = KvTransport::kUcx;
  std::shared_ptr<KvEndpoint> endpoint;  ///< to offer.source; null in-process, or when only NCCL reaches it
  std::shared_ptr<KvNcclDirection> nccl; ///< kNccl: the direction from the source, held (busy) until end_fetch
  Status nccl_error;                     ///< kNccl tried and failed (then retried over UCX): why
  std::unique_ptr<UcxRegion> buffer;     ///< registered, at least offer.bytes; the bytes land here
  Status status = Status(StatusCode::kUnavailable, "kv fetch not run");  ///< run()'s result
  /// Reads the offer's bytes into `buffer` by `deadline`; sets `status`. Errors:
  /// kUnavailable (the source or its offer is gone, the endpoint failed), kDeadlineExceeded
  /// (it stalled), kInvalidArgument (the source's size differs). Never blocks past the deadline
  /// (plus UCX's bounded close of a failed endpoint); an NCCL transfer that fails is retried over
  /// UCX (when an endpoint is connected) by now + budget, so at most twice that.
  void run();
};

/// Where a data plane runs and how it reaches GPU peers.
struct KvPlaneOptions {
  std::string node;           ///< the node it runs on (KvPlace::node)
  /// The node's host (topology nodes[i].host): UCX's network transports use only the interface
  /// that holds it (ucx_net_device_for_host; "lo" for loopback), unless UCX_NET_DEVICES is set.
  /// Empty, or an address on no interface here: every interface (UCX's default). A target shard
  /// sets it only when every node of its topology is on loopback (actors/target_shard_load.cpp):
  /// pinning a real interface would drop UCX's RDMA devices.
  std::string host;
  int32_t cuda_device = -1;   ///< the CUDA device of its KV cache; -1: the CPU
  /// Where NCCL unique ids are exchanged (a worker: ActorRendezvousStore to the scheduler); null:
  /// no NCCL channels (every transfer in-process or UCX).
  std::shared_ptr<RendezvousStore> nccl_store;
  std::chrono::milliseconds nccl_join_timeout{60000};  ///< bound of one channel's join
  /// This plane's process id (KvPlace::process); 0: kv_process_id(). NOTE: a test seam: two
  /// planes of one test process with different ids take the transport of two processes.
  uint64_t process = 0;
};

/// The host a target shard gives its data plane (KvPlaneOptions::host): `node_host` (its node's
/// host; "127.0.0.1" when empty) when every one of `node_hosts` (the topology's nodes[i].host;
/// none: one process) is a loopback address, i.e. the whole cluster is on this machine; else ""
/// (UCX keeps every device). NOTE: in a multi-host topology a node left at 127.0.0.1 must stay
/// reachable from the other hosts, and pinning a real interface (UCX_NET_DEVICES=eth0) would drop
/// the RDMA devices (mlx5_0:1), which UCX names apart from their netdevs.
std::string kv_plane_host(const std::vector<std::string>& node_hosts, const std::string& node_host);

class KvDataPlane {
 public:
  /// Creates the UCX agent (UCX_TLS from the environment) with its progress thread. Errors:
  /// kUnavailable when UCX has no usable transport (the shard then runs without a data plane:
  /// migrations recompute).
  /// `name`: this worker's kv_peer_name (actors/messages.h).
  /// `options`: its place; with a CUDA device, a store and NCCL in this build it joins NCCL KV
  /// channels with GPU peers (place().nccl is then true).
  static Expected<std::unique_ptr<KvDataPlane>> create(const std::string& name, const KvPlaneOptions& options = {});
  /// Where this plane runs (for WorkerHello and choose_kv_transport).
  const KvPlace& place() const { return place_; }

  /// The agent's worker address (bytes), for WorkerHello::kv_address.
  std::string address() const;
  const std::string& name() const { return name_; }
  /// The UCX_NET_DEVICES its agent runs with ("lo" for a loopback node; UcxAgent::net_devices()).
  const std::string& net_devices() const;
  /// Connects an endpoint to every peer not connected yet (not itself), each within
  /// `timeout`; a peer whose address changed (a restarted worker) is connected afresh. A peer
  /// that cannot be reached is logged and retried on the next call.
  void connect_peers(const std::vector<KvPeer>& peers, std::chrono::milliseconds timeout);
  /// Whether an endpoint to the peer `name` is connected and has not failed.
  bool connected_to(const std::string& name) const;
  /// The transport a fetch from the peer `name` would take now: kNccl when choose_kv_transport
  /// says so and the channel from it is joined, not failed and not busy; kInProcess for a peer
  /// of this process; else kUcx.
  KvTransport transport_from(const std::string& name);

  /// The source's side of an NCCL fetch (KvSendMsg): sends the export of `offer_id` to the peer
  /// `to` on a thread of its own, by `deadline`; the offer's staging region stays alive until
  /// the send ends, even if released meanwhile. Errors (at once): kNotFound (no such offer),
  /// kUnavailable (no NCCL channel to `to`).
  Status serve_send(int64_t offer_id, const std::string& to, KvDeadline deadline);

  /// Exports `blocks` (holding the first `num_tokens` tokens of a sequence) into a new staging
  /// region and returns its descriptor. `tokens_hash` is kv_tokens_hash of those tokens. Errors:
  /// those of export_kv_blocks and of registering the region.
  Expected<KvOffer> offer(Backend& backend, KvStorage& kv, const KvExportFormat& format, std::span<const int32_t> blocks,
                          int32_t num_tokens, uint64_t tokens_hash);
  ~KvDataPlane();  ///< frees every offer
  /// Ends an offer (unknown ids are ignored): its staging region is kept for a later offer
  /// (at most kMaxSpareRegions regions and kMaxSpareBytes bytes are kept; the oldest go first).
  /// NOTE: reusing regions saves the source a ucp_mem_map (plus first-touch page faults) per
  /// migration, and lets receivers reuse the rkey they unpacked for it (their endpoint's cache).
  void release(int64_t offer_id);
  /// Staging regions kept for reuse (released, not yet given to a new offer).
  int32_t num_spare_regions() const { return static_cast<int32_t>(spare_.size()); }
  static constexpr int32_t kMaxSpareRegions = 8;
  static constexpr int64_t kMaxSpareBytes = int64_t{512} << 20;
  /// Frees the regions of offers older than `max_age` (a receiver that never answered); returns
  /// how many.
  int expire(std::chrono::milliseconds max_age);
  int32_t num_offers() const { return static_cast<int32_t>(offers_.size()); }

  /// Reads the export of `offer` from its source by `deadline` and imports it into `blocks` of
  /// `kv` (ceil(offer.num_cached / block_size) ids). Errors (the caller recomputes): kUnavailable
  /// (no endpoint to the source, or it died), kDeadlineExceeded (it stalled), kCorruptData
  /// (checksum), kInvalidArgument (another model or layout, or the export holds another number
  /// of tokens than the offer says), kResourceExhausted (the receive region cannot grow).
  /// The bytes land in one registered receive region of this data plane, grown to the largest
  /// offer fetched so far and reused (not freed between fetches).
  Status fetch(const KvOffer& offer, Backend& backend, KvStorage& kv, const KvExportFormat& expected,
               std::span<const int32_t> blocks, KvDeadline deadline);

  /// fetch() in three parts, so that the transfer runs off the caller's thread:
  /// start_fetch checks the offer's size against `expected` and `num_blocks`, chooses the
  /// transport (transport_from; the caller sends the source KvSendMsg when it is kNccl), finds
  /// the endpoint to its source and hands the fetch a receive region (the plane's reusable one when free, else
  /// a new one); the caller then calls KvFetch::run() on any thread, and finish_fetch() (on this
  /// plane's thread) imports the bytes into `blocks` of `kv`. Errors: start_fetch: kInvalidArgument
  /// (size), kUnavailable (no endpoint, or an earlier worker of that name), kResourceExhausted;
  /// finish_fetch: run()'s error, then those of import_kv_blocks, and kInvalidArgument when the
  /// export holds another number of tokens than the offer says.
  Expected<std::shared_ptr<KvFetch>> start_fetch(const KvOffer& offer, const KvExportFormat& expected, int64_t num_blocks,
                                                 KvDeadline deadline);
  Status finish_fetch(KvFetch& f, Backend& backend, KvStorage& kv, const KvExportFormat& expected,
                      std::span<const int32_t> blocks);
  /// Ends a fetch after run() (imported or not): forgets its endpoint when it failed (the next
  /// KvPeersMsg reconnects), frees its NCCL direction for the next fetch and keeps its receive
  /// region for reuse. Call on this plane's thread.
  void end_fetch(KvFetch& f);

 private:
  KvDataPlane() = default;
  struct Offer {
    std::shared_ptr<UcxRegion> region;  // shared with an NCCL send running on another thread
    std::chrono::steady_clock::time_point created;
    int64_t bytes = 0;  // the export's (header + blocks), at the region's start
  };
  std::string name_;
  KvPlace place_;
  std::unique_ptr<UcxAgent> agent_;
  // After agent_: destroyed first, so a send thread's staging region is unmapped while the agent lives.
  std::unique_ptr<KvNcclLinks> nccl_;  // null without NCCL
  struct Peer {
    std::string address;
    std::shared_ptr<KvEndpoint> endpoint;  // shared with fetches running on other threads; null: not connected
    KvPlace place;
  };
  std::map<std::string, Peer> peers_;  // by peer name
  std::map<int64_t, Offer> offers_;
  // Staging regions of released offers, oldest first, reused by offer().
  std::vector<std::shared_ptr<UcxRegion>> spare_;
  // A staging region of at least `bytes`: the smallest spare one that fits, else a new one
  // (rounded up to a MiB). Errors: those of UcxAgent::allocate_region.
  Expected<std::shared_ptr<UcxRegion>> take_staging(int64_t bytes);
  // The registered region fetch() gets into (grown on demand, kept between fetches).
  std::unique_ptr<UcxRegion> recv_;
  // recv_ (taken out of the plane), grown to hold `bytes`, or a new region when a running fetch
  // holds it. Errors: those of UcxAgent::allocate_region.
  Expected<std::unique_ptr<UcxRegion>> take_receive_buffer(int64_t bytes);
  int64_t next_offer_ = 1;
};

/// This process's random id (drawn once): KvOffer::source_process.
uint64_t kv_process_id();

/// XXH3-64 of token ids (the KvOffer check that sender and receiver mean the same tokens).
uint64_t kv_tokens_hash(std::span<const int32_t> tokens);

}  // namespace specserve
