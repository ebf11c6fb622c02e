// specserve cpu: Q4_1 / Q8_0 tile kernels that dequantise each 32-value block in registers as they
// read it, for the few x rows of decode and verification steps (cpu/matmul.h fused_block_matmul;
// matmul_with in cpu/matmul.cpp dispatches to them). Per accumulator they do the same fused
// multiply-adds in the same k order, on the same dequantised values (dequant_row_*'s arithmetic),
// as tile16 / tile8 over the dequantised buffer: the same bits.
#include <immintrin.h>

#include <cstdint>
#include <cstring>
#include <string>

#include "core/status.h"
#include "cpu/matmul_internal.h"

namespace specserve::matmul_internal {
namespace {

// NOTE: see cpu/matmul_internal.h reduce16 (GCC 12's avx512fintrin.h warnings).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"


template <WeightFormat F, int NX, int NW>
SPECSERVE_AVX512 inline void tile16_blocks(const float* x, const uint8_t* w, int64_t row_bytes, float* y, int64_t cols,
                                           int64_t ldy) {
  constexpr int64_t kBlockBytes = F == WeightFormat::kQ4_1 ? 20 : 34;
  __m512 acc[NX][NW];
#pragma GCC unroll 8
  for (int i = 0; i < NX; ++i)
#pragma GCC unroll 8
    for (int j = 0; j < NW; ++j) acc[i][j] = _mm512_setzero_ps();
  const __m128i low4 = _mm_set1_epi8(0x0f);
  for (int64_t k = 0, off = 0; k < cols; k += 32, off += kBlockBytes) {
    __m512 d[NW], m[NW];
    __m128i q[NW];
#pragma GCC unroll 8
    for (int j = 0; j < NW; ++j) {
      const uint8_t* b = w + j * row_bytes + off;
      uint16_t hd;
      std::memcpy(&hd, b, 2);
      d[j] = _mm512_set1_ps(_cvtsh_ss(hd));
      if constexpr (F == WeightFormat::kQ4_1) {
        uint16_t hm;
        std::memcpy(&hm, b + 2, 2);
        m[j] = _mm512_set1_ps(_cvtsh_ss(hm));
        q[j] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 4));
      } else {
        m[j] = _mm512_setzero_ps();
        q[j] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 2));
      }
    }
#pragma GCC unroll 8
    for (int h = 0; h < 2; ++h) {
      __m512 wv[NW];
#pragma GCC unroll 8
      for (int j = 0; j < NW; ++j) {
        if constexpr (F == WeightFormat::kQ4_1) {
          const __m128i nib = h == 0 ? _mm_and_si128(q[j], low4) : _mm_and_si128(_mm_srli_epi16(q[j], 4), low4);
          wv[j] = _mm512_fmadd_ps(d[j], _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(nib)), m[j]);
        } else {
          const __m128i qq = h == 0 ? q[j] : _mm_loadu_si128(reinterpret_cast<const __m128i*>(w + j * row_bytes + off + 18));
          wv[j] = _mm512_mul_ps(d[j], _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(qq)));
        }
      }
#pragma GCC unroll 8
      for (int i = 0; i < NX; ++i) {
        __m512 xv = _mm512_loadu_ps(x + i * cols + k + 16 * h);
        asm("" : "+v"(xv));  // one load per x vector (see tile16)
#pragma GCC unroll 8
        for (int j = 0; j < NW; ++j) acc[i][j] = _mm512_fmadd_ps(xv, wv[j], acc[i][j]);
      }
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < NX; ++i)
#pragma GCC unroll 8
    for (int j = 0; j < NW; ++j) y[i * ldy + j] = reduce16(acc[i][j]);
}

template <WeightFormat F, int NW>
SPECSERVE_AVX512 __attribute__((noinline)) void rows16_blocks(const float* x, const uint8_t* w, int64_t row_bytes, float* y,
                                                              int64_t nx, int64_t cols, int64_t ldy) {
  switch (nx) {
    case 8: if constexpr (NW <= 2) return tile16_blocks<F, 8, NW>(x, w, row_bytes, y, cols, ldy); break;
    case 7: if constexpr (NW <= 2) return tile16_blocks<F, 7, NW>(x, w, row_bytes, y, cols, ldy); break;
    case 6: if constexpr (NW <= 2) return tile16_blocks<F, 6, NW>(x, w, row_bytes, y, cols, ldy); break;
    case 5: if constexpr (NW <= 2) return tile16_blocks<F, 5, NW>(x, w, row_bytes, y, cols, ldy); break;
    case 4: return tile16_blocks<F, 4, NW>(x, w, row_bytes, y, cols, ldy);
    case 3: return tile16_blocks<F, 3, NW>(x, w, row_bytes, y, cols, ldy);
    case 2: return tile16_blocks<F, 2, NW>(x, w, row_bytes, y, cols, ldy);
    default: return tile16_blocks<F, 1, NW>(x, w, row_bytes, y, cols, ldy);
  }
  SPECSERVE_CHECK(false, "matmul: " + std::to_string(nx) + " x rows against " + std::to_string(NW) + " fused weight rows");
}

}  // namespace

SPECSERVE_AVX512 void tile_blocks_avx512(WeightFormat f, const float* x, const uint8_t* w, int64_t row_bytes, float* y,
                                         int64_t nx, int64_t nw, int64_t cols, int64_t ldy) {
  const bool q4 = f == WeightFormat::kQ4_1;
  if (nx > 4 && nw == 3) {
    tile_blocks_avx512(f, x, w, row_bytes, y, nx, 2, cols, ldy);
    return tile_blocks_avx512(f, x, w + 2 * row_bytes, row_bytes, y + 2, nx, 1, cols, ldy);
  }
  switch (nw) {
    case 3: return q4 ? rows16_blocks<WeightFormat::kQ4_1, 3>(x, w, row_bytes, y, nx, cols, ldy)
                      : rows16_blocks<WeightFormat::kQ8_0, 3>(x, w, row_bytes, y, nx, cols, ldy);
    case 2: return q4 ? rows16_blocks<WeightFormat::kQ4_1, 2>(x, w, row_bytes, y, nx, cols, ldy)
                      : rows16_blocks<WeightFormat::kQ8_0, 2>(x, w, row_bytes, y, nx, cols, ldy);
    default: return q4 ? rows16_blocks<WeightFormat::kQ4_1, 1>(x, w, row_bytes, y, nx, cols, ldy)
                       : rows16_blocks<WeightFormat::kQ8_0, 1>(x, w, row_bytes, y, nx, cols, ldy);
  }
}


#pragma GCC diagnostic pop

namespace {


template <WeightFormat F, int NX, int NW>
inline void tile8_blocks(const float* x, const uint8_t* w, int64_t row_bytes, float* y, int64_t cols, int64_t ldy) {
  constexpr int64_t kBlockBytes = F == WeightFormat::kQ4_1 ? 20 : 34;
  __m256 acc[NX][NW];
#pragma GCC unroll 8
  for (int i = 0; i < NX; ++i)
#pragma GCC unroll 8
    for (int j = 0; j < NW; ++j) acc[i][j] = _mm256_setzero_ps();
  const __m128i low4 = _mm_set1_epi8(0x0f);
  for (int64_t k = 0, off = 0; k < cols; k += 32, off += kBlockBytes) {
    __m256 d[NW], m[NW];
    __m128i lo[NW], hi[NW];
#pragma GCC unroll 8
    for (int j = 0; j < NW; ++j) {
      const uint8_t* b = w + j * row_bytes + off;
      d[j] = _mm256_set1_ps(fp16_at(b));
      if constexpr (F == WeightFormat::kQ4_1) {
        m[j] = _mm256_set1_ps(fp16_at(b + 2));
        const __m128i qs = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 4));
        lo[j] = _mm_and_si128(qs, low4);
        hi[j] = _mm_and_si128(_mm_srli_epi16(qs, 4), low4);
      } else {
        m[j] = _mm256_setzero_ps();
        lo[j] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 2));
        hi[j] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 18));
      }
    }
#pragma GCC unroll 8
    for (int s = 0; s < 4; ++s) {
      __m256 wv[NW];
#pragma GCC unroll 8
      for (int j = 0; j < NW; ++j) {
        const __m128i src = s < 2 ? lo[j] : hi[j];
        const __m128i part = s % 2 == 0 ? src : _mm_srli_si128(src, 8);
        if constexpr (F == WeightFormat::kQ4_1) {
          wv[j] = _mm256_fmadd_ps(d[j], u8_to_ps(part), m[j]);
        } else {
          wv[j] = _mm256_mul_ps(d[j], _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(part)));
        }
      }
#pragma GCC unroll 8
      for (int i = 0; i < NX; ++i) {
        const __m256 xv = _mm256_loadu_ps(x + i * cols + k + 8 * s);
#pragma GCC unroll 8
        for (int j = 0; j < NW; ++j) acc[i][j] = _mm256_fmadd_ps(xv, wv[j], acc[i][j]);
      }
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < NX; ++i)
#pragma GCC unroll 8
    for (int j = 0; j < NW; ++j) y[i * ldy + j] = reduce8(acc[i][j]);
}

template <WeightFormat F>
void tile_blocks_avx2_of(const float* x, const uint8_t* w, int64_t row_bytes, float* y, int64_t nx, int64_t nw, int64_t cols,
                         int64_t ldy) {
  if (nx > 2) {  // 3 or 4 x rows: one weight row at a time (the accumulators of two would not fit)
    for (int64_t j = 0; j < nw; ++j) {
      if (nx == 4) tile8_blocks<F, 4, 1>(x, w + j * row_bytes, row_bytes, y + j, cols, ldy);
      else tile8_blocks<F, 3, 1>(x, w + j * row_bytes, row_bytes, y + j, cols, ldy);
    }
    return;
  }
  for (int64_t j = 0; j < nw; j += 2) {
    const uint8_t* wj = w + j * row_bytes;
    float* yj = y + j;
    if (nw - j >= 2) {
      if (nx == 2) tile8_blocks<F, 2, 2>(x, wj, row_bytes, yj, cols, ldy); else tile8_blocks<F, 1, 2>(x, wj, row_bytes, yj, cols, ldy);
    } else {
      if (nx == 2) tile8_blocks<F, 2, 1>(x, wj, row_bytes, yj, cols, ldy); else tile8_blocks<F, 1, 1>(x, wj, row_bytes, yj, cols, ldy);
    }
  }
}

}  // namespace

void tile_blocks_avx2(WeightFormat f, const float* x, const uint8_t* w, int64_t row_bytes, float* y, int64_t nx, int64_t nw,
                      int64_t cols, int64_t ldy) {
  if (f == WeightFormat::kQ4_1) return tile_blocks_avx2_of<WeightFormat::kQ4_1>(x, w, row_bytes, y, nx, nw, cols, ldy);
  tile_blocks_avx2_of<WeightFormat::kQ8_0>(x, w, row_bytes, y, nx, nw, cols, ldy);
}


}  // namespace specserve::matmul_internal
