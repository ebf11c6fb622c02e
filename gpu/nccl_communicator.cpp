#include "gpu/nccl_communicator.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <string>

#include "gpu/nccl_group.h"
#include "gpu/nccl_kernels.h"

namespace specserve {
namespace {

class NcclCommunicator final : public Communicator {
 public:
  explicit NcclCommunicator(std::unique_ptr<gpu::NcclGroup> g) : g_(std::move(g)) {}
  int rank() const override { return g_->rank(); }
  int size() const override { return g_->size(); }

  // data [n] fp32 -> allgather into gathered [size, n] -> rank-order sum back into data (see the
  // file comment of gpu/nccl_communicator.h). Host memory goes through staged [n].
  Status all_reduce_sum(float* data, int64_t n) override {
    const char* op = "all_reduce_sum";
    if (n < 0) return invalid_argument(g_->name() + ": all_reduce_sum: n = " + std::to_string(n) + " < 0");
    SPECSERVE_RETURN_IF_ERROR(g_->begin(op));
    if (n == 0) return Status();
    const auto deadline = g_->default_deadline();
    auto on_device = g_->on_device(data, "all_reduce_sum's data");
    if (!on_device.ok()) return on_device.status();
    const size_t bytes = static_cast<size_t>(n) * sizeof(float);
    float* buf = data;
    if (!*on_device) {
      auto staged = g_->scratch(1).get(bytes, "all_reduce_sum's staging of host memory");
      if (!staged.ok()) return staged.status();
      buf = static_cast<float*>(*staged);
      SPECSERVE_RETURN_IF_ERROR(g_->check_cuda(cudaMemcpyAsync(buf, data, bytes, cudaMemcpyHostToDevice, g_->stream()),
                                               op, "cudaMemcpyAsync (host to device)"));
    }
    auto gathered = g_->scratch(0).get(bytes * static_cast<size_t>(size()), "all_reduce_sum's gathered ranks");
    if (!gathered.ok()) return gathered.status();
    float* all = static_cast<float*>(*gathered);  // [size, n]
    SPECSERVE_RETURN_IF_ERROR(g_->check_nccl(
        ncclAllGather(buf, all, static_cast<size_t>(n), ncclFloat32, g_->comm(), g_->stream()), op, "ncclAllGather"));
    // The sum must follow the gather on the stream: wait until NCCL has enqueued it.
    SPECSERVE_RETURN_IF_ERROR(g_->wait_enqueued(op, deadline));
    gpu::launch_sum_rank_order(all, size(), n, buf, g_->stream());
    SPECSERVE_RETURN_IF_ERROR(g_->check_cuda(cudaGetLastError(), op, "the rank-order sum kernel's launch"));
    SPECSERVE_RETURN_IF_ERROR(g_->wait(op, deadline));
    if (buf != data) return copy_out(op, data, buf, bytes, deadline);
    return Status();
  }

  Status broadcast(void* data, int64_t bytes, int root) override {
    const char* op = "broadcast";
    if (root < 0 || root >= size()) {
      return invalid_argument(g_->name() + ": broadcast: root " + std::to_string(root) + " is outside a group of " +
                              std::to_string(size()));
    }
    if (bytes < 0) return invalid_argument(g_->name() + ": broadcast: bytes = " + std::to_string(bytes) + " < 0");
    SPECSERVE_RETURN_IF_ERROR(g_->begin(op));
    if (bytes == 0) return Status();
    const auto deadline = g_->default_deadline();
    auto on_device = g_->on_device(data, "broadcast's data");
    if (!on_device.ok()) return on_device.status();
    void* buf = data;
    if (!*on_device) {
      auto staged = g_->scratch(1).get(static_cast<size_t>(bytes), "broadcast's staging of host memory");
      if (!staged.ok()) return staged.status();
      buf = *staged;
      if (rank() == root) {
        SPECSERVE_RETURN_IF_ERROR(g_->check_cuda(
            cudaMemcpyAsync(buf, data, static_cast<size_t>(bytes), cudaMemcpyHostToDevice, g_->stream()), op,
            "cudaMemcpyAsync (host to device)"));
      }
    }
    SPECSERVE_RETURN_IF_ERROR(g_->check_nccl(
        ncclBroadcast(buf, buf, static_cast<size_t>(bytes), ncclUint8, root, g_->comm(), g_->stream()), op,
        "ncclBroadcast"));
    SPECSERVE_RETURN_IF_ERROR(g_->wait(op, deadline));
    if (buf != data && rank() != root) return copy_out(op, data, buf, static_cast<size_t>(bytes), deadline);
    return Status();
  }

  // NCCL has no barrier: an all-reduce of one int32 that every rank must join.
  Status barrier() override {
    const char* op = "barrier";
    SPECSERVE_RETURN_IF_ERROR(g_->begin(op));
    const auto deadline = g_->default_deadline();
    auto word = g_->scratch(2).get(sizeof(int32_t), "barrier's word");
    if (!word.ok()) return word.status();
    SPECSERVE_RETURN_IF_ERROR(
        g_->check_cuda(cudaMemsetAsync(*word, 0, sizeof(int32_t), g_->stream()), op, "cudaMemsetAsync"));
    SPECSERVE_RETURN_IF_ERROR(
        g_->check_nccl(ncclAllReduce(*word, *word, 1, ncclInt32, ncclSum, g_->comm(), g_->stream()), op, "ncclAllReduce"));
    return g_->wait(op, deadline);
  }

 private:
  // Device -> host after the collective has completed: the stream is idle, so a copy to pageable
  // memory (which blocks the host until done) cannot wait on a stalled peer.
  Status copy_out(const char* op, void* host, const void* dev, size_t bytes, gpu::NcclDeadline deadline) {
    SPECSERVE_RETURN_IF_ERROR(g_->check_cuda(cudaMemcpyAsync(host, dev, bytes, cudaMemcpyDeviceToHost, g_->stream()), op,
                                             "cudaMemcpyAsync (device to host)"));
    return g_->wait(op, deadline);
  }

  std::unique_ptr<gpu::NcclGroup> g_;
};

}  // namespace

int nccl_version() {
  int v = 0;
  return ncclGetVersion(&v) == ncclSuccess ? v : 0;
}

Expected<std::unique_ptr<Communicator>> make_nccl_communicator(int rank, int size, int cuda_device,
                                                               std::shared_ptr<RendezvousStore> store,
                                                               const NcclOptions& options) {
  auto g = gpu::NcclGroup::create("nccl group", rank, size, cuda_device, std::move(store), options);
  if (!g.ok()) return g.status();
  return std::unique_ptr<Communicator>(new NcclCommunicator(std::move(*g)));
}

}  // namespace specserve
