// specserve core: the compute dtype a user asks for — vLLM's `--dtype` (and `dtype` of a
// topology's models.target). The backends map it (actors/backend_factory.h):
//   auto      each backend's default: fp32 matmuls on the CPU (SPECSERVE_CPU_MATMUL may pick
//             another kernel), bf16 weights on CUDA (SPECSERVE_CUDA_WEIGHTS may pick another)
//   float32   fp32 matmuls: the CPU's fp32 kernel (avx512, or avx2), CUDA's fp32 weights
//   bfloat16  bf16 x bf16 products with fp32 sums: the CPU's AMX kernel (cpu/matmul.h), CUDA's
//             bf16 weights
//   float16   CUDA's fp16 weights; the CPU backend has no fp16 kernel (an error, naming it)
// vLLM's spellings "float" (= float32) and "half" (= float16) are accepted too. Norms,
// attention, sampling and the KV cache stay fp32 under every choice.
#pragma once

#include <string>

#include "core/status.h"

namespace specserve {

enum class ComputeDtype { kAuto, kFloat32, kBFloat16, kFloat16 };

/// Parses a dtype name (exact, lower case, as vLLM's --dtype choices). Errors: kInvalidArgument
/// "<field> = '<text>': not one of auto, float32, float, bfloat16, float16, half".
Expected<ComputeDtype> parse_compute_dtype(const std::string& text, const std::string& field);

/// "auto", "float32", "bfloat16" or "float16".
const char* compute_dtype_name(ComputeDtype dtype);

}  // namespace specserve
