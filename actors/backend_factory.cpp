#include "actors/backend_factory.h"

#include <cstdlib>

#include "config/topology.h"
#include "cpu/cpu_backend.h"
#ifdef SPECSERVE_WITH_CUDA
#include "gpu/cuda_backend.h"
#endif

namespace specserve {

Expected<std::unique_ptr<Backend>> make_backend_for_device(const std::string& flag, const std::string& device,
                                                           int threads) {
  auto spec = parse_device(device);
  if (!spec.ok()) return invalid_argument(flag + " = '" + device + "': " + spec.status().message());
  if (spec->kind == DeviceKind::kCpu) return make_cpu_backend(threads);
#ifdef SPECSERVE_WITH_CUDA
  CudaBackendOptions opts;
  if (const char* mm = std::getenv("SPECSERVE_CUDA_MATMUL"); mm && *mm) {
    auto m = parse_cuda_matmul(mm);
    if (!m.ok()) return invalid_argument("SPECSERVE_CUDA_MATMUL: " + m.status().message());
    opts.matmul = *m;
  }
  if (const char* w = std::getenv("SPECSERVE_CUDA_WEIGHTS"); w && *w) {
    auto v = parse_cuda_weights(w);
    if (!v.ok()) return invalid_argument("SPECSERVE_CUDA_WEIGHTS: " + v.status().message());
    opts.weights = *v;
  }
  auto b = make_cuda_backend(spec->index, opts);
  if (!b.ok()) return Status(b.status().code(), flag + " = '" + device + "': " + b.status().message());
  return std::move(*b);
#else
  return unavailable(flag + " = '" + device + "': this specserve was built without the CUDA backend (nvcc not found at configure time)");
#endif
}

Status check_device_available(const std::string& flag, const std::string& device) {
  auto spec = parse_device(device);
  if (!spec.ok()) return invalid_argument(flag + " = '" + device + "': " + spec.status().message());
  if (spec->kind == DeviceKind::kCpu) return Status();
#ifdef SPECSERVE_WITH_CUDA
  auto info = cuda_device_info(spec->index);
  if (!info.ok()) return Status(info.status().code(), flag + " = '" + device + "': " + info.status().message());
  return Status();
#else
  return unavailable(flag + " = '" + device + "': this specserve was built without the CUDA backend (nvcc not found at configure time)");
#endif
}

Expected<DeviceMemory> device_memory(const std::string& device) {
  auto spec = parse_device(device);
  if (!spec.ok()) return invalid_argument("device '" + device + "': " + spec.status().message());
  if (spec->kind == DeviceKind::kCpu) return unsupported("device 'cpu': host memory is not planned");
#ifdef SPECSERVE_WITH_CUDA
  auto info = cuda_device_info(spec->index);
  if (!info.ok()) return Status(info.status().code(), "device '" + device + "': " + info.status().message());
  return DeviceMemory{info->total_bytes, info->free_bytes};
#else
  return unavailable("device '" + device + "': this specserve was built without the CUDA backend (nvcc not found at configure time)");
#endif
}

}  // namespace specserve
