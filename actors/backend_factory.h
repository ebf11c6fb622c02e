// specserve actors: the Backend a device names ("cpu" or "cuda:N"): a worker's `device` in a
// topology, or the CLI's `--device`. The one place that knows which backends this build has
// (SPECSERVE_WITH_CUDA: the CUDA backend, gpu/, was built).
#pragma once

#include <memory>
#include <string>

#include "core/dtype.h"
#include "core/status.h"
#include "model/backend.h"
#include "model/model_config.h"
#include "spec/engine.h"

namespace specserve {

/// The backend for `device` ("cpu" or "cuda:N", config/topology.h's DeviceSpec syntax);
/// `threads` is the CPU backend's thread count (0: every core). On CUDA the matmul path comes
/// from $SPECSERVE_CUDA_MATMUL ("cublas", the default, or "batch_invariant";
/// gpu/cuda_backend.h), the weights' storage from $SPECSERVE_CUDA_WEIGHTS ("bf16", the
/// default, "fp16" or "fp32"), and CUDA graphs from $SPECSERVE_CUDA_GRAPHS ("1", the default,
/// or "0": eager, what the CLI's --enforce-eager sets), and attention's split over the keys
/// from $SPECSERVE_CUDA_ATTENTION_SPLIT ("1", the default, or "0"; same results).
/// Errors name `flag` (the flag or field the value came from) and the value: kInvalidArgument for a malformed device or an ordinal
/// outside 0 .. count-1; kUnavailable when this build has no CUDA backend or no CUDA device is
/// present.
Expected<std::unique_ptr<Backend>> make_backend_for_device(const std::string& flag, const std::string& device,
                                                           int threads);

/// Applies a compute dtype (vLLM's --dtype; core/dtype.h) to this process, for models that run
/// on `device`; call it before the first backend is made. `field` names where the value came
/// from ("--dtype", "models.target.dtype") in errors and in the kernel log line.
/// - cpu: auto keeps the default kernel (or SPECSERVE_CPU_MATMUL's); float32 runs the fp32
///   kernel (avx512, or avx2 where the CPU lacks avx512f or SPECSERVE_CPU_MATMUL=avx2 asks for
///   it) even when SPECSERVE_CPU_MATMUL=amx or vnni; bfloat16 runs the AMX bf16 kernel (cpu/matmul.h).
///   The CPU backend is process-wide, so every model of the process (target and draft) follows.
/// - cuda:N: the weights' storage of every CudaBackend made afterwards in this process
///   (bfloat16, float16, float32; auto: $SPECSERVE_CUDA_WEIGHTS or bf16).
/// Errors (kInvalidArgument, naming `field`, the value and the reason): bfloat16 on a CPU or
/// kernel that refuses AMX (which one refused: cpu/matmul_amx.h amx_refusal()); float16 on the
/// CPU (no fp16 kernel); a malformed device.
Status apply_compute_dtype(ComputeDtype dtype, const std::string& device, const std::string& field);

/// The errors apply_compute_dtype would give, changing nothing (for `up --dry-run`).
Status check_compute_dtype(ComputeDtype dtype, const std::string& device, const std::string& field);

/// The matmul arithmetic a backend made now for `device` runs, for logs and `specserve status`:
/// "avx512 fp32", "avx2 fp32", "amx bf16" or "vnni int8" on the CPU (cpu/matmul.h matmul_isa(); vnni
/// with SPECSERVE_CPU_WEIGHTS=f32 computes in "avx512 fp32"); "cuda bf16
/// weights", "cuda fp16 weights" or "cuda fp32 weights" on a GPU; "cuda" in a build without it;
/// "?" for a malformed device.
std::string compute_description(const std::string& device);

/// Whether make_backend_for_device could make `device` here, without making it (no CUDA context,
/// no allocation): for checking a topology before a worker loads its model. Same errors.
Status check_device_available(const std::string& flag, const std::string& device);

/// A device's memory: total and free bytes now.
struct DeviceMemory {
  int64_t total_bytes = 0;
  int64_t free_bytes = 0;
};

/// The memory of `device` ("cuda:N") now (cudaMemGetInfo). Errors: kUnsupported for "cpu" (its
/// memory is not planned), else those of check_device_available.
Expected<DeviceMemory> device_memory(const std::string& device);

}  // namespace specserve
