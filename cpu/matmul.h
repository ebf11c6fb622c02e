// specserve cpu: fp32 matrix multiply with a fixed per-element reduction order.
//
// y[n, R] = x[n, C] * W[R, C]^T. Every y element is the dot product of one x row and one W row
// accumulated in 8 AVX2 lanes over k in ascending order, then summed lane by lane in a fixed
// tree — whatever n is and however the rows are tiled or split over threads. This makes the
// result of a row independent of the batch it is computed in (batch invariance), which the
// speculative engine needs for token-identical greedy output. Checked against OpenBLAS sgemm
// (tests/cpu/matmul_test.cpp).
#pragma once

#include <cstdint>

namespace specserve {

/// See the file comment. C must be a multiple of 8 (every llama-family width is); x, W, y must
/// not alias. Uses the OpenMP thread team.
void matmul_f32(const float* x, const float* w, float* y, int64_t n, int64_t rows, int64_t cols);

/// One dot product in the same order as matmul_f32 (for attention and tests).
float dot_f32(const float* a, const float* b, int64_t n);

}  // namespace specserve
