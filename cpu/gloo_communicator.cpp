#include "cpu/gloo_communicator.h"

#include <gloo/allgather.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>

#include <cstring>
#include <exception>
#include <stdexcept>
#include <vector>

namespace specserve {
namespace {

// Gloo's Store interface over a RendezvousStore (errors become exceptions, which Gloo expects
// and make_gloo_communicator turns back into a Status).
class StoreAdapter final : public gloo::rendezvous::Store {
 public:
  StoreAdapter(std::shared_ptr<RendezvousStore> store, std::string prefix, std::chrono::milliseconds timeout)
      : store_(std::move(store)), prefix_(std::move(prefix)), timeout_(timeout) {}
  void set(const std::string& key, const std::vector<char>& data) override {
    Status st = store_->set(prefix_ + "/" + key, data);
    if (!st.ok()) throw std::runtime_error(st.to_string());
  }
  std::vector<char> get(const std::string& key) override {
    auto v = store_->get(prefix_ + "/" + key, timeout_);
    if (!v.ok()) throw std::runtime_error(v.status().to_string());
    return std::move(*v);
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    for (const auto& k : keys) {
      auto v = store_->get(prefix_ + "/" + k, timeout);
      if (!v.ok()) throw std::runtime_error(v.status().to_string());
    }
  }

 private:
  std::shared_ptr<RendezvousStore> store_;
  std::string prefix_;
  std::chrono::milliseconds timeout_;
};

class GlooCommunicator final : public Communicator {
 public:
  GlooCommunicator(std::shared_ptr<gloo::Context> ctx, std::string name)
      : ctx_(std::move(ctx)), name_(std::move(name)) {}
  int rank() const override { return ctx_->rank; }
  int size() const override { return ctx_->size; }

  Status all_reduce_sum(float* data, int64_t n) override {
    if (n < 0) return invalid_argument("all_reduce_sum: n = " + std::to_string(n) + " < 0");
    if (size() == 1 || n == 0) return Status();
    return guarded("all_reduce_sum", [&] {
      const size_t p = static_cast<size_t>(size()), m = static_cast<size_t>(n);
      if (gathered_.size() < p * m) gathered_.resize(p * m);
      gloo::AllgatherOptions o(ctx_);
      o.setInput(data, m);
      o.setOutput(gathered_.data(), p * m);
      o.setTag(next_tag());
      gloo::allgather(o);
      // Rank order for every element (see the file comment of gloo_communicator.h).
      const float* g = gathered_.data();
      for (size_t i = 0; i < m; ++i) {
        float s = g[i];
        for (size_t r = 1; r < p; ++r) s += g[r * m + i];
        data[i] = s;
      }
    });
  }

  Status broadcast(void* data, int64_t bytes, int root) override {
    if (root < 0 || root >= size()) {
      return invalid_argument("broadcast: root " + std::to_string(root) + " is outside a group of " + std::to_string(size()));
    }
    if (bytes < 0) return invalid_argument("broadcast: bytes = " + std::to_string(bytes) + " < 0");
    if (size() == 1 || bytes == 0) return Status();
    return guarded("broadcast", [&] {
      gloo::BroadcastOptions o(ctx_);
      o.setOutput(static_cast<char*>(data), static_cast<size_t>(bytes));
      o.setRoot(root);
      o.setTag(next_tag());
      gloo::broadcast(o);
    });
  }

  Status barrier() override {
    if (size() == 1) return Status();
    return guarded("barrier", [&] {
      gloo::BarrierOptions o(ctx_);
      o.setTag(next_tag());
      gloo::barrier(o);
    });
  }

 private:
  template <typename F>
  Status guarded(const char* op, F&& f) {
    if (!broken_.empty()) return unavailable(name_ + ": " + op + ": the communicator failed earlier: " + broken_);
    try {
      f();
      return Status();
    } catch (const std::exception& e) {
      broken_ = e.what();
      return unavailable(name_ + ": " + op + ": " + e.what());
    }
  }
  // Collectives run one at a time, so tags only need to differ between consecutive ones.
  uint32_t next_tag() { return tag_++ & 0xffffu; }

  std::shared_ptr<gloo::Context> ctx_;
  std::string name_;
  std::vector<float> gathered_;  // [size, n] scratch of all_reduce_sum
  uint32_t tag_ = 0;
  std::string broken_;
};

}  // namespace

Expected<std::unique_ptr<Communicator>> make_gloo_communicator(int rank, int size, std::shared_ptr<RendezvousStore> store,
                                                               const GlooOptions& options) {
  if (size < 1) return invalid_argument("gloo communicator: size = " + std::to_string(size) + " < 1");
  if (rank < 0 || rank >= size) {
    return invalid_argument("gloo communicator: rank = " + std::to_string(rank) + " is outside [0, " + std::to_string(size) + ")");
  }
  if (!store) return invalid_argument("gloo communicator: store is null");
  const std::string name = "gloo group '" + options.prefix + "' rank " + std::to_string(rank) + "/" + std::to_string(size);
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = options.hostname;
    auto dev = gloo::transport::tcp::CreateDevice(attr);
    auto ctx = std::make_shared<gloo::rendezvous::Context>(rank, size);
    ctx->setTimeout(options.timeout);
    StoreAdapter adapter(std::move(store), options.prefix, options.timeout);
    ctx->connectFullMesh(adapter, dev);
    return std::unique_ptr<Communicator>(new GlooCommunicator(std::move(ctx), name));
  } catch (const std::exception& e) {
    const std::string what = e.what();
    if (what.find("did not appear") != std::string::npos) return deadline_exceeded(name + ": rendezvous: " + what);
    return unavailable(name + ": connect: " + what);
  }
}

}  // namespace specserve
