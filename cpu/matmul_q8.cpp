// specserve cpu: the int8 matmul (SPECSERVE_CPU_MATMUL=vnni, cpu/matmul.h): Q4_1 / Q8_0 weights
// repacked 16 rows at a time, x quantised to int8 per 32-value block, integer dot products by
// AVX512-VNNI's VPDPBUSD (Intel SDM vol. 2, "VPDPBUSD"). The scheme is llama.cpp's for these
// formats (ggml-cpu: activations as block_q8_1 — d = amax / 127, q = round(x * 127 / amax),
// s = d * sum(q) — against block_q4_1 / block_q8_0, and its repacked "x8" GEMM layouts), written
// here for 16-lane registers; no code is taken from it.
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "core/status.h"
#include "cpu/matmul_internal.h"

#define SPECSERVE_VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))

namespace specserve {
namespace {

constexpr int64_t kGroup = 16;  // weight rows per packed group: one output lane each

// Packed record of one group (16 weight rows) and one 32-value block; records are stored block
// by block within a group, group after group.
//   Q4_1 (320 bytes): fp16 d[16], fp16 m[16], then 4 x 64 bytes: vector t (t = 0..3) holds in
//     lane r (4 bytes) the quants of row r at k = 4t..4t+3 in its low nibbles and at
//     k = 16+4t..16+4t+3 in its high nibbles.
//   Q8_0 (576 bytes): fp16 d[16], int16 sum[16] (the row's 32 quants summed), then 8 x 64
//     bytes: vector s (s = 0..7) holds in lane r the int8 quants of row r at k = 4s..4s+3.
constexpr int64_t record_bytes(WeightFormat f) { return f == WeightFormat::kQ4_1 ? 320 : 576; }

// The 32 quants of one GGUF block, in k order (Q4_1: 0..15; Q8_0: -128..127).
void block_quants(WeightFormat f, const uint8_t* b, int32_t* q) {
  if (f == WeightFormat::kQ4_1) {
    for (int j = 0; j < 16; ++j) {
      q[j] = b[4 + j] & 0x0f;
      q[j + 16] = b[4 + j] >> 4;
    }
  } else {
    for (int j = 0; j < 32; ++j) q[j] = static_cast<int8_t>(b[2 + j]);
  }
}

}  // namespace

int64_t packed_q8_bytes(const MatmulWeight& w) {
  const int64_t groups = (w.rows + kGroup - 1) / kGroup;
  return groups * (w.cols / 32) * record_bytes(w.format);
}

std::vector<uint8_t> pack_weight_q8(const MatmulWeight& w) {
  SPECSERVE_CHECK(w.format == WeightFormat::kQ4_1 || w.format == WeightFormat::kQ8_0,
                  "pack_weight_q8: only Q4_1 and Q8_0 weights are packed");
  SPECSERVE_CHECK(w.cols % 32 == 0, "pack_weight_q8: width " + std::to_string(w.cols) + " is not a multiple of 32");
  const int64_t nb = w.cols / 32, groups = (w.rows + kGroup - 1) / kGroup, rb = weight_row_bytes(w.format, w.cols);
  const int64_t bs = w.format == WeightFormat::kQ4_1 ? 20 : 34;
  std::vector<uint8_t> out(static_cast<size_t>(packed_q8_bytes(w)), 0);  // rows past w.rows: d = m = 0, quants 0
  const auto* src = static_cast<const uint8_t*>(w.data);
#pragma omp parallel for schedule(static)
  for (int64_t g = 0; g < groups; ++g) {
    int32_t q[32];
    for (int64_t b = 0; b < nb; ++b) {
      uint8_t* rec = out.data() + (g * nb + b) * record_bytes(w.format);
      for (int64_t r = 0; r < kGroup && g * kGroup + r < w.rows; ++r) {
        const uint8_t* blk = src + (g * kGroup + r) * rb + b * bs;
        block_quants(w.format, blk, q);
        std::memcpy(rec + 2 * r, blk, 2);  // d
        if (w.format == WeightFormat::kQ4_1) {
          std::memcpy(rec + 32 + 2 * r, blk + 2, 2);  // m
          for (int t = 0; t < 4; ++t)
            for (int c = 0; c < 4; ++c)
              rec[64 + 64 * t + 4 * r + c] = static_cast<uint8_t>(q[4 * t + c] | (q[16 + 4 * t + c] << 4));
        } else {
          int16_t sum = 0;
          for (int j = 0; j < 32; ++j) sum = static_cast<int16_t>(sum + q[j]);
          std::memcpy(rec + 32 + 2 * r, &sum, 2);
          for (int s = 0; s < 8; ++s)
            for (int c = 0; c < 4; ++c) rec[64 + 64 * s + 4 * r + c] = static_cast<uint8_t>(static_cast<int8_t>(q[4 * s + c]));
        }
      }
    }
  }
  return out;
}

bool vnni_usable() {
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
         __builtin_cpu_supports("avx512vnni");
}

namespace {

// One x row quantised: llama.cpp's block_q8_1 split in arrays. qs: int8 quants (Q4_1 weights) or
// the quants + 128 as unsigned bytes (Q8_0 weights, VPDPBUSD's unsigned operand); d: the block's
// scale amax / 127 (0 for an all-zero block or one too small to scale; NaN for a block with a
// NaN or an infinity, so every product with it is NaN); s: d * sum(q) (Q4_1's min term).
struct QuantX {
  std::vector<uint8_t> qs;
  std::vector<float> d, s;
};

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
SPECSERVE_VNNI void quantize_rows_q8(const float* x, int64_t n, int64_t cols, bool unsigned_q, QuantX& out) {
  const int64_t nb = cols / 32;
  out.qs.resize(static_cast<size_t>(n * cols));
  out.d.resize(static_cast<size_t>(n * nb));
  out.s.resize(static_cast<size_t>(n * nb));
#pragma omp parallel for schedule(static) if (n * cols >= 65536)
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t b = 0; b < nb; ++b) {
      const float* xb = x + i * cols + b * 32;
      const __m512 v0 = _mm512_loadu_ps(xb), v1 = _mm512_loadu_ps(xb + 16);
      const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
      // A block too small for 127 / amax to be finite (amax below ~3.7e-37) counts as zeros. A
      // block holding a NaN or an infinity gets the scale NaN, so every output that reads it is
      // NaN: non-finite, as the fp32 kernels' are (otherwise max_ps drops a NaN, the conversion
      // turns it into -128 and an all-NaN row into zeros: finite logits from a corrupt model).
      // Tested on the exponent bits (all ones exactly for those), which no fast-math folds away.
      const __m512i exp_bits = _mm512_set1_epi32(0x7f800000);
      const bool non_finite =
          (_mm512_cmpeq_epi32_mask(_mm512_and_si512(_mm512_castps_si512(v0), exp_bits), exp_bits) |
           _mm512_cmpeq_epi32_mask(_mm512_and_si512(_mm512_castps_si512(v1), exp_bits), exp_bits)) != 0;
      const float inv = 127.0f / amax;
      const bool zero = non_finite || !(amax > 0.0f) || !std::isfinite(inv);
      const float d = non_finite ? std::numeric_limits<float>::quiet_NaN() : zero ? 0.0f : amax / 127.0f;
      const float id = zero ? 0.0f : inv;
      // Nearest, ties to even (the MXCSR default); |x * id| <= 127 so no saturation occurs (in a
      // non-finite block a NaN or infinity lane saturates to -128: d is NaN there anyway).
      const __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, _mm512_set1_ps(id)));
      const __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, _mm512_set1_ps(id)));
      __m128i b0 = _mm512_cvtsepi32_epi8(q0), b1 = _mm512_cvtsepi32_epi8(q1);
      if (unsigned_q) {
        b0 = _mm_xor_si128(b0, _mm_set1_epi8(static_cast<char>(0x80)));
        b1 = _mm_xor_si128(b1, _mm_set1_epi8(static_cast<char>(0x80)));
      }
      uint8_t* dst = out.qs.data() + i * cols + b * 32;
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst), b0);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 16), b1);
      out.d[static_cast<size_t>(i * nb + b)] = d;
      out.s[static_cast<size_t>(i * nb + b)] = d * static_cast<float>(_mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1)));
    }
  }
}

// NX x rows against one packed group of 16 weight rows: y[i * ldy + r] for r < nr. Per output,
// block by block in k order: isum = the block's integer dot product (exact), then
// acc = fma(float(isum), d_w * d_x, acc) and, for Q4_1, acc = fma(m_w, s_x, acc). Each output
// depends on its own x row and weight row only (batch and thread invariance).
inline int32_t load_i32(const uint8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

template <WeightFormat F, int NX>
SPECSERVE_VNNI void group_q8(const uint8_t* rec, int64_t nb, const QuantX& qx, int64_t x0, int64_t cols, float* y,
                             int64_t ldy, int64_t nr) {
  __m512 acc[NX];
#pragma GCC unroll 8
  for (int i = 0; i < NX; ++i) acc[i] = _mm512_setzero_ps();
  const __m512i low4 = _mm512_set1_epi8(0x0f);
  const int64_t nbx = cols / 32;
  for (int64_t b = 0; b < nb; ++b, rec += record_bytes(F)) {
    const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(rec)));
    __m512 mw = _mm512_setzero_ps();
    __m512i start = _mm512_setzero_si512();
    __m512i wq[8];
    if constexpr (F == WeightFormat::kQ4_1) {
      mw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(rec + 32)));
#pragma GCC unroll 4
      for (int t = 0; t < 4; ++t) {
        const __m512i v = _mm512_loadu_si512(rec + 64 + 64 * t);
        wq[t] = _mm512_and_si512(v, low4);
        wq[t + 4] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
      }
    } else {
      // (q_x + 128) . q_w = q_x . q_w + 128 * sum(q_w): start each sum at -128 * sum(q_w).
      const __m512i sum = _mm512_cvtepi16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(rec + 32)));
      start = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(sum, 7));
#pragma GCC unroll 8
      for (int s = 0; s < 8; ++s) wq[s] = _mm512_loadu_si512(rec + 64 + 64 * s);
    }
#pragma GCC unroll 8
    for (int i = 0; i < NX; ++i) {
      const uint8_t* xq = qx.qs.data() + (x0 + i) * cols + b * 32;
      __m512i s0 = start, s1 = _mm512_setzero_si512();
#pragma GCC unroll 8
      for (int s = 0; s < 8; s += 2) {
        // Each 4 bytes of x broadcast straight from memory (one load, no trip through a general
        // register: that had cost a shift and a register-to-vector broadcast per 64 products).
        const __m512i xa = _mm512_set1_epi32(load_i32(xq + 4 * s)), xb = _mm512_set1_epi32(load_i32(xq + 4 * s + 4));
        if constexpr (F == WeightFormat::kQ4_1) {
          s0 = _mm512_dpbusd_epi32(s0, wq[s], xa);
          s1 = _mm512_dpbusd_epi32(s1, wq[s + 1], xb);
        } else {
          s0 = _mm512_dpbusd_epi32(s0, xa, wq[s]);
          s1 = _mm512_dpbusd_epi32(s1, xb, wq[s + 1]);
        }
      }
      const float dx = qx.d[static_cast<size_t>((x0 + i) * nbx + b)];
      acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(s0, s1)), _mm512_mul_ps(dw, _mm512_set1_ps(dx)), acc[i]);
      if constexpr (F == WeightFormat::kQ4_1) {
        acc[i] = _mm512_fmadd_ps(mw, _mm512_set1_ps(qx.s[static_cast<size_t>((x0 + i) * nbx + b)]), acc[i]);
      }
    }
  }
  const __mmask16 keep = nr >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << nr) - 1);
#pragma GCC unroll 8
  for (int i = 0; i < NX; ++i) _mm512_mask_storeu_ps(y + i * ldy, keep, acc[i]);
}
#pragma GCC diagnostic pop

template <WeightFormat F>
SPECSERVE_VNNI void group_rows(const uint8_t* rec, int64_t nb, const QuantX& qx, int64_t n, int64_t cols, float* y, int64_t ldy,
                               int64_t nr) {
  constexpr int64_t kMaxX = 8;  // 8 weight vectors, 8 accumulators and the temporaries fit 32 registers
  for (int64_t x0 = 0; x0 < n; x0 += kMaxX) {
    float* yx = y + x0 * ldy;
    switch (std::min(kMaxX, n - x0)) {
      case 8: group_q8<F, 8>(rec, nb, qx, x0, cols, yx, ldy, nr); break;
      case 7: group_q8<F, 7>(rec, nb, qx, x0, cols, yx, ldy, nr); break;
      case 6: group_q8<F, 6>(rec, nb, qx, x0, cols, yx, ldy, nr); break;
      case 5: group_q8<F, 5>(rec, nb, qx, x0, cols, yx, ldy, nr); break;
      case 4: group_q8<F, 4>(rec, nb, qx, x0, cols, yx, ldy, nr); break;
      case 3: group_q8<F, 3>(rec, nb, qx, x0, cols, yx, ldy, nr); break;
      case 2: group_q8<F, 2>(rec, nb, qx, x0, cols, yx, ldy, nr); break;
      default: group_q8<F, 1>(rec, nb, qx, x0, cols, yx, ldy, nr); break;
    }
  }
}

}  // namespace

void matmul_q8(const float* x, const MatmulWeight& w, const void* packed, float* y, int64_t n) {
  SPECSERVE_CHECK(w.format == WeightFormat::kQ4_1 || w.format == WeightFormat::kQ8_0, "matmul_q8: a Q4_1 or Q8_0 weight");
  MatmulWeight wp = w;
  wp.packed_q8 = packed;
  matmul_q8_multi(x, &wp, &y, 1, n);
}

void matmul_q8_multi(const float* x, const MatmulWeight* ws, float* const* ys, int64_t count, int64_t n) {
  SPECSERVE_CHECK(count >= 1, "matmul_q8_multi: no weight");
  const WeightFormat format = ws[0].format;
  const int64_t cols = ws[0].cols;
  SPECSERVE_CHECK(format == WeightFormat::kQ4_1 || format == WeightFormat::kQ8_0, "matmul_q8: a Q4_1 or Q8_0 weight");
  for (int64_t i = 0; i < count; ++i)
    SPECSERVE_CHECK(ws[i].format == format && ws[i].cols == cols && ws[i].packed_q8 != nullptr,
                    "matmul_q8_multi: weights of one format and width, each with its packed copy");
  const UnitRanges group_of(ws, count, kGroup);  // weight i owns groups [start(i), start(i + 1))
  static const bool usable = vnni_usable();  // (CPUID once, not per matmul)
  SPECSERVE_CHECK(usable, "matmul_q8: this CPU lacks avx512vnni");
  if (n <= 0) return;
  // x is quantised once for all the weights (its blocks do not depend on the weight).
  // NOTE: per calling thread, reused: a decode step calls this ~120 times.
  thread_local QuantX qx;
  quantize_rows_q8(x, n, cols, format == WeightFormat::kQ8_0, qx);
  const int64_t nb = cols / 32, rec = record_bytes(format), groups = group_of.total();
  const QuantX& q = qx;
#pragma omp parallel for schedule(static) if (groups * n * cols > 32768)
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t i = group_of.weight_of(g);
    const MatmulWeight& w = ws[i];
    const int64_t lg = g - group_of.start(i);
    const uint8_t* r = static_cast<const uint8_t*>(w.packed_q8) + lg * nb * rec;
    const int64_t nr = std::min(kGroup, w.rows - lg * kGroup);
    float* y = ys[i] + lg * kGroup;
    // NOTE: no software prefetch: the records stream in address order, which the hardware
    // prefetcher follows; prefetching the next group into L1 made a 1-row step 1.3x as long
    // (4.6-4.7 against 3.4-3.8 ms, bench-model --decode-batches 1 2 4 on the 2-core EPYC).
    if (format == WeightFormat::kQ4_1) {
      group_rows<WeightFormat::kQ4_1>(r, nb, q, n, cols, y, w.rows, nr);
    } else {
      group_rows<WeightFormat::kQ8_0>(r, nb, q, n, cols, y, w.rows, nr);
    }
  }
  // A long prefill's quantised x is not kept for the rest of the thread's life.
  if (qx.qs.capacity() > (size_t{8} << 20)) qx = QuantX();
}

}  // namespace specserve
