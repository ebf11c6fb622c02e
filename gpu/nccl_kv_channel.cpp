#include "gpu/nccl_kv_channel.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <string>

#include "gpu/nccl_group.h"

namespace specserve {
namespace {

class NcclKvChannelImpl final : public NcclKvChannel {
 public:
  explicit NcclKvChannelImpl(std::unique_ptr<gpu::NcclGroup> g) : g_(std::move(g)) {}
  int rank() const override { return g_->rank(); }
  int size() const override { return g_->size(); }
  bool failed() const override { return g_->failed(); }
  std::string describe() const override { return g_->name(); }

  Status send(const void* src, int64_t bytes, int peer, Deadline deadline) override {
    const char* op = "send";
    SPECSERVE_RETURN_IF_ERROR(check_args(op, bytes, peer));
    SPECSERVE_RETURN_IF_ERROR(g_->begin(op));
    if (bytes == 0) return Status();
    auto on_device = g_->on_device(src, "send's src");
    if (!on_device.ok()) return on_device.status();
    const void* buf = src;
    if (!*on_device) {
      auto staged = g_->scratch(1).get(static_cast<size_t>(bytes), "send's staging of host memory");
      if (!staged.ok()) return staged.status();
      buf = *staged;
      SPECSERVE_RETURN_IF_ERROR(g_->check_cuda(
          cudaMemcpyAsync(*staged, src, static_cast<size_t>(bytes), cudaMemcpyHostToDevice, g_->stream()), op,
          "cudaMemcpyAsync (host to device)"));
    }
    SPECSERVE_RETURN_IF_ERROR(g_->check_nccl(
        ncclSend(buf, static_cast<size_t>(bytes), ncclUint8, peer, g_->comm(), g_->stream()), op, "ncclSend"));
    return g_->wait(op, deadline);
  }

  Status recv(void* dst, int64_t bytes, int peer, Deadline deadline) override {
    const char* op = "recv";
    SPECSERVE_RETURN_IF_ERROR(check_args(op, bytes, peer));
    SPECSERVE_RETURN_IF_ERROR(g_->begin(op));
    if (bytes == 0) return Status();
    auto on_device = g_->on_device(dst, "recv's dst");
    if (!on_device.ok()) return on_device.status();
    void* buf = dst;
    if (!*on_device) {
      auto staged = g_->scratch(1).get(static_cast<size_t>(bytes), "recv's staging of host memory");
      if (!staged.ok()) return staged.status();
      buf = *staged;
    }
    SPECSERVE_RETURN_IF_ERROR(g_->check_nccl(
        ncclRecv(buf, static_cast<size_t>(bytes), ncclUint8, peer, g_->comm(), g_->stream()), op, "ncclRecv"));
    SPECSERVE_RETURN_IF_ERROR(g_->wait(op, deadline));
    if (buf == dst) return Status();
    // The receive is complete and the stream idle: the copy to (pageable) host memory cannot wait
    // on the peer.
    SPECSERVE_RETURN_IF_ERROR(g_->check_cuda(
        cudaMemcpyAsync(dst, buf, static_cast<size_t>(bytes), cudaMemcpyDeviceToHost, g_->stream()), op,
        "cudaMemcpyAsync (device to host)"));
    return g_->wait(op, deadline);
  }

 private:
  Status check_args(const char* op, int64_t bytes, int peer) const {
    if (bytes < 0) return invalid_argument(g_->name() + ": " + op + ": bytes = " + std::to_string(bytes) + " < 0");
    if (peer < 0 || peer >= size() || peer == rank()) {
      return invalid_argument(g_->name() + ": " + op + ": peer " + std::to_string(peer) + " is " +
                              (peer == rank() ? "this rank" : "outside the group of " + std::to_string(size())));
    }
    return Status();
  }

  std::unique_ptr<gpu::NcclGroup> g_;
};

}  // namespace

Expected<std::unique_ptr<NcclKvChannel>> make_nccl_kv_channel(int rank, int size, int cuda_device,
                                                              std::shared_ptr<RendezvousStore> store,
                                                              const NcclOptions& options) {
  auto g = gpu::NcclGroup::create("nccl kv channel", rank, size, cuda_device, std::move(store), options);
  if (!g.ok()) return g.status();
  return std::unique_ptr<NcclKvChannel>(new NcclKvChannelImpl(std::move(*g)));
}

}  // namespace specserve
