#include "kv/transport.h"

#include <cstring>

namespace specserve {
namespace {

class InProcessEndpoint final : public KvEndpoint {
 public:
  Status get(void* dst, int64_t bytes, const KvRemoteRegion& remote, int64_t remote_offset, KvDeadline) override {
    SPECSERVE_RETURN_IF_ERROR(check_region_range(remote, remote_offset, bytes));
    std::memcpy(dst, reinterpret_cast<const char*>(remote.base) + remote_offset, static_cast<size_t>(bytes));
    return Status();
  }
  Status put(const void* src, int64_t bytes, const KvRemoteRegion& remote, int64_t remote_offset, KvDeadline) override {
    SPECSERVE_RETURN_IF_ERROR(check_region_range(remote, remote_offset, bytes));
    std::memcpy(reinterpret_cast<char*>(remote.base) + remote_offset, src, static_cast<size_t>(bytes));
    return Status();
  }
  bool failed() const override { return false; }
  std::string describe() const override { return "in-process"; }
};

}  // namespace

std::unique_ptr<KvEndpoint> make_in_process_endpoint() { return std::make_unique<InProcessEndpoint>(); }

KvRemoteRegion in_process_region(void* base, int64_t bytes) {
  KvRemoteRegion r;
  r.base = reinterpret_cast<uint64_t>(base);
  r.bytes = static_cast<uint64_t>(bytes);
  return r;
}

Status check_region_range(const KvRemoteRegion& region, int64_t offset, int64_t bytes) {
  if (offset < 0 || bytes < 0 || static_cast<uint64_t>(offset) > region.bytes ||
      static_cast<uint64_t>(bytes) > region.bytes - static_cast<uint64_t>(offset)) {
    return invalid_argument("kv transfer: range [" + std::to_string(offset) + ", +" + std::to_string(bytes) +
                            ") outside the remote region of " + std::to_string(region.bytes) + " bytes");
  }
  return Status();
}

const char* kv_transport_name(KvTransport t) {
  switch (t) {
    case KvTransport::kInProcess: return "in-process";
    case KvTransport::kUcx: return "ucx";
    case KvTransport::kNccl: return "nccl";
  }
  return "unknown";
}

KvTransport choose_kv_transport(const KvPlace& src, const KvPlace& dst) {
  if (src.process != 0 && src.process == dst.process) return KvTransport::kInProcess;
  const bool both_gpus = src.cuda_device >= 0 && dst.cuda_device >= 0;
  const bool same_machine = !src.machine.empty() && !dst.machine.empty() ? src.machine == dst.machine : src.node == dst.node;
  const bool same_gpu = both_gpus && same_machine && src.cuda_device == dst.cuda_device;
  if (both_gpus && src.nccl && dst.nccl && !same_gpu) return KvTransport::kNccl;
  return KvTransport::kUcx;
}

}  // namespace specserve
