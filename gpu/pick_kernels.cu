// specserve gpu: the kernel of Backend::argmax_rows and Backend::sample_rows — a greedy or
// temperature-only token from each logit row on the device, the CPU's exact steps
// (model/sampling.h greedy_pick, temperature_pick), so only the token and its logprob reach the
// host. Apart from kernels.cu because it changes with the sampler (model/sampling.cpp), not with
// the model's ops. Compiled without fast math, like kernels.cu.
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cmath>

#include "gpu/kernels.h"

namespace specserve::gpu {
namespace {

constexpr int kThreads = 256;  // one block per row

// greedy_pick's exp (exp_scalar in model/sampling.cpp: Cephes expf for x <= 0, x < -87 gives 0),
// operation for operation. The _rn intrinsics keep nvcc from contracting a multiply and an add
// into an fma that the CPU does not do, so every exp has the CPU's bits.
__device__ __forceinline__ float exp_nonpositive(float x) {
  constexpr float kExpLo = -87.0f, kLog2e = 1.44269504088896341f, kRound = 12582912.0f;
  constexpr float kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
  constexpr float kP0 = 1.9875691500e-4f, kP1 = 1.3981999507e-3f, kP2 = 8.3334519073e-3f, kP3 = 4.1665795894e-2f,
                  kP4 = 1.6666665459e-1f, kP5 = 5.0000001201e-1f;
  const bool under = x < kExpLo;
  x = fmaxf(x, kExpLo);
  const float n = __fsub_rn(__fmaf_rn(x, kLog2e, kRound), kRound);
  float r = __fmaf_rn(n, -kLn2Hi, x);
  r = __fmaf_rn(n, -kLn2Lo, r);
  float y = __fmaf_rn(kP0, r, kP1);
  y = __fmaf_rn(y, r, kP2);
  y = __fmaf_rn(y, r, kP3);
  y = __fmaf_rn(y, r, kP4);
  y = __fmaf_rn(y, r, kP5);
  y = __fadd_rn(__fmaf_rn(y, __fmul_rn(r, r), r), 1.0f);
  const float scale = __int_as_float((static_cast<int>(n) + 127) << 23);
  return under ? 0.0f : __fmul_rn(y, scale);
}

constexpr int kLseChunk = 1024;  // exp_sum's flush interval (kFlush in model/sampling.cpp)
constexpr int kLseLanes = 8;     // its float lanes (one AVX2 register)

// The float lanes of exp_sum (model/sampling.cpp) over a row, into lanes[chunk * 8 + j]: one
// thread per (chunk of 1024, lane j) sums e_i = exp((x_i - mx) * scale), times f when f > 0
// (scale_by's renormalised probabilities), for i = chunk + j, chunk + j + 8, ... in order from
// 0.0f, as the CPU's lane j does (its AVX2 loop and its remainder loop alike).
__device__ void exp_lanes(const float* row, int64_t cols, float mx, float scale, float f, float* lanes) {
  const int64_t chunks = (cols + kLseChunk - 1) / kLseChunk;
  for (int64_t item = threadIdx.x; item < chunks * kLseLanes; item += blockDim.x) {
    const int64_t end = min(cols, (item / kLseLanes + 1) * kLseChunk);
    float acc = 0.0f;
    for (int64_t i = (item / kLseLanes) * kLseChunk + item % kLseLanes; i < end; i += kLseLanes) {
      float e = exp_nonpositive(__fmul_rn(__fsub_rn(row[i], mx), scale));
      if (f > 0.0f) e = __fmul_rn(e, f);
      acc = __fadd_rn(acc, e);
    }
    lanes[item] = acc;
  }
}

// flush_lanes of chunk c: its 8 lanes added into a double in lane order.
__device__ __forceinline__ double chunk_total(const float* lanes, int64_t c) {
  double s = 0.0;
  for (int j = 0; j < kLseLanes; ++j) s += static_cast<double>(lanes[c * kLseLanes + j]);
  return s;
}

// One block of kThreads per row: Backend::argmax_rows (temperature == nullptr) and
// Backend::sample_rows, the steps of greedy_pick / temperature_pick (model/sampling.cpp):
//  1. argmax (each thread walks its indices upwards and keeps the first maximum; the merges
//     prefer the lower index on equal values) and the row's validity;
//  2. the raw normaliser log_z = mx + log(sum exp(x - mx)) from exp_lanes, summed by thread 0
//     in the CPU's order;
//  greedy rows stop here; sampled rows (temperature >= 1e-5) go on as compute_probs and
//  draw_inverse_cdf do:
//  3. S = exp_sum at scale 1 / temperature, f = float(1 / S);
//  4. the lanes of p_i = exp((x_i - mx) / T) * f give each chunk's total; thread 0 walks the
//     chunks with a running double prefix to the first whose prefix + total exceeds u * total;
//     the block writes that chunk's p_i to shared memory and thread 0 scans it in index order
//     (a chunk that rounding leaves without a token hands on to the next); else the last index
//     with p_i > 0.
// Dynamic shared memory: chunks * 8 + 1024 floats.
__global__ void pick_rows_kernel(const float* x, int64_t cols, const float* temperature, const double* uniform,
                                 int32_t* token, float* logprob) {
  extern __shared__ float shared[];
  const int64_t chunks = (cols + kLseChunk - 1) / kLseChunk;
  float* lanes = shared;                          // [chunks * 8]
  float* chunk_p = shared + chunks * kLseLanes;   // [1024]
  __shared__ float warp_best[kThreads / 32];
  __shared__ int warp_index[kThreads / 32];
  __shared__ float row_max, inv_sum;
  __shared__ int row_token, last_positive, scan_chunk, result;
  __shared__ double log_z, prefix, target;
  const float* row = x + static_cast<int64_t>(blockIdx.x) * cols;
  float best = -INFINITY;
  int index = INT_MAX;
  int bad = 0, finite = 0;
  for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) {
    const float v = row[i];
    bad |= (v != v) || (v == INFINITY);
    finite |= v > -INFINITY;
    if (v > best) best = v, index = static_cast<int>(i);
  }
  bad = __syncthreads_or(bad);
  finite = __syncthreads_or(finite);
  if (bad || !finite) {
    if (threadIdx.x == 0) token[blockIdx.x] = -1, logprob[blockIdx.x] = 0.0f;
    return;  // uniform across the block
  }
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  for (int off = 16; off > 0; off >>= 1) {
    const float ob = __shfl_xor_sync(0xffffffffu, best, off);
    const int oi = __shfl_xor_sync(0xffffffffu, index, off);
    if (ob > best || (ob == best && oi < index)) best = ob, index = oi;
  }
  if (lane == 0) warp_best[warp] = best, warp_index[warp] = index;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kThreads / 32; ++w) {
      if (warp_best[w] > best || (warp_best[w] == best && warp_index[w] < index)) best = warp_best[w], index = warp_index[w];
    }
    row_max = best;
    row_token = index;
    last_positive = -1;
  }
  __syncthreads();
  const float mx = row_max;
  exp_lanes(row, cols, mx, 1.0f, 0.0f, lanes);
  __syncthreads();
  if (threadIdx.x == 0) {
    double total = 0.0;
    for (int64_t c = 0; c < chunks; ++c) total += chunk_total(lanes, c);
    log_z = static_cast<double>(mx) + log(total);
  }
  __syncthreads();
  const float t = temperature ? temperature[blockIdx.x] : 0.0f;
  if (!(t >= 1e-5f)) {  // greedy (kGreedyTemperature in model/sampling.cpp)
    if (threadIdx.x == 0) {
      token[blockIdx.x] = row_token;
      logprob[blockIdx.x] = static_cast<float>(static_cast<double>(row[row_token]) - log_z);
    }
    return;  // uniform across the block
  }
  const float inv_t = __fdiv_rn(1.0f, t);
  exp_lanes(row, cols, mx, inv_t, 0.0f, lanes);
  __syncthreads();
  if (threadIdx.x == 0) {
    double total = 0.0;
    for (int64_t c = 0; c < chunks; ++c) total += chunk_total(lanes, c);
    inv_sum = static_cast<float>(1.0 / total);
  }
  __syncthreads();
  const float f = inv_sum;
  exp_lanes(row, cols, mx, inv_t, f, lanes);
  int last = -1;  // this thread's last index with p > 0
  for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) {
    if (__fmul_rn(exp_nonpositive(__fmul_rn(__fsub_rn(row[i], mx), inv_t)), f) > 0.0f) last = static_cast<int>(i);
  }
  __syncthreads();
  atomicMax(&last_positive, last);
  if (threadIdx.x == 0) {
    double total = 0.0;
    for (int64_t c = 0; c < chunks; ++c) total += chunk_total(lanes, c);
    target = uniform[blockIdx.x] * total;
    double pre = 0.0;
    int64_t c = 0;
    while (c < chunks && !(pre + chunk_total(lanes, c) > target)) pre += chunk_total(lanes, c), ++c;
    prefix = pre;
    scan_chunk = static_cast<int>(c);
    result = -1;
  }
  __syncthreads();
  while (scan_chunk < chunks) {  // every thread reads the same shared values
    const int64_t c0 = static_cast<int64_t>(scan_chunk) * kLseChunk, end = min(cols, c0 + kLseChunk);
    for (int64_t i = c0 + threadIdx.x; i < end; i += blockDim.x) {
      chunk_p[i - c0] = __fmul_rn(exp_nonpositive(__fmul_rn(__fsub_rn(row[i], mx), inv_t)), f);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      double cum = prefix;
      for (int64_t i = c0; i < end && result < 0; ++i) {
        const float p = chunk_p[i - c0];
        if (p <= 0.0f) continue;
        cum += p;
        if (cum > target) result = static_cast<int>(i);
      }
      if (result >= 0) {
        scan_chunk = static_cast<int>(chunks);
      } else {  // on to the next chunk whose prefix + total exceeds target
        double pre = prefix + chunk_total(lanes, scan_chunk);
        int64_t c = scan_chunk + 1;
        while (c < chunks && !(pre + chunk_total(lanes, c) > target)) pre += chunk_total(lanes, c), ++c;
        prefix = pre;
        scan_chunk = static_cast<int>(c);
      }
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    const int tok = result >= 0 ? result : last_positive;
    token[blockIdx.x] = tok;
    logprob[blockIdx.x] = static_cast<float>(static_cast<double>(row[tok]) - log_z);
  }
}

}  // namespace

void launch_argmax_rows(const float* x, int64_t rows, int64_t cols, int32_t* token, float* logprob, cudaStream_t stream) {
  launch_sample_rows(x, rows, cols, nullptr, nullptr, token, logprob, stream);
}

void launch_sample_rows(const float* x, int64_t rows, int64_t cols, const float* temperature, const double* uniform,
                        int32_t* token, float* logprob, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return;
  const int64_t chunks = (cols + kLseChunk - 1) / kLseChunk;
  // <= 36 KiB for cols <= 2^20 (under the 48 KiB a kernel may use without opting in)
  const size_t shared = static_cast<size_t>(chunks * kLseLanes + kLseChunk) * sizeof(float);
  pick_rows_kernel<<<static_cast<unsigned>(rows), kThreads, shared, stream>>>(x, cols, temperature, uniform, token, logprob);
}

}  // namespace specserve::gpu
