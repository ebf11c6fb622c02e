// specserve gpu: the CUDA kernels of CudaBackend, kernels first, launchers after.
//
// One plain kernel per op, written to be checked by reading: each mirrors the CpuBackend op of
// the same name (cpu/cpu_backend.cpp), which is its test oracle (tests/gpu/cuda_backend_test.cpp).
// Every reduction has a fixed order that depends on the op's shape only (never on the number
// of rows in the call), so the Backend determinism contract holds for these kernels.
// NOTE: compiled without fast math: expf/cosf/sinf/sqrtf and division are the IEEE-accurate
// versions, so results stay within a few ulp of the CPU's libm.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>

#include "gpu/kernels.h"

namespace specserve::gpu {
namespace {

constexpr int kThreads = 256;         // block size of the simple row kernels (a power of two)
constexpr int kMatmulWarps = 8;       // output features per matmul block (one warp each)
constexpr int kMatmulRows = 4;        // activation rows per pass over a weight row
constexpr int kAttnWarps = 4;         // warps per (row, head) attention block
constexpr int kMaxHeadDim = 256;      // attention: floats per head at most
constexpr int kMaxPerLane = kMaxHeadDim / 32;

__device__ __forceinline__ float load_w(const void* w, WeightType t, int64_t i) {
  if (t == WeightType::kBF16) return __bfloat162float(static_cast<const __nv_bfloat16*>(w)[i]);
  if (t == WeightType::kF16) return __half2float(static_cast<const __half*>(w)[i]);
  return static_cast<const float*>(w)[i];
}

// Grid-stride loop bounds for the element-wise kernels.
__device__ __forceinline__ int64_t first_index() { return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; }
__device__ __forceinline__ int64_t stride() { return static_cast<int64_t>(gridDim.x) * blockDim.x; }

// Sum over the 32 lanes of a warp; every lane ends with the same bits (each butterfly step adds
// the same two values on both lanes of a pair, and float addition is commutative).
__device__ __forceinline__ float warp_sum(float v) {
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

__global__ void f32_to_bf16_kernel(const float* x, __nv_bfloat16* y, int64_t n) {
  for (int64_t i = first_index(); i < n; i += stride()) y[i] = __float2bfloat16_rn(x[i]);
}

__global__ void f32_to_f16_kernel(const float* x, __half* y, int64_t n) {
  for (int64_t i = first_index(); i < n; i += stride()) y[i] = __float2half_rn(x[i]);
}

// Eight 16-bit weights (one 16-byte load) as floats.
template <WeightType kType>
__device__ __forceinline__ void unpack8(const uint4& raw, float* wf) {
#pragma unroll
  for (int p = 0; p < 4; ++p) {
    float2 f;
    if constexpr (kType == WeightType::kBF16) {
      f = __bfloat1622float2(reinterpret_cast<const __nv_bfloat162*>(&raw)[p]);
    } else {
      f = __half22float2(reinterpret_cast<const __half2*>(&raw)[p]);
    }
    wf[2 * p] = f.x;
    wf[2 * p + 1] = f.y;
  }
}

// One block per token: out[i, :] = table[ids[i], :].
__global__ void embedding_kernel(const void* table, WeightType t, int64_t rows, int64_t cols, const int32_t* ids,
                                 float* out, int32_t* err) {
  const int64_t i = blockIdx.x;
  const int32_t id = ids[i];
  float* o = out + i * cols;
  if (id < 0 || id >= rows) {
    if (threadIdx.x == 0) atomicOr(err, kErrTokenId);
    for (int64_t e = threadIdx.x; e < cols; e += blockDim.x) o[e] = NAN;
    return;
  }
  for (int64_t e = threadIdx.x; e < cols; e += blockDim.x) o[e] = load_w(table, t, static_cast<int64_t>(id) * cols + e);
}

// One block of kThreads per row. The sum of squares is taken in double, as llama.cpp and the CPU
// reference do, with a fixed tree order.
__global__ void rms_norm_kernel(const float* x, const void* w, WeightType t, float eps, int64_t d, float* out) {
  __shared__ double partial[kThreads];
  const float* xi = x + static_cast<int64_t>(blockIdx.x) * d;
  float* oi = out + static_cast<int64_t>(blockIdx.x) * d;
  double ss = 0;
  for (int64_t e = threadIdx.x; e < d; e += blockDim.x) {
    const double v = xi[e];
    ss += v * v;
  }
  partial[threadIdx.x] = ss;
  __syncthreads();
  for (int s = kThreads / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) partial[threadIdx.x] += partial[threadIdx.x + s];
    __syncthreads();
  }
  const float scale = 1.0f / sqrtf(static_cast<float>(partial[0] / static_cast<double>(d)) + eps);
  for (int64_t e = threadIdx.x; e < d; e += blockDim.x) oi[e] = xi[e] * scale * load_w(w, t, e);
}

__global__ void add_bias_kernel(float* y, const void* bias, WeightType t, int64_t total, int64_t cols) {
  for (int64_t i = first_index(); i < total; i += stride()) y[i] += load_w(bias, t, i % cols);
}

// y[n, rows] = x[n, cols] * w[rows, cols]^T. One warp per output feature j; it walks the weight
// row once per group of kMatmulRows activation rows. Lane l sums, in ascending order, the
// products of the columns it owns (vectorised: the 8-column groups l, l+32, ...; scalar: the
// columns l, l+32, ...), then warp_sum adds the 32 partial sums. That order depends on `cols`
// alone, so a row's result is the same whatever `n` is and wherever the row sits in the batch.
// kVec: kF32 = the scalar loop (any type, any alignment); kBF16 / kF16 = 16-byte loads of 8
// weights of that type (cols % 8 == 0, rows and x 16-byte aligned).
template <WeightType kVec>
__global__ void matmul_rowwise_kernel(const void* w, WeightType t, int64_t rows, int64_t cols, const float* x, int64_t n,
                                      float* y) {
  const int lane = threadIdx.x & 31;
  const int64_t j = static_cast<int64_t>(blockIdx.x) * kMatmulWarps + (threadIdx.x >> 5);
  if (j >= rows) return;  // uniform across the warp
  for (int64_t i0 = 0; i0 < n; i0 += kMatmulRows) {
    const int nr = static_cast<int>(n - i0 < kMatmulRows ? n - i0 : kMatmulRows);
    float acc[kMatmulRows];
#pragma unroll
    for (int r = 0; r < kMatmulRows; ++r) acc[r] = 0.0f;
    if constexpr (kVec != WeightType::kF32) {
      // 16-bit weights, cols % 8 == 0, 16-byte aligned rows: 8 weights (one uint4) per step.
      const uint4* wr = reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(w) + j * cols);
      for (int64_t c = lane; c < cols / 8; c += 32) {
        const uint4 raw = wr[c];
        float wf[8];
        unpack8<kVec>(raw, wf);
#pragma unroll
        for (int r = 0; r < kMatmulRows; ++r) {
          if (r < nr) {
            const float4* xr = reinterpret_cast<const float4*>(x + (i0 + r) * cols) + 2 * c;
            const float4 a = xr[0], b = xr[1];
            float s = acc[r];
            s = fmaf(wf[0], a.x, s);
            s = fmaf(wf[1], a.y, s);
            s = fmaf(wf[2], a.z, s);
            s = fmaf(wf[3], a.w, s);
            s = fmaf(wf[4], b.x, s);
            s = fmaf(wf[5], b.y, s);
            s = fmaf(wf[6], b.z, s);
            s = fmaf(wf[7], b.w, s);
            acc[r] = s;
          }
        }
      }
    } else {
      for (int64_t k = lane; k < cols; k += 32) {
        const float wk = load_w(w, t, j * cols + k);
#pragma unroll
        for (int r = 0; r < kMatmulRows; ++r)
          if (r < nr) acc[r] = fmaf(wk, x[(i0 + r) * cols + k], acc[r]);
      }
    }
#pragma unroll
    for (int r = 0; r < kMatmulRows; ++r) {
      const float s = warp_sum(acc[r]);
      if (lane == 0 && r < nr) y[(i0 + r) * rows + j] = s;
    }
  }
}

// One block per token. The cos/sin table of the token's position is built in shared memory
// (gpu/rope_math.h: theta multiplied up pair by pair, as CpuBackend::rope), then every
// (head, pair) is rotated.
__global__ void rope_kernel(float* x, const int32_t* positions, int64_t num_heads, RopeKernelParams p) {
  extern __shared__ float cs[];  // [rope_dim]: cos, sin of each pair
  const int64_t i = blockIdx.x;
  const int npairs = p.rope_dim / 2;
  for (int pr = threadIdx.x; pr < npairs; pr += blockDim.x) {
    const float theta = rope_angle(positions[i], pr, p);
    cs[2 * pr] = cosf(theta) * p.mscale;
    cs[2 * pr + 1] = sinf(theta) * p.mscale;
  }
  __syncthreads();
  for (int64_t idx = threadIdx.x; idx < num_heads * npairs; idx += blockDim.x) {
    const int64_t h = idx / npairs;
    const int pr = static_cast<int>(idx % npairs);
    float* v = x + (i * num_heads + h) * p.head_dim;
    int a, b;
    rope_pair_dims(pr, p, &a, &b);
    const float c = cs[2 * pr], s = cs[2 * pr + 1];
    const float x0 = v[a], x1 = v[b];
    v[a] = x0 * c - x1 * s;
    v[b] = x0 * s + x1 * c;
  }
}

// One block per token.
__global__ void kv_write_kernel(KvView kv, int64_t layer, const float* k, const float* v, const int32_t* slots,
                                int32_t* err) {
  const int64_t i = blockIdx.x;
  const int64_t slot = slots[i];
  if (slot < 0 || slot >= kv.num_slots) {
    if (threadIdx.x == 0) atomicOr(err, kErrKvSlot);
    return;
  }
  const int64_t d = kv.kv_dim;
  float* kd = kv.k + (layer * kv.num_slots + slot) * d;
  float* vd = kv.v + (layer * kv.num_slots + slot) * d;
  for (int64_t e = threadIdx.x; e < d; e += blockDim.x) {
    kd[e] = k[i * d + e];
    vd[e] = v[i * d + e];
  }
}

// Attention over the keys a row sees (AttentionSeq: prefix + causal rows, or prefix + tree
// ancestors and itself), scores q.k / sqrt(hd) in fp32, softmax by online rescaling (Milakov &
// Gimelshein 2018). The keys are taken in chunks of kAttnChunk; within a chunk each of the
// kAttnWarps warps takes every kAttnWarps-th key and keeps its own running max, sum and weighted
// sum of values (lane owns dims lane, lane+32, ...); the warps' states are merged in warp order
// into the chunk's state (max cm, sum cl, values cacc). Chunk states are folded in chunk order
// (attn_fold). Two ways to run it, with the same float operations in the same order, so the
// same bits:
//   - attention_kernel<false>: one block per (row, head), block x = item, y = head, walking the
//     row's chunks itself;
//   - attention_kernel<true> + attention_combine_kernel: one block per (row, head, chunk) writes
//     its chunk state to a workspace, the combine folds them (flash-decoding's split over the
//     keys, Dao et al. 2023): many more blocks when few rows attend to many keys (decode).
// Which one runs depends on the batch; a row's result does not (the Backend determinism contract).
// NOTE: the sums are written with __fmaf_rn / __fmul_rn: the compiler may not contract them
// differently in the two kernels, which would break "the same bits".
constexpr int kAttnChunk = 128;                                // keys per chunk
constexpr int kAttnDimsPerThread = kMaxHeadDim / (kAttnWarps * 32);  // output dims a thread owns

// Folds a chunk state (cm, cl, cacc[] of the dims this thread owns) into the running state.
__device__ __forceinline__ void attn_fold(float& M, float& L, float* A, float cm, float cl, const float* cacc) {
  if (cm == -INFINITY) return;  // a chunk without keys
  const float mn = fmaxf(M, cm);
  const float a = M == -INFINITY ? 0.0f : expf(M - mn);
  const float b = expf(cm - mn);
  L = __fmaf_rn(L, a, __fmul_rn(cl, b));
#pragma unroll
  for (int k = 0; k < kAttnDimsPerThread; ++k) A[k] = __fmaf_rn(A[k], a, __fmul_rn(cacc[k], b));
  M = mn;
}

template <bool kSplit>
__global__ void attention_kernel(KvView kv, int64_t layer, const float* q, AttentionMeta m, int num_heads, int group,
                                 int head_dim, float scale, float* out, float* ws, int32_t* err) {
  const int h = blockIdx.y;
  const AttentionRow r = attention_row(m.meta, m.seqs_offset, static_cast<int32_t>(blockIdx.x));
  const int nk = r.num_keys;
  const int64_t row = r.row;
  const int kvh = h / group;

  __shared__ float qs[kMaxHeadDim];
  __shared__ float sm_m[kAttnWarps], sm_l[kAttnWarps];
  __shared__ float sm_acc[kAttnWarps][kMaxHeadDim];
  const float* qr = q + (row * num_heads + h) * head_dim;
  for (int e = threadIdx.x; e < head_dim; e += blockDim.x) qs[e] = qr[e];
  __syncthreads();

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const float* kbase = kv.k + layer * kv.num_slots * kv.kv_dim + static_cast<int64_t>(kvh) * head_dim;
  const float* vbase = kv.v + layer * kv.num_slots * kv.kv_dim + static_cast<int64_t>(kvh) * head_dim;
  float M = -INFINITY, L = 0.0f, A[kAttnDimsPerThread];
#pragma unroll
  for (int k = 0; k < kAttnDimsPerThread; ++k) A[k] = 0.0f;
  const int c_begin = kSplit ? static_cast<int>(blockIdx.z) : 0;
  const int c_end = kSplit ? c_begin + 1 : (nk + kAttnChunk - 1) / kAttnChunk;
  for (int c = c_begin; c < c_end; ++c) {
    const int t0 = c * kAttnChunk, t1 = min(nk, t0 + kAttnChunk);
    float mx = -INFINITY, l = 0.0f;
    float acc[kMaxPerLane];
#pragma unroll
    for (int i = 0; i < kMaxPerLane; ++i) acc[i] = 0.0f;
    for (int t = t0 + warp; t < t1; t += kAttnWarps) {
      const int64_t slot = attention_key_slot(r, t, kv.block_size);
      if (slot < 0 || slot >= kv.num_slots) {  // uniform across the warp
        if (lane == 0) atomicOr(err, kErrKvSlot);
        continue;
      }
      const float* kr = kbase + slot * kv.kv_dim;
      const float* vr = vbase + slot * kv.kv_dim;
      float dot = 0.0f;
      for (int e = lane; e < head_dim; e += 32) dot = fmaf(qs[e], kr[e], dot);
      const float s = warp_sum(dot) * scale;
      const float mnew = fmaxf(mx, s);
      const float corr = mx == -INFINITY ? 0.0f : expf(mx - mnew);
      const float p = expf(s - mnew);
      l = __fmaf_rn(l, corr, p);
#pragma unroll
      for (int i = 0; i < kMaxPerLane; ++i) {
        const int e = lane + 32 * i;
        if (e < head_dim) acc[i] = __fmaf_rn(acc[i], corr, __fmul_rn(p, vr[e]));
      }
      mx = mnew;
    }
    __syncthreads();  // the previous chunk's merge has read sm_*
    if (lane == 0) {
      sm_m[warp] = mx;
      sm_l[warp] = l;
    }
#pragma unroll
    for (int i = 0; i < kMaxPerLane; ++i) {
      const int e = lane + 32 * i;
      if (e < head_dim) sm_acc[warp][e] = acc[i];
    }
    __syncthreads();
    float cm = -INFINITY;
    for (int w = 0; w < kAttnWarps; ++w) cm = fmaxf(cm, sm_m[w]);
    float cl = 0.0f;
    for (int w = 0; w < kAttnWarps; ++w)
      if (sm_m[w] != -INFINITY) cl = __fmaf_rn(sm_l[w], expf(sm_m[w] - cm), cl);
    float cacc[kAttnDimsPerThread];
#pragma unroll
    for (int k = 0; k < kAttnDimsPerThread; ++k) {
      const int e = threadIdx.x + k * blockDim.x;
      float sum = 0.0f;
      if (e < head_dim) {
        for (int w = 0; w < kAttnWarps; ++w)
          if (sm_m[w] != -INFINITY) sum = __fmaf_rn(sm_acc[w][e], expf(sm_m[w] - cm), sum);
      }
      cacc[k] = sum;
    }
    if constexpr (kSplit) {
      // This chunk's state for the combine: [cm, cl, cacc[head_dim]].
      float* p = ws + ((static_cast<int64_t>(blockIdx.x) * num_heads + h) * gridDim.z + blockIdx.z) * (head_dim + 2);
      if (threadIdx.x == 0) {
        p[0] = cm;
        p[1] = cl;
      }
#pragma unroll
      for (int k = 0; k < kAttnDimsPerThread; ++k) {
        const int e = threadIdx.x + k * blockDim.x;
        if (e < head_dim) p[2 + e] = cacc[k];
      }
    } else {
      attn_fold(M, L, A, cm, cl, cacc);
    }
  }
  if constexpr (!kSplit) {
    float* o = out + (row * num_heads + h) * head_dim;
#pragma unroll
    for (int k = 0; k < kAttnDimsPerThread; ++k) {
      const int e = threadIdx.x + k * blockDim.x;
      if (e < head_dim) o[e] = A[k] / L;
    }
  }
}

// Folds the chunk states attention_kernel<true> wrote, in chunk order (grid: item, head).
__global__ void attention_combine_kernel(AttentionMeta m, int num_heads, int head_dim, int num_chunks, const float* ws,
                                         float* out) {
  const int h = blockIdx.y;
  const AttentionRow r = attention_row(m.meta, m.seqs_offset, static_cast<int32_t>(blockIdx.x));
  const float* base = ws + (static_cast<int64_t>(blockIdx.x) * num_heads + h) * num_chunks * (head_dim + 2);
  float M = -INFINITY, L = 0.0f, A[kAttnDimsPerThread];
#pragma unroll
  for (int k = 0; k < kAttnDimsPerThread; ++k) A[k] = 0.0f;
  for (int c = 0; c < num_chunks; ++c) {
    const float* p = base + static_cast<int64_t>(c) * (head_dim + 2);
    float cacc[kAttnDimsPerThread];
#pragma unroll
    for (int k = 0; k < kAttnDimsPerThread; ++k) {
      const int e = threadIdx.x + k * blockDim.x;
      cacc[k] = e < head_dim ? p[2 + e] : 0.0f;
    }
    attn_fold(M, L, A, p[0], p[1], cacc);
  }
  float* o = out + (static_cast<int64_t>(r.row) * num_heads + h) * head_dim;
#pragma unroll
  for (int k = 0; k < kAttnDimsPerThread; ++k) {
    const int e = threadIdx.x + k * blockDim.x;
    if (e < head_dim) o[e] = A[k] / L;
  }
}

__global__ void swiglu_kernel(const float* gate, const float* up, int64_t n, float* out) {
  for (int64_t i = first_index(); i < n; i += stride()) {
    const float g = gate[i];
    out[i] = g / (1.0f + expf(-g)) * up[i];
  }
}

__global__ void add_kernel(float* x, const float* y, int64_t n) {
  for (int64_t i = first_index(); i < n; i += stride()) x[i] += y[i];
}

__global__ void gather_rows_kernel(const float* x, const int32_t* idx, int64_t cols, float* out) {
  const int64_t i = blockIdx.x;
  const float* src = x + static_cast<int64_t>(idx[i]) * cols;
  for (int64_t e = threadIdx.x; e < cols; e += blockDim.x) out[i * cols + e] = src[e];
}

// One block per (layer, K|V). The copies run in index order; no barrier is needed between them:
// element e of every slot row is always copied by the same thread, so a copy that reads what an
// earlier one wrote reads it in program order.
__global__ void kv_copy_slots_kernel(KvView kv, const int32_t* src, const int32_t* dst, int64_t n, int32_t* err) {
  const int64_t layer = blockIdx.x;
  float* base = (blockIdx.y == 0 ? kv.k : kv.v) + layer * kv.num_slots * kv.kv_dim;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t s = src[i], d = dst[i];
    if (s == d) continue;
    if (s < 0 || d < 0 || s >= kv.num_slots || d >= kv.num_slots) {
      if (threadIdx.x == 0) atomicOr(err, kErrKvSlot);
      continue;
    }
    for (int64_t e = threadIdx.x; e < kv.kv_dim; e += blockDim.x) base[d * kv.kv_dim + e] = base[s * kv.kv_dim + e];
  }
}

// One block per (block i, layer, K|V): a [block_size, kv_dim] run, contiguous on both sides.
__global__ void kv_pack_kernel(KvView kv, int64_t layer_begin, int64_t num_layers, const int32_t* blocks, float* packed,
                               bool export_blocks) {
  const int64_t i = blockIdx.x, l = layer_begin + blockIdx.y, which = blockIdx.z;
  const int64_t part = kv.block_size * kv.kv_dim;
  float* p = packed + ((i * num_layers + blockIdx.y) * 2 + which) * part;
  float* s = (which == 0 ? kv.k : kv.v) + (l * kv.num_slots + static_cast<int64_t>(blocks[i]) * kv.block_size) * kv.kv_dim;
  for (int64_t e = threadIdx.x; e < part; e += blockDim.x) {
    if (export_blocks) {
      p[e] = s[e];
    } else {
      s[e] = p[e];
    }
  }
}

unsigned grid_for(int64_t n) {
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(blocks, 65536)));
}

}  // namespace

// ---------------------------------------------------------------- launchers

void launch_f32_to_half(const float* x, uint16_t* y, WeightType type, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  if (type == WeightType::kF16) {
    f32_to_f16_kernel<<<grid_for(n), kThreads, 0, stream>>>(x, reinterpret_cast<__half*>(y), n);
  } else {
    f32_to_bf16_kernel<<<grid_for(n), kThreads, 0, stream>>>(x, reinterpret_cast<__nv_bfloat16*>(y), n);
  }
}

void launch_embedding(const void* table, WeightType type, int64_t rows, int64_t cols, const int32_t* ids, int64_t n,
                      float* out, int32_t* err, cudaStream_t stream) {
  if (n <= 0) return;
  embedding_kernel<<<static_cast<unsigned>(n), kThreads, 0, stream>>>(table, type, rows, cols, ids, out, err);
}

void launch_rms_norm(const float* x, const void* w, WeightType type, float eps, int64_t n, int64_t d, float* out,
                     cudaStream_t stream) {
  if (n <= 0) return;
  rms_norm_kernel<<<static_cast<unsigned>(n), kThreads, 0, stream>>>(x, w, type, eps, d, out);
}

void launch_add_bias(float* y, const void* bias, WeightType type, int64_t n, int64_t cols, cudaStream_t stream) {
  if (n <= 0) return;
  add_bias_kernel<<<grid_for(n * cols), kThreads, 0, stream>>>(y, bias, type, n * cols, cols);
}

void launch_matmul_rowwise(const void* w, WeightType type, int64_t rows, int64_t cols, const float* x, int64_t n,
                           float* y, cudaStream_t stream) {
  if (n <= 0) return;
  const unsigned blocks = static_cast<unsigned>((rows + kMatmulWarps - 1) / kMatmulWarps);
  const bool vec = type != WeightType::kF32 && cols % 8 == 0 && reinterpret_cast<uintptr_t>(w) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(x) % 16 == 0;
  // NOTE: the vectorised and scalar kernels sum in different orders; which one runs depends on
  // the shape, the type and the pointers' alignment, never on n, so batch invariance is kept.
  const unsigned threads = kMatmulWarps * 32;
  if (vec && type == WeightType::kBF16) {
    matmul_rowwise_kernel<WeightType::kBF16><<<blocks, threads, 0, stream>>>(w, type, rows, cols, x, n, y);
  } else if (vec) {
    matmul_rowwise_kernel<WeightType::kF16><<<blocks, threads, 0, stream>>>(w, type, rows, cols, x, n, y);
  } else {
    matmul_rowwise_kernel<WeightType::kF32><<<blocks, threads, 0, stream>>>(w, type, rows, cols, x, n, y);
  }
}

void launch_rope(float* x, const int32_t* positions, int64_t n, int64_t num_heads, const RopeKernelParams& p,
                 cudaStream_t stream) {
  if (n <= 0 || p.rope_dim <= 0) return;
  rope_kernel<<<static_cast<unsigned>(n), 128, static_cast<size_t>(p.rope_dim) * sizeof(float), stream>>>(
      x, positions, num_heads, p);
}

void launch_kv_write(const KvView& kv, int64_t layer, const float* k, const float* v, const int32_t* slots, int64_t n,
                     int32_t* err, cudaStream_t stream) {
  if (n <= 0) return;
  kv_write_kernel<<<static_cast<unsigned>(n), kThreads, 0, stream>>>(kv, layer, k, v, slots, err);
}

int64_t attention_chunks(int64_t num_keys) { return (num_keys + kAttnChunk - 1) / kAttnChunk; }

void launch_attention(const KvView& kv, int64_t layer, const float* q, const AttentionMeta& m, int64_t num_heads,
                      int64_t num_kv_heads, int64_t head_dim, float* out, float* ws, int64_t num_chunks, int32_t* err,
                      cudaStream_t stream) {
  if (m.num_items <= 0) return;
  const float scale = 1.0f / sqrtf(static_cast<float>(head_dim));
  const int nh = static_cast<int>(num_heads), group = static_cast<int>(num_heads / num_kv_heads);
  const int hd = static_cast<int>(head_dim);
  if (num_chunks <= 1 || ws == nullptr) {
    const dim3 grid(static_cast<unsigned>(m.num_items), static_cast<unsigned>(num_heads));
    attention_kernel<false><<<grid, kAttnWarps * 32, 0, stream>>>(kv, layer, q, m, nh, group, hd, scale, out, nullptr, err);
    return;
  }
  const dim3 grid(static_cast<unsigned>(m.num_items), static_cast<unsigned>(num_heads), static_cast<unsigned>(num_chunks));
  attention_kernel<true><<<grid, kAttnWarps * 32, 0, stream>>>(kv, layer, q, m, nh, group, hd, scale, out, ws, err);
  const dim3 grid2(static_cast<unsigned>(m.num_items), static_cast<unsigned>(num_heads));
  attention_combine_kernel<<<grid2, kAttnWarps * 32, 0, stream>>>(m, nh, hd, static_cast<int>(num_chunks), ws, out);
}

void launch_swiglu(const float* gate, const float* up, int64_t n, float* out, cudaStream_t stream) {
  if (n <= 0) return;
  swiglu_kernel<<<grid_for(n), kThreads, 0, stream>>>(gate, up, n, out);
}

void launch_add(float* x, const float* y, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  add_kernel<<<grid_for(n), kThreads, 0, stream>>>(x, y, n);
}

void launch_gather_rows(const float* x, const int32_t* idx, int64_t m, int64_t cols, float* out, cudaStream_t stream) {
  if (m <= 0) return;
  gather_rows_kernel<<<static_cast<unsigned>(m), kThreads, 0, stream>>>(x, idx, cols, out);
}

void launch_kv_copy_slots(const KvView& kv, const int32_t* src, const int32_t* dst, int64_t n, int32_t* err,
                          cudaStream_t stream) {
  if (n <= 0) return;
  const dim3 grid(static_cast<unsigned>(kv.num_layers), 2);
  kv_copy_slots_kernel<<<grid, kThreads, 0, stream>>>(kv, src, dst, n, err);
}

void launch_kv_pack_blocks(const KvView& kv, int64_t layer_begin, int64_t layer_end, const int32_t* blocks, int64_t n,
                           float* packed, bool export_blocks, cudaStream_t stream) {
  if (n <= 0) return;
  const dim3 grid(static_cast<unsigned>(n), static_cast<unsigned>(layer_end - layer_begin), 2);
  kv_pack_kernel<<<grid, kThreads, 0, stream>>>(kv, layer_begin, layer_end - layer_begin, blocks, packed, export_blocks);
}

}  // namespace specserve::gpu
