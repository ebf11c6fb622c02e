// specserve cpu: the CPU reference Backend (OpenBLAS sgemm for matmuls, OpenMP threads for
// the rest). Weights are dequantised to fp32 at load: the reference numerics every other
// backend is compared against.
#pragma once

#include <memory>

#include "model/backend.h"

namespace specserve {

/// A CPU backend using `num_threads` threads (<= 0: every core). Thread counts are process-wide
/// for OpenBLAS and OpenMP; the last backend created sets them.
std::unique_ptr<Backend> make_cpu_backend(int num_threads);

}  // namespace specserve
