// specserve actors: the messages of the KV data plane (actors/kv_data_plane.h): where a
// migrating sequence's KV waits, the peers every worker connects to at start, and the receiver's
// requests to the source (send it over NCCL; free it). Part of actors/messages.h (which includes
// this file and gives these types their CAF type IDs); include that one.
//
// Only addresses, keys, sizes and ids travel here, never KV bytes (DESIGN.md section 2).
//
// Who sends what:
//   scheduler -> worker : KvPeersMsg (every ready worker's data-plane address and place, so that
//                         UCX endpoints and NCCL channels are connected at start, not on first use)
//   receiver -> scheduler -> source : KvSendMsg (post the NCCL send of an offer to me: NCCL
//                         point-to-point is two-sided), KvReleaseMsg (the offer can be freed)
#pragma once

#include <caf/all.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace specserve {

/// Where a migrating sequence's KV waits on the worker it left (the data plane, kv/transfer.h):
/// a staging region with the KV export (header + blocks) that the receiver reads with a UCX get,
/// or asks the source to send over their NCCL channel (KvSendMsg).
struct KvOffer {
  std::string source;           ///< data-plane name of the worker holding the staging region (kv_peer_name); "": no KV
  int64_t offer_id = 0;         ///< the source's id of the region (KvReleaseMsg names it)
  int32_t num_cached = 0;       ///< tokens (from the start of prompt + output) whose KV the export holds
  uint64_t tokens_hash = 0;     ///< XXH3-64 of those token ids: the receiver checks them against its own
  uint64_t remote_addr = 0;     ///< the staging region's address in the source process
  std::string rkey;             ///< its packed UCX remote key (bytes)
  int64_t bytes = 0;            ///< size of the export (header + blocks)
  uint64_t source_process = 0;  ///< a random id of the source's process (kv_process_id): same process, a plain copy
  uint64_t source_address_hash = 0;  ///< XXH3-64 of the source's UCX worker address: a restarted worker with the same name is not it
};

/// One worker of the data plane, as KvPeersMsg lists it: its name, UCX address and place (what
/// choose_kv_transport, kv/transport.h, decides on).
struct KvPeer {
  std::string name;             ///< kv_peer_name(role, replica)
  std::string address;          ///< UCX worker address (bytes)
  std::string node;             ///< the node it runs on (WorkerHello::node)
  uint64_t process = 0;         ///< kv_process_id of its process (WorkerHello::kv_process)
  int32_t cuda_device = -1;     ///< its CUDA device ordinal; -1: the CPU (WorkerHello::kv_cuda_device)
  bool nccl = false;            ///< it joins NCCL KV channels with GPU peers (WorkerHello::kv_nccl)
  std::string machine;          ///< its machine's hostname (WorkerHello::kv_machine; KvPlace::machine)
};
/// Scheduler -> worker: every ready worker's data-plane address and place.
struct KvPeersMsg {
  std::vector<KvPeer> peers;
};

/// Receiver -> scheduler -> source: the staging region `offer_id` can be freed.
struct KvReleaseMsg {
  std::string source;           ///< KvOffer::source
  int64_t offer_id = 0;
};

/// Receiver -> scheduler -> source: send the export of `offer_id` to the worker `to` over their
/// NCCL KV channel (the receiver has posted, or is about to post, the matching recv). The source
/// answers nothing: a send it cannot make ends the receiver's recv by its deadline, and the
/// receiver then retries over UCX (actors/kv_data_plane.h).
struct KvSendMsg {
  std::string source;           ///< KvOffer::source
  int64_t offer_id = 0;
  std::string to;               ///< the receiver's kv_peer_name
};

/// A worker's name on the data plane: "target_shard/0", "prefill_worker/0".
inline std::string kv_peer_name(const std::string& role, int32_t replica) { return role + "/" + std::to_string(replica); }

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, KvOffer& x) {
  return f(caf::meta::type_name("KvOffer"), x.source, x.offer_id, x.num_cached, x.tokens_hash, x.remote_addr, x.rkey,
           x.bytes, x.source_process, x.source_address_hash);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, KvPeer& x) {
  return f(caf::meta::type_name("KvPeer"), x.name, x.address, x.node, x.process, x.cuda_device, x.nccl, x.machine);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, KvPeersMsg& x) {
  return f(caf::meta::type_name("KvPeersMsg"), x.peers);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, KvReleaseMsg& x) {
  return f(caf::meta::type_name("KvReleaseMsg"), x.source, x.offer_id);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, KvSendMsg& x) {
  return f(caf::meta::type_name("KvSendMsg"), x.source, x.offer_id, x.to);
}

}  // namespace specserve
