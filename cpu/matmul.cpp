#include "cpu/matmul.h"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>

namespace specserve {
namespace {

inline float reduce8(__m256 v) {
  alignas(32) float l[8];
  _mm256_store_ps(l, v);
  return ((l[0] + l[4]) + (l[1] + l[5])) + ((l[2] + l[6]) + (l[3] + l[7]));
}

// Tile of NX x rows by NW weight rows: NX*NW accumulators, k ascending.
template <int NX, int NW>
inline void tile(const float* x, const float* w, float* y, int64_t cols, int64_t ldy) {
  // NOTE: the unroll pragmas keep the NX*NW accumulators in registers; without them GCC
  // leaves the arrays in memory and the kernel runs 5x slower.
  __m256 acc[NX][NW];
#pragma GCC unroll 4
  for (int i = 0; i < NX; ++i)
#pragma GCC unroll 4
    for (int j = 0; j < NW; ++j) acc[i][j] = _mm256_setzero_ps();
  for (int64_t k = 0; k < cols; k += 8) {
    __m256 wv[NW];
#pragma GCC unroll 4
    for (int j = 0; j < NW; ++j) wv[j] = _mm256_loadu_ps(w + j * cols + k);
#pragma GCC unroll 4
    for (int i = 0; i < NX; ++i) {
      const __m256 xv = _mm256_loadu_ps(x + i * cols + k);
#pragma GCC unroll 4
      for (int j = 0; j < NW; ++j) acc[i][j] = _mm256_fmadd_ps(xv, wv[j], acc[i][j]);
    }
  }
#pragma GCC unroll 4
  for (int i = 0; i < NX; ++i)
#pragma GCC unroll 4
    for (int j = 0; j < NW; ++j) y[i * ldy + j] = reduce8(acc[i][j]);
}

template <int NW>
inline void tile_rows(const float* x, const float* w, float* y, int64_t nx, int64_t cols, int64_t ldy) {
  int64_t i = 0;
  for (; i + 3 <= nx; i += 3) tile<3, NW>(x + i * cols, w, y + i * ldy, cols, ldy);
  for (; i < nx; ++i) tile<1, NW>(x + i * cols, w, y + i * ldy, cols, ldy);
}

}  // namespace

float dot_f32(const float* a, const float* b, int64_t n) {
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < n; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
  return reduce8(acc);
}

void matmul_f32(const float* x, const float* w, float* y, int64_t n, int64_t rows, int64_t cols) {
  // x is processed in chunks that stay in L2 while every weight row streams past them.
  const int64_t x_chunk = std::max<int64_t>(3, (256 * 1024 / (cols * 4)) / 3 * 3);
  const int64_t w_tile = 4;
  const int64_t num_wt = (rows + w_tile - 1) / w_tile;
  for (int64_t x0 = 0; x0 < n; x0 += x_chunk) {
    const int64_t nx = std::min(x_chunk, n - x0);
#pragma omp parallel for schedule(static) if (num_wt * nx * cols > 32768)
    for (int64_t t = 0; t < num_wt; ++t) {
      const int64_t r0 = t * w_tile;
      const float* wt = w + r0 * cols;
      const float* xc = x + x0 * cols;
      float* yc = y + x0 * rows + r0;
      switch (std::min(w_tile, rows - r0)) {
        case 4: tile_rows<4>(xc, wt, yc, nx, cols, rows); break;
        case 3: tile_rows<3>(xc, wt, yc, nx, cols, rows); break;
        case 2: tile_rows<2>(xc, wt, yc, nx, cols, rows); break;
        default: tile_rows<1>(xc, wt, yc, nx, cols, rows); break;
      }
    }
  }
}

}  // namespace specserve
