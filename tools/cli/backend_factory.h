// specserve CLI: the Backend a `--device` flag names ("cpu" or "cuda:N"), for every subcommand
// that runs a model in this process.
#pragma once

#include <memory>
#include <string>

#include "core/status.h"
#include "model/backend.h"

namespace specserve::cli {

/// The backend for `device` ("cpu" or "cuda:N", config/topology.h's DeviceSpec syntax);
/// `threads` is the CPU backend's thread count (0: every core). On CUDA the matmul path comes
/// from $SPECSERVE_CUDA_MATMUL ("cublas", the default, or "batch_invariant";
/// gpu/cuda_backend.h).
/// Errors name `flag` and the value: kInvalidArgument for a malformed device or an ordinal
/// outside 0 .. count-1; kUnavailable when this build has no CUDA backend or no CUDA device is
/// present.
Expected<std::unique_ptr<Backend>> make_backend_for_device(const std::string& flag, const std::string& device,
                                                           int threads);

}  // namespace specserve::cli
