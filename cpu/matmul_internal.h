// specserve cpu: what cpu/matmul.cpp and cpu/matmul_blocks.cpp share (not part of the public
// API): the reduction trees every kernel ends with, the fp16 / byte conversions of the block
// formats, and the tile kernels that dequantise Q4_1 / Q8_0 blocks in registers for few x rows
// (cpu/matmul.h fused_block_matmul). Include only from cpu/matmul*.cpp.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "cpu/matmul.h"

// AVX-512 code is compiled for avx512f by function attribute only (no -mavx512f on the files), so
// nothing shared with the rest of the program is built with instructions an older CPU lacks; it
// runs only after the CPUID check in matmul_weight's dispatch.
#define SPECSERVE_AVX512 __attribute__((target("avx512f,avx2,fma,f16c")))

namespace specserve::matmul_internal {

inline float reduce8(__m256 v) {
  // ((l0 + l4) + (l1 + l5)) + ((l2 + l6) + (l3 + l7)) in lanes l: the halves lane by lane, then
  // (t0 + t1) + (t2 + t3) by a horizontal add (fp32 addition is commutative, so this is the
  // same sum bit for bit as written out in scalars).
  const __m128 t = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 h = _mm_hadd_ps(t, t);
  return _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)));
}

// NOTE: GCC 12 warns "'__Y' is used uninitialized" inside its own avx512fintrin.h for the
// 512 -> 256 casts (they start from _mm256_undefined_ps); the upper lanes are never read.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
SPECSERVE_AVX512 inline float reduce16(__m512 v) {
  // Fixed tree: the two 256-bit halves lane by lane (l[i] + l[i + 8]), then reduce8's order.
  const __m512 swapped = _mm512_shuffle_f32x4(v, v, 0x4E);  // 256-bit halves exchanged
  return reduce8(_mm256_add_ps(_mm512_castps512_ps256(v), _mm512_castps512_ps256(swapped)));
}
#pragma GCC diagnostic pop

// The block formats' scales. NOTE: F16C by function attribute: the files' baseline flags
// (SPECSERVE_CPU_FLAGS) may omit -mf16c; every x86 CPU with AVX2 has it.
__attribute__((target("f16c"))) inline float fp16_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

// 8 unsigned bytes -> 8 floats.
inline __m256 u8_to_ps(__m128i b) { return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(b)); }

// Few x rows (decode, verification): the block-format weight is dequantised in registers as
// tile16 reads it, instead of through a per-thread buffer (a store and a load less per 16
// weights). Per accumulator the same fused multiply-adds in the same k order with the same
// dequantised values (dequant_row_*_avx512's arithmetic) as tile16 over that buffer: the same
// bits. Each 32-value block gives two 16-lane weight vectors (Q4_1: the low nibbles of its 16
// bytes, then the high ones; Q8_0: bytes 0..15, then 16..31), each FMA'd into every x row.
// Up to 4 x rows a tile of 3 weight rows runs at once; 5 to 8 take its rows 2 + 1 (16
// accumulators, the blocks' scales and two weight vectors fit the 32 registers).
constexpr int kFusedMaxRows = 8;

/// nx (1..kFusedMaxRows) x rows [nx, cols] against nw (1..3) Q4_1 or Q8_0 weight rows starting at
/// w (row_bytes apart): y[i * ldy + j] = the dot product of x row i and weight row j, bit for bit
/// what tile_avx512 gives over the rows dequantised (see cpu/matmul_blocks.cpp). cols: a multiple of 32.
SPECSERVE_AVX512 void tile_blocks_avx512(WeightFormat f, const float* x, const uint8_t* w, int64_t row_bytes, float* y,
                                         int64_t nx, int64_t nw, int64_t cols, int64_t ldy);

// The AVX2 counterpart of tile16_blocks (see there): up to kFusedMaxRowsAvx2 x rows against 1 or
// 2 weight rows, each 32-value block dequantised in registers 8 values at a time in
// dequant_row_q4_1 / dequant_row_q8_0's order and arithmetic, FMA'd in tile8's k order: the
// same bits as tile8 over the buffer. (Two weight rows at a time: the blocks' scales of more would
// not fit the 16 ymm registers beside the accumulators.)
// 3 or 4 x rows take one weight row at a time. NOTE: every loop over x rows is unrolled as far
// as its count: a partly unrolled one leaves the accumulators in memory (4 rows then ran 2.5x
// slower than the buffer, 5-8 rows under avx512 1.4x).
constexpr int kFusedMaxRowsAvx2 = 4;

/// The AVX2 counterpart: nx (1..kFusedMaxRowsAvx2) x rows against nw (1..4) weight rows, bit for
/// bit what tile_avx2 gives over the rows dequantised.
void tile_blocks_avx2(WeightFormat f, const float* x, const uint8_t* w, int64_t row_bytes, float* y, int64_t nx, int64_t nw,
                      int64_t cols, int64_t ldy);

}  // namespace specserve::matmul_internal

namespace specserve {
/// Where each of `count` weights' units (weight tiles, 16-row groups) lie in one parallel loop
/// over all of them (cpu/matmul.h matmul_weights): weight i owns units [start(i), start(i + 1)),
/// ceil(rows / unit) of them. Kept on the stack for up to 8 weights (this runs ~120 times per
/// decode step).
class UnitRanges {
 public:
  UnitRanges(const MatmulWeight* ws, int64_t count, int64_t unit) : count_(count) {
    if (count > kInline) {
      large_.resize(static_cast<size_t>(count) + 1);
      first_ = large_.data();
    }
    first_[0] = 0;
    for (int64_t i = 0; i < count; ++i) first_[i + 1] = first_[i] + (ws[i].rows + unit - 1) / unit;
  }
  UnitRanges(const UnitRanges&) = delete;
  UnitRanges& operator=(const UnitRanges&) = delete;
  int64_t start(int64_t i) const { return first_[i]; }
  int64_t total() const { return first_[count_]; }
  /// The weight unit u (0 <= u < total()) belongs to (few weights: a linear scan).
  int64_t weight_of(int64_t u) const {
    int64_t i = 0;
    while (u >= first_[i + 1]) ++i;
    return i;
  }

 private:
  static constexpr int64_t kInline = 8;
  int64_t count_;
  int64_t small_[kInline + 1];
  std::vector<int64_t> large_;
  int64_t* first_ = small_;
};

/// y[n, w.rows] = x[n, w.cols] * W^T by the vnni kernel (cpu/matmul.h, cpu/matmul_q8.cpp);
/// `packed` = pack_weight_q8(w)'s bytes. Requires vnni_usable(). Uses the OpenMP thread team.
void matmul_q8(const float* x, const MatmulWeight& w, const void* packed, float* y, int64_t n);
/// ys[i][n, ws[i].rows] = x[n, cols] * W_i^T for `count` >= 1 weights of one format (Q4_1 or
/// Q8_0) and width, each with its packed_q8 copy: x is quantised once and one parallel loop runs
/// over the 16-row groups of all of them. Each output is bit for bit what matmul_q8 gives it.
void matmul_q8_multi(const float* x, const MatmulWeight* ws, float* const* ys, int64_t count, int64_t n);
}  // namespace specserve
