#include "actors/kv_data_plane.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <random>

#include <unistd.h>

#include <xxhash.h>

#include "config/topology.h"
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

std::string kv_plane_host(const std::vector<std::string>& node_hosts, const std::string& node_host) {
  for (const std::string& h : node_hosts) {
    if (!is_loopback_host(h)) return {};
  }
  return node_host.empty() ? "127.0.0.1" : node_host;
}

Expected<std::unique_ptr<KvDataPlane>> KvDataPlane::create(const std::string& name, const KvPlaneOptions& options) {
  UcxAgentOptions o;
  o.name = name;
  o.progress_thread = true;
  if (std::getenv("UCX_NET_DEVICES") == nullptr) o.net_devices = ucx_net_device_for_host(options.host);
  auto agent = UcxAgent::create(o);
  if (!agent.ok()) return agent.status();
  if (!options.host.empty() && o.net_devices.empty() && std::getenv("UCX_NET_DEVICES") == nullptr) {
    get_logger("kv")->info("{}: node host {} is on no network interface of this machine; UCX uses every interface "
                           "(set UCX_NET_DEVICES to choose)",
                           name, options.host);
  }
  std::unique_ptr<KvDataPlane> p(new KvDataPlane());
  p->name_ = name;
  p->agent_ = std::move(*agent);
  p->place_.node = options.node;
  char host[256] = {};
  if (gethostname(host, sizeof host - 1) == 0) p->place_.machine = host;
  p->place_.process = options.process != 0 ? options.process : kv_process_id();
  p->place_.cuda_device = options.cuda_device;
  if (options.cuda_device >= 0 && options.nccl_store != nullptr && KvNcclLinks::available()) {
    KvNcclLinks::Options lo;
    lo.self_name = name;
    lo.cuda_device = options.cuda_device;
    lo.store = options.nccl_store;
    lo.join_timeout = options.nccl_join_timeout;
    p->nccl_ = std::make_unique<KvNcclLinks>(std::move(lo));
    p->place_.nccl = true;
  }
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
  const std::string self_address = address();
  for (const KvPeer& p : peers) {
    if (p.name == name_ || p.address.empty()) continue;
    const KvPlace place{p.node, p.process, p.cuda_device, p.nccl, p.machine};
    // NCCL first: its joins run on threads of their own (the peer joins at the same time), so
    // they overlap the UCX connects below.
    if (nccl_ != nullptr && choose_kv_transport(place, place_) == KvTransport::kNccl) {
      nccl_->connect(p.name, self_address, p.address);
    }
    auto it = peers_.find(p.name);
    if (it != peers_.end() && it->second.endpoint && !it->second.endpoint->failed() && it->second.address == p.address) {
      it->second.place = place;
      continue;
    }
    const std::vector<uint8_t> addr(p.address.begin(), p.address.end());
    auto ep = agent_->connect(addr, p.name, kv_deadline_after(timeout));
    if (!ep.ok()) {
      // Kept without an endpoint (an NCCL channel may still reach it); retried on the next call.
      get_logger("kv")->warn("{}: no KV endpoint to {}: {}", name_, p.name, ep.status().to_string());
      peers_[p.name] = Peer{p.address, nullptr, place};
      continue;
    }
    peers_[p.name] = Peer{p.address, std::move(*ep), place};
    get_logger("kv")->info("{}: KV endpoint to {} connected (UCX_TLS {}, UCX_NET_DEVICES {}); transport from it: {}",
                           name_, p.name, agent_->transports(), agent_->net_devices(), kv_transport_name(choose_kv_transport(place, place_)));
  }
}

const std::string& KvDataPlane::net_devices() const { return agent_->net_devices(); }

bool KvDataPlane::connected_to(const std::string& name) const {
  auto it = peers_.find(name);
  return it != peers_.end() && it->second.endpoint && !it->second.endpoint->failed();
}

KvTransport KvDataPlane::transport_from(const std::string& name) {
  auto it = peers_.find(name);
  if (it == peers_.end()) return KvTransport::kUcx;
  const KvTransport t = choose_kv_transport(it->second.place, place_);
  if (t == KvTransport::kNccl && (nccl_ == nullptr || !nccl_->can_receive_from(name))) return KvTransport::kUcx;
  return t;
}

Status KvDataPlane::serve_send(int64_t offer_id, const std::string& to, KvDeadline deadline) {
  auto it = offers_.find(offer_id);
  if (it == offers_.end()) return not_found(name_ + ": kv offer " + std::to_string(offer_id) + " is gone");
  if (nccl_ == nullptr) return unavailable(name_ + ": no nccl kv channels here");
  std::shared_ptr<UcxRegion> region = it->second.region;
  const void* data = region->data();
  // The region's bytes: kv_export_bytes of the offer, which the receiver recvs exactly.
  const int64_t bytes = it->second.bytes;
  return nccl_->send_async(to, std::shared_ptr<const void>(region, data), data, bytes, deadline);
}

Expected<KvOffer> KvDataPlane::offer(Backend& backend, KvStorage& kv, const KvExportFormat& format,
                                     std::span<const int32_t> blocks, int32_t num_tokens, uint64_t tokens_hash) {
  const int64_t n = static_cast<int64_t>(blocks.size());
  const int64_t bytes = kv_export_bytes(format, n);
  auto region = take_staging(bytes);
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
  o.source_process = place_.process;
  o.source_address_hash = XXH3_64bits(agent_->address().data(), agent_->address().size());
  {
    std::lock_guard<std::mutex> lock(local_offers().mu);
    local_offers().live[{name_, o.offer_id}] = {(*region)->data(), bytes};
  }
  offers_[o.offer_id] = Offer{std::move(*region), std::chrono::steady_clock::now(), bytes};
  return o;
}

Expected<std::shared_ptr<UcxRegion>> KvDataPlane::take_staging(int64_t bytes) {
  auto best = spare_.end();
  for (auto it = spare_.begin(); it != spare_.end(); ++it) {
    if ((*it)->bytes() >= bytes && (best == spare_.end() || (*it)->bytes() < (*best)->bytes())) best = it;
  }
  if (best != spare_.end()) {
    std::shared_ptr<UcxRegion> r = std::move(*best);
    spare_.erase(best);
    return r;
  }
  const int64_t mib = int64_t{1} << 20;
  auto r = agent_->allocate_region((bytes + mib - 1) / mib * mib);
  if (!r.ok()) return r.status();
  return std::shared_ptr<UcxRegion>(std::move(*r));
}

void KvDataPlane::release(int64_t offer_id) {
  {
    // First out of the table: an in-process reader copies under this lock, so none reads the
    // region once it is reused.
    std::lock_guard<std::mutex> lock(local_offers().mu);
    local_offers().live.erase({name_, offer_id});
  }
  auto it = offers_.find(offer_id);
  if (it == offers_.end()) return;
  // NOTE: the receiver answers (KvReleaseMsg) after its get ended, and an unanswered offer expires
  // long after any receiver's deadline, so no UCX get still reads a region that is reused. An
  // NCCL send still running holds the region too: it is then not reused (freed when the send ends).
  if (it->second.region.use_count() == 1) spare_.push_back(std::move(it->second.region));
  offers_.erase(it);
  int64_t total = 0;
  for (const auto& r : spare_) total += r->bytes();
  while (!spare_.empty() && (static_cast<int32_t>(spare_.size()) > kMaxSpareRegions || total > kMaxSpareBytes)) {
    total -= spare_.front()->bytes();
    spare_.erase(spare_.begin());
  }
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

Expected<std::unique_ptr<UcxRegion>> KvDataPlane::take_receive_buffer(int64_t bytes) {
  if (recv_ != nullptr && recv_->bytes() >= bytes) return std::move(recv_);
  // NOTE: grown to the next MiB and kept (end_fetch gives it back): one registration per data
  // plane rather than one per fetch (ucp_mem_map of tens of MiB costs milliseconds), and UCX gets
  // straight into it. A second fetch while one runs gets a region of its own.
  const int64_t mib = int64_t{1} << 20;
  const int64_t grown = std::max((bytes + mib - 1) / mib * mib, recv_ == nullptr ? 0 : recv_->bytes() * 2);
  recv_.reset();
  auto region = agent_->allocate_region(grown);
  if (!region.ok()) return region.status();
  return std::move(*region);
}

Expected<std::shared_ptr<KvFetch>> KvDataPlane::start_fetch(const KvOffer& offer, const KvExportFormat& expected,
                                                            int64_t num_blocks, KvDeadline deadline) {
  // The size follows from the format and the blocks: anything else is refused before a byte is
  // allocated or read.
  const int64_t want = kv_export_bytes(expected, num_blocks);
  if (offer.bytes != want) {
    return invalid_argument("kv offer: " + std::to_string(offer.bytes) + " bytes, expected " + std::to_string(want) + " for " +
                            std::to_string(num_blocks) + " blocks");
  }
  auto f = std::make_shared<KvFetch>();
  f->offer = offer;
  f->deadline = deadline;
  f->budget = std::max(std::chrono::milliseconds(0), std::chrono::duration_cast<std::chrono::milliseconds>(
                                                          deadline - std::chrono::steady_clock::now()));
  if (offer.source_process == place_.process) {
    f->transport = KvTransport::kInProcess;
  } else {
    auto it = peers_.find(offer.source);
    if (it == peers_.end()) return unavailable("no KV endpoint to " + offer.source);
    if (XXH3_64bits(it->second.address.data(), it->second.address.size()) != offer.source_address_hash) {
      // NOTE: the worker of that name was restarted: the offer's region and key died with the old one.
      return unavailable("kv offer of " + offer.source + " comes from an earlier worker of that name");
    }
    if (it->second.endpoint && !it->second.endpoint->failed()) f->endpoint = it->second.endpoint;
    if (nccl_ != nullptr && choose_kv_transport(it->second.place, place_) == KvTransport::kNccl) {
      f->nccl = nccl_->try_take_recv(offer.source);  // null: not joined, failed, or another fetch holds it
    }
    if (f->nccl != nullptr) {
      f->transport = KvTransport::kNccl;
    } else if (f->endpoint == nullptr) {
      return unavailable("no KV endpoint to " + offer.source);
    }
  }
  auto buffer = take_receive_buffer(offer.bytes);
  if (!buffer.ok()) {
    if (nccl_ != nullptr) nccl_->give_back_recv(f->nccl);
    return buffer.status();
  }
  f->buffer = std::move(*buffer);
  return f;
}

void KvFetch::run() {
  auto* buf = static_cast<uint8_t*>(buffer->data());
  if (transport == KvTransport::kNccl) {
    status = nccl->recv(buf, offer.bytes, deadline);
    if (status.ok() || endpoint == nullptr) return;
    // NOTE: another path: the source's staging region is still there (it is freed only after our
    // KvReleaseMsg), so a stalled NCCL peer or a broken channel costs one retry over UCX.
    nccl_error = status;
    get_logger("kv")->warn("kv offer {} of {}: nccl recv failed, retrying over UCX: {}", offer.offer_id, offer.source,
                           status.to_string());
    transport = KvTransport::kUcx;
    deadline = kv_deadline_after(budget);
  }
  if (transport == KvTransport::kInProcess) {
    // NOTE: the source lives in this process: copy from its live offer under the table's lock.
    std::lock_guard<std::mutex> lock(local_offers().mu);
    auto it = local_offers().live.find({offer.source, offer.offer_id});
    if (it == local_offers().live.end()) {
      status = unavailable("kv offer " + std::to_string(offer.offer_id) + " of " + offer.source + " is gone");
    } else if (it->second.second != offer.bytes) {
      status = invalid_argument("kv offer: size differs from the source's");
    } else {
      std::memcpy(buf, it->second.first, static_cast<size_t>(offer.bytes));
      status = Status();
    }
    return;
  }
  KvRemoteRegion remote;
  remote.base = offer.remote_addr;
  remote.bytes = static_cast<uint64_t>(offer.bytes);
  remote.rkey.assign(offer.rkey.begin(), offer.rkey.end());
  status = endpoint->get(buf, offer.bytes, remote, 0, deadline);
}

Status KvDataPlane::finish_fetch(KvFetch& f, Backend& backend, KvStorage& kv, const KvExportFormat& expected,
                                 std::span<const int32_t> blocks) {
  SPECSERVE_RETURN_IF_ERROR(f.status);
  auto header = import_kv_blocks(backend, kv, expected, f.buffer->data(), f.offer.bytes, blocks.data(),
                                 static_cast<int64_t>(blocks.size()));
  if (!header.ok()) return header.status();
  if (header->num_tokens != f.offer.num_cached) {
    return invalid_argument("kv export: num_tokens " + std::to_string(header->num_tokens) + " != the offer's " +
                            std::to_string(f.offer.num_cached));
  }
  return Status();
}

void KvDataPlane::end_fetch(KvFetch& f) {
  if (f.endpoint != nullptr && f.endpoint->failed()) {
    auto it = peers_.find(f.offer.source);
    if (it != peers_.end() && it->second.endpoint == f.endpoint) it->second.endpoint = nullptr;
  }
  if (nccl_ != nullptr) nccl_->give_back_recv(f.nccl);
  f.nccl = nullptr;
  if (f.buffer != nullptr && (recv_ == nullptr || recv_->bytes() < f.buffer->bytes())) recv_ = std::move(f.buffer);
  f.buffer.reset();
}

Status KvDataPlane::fetch(const KvOffer& offer, Backend& backend, KvStorage& kv, const KvExportFormat& expected,
                          std::span<const int32_t> blocks, KvDeadline deadline) {
  auto f = start_fetch(offer, expected, static_cast<int64_t>(blocks.size()), deadline);
  if (!f.ok()) return f.status();
  (*f)->run();
  Status st = finish_fetch(**f, backend, kv, expected, blocks);
  end_fetch(**f);
  return st;
}

}  // namespace specserve
