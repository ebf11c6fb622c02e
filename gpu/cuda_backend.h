// specserve gpu: the CUDA Backend (model/backend.h) — cuBLAS matmuls and own kernels.
//
// This header names no CUDA type: callers (the CLI, actors, tests) include it without the CUDA
// toolkit's headers. It exists only in builds configured with CUDA (SPECSERVE_HAVE_CUDA); code
// that must also build without CUDA reaches it through actors/backend_factory.h.
//
// Numerics: activations and the KV cache are fp32 in device memory, as on the CPU. 2-D weights
// (matmul weights and embedding tables) are dequantised from GGUF on the host at load
// (model/dequant.h) and stored as bf16 (or fp16 or fp32: CudaBackendOptions::weights); vectors
// (norm weights, biases) stay fp32. Matmuls
// multiply bf16 weights by the bf16-rounded activations with fp32 accumulation and fp32
// output. Results therefore differ from the fp32 CPU reference by bf16 rounding (relative
// error ~1e-3 per matmul); tests/gpu/cuda_backend_test.cpp states the bounds it checks.
// Thread-safety: a backend is used by one thread at a time (Backend's contract); it owns one
// CUDA stream, and every op is ordered on it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "core/status.h"
#include "model/backend.h"

namespace specserve {

/// How CudaBackend::matmul computes.
enum class CudaMatmul {
  /// cublasGemmEx, bf16 x bf16 (or fp16 x fp16) -> fp32 with fp32 accumulation. Fast at every batch size, but
  /// cuBLAS may pick a different algorithm (split-K, another tile) for another number of rows,
  /// so a row's result can depend on the batch (see the NOTE in gpu/cuda_backend.cpp).
  kCublas,
  /// Own kernel, one warp per output feature, reduction order fixed by the shape: a row's
  /// result never depends on the batch (the Backend determinism contract holds), at the cost
  /// of speed for large batches (prefill).
  kBatchInvariant,
};

/// Parses "cublas" or "batch_invariant" (kInvalidArgument naming the value otherwise).
Expected<CudaMatmul> parse_cuda_matmul(const std::string& text);
const char* cuda_matmul_name(CudaMatmul m);

/// How CudaBackend stores matrices (vectors always stay fp32).
enum class CudaWeights {
  kBF16,  ///< bf16: fp32's range, 8-bit mantissa (the default)
  kF16,   ///< fp16: 11-bit mantissa, range +-65504 (the activations a cuBLAS matmul reads are
          ///< rounded to fp16 too, so a model with huge activations overflows)
  kF32,   ///< fp32: twice the bytes; the CPU reference's numerics up to summation order (parity)
};

/// Parses "bf16", "fp16" or "fp32" (kInvalidArgument naming the value otherwise).
Expected<CudaWeights> parse_cuda_weights(const std::string& text);
const char* cuda_weights_name(CudaWeights w);

struct CudaBackendOptions {
  CudaMatmul matmul = CudaMatmul::kCublas;
  CudaWeights weights = CudaWeights::kBF16;
  /// CUDA graphs for repeated segments of ops (decode and verify steps; gpu/cuda_graphs.h):
  /// outputs are bit-identical either way, graphs launch a step at once instead of op by op.
  /// Off: vLLM's --enforce-eager; $SPECSERVE_CUDA_GRAPHS=0 (actors/backend_factory.h).
  bool cuda_graphs = true;
  /// Attention split over the keys (flash-decoding) when few rows see many keys: same bits,
  /// more blocks (gpu/kernels.h launch_attention). Off: $SPECSERVE_CUDA_ATTENTION_SPLIT=0.
  bool attention_split = true;
};

/// CUDA graph counters of a backend made by make_cuda_backend (all 0 for any other backend, or
/// with graphs off).
struct CudaGraphStats {
  int64_t replays = 0;          ///< segments run as one graph launch
  int64_t captures = 0;         ///< graphs captured
  int64_t eager_segments = 0;   ///< segments run op by op (first sight, prefill, short ones)
  int64_t failed_captures = 0;  ///< captures CUDA refused (those segments run op by op)
  int64_t graphs_held = 0;      ///< instantiated graphs held now
};
CudaGraphStats cuda_graph_stats(const Backend& backend);

/// Number of CUDA devices visible to this process; 0 (never an error) when there is no GPU, no
/// driver, or the runtime cannot start.
int cuda_device_count();

/// Facts about one device, from cudaGetDeviceProperties / cudaDeviceGetAttribute.
struct CudaDeviceInfo {
  std::string name;
  int cc_major = 0, cc_minor = 0;
  int64_t total_bytes = 0;      ///< global memory
  int64_t free_bytes = 0;       ///< free global memory when asked
  double peak_bandwidth_gb_s = 0;  ///< 2 x memory clock x bus width (the DDR peak), GB/s
  int num_sms = 0;
};

/// Errors: kUnavailable when no device is present (the message says so), kInvalidArgument when
/// `device` is not in 0 .. cuda_device_count() - 1.
Expected<CudaDeviceInfo> cuda_device_info(int device);

/// A backend on CUDA device `device` (its own stream and cuBLAS handle).
/// Errors: those of cuda_device_info; kInternal naming the CUDA call when the context, stream or
/// cuBLAS handle cannot be created.
Expected<std::unique_ptr<Backend>> make_cuda_backend(int device, CudaBackendOptions options = {});

}  // namespace specserve
