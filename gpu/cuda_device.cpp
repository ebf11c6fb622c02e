// specserve gpu: the device queries and option parsers of gpu/cuda_backend.h.
#include <cuda_runtime_api.h>

#include <string>

#include "gpu/cuda_backend.h"

namespace specserve {

Expected<CudaMatmul> parse_cuda_matmul(const std::string& text) {
  if (text == "cublas") return CudaMatmul::kCublas;
  if (text == "batch_invariant") return CudaMatmul::kBatchInvariant;
  return invalid_argument("cuda matmul '" + text + "': expected cublas or batch_invariant");
}

const char* cuda_matmul_name(CudaMatmul m) { return m == CudaMatmul::kCublas ? "cublas" : "batch_invariant"; }

Expected<CudaWeights> parse_cuda_weights(const std::string& text) {
  if (text == "bf16") return CudaWeights::kBF16;
  if (text == "fp16") return CudaWeights::kF16;
  if (text == "fp32") return CudaWeights::kF32;
  return invalid_argument("cuda weights '" + text + "': expected bf16, fp16 or fp32");
}

const char* cuda_weights_name(CudaWeights w) {
  return w == CudaWeights::kBF16 ? "bf16" : w == CudaWeights::kF16 ? "fp16" : "fp32";
}

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // no driver / no device: not an error for the caller
    return 0;
  }
  return n;
}

Expected<CudaDeviceInfo> cuda_device_info(int device) {
  const int count = cuda_device_count();
  if (count == 0) {
    int driver = 0;
    const cudaError_t e = cudaDriverGetVersion(&driver);
    return unavailable(std::string("no CUDA device is present (") +
                       (e == cudaSuccess && driver == 0 ? "no NVIDIA driver" : "cudaGetDeviceCount found none") + ")");
  }
  if (device < 0 || device >= count) {
    return invalid_argument("cuda device " + std::to_string(device) + " does not exist: " + std::to_string(count) +
                            " device(s), ordinals 0.." + std::to_string(count - 1));
  }
  cudaDeviceProp p{};
  cudaError_t e = cudaGetDeviceProperties(&p, device);
  if (e != cudaSuccess) return internal_error("cudaGetDeviceProperties(" + std::to_string(device) + "): " + cudaGetErrorString(e));
  CudaDeviceInfo info;
  info.name = p.name;
  info.cc_major = p.major;
  info.cc_minor = p.minor;
  info.total_bytes = static_cast<int64_t>(p.totalGlobalMem);
  info.num_sms = p.multiProcessorCount;
  int clock_khz = 0, bus_bits = 0;
  cudaDeviceGetAttribute(&clock_khz, cudaDevAttrMemoryClockRate, device);
  cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, device);
  info.peak_bandwidth_gb_s = 2.0 * clock_khz * 1e3 * (bus_bits / 8.0) / 1e9;
  int prev = 0;
  cudaGetDevice(&prev);
  if (cudaSetDevice(device) == cudaSuccess) {
    size_t free_b = 0, total_b = 0;
    if (cudaMemGetInfo(&free_b, &total_b) == cudaSuccess) info.free_bytes = static_cast<int64_t>(free_b);
    cudaSetDevice(prev);
  }
  cudaGetLastError();
  return info;
}

}  // namespace specserve
