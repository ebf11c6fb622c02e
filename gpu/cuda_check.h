// specserve gpu: aborting checks of CUDA runtime calls (internal to gpu/). A failed CUDA call
// inside an op is a bug or a dead device: Backend ops have no error channel (as on the CPU), so
// the process aborts naming the call and CUDA's error text.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "core/status.h"

#define SPECSERVE_CUDA_CHECK(expr)                                                                      \
  do {                                                                                                  \
    const cudaError_t cuda_rc_ = (expr);                                                                \
    SPECSERVE_CHECK(cuda_rc_ == cudaSuccess, std::string(#expr) + ": " + cudaGetErrorString(cuda_rc_)); \
  } while (0)
// After a kernel launch: configuration errors surface here, execution errors at the next sync.
#define SPECSERVE_CUDA_LAUNCHED() SPECSERVE_CUDA_CHECK(cudaGetLastError())
