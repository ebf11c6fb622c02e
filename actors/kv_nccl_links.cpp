#include "actors/kv_nccl_links.h"

#include <xxhash.h>

#include <cstdio>

#include "core/logging.h"

namespace specserve {
namespace {

std::string address_tag(const std::string& address) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx",
                static_cast<unsigned long long>(XXH3_64bits(address.data(), address.size())));
  return buf;
}

}  // namespace

bool KvNcclLinks::available() {
#ifdef SPECSERVE_WITH_CUDA
  return nccl_version() > 0;
#else
  return false;
#endif
}

bool KvNcclDirection::usable() {
  std::lock_guard<std::mutex> lock(mu);
  return channel != nullptr && !failed.load();
}

Status KvNcclDirection::recv(void* dst, int64_t bytes, KvDeadline deadline) {
  NcclKvChannel* ch = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu);
    ch = channel.get();  // set once, never reset while this direction lives
  }
  if (ch == nullptr) return unavailable("nccl kv channel: not joined");
  std::lock_guard<std::mutex> transfer(transfer_mu);
  Status st = ch->recv(dst, bytes, peer_rank, deadline);
  if (!st.ok() || ch->failed()) failed.store(true);
  return st;
}

Status KvNcclDirection::send(const void* src, int64_t bytes, KvDeadline deadline) {
  NcclKvChannel* ch = nullptr;
  {
    std::unique_lock<std::mutex> lock(mu);
    // NOTE: the receiver chose NCCL because its end had joined; this end's join thread may not
    // have reported yet (the two ends of a group finish together, give or take a scheduling delay).
    joined_cv.wait_until(lock, deadline, [&] { return !joining; });
    if (channel == nullptr) {
      return unavailable("nccl kv channel: " + (joining ? std::string("still joining at the deadline")
                                                        : "the join failed: " + join_status.to_string()));
    }
    ch = channel.get();
  }
  std::lock_guard<std::mutex> transfer(transfer_mu);
  Status st = ch->send(src, bytes, peer_rank, deadline);
  if (!st.ok() || ch->failed()) failed.store(true);
  return st;
}

KvNcclLinks::~KvNcclLinks() {
  for (Worker& w : threads_) {
    if (w.thread.joinable()) w.thread.join();
  }
}

void KvNcclLinks::reap() {
  for (auto it = threads_.begin(); it != threads_.end();) {
    if (it->done->load()) {
      if (it->thread.joinable()) it->thread.join();
      it = threads_.erase(it);
    } else {
      ++it;
    }
  }
}

void KvNcclLinks::start_join(std::shared_ptr<KvNcclDirection> d, int rank, const std::string& prefix) {
  d->peer_rank = 1 - rank;
  auto done = std::make_shared<std::atomic<bool>>(false);
  Options o = o_;
  std::thread t([d, rank, prefix, o, done] {
#ifdef SPECSERVE_WITH_CUDA
    NcclOptions no;
    no.prefix = prefix;
    no.timeout = o.join_timeout;
    auto ch = make_nccl_kv_channel(rank, 2, o.cuda_device, o.store, no);
#else
    Expected<std::unique_ptr<NcclKvChannel>> ch = unsupported("nccl kv channel: this build has no CUDA backend");
#endif
    {
      std::lock_guard<std::mutex> lock(d->mu);
      d->joining = false;
      if (ch.ok()) {
        d->channel = std::move(*ch);
      } else {
        d->join_status = ch.status();
      }
    }
    d->joined_cv.notify_all();
    if (ch.ok()) {
      get_logger("kv")->info("{}: nccl kv channel '{}' joined as rank {} on cuda:{}", o.self_name, prefix, rank,
                             o.cuda_device);
    } else {
      get_logger("kv")->warn("{}: nccl kv channel '{}' not joined (its transfers go over UCX): {}", o.self_name, prefix,
                             ch.status().to_string());
    }
    done->store(true);
  });
  threads_.push_back(Worker{std::move(t), done});
}

void KvNcclLinks::connect(const std::string& peer, const std::string& self_address, const std::string& peer_address) {
  reap();
  if (o_.store == nullptr || peer == o_.self_name) return;
  auto it = pairs_.find(peer);
  if (it != pairs_.end() && it->second.peer_address == peer_address) return;
  // A new peer, or a restarted one (new address): new groups; the old channels (if any) end when
  // the last fetch or send holding them lets go.
  Pair p;
  p.peer_address = peer_address;
  p.out = std::make_shared<KvNcclDirection>();
  p.in = std::make_shared<KvNcclDirection>();
  const std::string self_tag = address_tag(self_address), peer_tag = address_tag(peer_address);
  start_join(p.out, 0, "kv/" + o_.self_name + ">" + peer + "/" + self_tag + "-" + peer_tag);
  start_join(p.in, 1, "kv/" + peer + ">" + o_.self_name + "/" + peer_tag + "-" + self_tag);
  pairs_[peer] = std::move(p);
}

bool KvNcclLinks::can_receive_from(const std::string& peer) {
  auto it = pairs_.find(peer);
  return it != pairs_.end() && it->second.in->usable();
}

std::shared_ptr<KvNcclDirection> KvNcclLinks::try_take_recv(const std::string& peer) {
  auto it = pairs_.find(peer);
  if (it == pairs_.end()) return nullptr;
  const auto& d = it->second.in;
  std::lock_guard<std::mutex> lock(d->mu);
  if (d->busy || d->channel == nullptr || d->failed.load()) return nullptr;
  d->busy = true;
  return d;
}

void KvNcclLinks::give_back_recv(const std::shared_ptr<KvNcclDirection>& d) {
  if (d == nullptr) return;
  std::lock_guard<std::mutex> lock(d->mu);
  d->busy = false;
}

Status KvNcclLinks::send_async(const std::string& peer, std::shared_ptr<const void> hold, const void* data,
                               int64_t bytes, KvDeadline deadline) {
  reap();
  auto it = pairs_.find(peer);
  if (it == pairs_.end()) return unavailable(o_.self_name + ": no nccl kv channel to " + peer);
  auto d = it->second.out;
  auto done = std::make_shared<std::atomic<bool>>(false);
  const std::string self_name = o_.self_name;
  std::thread t([d, hold = std::move(hold), data, bytes, deadline, done, self_name, peer] {
    Status st = d->send(data, bytes, deadline);
    if (!st.ok()) {
      get_logger("kv")->warn("{}: nccl kv send of {} bytes to {} failed (the receiver retries over UCX): {}", self_name,
                             bytes, peer, st.to_string());
    }
    done->store(true);
  });
  threads_.push_back(Worker{std::move(t), done});
  return Status();
}

std::string KvNcclLinks::describe() const {
  return "nccl kv channels to " + std::to_string(pairs_.size()) + " peers (cuda:" + std::to_string(o_.cuda_device) + ")";
}

}  // namespace specserve
