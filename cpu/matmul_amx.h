// specserve cpu: the AMX bf16 matmul kernel behind SPECSERVE_CPU_MATMUL=amx (cpu/matmul.h's file
// comment gives its numerics and figures). Internal to cpu/: callers use matmul_weight.
#pragma once

#include <cstdint>
#include <string>

#include "cpu/matmul.h"

namespace specserve {

/// Why the AMX kernel cannot run in this process ("" when it can): the CPU lacks amx-tile,
/// amx-bf16 or avx512bf16, or Linux refused the tile data state (arch_prctl
/// ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA; requested once per process, with errno's text).
const std::string& amx_refusal();

/// amx_refusal() is empty.
bool amx_usable();

/// y[n, w.rows] = x[n, w.cols] * W^T in bf16 tiles with fp32 sums, for any WeightFormat;
/// w.cols must be a multiple of 32 and amx_usable() true (the caller checks both). n = 0 does
/// nothing. Uses the OpenMP thread team; x, y must not alias.
void matmul_amx(const float* x, const MatmulWeight& w, float* y, int64_t n);

}  // namespace specserve
