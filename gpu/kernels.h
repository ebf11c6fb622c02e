// specserve gpu: launchers of the CUDA kernels (gpu/kernels.cu; argmax and sampling:
// gpu/pick_kernels.cu), one per Backend op.
//
// Internal to gpu/: included by gpu/cuda_backend.cpp only. Pointers are device pointers unless
// said otherwise; bf16 and fp16 values travel as uint16_t (their bit pattern) so that this header needs
// no CUDA C++ types. Every launcher enqueues on `stream` and returns at once; launch errors are
// checked by the caller (cudaGetLastError). Each kernel's CPU reference is the CpuBackend op of
// the same name (cpu/cpu_backend.cpp); tests/gpu/cuda_backend_test.cpp compares the two.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "gpu/attention_meta.h"
#include "gpu/rope_math.h"

namespace specserve::gpu {

/// Bits of the backend's device error word (set by kernels, read by CudaBackend::synchronize).
enum ErrorBit : int32_t {
  kErrTokenId = 1,    ///< embedding: a token id outside the table
  kErrKvSlot = 2,     ///< kv_write / attention / kv_copy_slots: a slot outside the KV storage
};

/// Storage of a weight on the device.
enum class WeightType { kF32, kBF16, kF16 };

/// y[i] = x[i] as bf16 or fp16 (`type`; round to nearest even), i < n.
void launch_f32_to_half(const float* x, uint16_t* y, WeightType type, int64_t n, cudaStream_t stream);

/// out[i, :] = table[ids[i], :] for i < n; table [rows, cols].
void launch_embedding(const void* table, WeightType type, int64_t rows, int64_t cols, const int32_t* ids, int64_t n,
                      float* out, int32_t* err, cudaStream_t stream);

/// out[n, d] = x / sqrt(mean(x^2) + eps) * w   (sum of squares in double, as the CPU).
void launch_rms_norm(const float* x, const void* w, WeightType type, float eps, int64_t n, int64_t d, float* out,
                     cudaStream_t stream);

/// y[i, j] += bias[j] for i < n, j < cols (bias of any WeightType).
void launch_add_bias(float* y, const void* bias, WeightType type, int64_t n, int64_t cols, cudaStream_t stream);

/// Batch-invariant matmul y[n, rows] = x[n, cols] * w[rows, cols]^T with w bf16, fp16 or fp32: one
/// warp per output feature, each output's reduction order fixed by `cols` alone.
void launch_matmul_rowwise(const void* w, WeightType type, int64_t rows, int64_t cols, const float* x, int64_t n,
                           float* y, cudaStream_t stream);

/// RoPE in place on x[n, num_heads, head_dim] (llama.cpp's rope with yarn, as CpuBackend::rope;
/// the per-pair math is gpu/rope_math.h).
void launch_rope(float* x, const int32_t* positions, int64_t n, int64_t num_heads, const RopeKernelParams& p,
                 cudaStream_t stream);

/// K/V storage of one model on the device: k and v are [layers, num_slots, kv_dim] fp32.
struct KvView {
  float* k;
  float* v;
  int64_t num_layers, num_slots, block_size, kv_dim;
};

/// kv.k/v[layer, slots[i], :] = k/v[i, :] for i < n.
void launch_kv_write(const KvView& kv, int64_t layer, const float* k, const float* v, const int32_t* slots, int64_t n,
                     int32_t* err, cudaStream_t stream);

/// Chunks of keys attention folds for a row that sees `num_keys` keys (128 keys each).
int64_t attention_chunks(int64_t num_keys);

/// out[row, h, :] = softmax(q k^T / sqrt(head_dim)) v for every item's row and every head h,
/// fp32 online softmax over the keys the row sees, chunk by chunk. head_dim <= 256.
/// With num_chunks > 1 and a workspace `ws` of num_items * num_heads * num_chunks *
/// (head_dim + 2) floats, one block per (row, head, chunk) and a combine pass (split over the
/// keys: more parallel work when few rows see many keys; num_chunks must be at least
/// attention_chunks of the longest row); else one block per (row, head). Both give the same
/// bits (kernels.cu).
void launch_attention(const KvView& kv, int64_t layer, const float* q, const AttentionMeta& m, int64_t num_heads,
                      int64_t num_kv_heads, int64_t head_dim, float* out, float* ws, int64_t num_chunks, int32_t* err,
                      cudaStream_t stream);

/// out[i] = silu(gate[i]) * up[i] for i < n (out may be gate).
void launch_swiglu(const float* gate, const float* up, int64_t n, float* out, cudaStream_t stream);
/// x[i] += y[i] for i < n.
void launch_add(float* x, const float* y, int64_t n, cudaStream_t stream);
/// out[i, :] = x[idx[i], :] for i < m (idx a device pointer).
void launch_gather_rows(const float* x, const int32_t* idx, int64_t m, int64_t cols, float* out, cudaStream_t stream);
/// Backend::argmax_rows: token[r] = argmax of row r of x[rows, cols] (ties: the lowest index),
/// logprob[r] = x[r, token] - log_sum_exp(row), with greedy_pick's exp polynomial, lane order and
/// double sums (model/sampling.cpp), so the token is the CPU's and the logprob differs at most
/// in the last bits of the final double log; -1 and 0 for a row with a NaN or +inf or no
/// finite value. One block per row; cols <= 2^20.
void launch_argmax_rows(const float* x, int64_t rows, int64_t cols, int32_t* token, float* logprob, cudaStream_t stream);
/// Backend::sample_rows: row r drawn at temperature[r] with uniform[r] (device arrays) in
/// temperature_pick's steps (model/sampling.h: compute_probs, then draw_inverse_cdf's chunked
/// inverse CDF), so the CPU's token; temperature[r] < 1e-5 is launch_argmax_rows' pick.
void launch_sample_rows(const float* x, int64_t rows, int64_t cols, const float* temperature, const double* uniform,
                        int32_t* token, float* logprob, cudaStream_t stream);
/// In every layer, K and V of slot src[i] copied to slot dst[i], for i = 0, 1, ... n-1 in that
/// order (as CpuBackend's memmove loop: a later copy sees an earlier one's result).
void launch_kv_copy_slots(const KvView& kv, const int32_t* src, const int32_t* dst, int64_t n, int32_t* err,
                          cudaStream_t stream);
/// Packs (export = true) or unpacks whole blocks between the storage and `packed`, in the
/// layout of Backend::kv_export_blocks for layers [layer_begin, layer_end).
void launch_kv_pack_blocks(const KvView& kv, int64_t layer_begin, int64_t layer_end, const int32_t* blocks, int64_t n,
                           float* packed, bool export_blocks, cudaStream_t stream);

}  // namespace specserve::gpu
