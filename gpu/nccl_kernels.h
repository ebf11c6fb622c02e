// specserve gpu: the kernel of the NCCL communicator's rank-order all-reduce
// (gpu/nccl_communicator.h explains why it is an allgather plus this sum, not ncclAllReduce).
//
// Internal to gpu/: included by gpu/nccl_communicator.cpp and gpu/nccl_kernels.cu only. Its CPU
// reference is the rank-order loop of cpu/gloo_communicator.cpp (and the test's own sum in
// tests/gpu/nccl_test.cpp).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace specserve::gpu {

/// out[i] = ((g[0, i] + g[1, i]) + g[2, i]) + ... + g[p - 1, i] for i < n, with g [p, n] fp32
/// (device pointers; out must not overlap g): IEEE fp32 adds in rank order, so the bits equal a
/// CPU's loop in the same order. Enqueues on `stream` and returns at once (launch errors:
/// cudaGetLastError).
void launch_sum_rank_order(const float* g, int64_t p, int64_t n, float* out, cudaStream_t stream);

}  // namespace specserve::gpu
