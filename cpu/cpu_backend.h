// specserve cpu: the CPU reference Backend: the kernels of cpu/matmul.h and cpu/attention.h,
// OpenMP threads for the rest. Its numerics are those of fp32 weights (GGUF tensors dequantised
// exactly as model/dequant.h does), the reference every other backend is compared against.
// Q4_1 and Q8_0 matmul weights stay in their GGUF blocks and are dequantised tile by tile inside
// matmul, to the same floats (SPECSERVE_CPU_WEIGHTS=f32 dequantises everything at load instead;
// same bits, 5.4x the bytes per decode step of the default model).
#pragma once

#include <memory>

#include "model/backend.h"

namespace specserve {

/// A CPU backend using `num_threads` threads (<= 0: every core). Thread counts are process-wide
/// for OpenMP; the last backend created sets them.
std::unique_ptr<Backend> make_cpu_backend(int num_threads);

/// "blocks" or "f32": how this process stores Q4_1 / Q8_0 matmul weights (SPECSERVE_CPU_WEIGHTS,
/// read once, trimmed, any case; another value is warned about and ignored), for logs and
/// benchmark records.
const char* cpu_weight_storage();

}  // namespace specserve
