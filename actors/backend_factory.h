// specserve actors: the Backend a device names ("cpu" or "cuda:N"): a worker's `device` in a
// topology, or the CLI's `--device`. The one place that knows which backends this build has
// (SPECSERVE_WITH_CUDA: the CUDA backend, gpu/, was built).
#pragma once

#include <memory>
#include <string>

#include "core/status.h"
#include "model/backend.h"
#include "model/model_config.h"
#include "spec/engine.h"

namespace specserve {

/// The backend for `device` ("cpu" or "cuda:N", config/topology.h's DeviceSpec syntax);
/// `threads` is the CPU backend's thread count (0: every core). On CUDA the matmul path comes
/// from $SPECSERVE_CUDA_MATMUL ("cublas", the default, or "batch_invariant";
/// gpu/cuda_backend.h), and the weights' storage from $SPECSERVE_CUDA_WEIGHTS ("bf16", the
/// default, "fp16" or "fp32").
/// Errors name `flag` (the flag or field the value came from) and the value: kInvalidArgument for a malformed device or an ordinal
/// outside 0 .. count-1; kUnavailable when this build has no CUDA backend or no CUDA device is
/// present.
Expected<std::unique_ptr<Backend>> make_backend_for_device(const std::string& flag, const std::string& device,
                                                           int threads);

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
