// specserve actors: a target shard's end of the KV data plane — moving a sequence's KV blocks to
// another worker when it migrates (a draining replica, a prefill worker handing over).
//
// Built on kv/transfer.h (the checked export format) and kv/ucx_transport.h (UCX one-sided get):
//   - at worker start the shard creates its UcxAgent (with a progress thread, so peers' tcp gets
//     are served while the shard computes) and publishes the agent's address in WorkerHello;
//   - the scheduler sends every ready shard the addresses of the others (KvPeersMsg) and each
//     connects its endpoints then, not on first use;
//   - a sequence that leaves is exported into a staging region of its own (offer()); the
//     KvOffer (address, rkey, size, token hash) travels in the actor messages;
//   - the receiver fetches it with a deadline (fetch()), checks model, layout and per-block
//     checksums (import_kv_blocks) and writes it into its own blocks; any failure — a dead or
//     stalled peer, a checksum mismatch, a model mismatch — is an error the caller answers by
//     recomputing the sequence's KV (Engine::add_migrated);
//   - the receiver's KvReleaseMsg, or the offer's expiry, frees the staging region.
// Inside one process (same kv_process_id, a random number drawn at start: pids repeat across
// hosts and containers) the bytes are copied from the source's live offer, looked up in a
// process-wide table under a lock — never through an address taken from a message.
// Thread-safety: one actor uses a KvDataPlane; the agent's own lock covers its progress thread.
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
#include "kv/transfer.h"
#include "kv/ucx_transport.h"

namespace specserve {

class KvDataPlane {
 public:
  /// Creates the UCX agent (UCX_TLS from the environment) with its progress thread. Errors:
  /// kUnavailable when UCX has no usable transport (the shard then runs without a data plane:
  /// migrations recompute).
  /// `name`: this worker's kv_peer_name (actors/messages.h).
  static Expected<std::unique_ptr<KvDataPlane>> create(const std::string& name);

  /// The agent's worker address (bytes), for WorkerHello::kv_address.
  std::string address() const;
  const std::string& name() const { return name_; }
  /// Connects an endpoint to every peer not connected yet (not itself), each within
  /// `timeout`; a peer whose address changed (a restarted worker) is connected afresh. A peer
  /// that cannot be reached is logged and retried on the next call.
  void connect_peers(const std::vector<KvPeer>& peers, std::chrono::milliseconds timeout);
  /// Whether an endpoint to the peer `name` is connected and has not failed.
  bool connected_to(const std::string& name) const;

  /// Exports `blocks` (holding the first `num_tokens` tokens of a sequence) into a new staging
  /// region and returns its descriptor. `tokens_hash` is kv_tokens_hash of those tokens. Errors:
  /// those of export_kv_blocks and of registering the region.
  Expected<KvOffer> offer(Backend& backend, KvStorage& kv, const KvExportFormat& format, std::span<const int32_t> blocks,
                          int32_t num_tokens, uint64_t tokens_hash);
  ~KvDataPlane();  ///< frees every offer
  /// Frees the staging region of an offer (unknown ids are ignored).
  void release(int64_t offer_id);
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

 private:
  KvDataPlane() = default;
  struct Offer {
    std::unique_ptr<UcxRegion> region;
    std::chrono::steady_clock::time_point created;
  };
  std::string name_;
  std::unique_ptr<UcxAgent> agent_;
  struct Peer {
    std::string address;
    std::unique_ptr<KvEndpoint> endpoint;
  };
  std::map<std::string, Peer> peers_;  // by peer name
  std::map<int64_t, Offer> offers_;
  // The registered region fetch() gets into (grown on demand, kept between fetches).
  std::unique_ptr<UcxRegion> recv_;
  // recv_, grown to hold `bytes`. Errors: those of UcxAgent::allocate_region.
  Expected<uint8_t*> receive_buffer(int64_t bytes);
  int64_t next_offer_ = 1;
};

/// This process's random id (drawn once): KvOffer::source_process.
uint64_t kv_process_id();

/// XXH3-64 of token ids (the KvOffer check that sender and receiver mean the same tokens).
uint64_t kv_tokens_hash(std::span<const int32_t> tokens);

}  // namespace specserve
