#include "actors/kv_data_plane.h"

#include <algorithm>
#include <cstring>
#include <mutex>
#include <random>

#include <xxhash.h>

#include "core/logging.h"
#include "model/backend.h"

namespace specserve {
namespace {

// Offers of every data plane of this process, for in-process readers: (source name, offer id)
// -> the export's bytes. An entry lives exactly as long as its region (offer() .. release /
// expire / the plane's end), and readers copy under the lock.
struct LocalOffers {
  std::mutex mu;
  std::map<std::pair<std::string, int64_t>, std::pair<const void*, int64_t>> live;
};

LocalOffers& local_offers() {
  static LocalOffers* o = new LocalOffers();  // never destroyed: planes may outlive statics' order
  return *o;
}

uint64_t random_u64() {
  std::random_device rd;
  return (static_cast<uint64_t>(rd()) << 32) ^ rd();
}

}  // namespace

uint64_t kv_process_id() {
  static const uint64_t id = random_u64() | 1;  // never 0 (0: "no source")
  return id;
}

uint64_t kv_tokens_hash(std::span<const int32_t> tokens) { return XXH3_64bits(tokens.data(), tokens.size_bytes()); }

Expected<std::unique_ptr<KvDataPlane>> KvDataPlane::create(const std::string& name) {
  UcxAgentOptions o;
  o.name = name;
  o.progress_thread = true;
  auto agent = UcxAgent::create(o);
  if (!agent.ok()) return agent.status();
  std::unique_ptr<KvDataPlane> p(new KvDataPlane());
  p->name_ = name;
  p->agent_ = std::move(*agent);
  // NOTE: offer ids start at a random point, so a release meant for an earlier incarnation of a
  // worker with the same name (a restarted replica) does not free one of this one's offers.
  p->next_offer_ = static_cast<int64_t>(random_u64() >> 2) + 1;
  return p;
}

KvDataPlane::~KvDataPlane() {
  std::lock_guard<std::mutex> lock(local_offers().mu);
  for (const auto& [id, o] : offers_) local_offers().live.erase({name_, id});
}

std::string KvDataPlane::address() const {
  const auto& a = agent_->address();
  return std::string(a.begin(), a.end());
}

void KvDataPlane::connect_peers(const std::vector<KvPeer>& peers, std::chrono::milliseconds timeout) {
  for (const KvPeer& p : peers) {
    if (p.name == name_ || p.address.empty()) continue;
    auto it = peers_.find(p.name);
    if (it != peers_.end() && !it->second.endpoint->failed() && it->second.address == p.address) continue;
    const std::vector<uint8_t> addr(p.address.begin(), p.address.end());
    auto ep = agent_->connect(addr, p.name, kv_deadline_after(timeout));
    if (!ep.ok()) {
      get_logger("kv")->warn("{}: no KV endpoint to {}: {}", name_, p.name, ep.status().to_string());
      peers_.erase(p.name);
      continue;
    }
    peers_[p.name] = Peer{p.address, std::move(*ep)};
    get_logger("kv")->info("{}: KV endpoint to {} connected (UCX_TLS {})", name_, p.name, agent_->transports());
  }
}

bool KvDataPlane::connected_to(const std::string& name) const {
  auto it = peers_.find(name);
  return it != peers_.end() && !it->second.endpoint->failed();
}

Expected<KvOffer> KvDataPlane::offer(Backend& backend, KvStorage& kv, const KvExportFormat& format,
                                     std::span<const int32_t> blocks, int32_t num_tokens, uint64_t tokens_hash) {
  const int64_t n = static_cast<int64_t>(blocks.size());
  const int64_t bytes = kv_export_bytes(format, n);
  auto region = agent_->allocate_region(bytes);
  if (!region.ok()) return region.status();
  auto header = export_kv_blocks(backend, kv, format, blocks.data(), n, num_tokens, (*region)->data(), bytes);
  if (!header.ok()) return header.status();
  KvOffer o;
  o.source = name_;
  o.offer_id = next_offer_++;
  o.num_cached = num_tokens;
  o.tokens_hash = tokens_hash;
  o.remote_addr = (*region)->remote().base;
  o.rkey.assign((*region)->remote().rkey.begin(), (*region)->remote().rkey.end());
  o.bytes = bytes;
  o.source_process = kv_process_id();
  o.source_address_hash = XXH3_64bits(agent_->address().data(), agent_->address().size());
  {
    std::lock_guard<std::mutex> lock(local_offers().mu);
    local_offers().live[{name_, o.offer_id}] = {(*region)->data(), bytes};
  }
  offers_[o.offer_id] = Offer{std::move(*region), std::chrono::steady_clock::now()};
  return o;
}

void KvDataPlane::release(int64_t offer_id) {
  {
    std::lock_guard<std::mutex> lock(local_offers().mu);
    local_offers().live.erase({name_, offer_id});
  }
  offers_.erase(offer_id);
}

int KvDataPlane::expire(std::chrono::milliseconds max_age) {
  const auto now = std::chrono::steady_clock::now();
  std::vector<int64_t> old;
  for (const auto& [id, o] : offers_) {
    if (now - o.created > max_age) old.push_back(id);
  }
  for (int64_t id : old) release(id);
  return static_cast<int>(old.size());
}

Expected<uint8_t*> KvDataPlane::receive_buffer(int64_t bytes) {
  if (recv_ == nullptr || recv_->bytes() < bytes) {
    // NOTE: grown to the next MiB and kept: one registration per data plane rather than one per
    // fetch (ucp_mem_map of tens of MiB costs milliseconds), and UCX gets straight into it.
    const int64_t mib = int64_t{1} << 20;
    const int64_t grown = std::max((bytes + mib - 1) / mib * mib, recv_ == nullptr ? 0 : recv_->bytes() * 2);
    recv_.reset();
    auto region = agent_->allocate_region(grown);
    if (!region.ok()) return region.status();
    recv_ = std::move(*region);
  }
  return static_cast<uint8_t*>(recv_->data());
}

Status KvDataPlane::fetch(const KvOffer& offer, Backend& backend, KvStorage& kv, const KvExportFormat& expected,
                          std::span<const int32_t> blocks, KvDeadline deadline) {
  // The size follows from the format and the blocks: anything else is refused before a byte is
  // allocated or read.
  const int64_t want = kv_export_bytes(expected, static_cast<int64_t>(blocks.size()));
  if (offer.bytes != want) {
    return invalid_argument("kv offer: " + std::to_string(offer.bytes) + " bytes, expected " + std::to_string(want) + " for " +
                            std::to_string(blocks.size()) + " blocks");
  }
  auto staging = receive_buffer(offer.bytes);
  if (!staging.ok()) return staging.status();
  uint8_t* buf = *staging;
  if (offer.source_process == kv_process_id()) {
    // NOTE: the source lives in this process: copy from its live offer under the table's lock.
    std::lock_guard<std::mutex> lock(local_offers().mu);
    auto it = local_offers().live.find({offer.source, offer.offer_id});
    if (it == local_offers().live.end()) return unavailable("kv offer " + std::to_string(offer.offer_id) + " of " + offer.source + " is gone");
    if (it->second.second != offer.bytes) return invalid_argument("kv offer: size differs from the source's");
    std::memcpy(buf, it->second.first, static_cast<size_t>(offer.bytes));
  } else {
    auto it = peers_.find(offer.source);
    if (it == peers_.end() || it->second.endpoint->failed()) return unavailable("no KV endpoint to " + offer.source);
    if (XXH3_64bits(it->second.address.data(), it->second.address.size()) != offer.source_address_hash) {
      // NOTE: the worker of that name was restarted: the offer's region and key died with the old one.
      return unavailable("kv offer of " + offer.source + " comes from an earlier worker of that name");
    }
    KvRemoteRegion remote;
    remote.base = offer.remote_addr;
    remote.bytes = static_cast<uint64_t>(offer.bytes);
    remote.rkey.assign(offer.rkey.begin(), offer.rkey.end());
    Status st = it->second.endpoint->get(buf, offer.bytes, remote, 0, deadline);
    if (it->second.endpoint->failed()) peers_.erase(it);
    SPECSERVE_RETURN_IF_ERROR(st);
  }
  auto header = import_kv_blocks(backend, kv, expected, buf, offer.bytes, blocks.data(),
                                 static_cast<int64_t>(blocks.size()));
  if (!header.ok()) return header.status();
  if (header->num_tokens != offer.num_cached) {
    return invalid_argument("kv export: num_tokens " + std::to_string(header->num_tokens) + " != the offer's " +
                            std::to_string(offer.num_cached));
  }
  return Status();
}

}  // namespace specserve
