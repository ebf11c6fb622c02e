// specserve gpu: the rank-order sum of the NCCL communicator (gpu/nccl_kernels.h).
// NOTE: __fadd_rn makes each add a separately rounded IEEE add that the compiler may not fuse
// or reorder; compiled without fast math, so subnormals are kept (no flush to zero) as on the CPU.
#include <cuda_runtime.h>

#include <algorithm>

#include "gpu/nccl_kernels.h"

namespace specserve::gpu {
namespace {

constexpr int kThreads = 256;

__global__ void sum_rank_order_kernel(const float* __restrict__ g, int64_t p, int64_t n, float* __restrict__ out) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    float s = g[i];
    for (int64_t r = 1; r < p; ++r) s = __fadd_rn(s, g[r * n + i]);
    out[i] = s;
  }
}

}  // namespace

void launch_sum_rank_order(const float* g, int64_t p, int64_t n, float* out, cudaStream_t stream) {
  if (n <= 0) return;
  const int64_t blocks = std::min<int64_t>((n + kThreads - 1) / kThreads, 4096);
  sum_rank_order_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(g, p, n, out);
}

}  // namespace specserve::gpu
