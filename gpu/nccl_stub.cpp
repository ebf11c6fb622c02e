// specserve gpu: the NCCL factories of a build without NCCL (gpu/CMakeLists.txt compiles this
// file instead of gpu/nccl_*.cpp when nccl.h or libnccl is not found).
#include "gpu/nccl_communicator.h"
#include "gpu/nccl_kv_channel.h"

namespace specserve {
namespace {

Status no_nccl(const char* what) {
  return unsupported(std::string(what) +
                     ": this build has no NCCL (nccl.h / libnccl.so were not found in the CUDA toolkit or the "
                     "system when it was configured, or SPECSERVE_NCCL=OFF); install NCCL (CUDA's nccl or Debian's "
                     "libnccl-dev) and reconfigure");
}

}  // namespace

int nccl_version() { return 0; }

Expected<std::unique_ptr<Communicator>> make_nccl_communicator(int, int, int, std::shared_ptr<RendezvousStore>,
                                                               const NcclOptions&) {
  return no_nccl("nccl communicator");
}

Expected<std::unique_ptr<NcclKvChannel>> make_nccl_kv_channel(int, int, int, std::shared_ptr<RendezvousStore>,
                                                              const NcclOptions&) {
  return no_nccl("nccl kv channel");
}

}  // namespace specserve
