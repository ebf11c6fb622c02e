// The AMX bf16 matmul kernel (cpu/matmul_amx.h); cpu/matmul.cpp dispatches to it under
// SPECSERVE_CPU_MATMUL=amx. Compiled for AMX and AVX-512 by function attribute only, like the
// AVX-512 kernels, and reached only after amx_usable().
#include "cpu/matmul_amx.h"

#include <immintrin.h>
#include <omp.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace specserve {

// AMX needs the CPU's amx-tile, amx-bf16 and avx512bf16, and Linux's permission for the tile
// data state (arch_prctl ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA; once per process).
// Why AMX cannot run here ("" when it can), for the warnings.
const std::string& amx_refusal() {
  static const std::string why = []() -> std::string {
    if (!__builtin_cpu_supports("amx-tile") || !__builtin_cpu_supports("amx-bf16") || !__builtin_cpu_supports("avx512bf16"))
      return "this CPU lacks amx-tile, amx-bf16 or avx512bf16";
    constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    if (syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) != 0)
      return std::string("the kernel refused the AMX tile state (arch_prctl ARCH_REQ_XCOMP_PERM: ") + std::strerror(errno) + ")";
    return "";
  }();
  return why;
}

bool amx_usable() { return amx_refusal().empty(); }

namespace {

// SPECSERVE_CPU_MATMUL=amx: bf16 tiles, fp32 accumulation (Intel SDM, TDPBF16PS). A weight tile
// of 32 rows is dequantised (or copied) to bf16 and forms two A tiles of 16 rows x 32 k; the x
// rows are packed once per call into the B operand's pair layout, as many per B tile as there
// are rows up to 16; C holds y^T (weight rows x x rows). Each C element depends only on its own
// x row and weight row, so batch invariance holds; padding rows of a last, partial group of 16
// hold stale values whose results are dropped.

#define SPECSERVE_AMX __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512bf16,avx2,fma,f16c")))
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

struct alignas(64) TileConfig {
  uint8_t palette_id = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

constexpr int64_t kAmxWRows = 32;  // weight rows per tile (two A tiles)

// Bytes of one block of 32 weights (F32: 32 floats).
constexpr int64_t format_block_bytes(WeightFormat f) { return f == WeightFormat::kQ4_1 ? 20 : f == WeightFormat::kQ8_0 ? 34 : 128; }
constexpr int64_t kAmxXRows = 16;  // x rows per B tile

// 32 floats -> 32 bf16 (round to nearest even), as one 64-byte vector in k order.
SPECSERVE_AMX inline __m512i bf16x32(__m512 lo, __m512 hi) { return reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(hi, lo)); }

// One Q4_1 block (fp16 d, fp16 m, 16 bytes of nibbles) as 32 bf16 in k order: the 16 values
// d * q + m (q = 0..15) are computed once, exactly as dequant_row_q4_1_avx512 computes each
// element (one fused multiply-add, then rounded to bf16), and the nibbles pick from them
// (vpermw), so the result equals rounding that function's floats.
SPECSERVE_AMX inline __m512i q4_1_block_bf16(const uint8_t* p) {
  const __m512 iota = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  uint16_t hd, hm;
  std::memcpy(&hd, p, 2);
  std::memcpy(&hm, p + 2, 2);
  const __m512 values = _mm512_fmadd_ps(_mm512_set1_ps(_cvtsh_ss(hd)), iota, _mm512_set1_ps(_cvtsh_ss(hm)));
  const __m512i lut = _mm512_castsi256_si512(reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(values)));
  const __m128i low4 = _mm_set1_epi8(0x0f);
  const __m128i qs = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 4));
  const __m128i lo = _mm_and_si128(qs, low4), hi = _mm_and_si128(_mm_srli_epi16(qs, 4), low4);
  const __m512i idx = _mm512_cvtepu8_epi16(_mm256_set_m128i(hi, lo));
  return _mm512_permutexvar_epi16(idx, lut);
}

constexpr int64_t kAmxKChunk = 256;  // k per dequantised chunk: 32 rows x 256 bf16 = 16 KiB, in L1

// Columns [c0, c0 + nc) of weight rows [r0, r0 + nw) as bf16 into out (kAmxWRows rows of nc);
// rows past nw are zero. The values are the floats dequantize_rows gives, rounded to bf16.
SPECSERVE_AMX void weight_chunk_bf16(const MatmulWeight& w, int64_t r0, int64_t nw, int64_t c0, int64_t nc, uint16_t* out) {
  const int64_t rb = weight_row_bytes(w.format, w.cols);
  for (int64_t i = 0; i < kAmxWRows; ++i) {
    uint16_t* o = out + i * nc;
    if (i >= nw) {
      std::memset(o, 0, static_cast<size_t>(nc) * 2);
      continue;
    }
    const uint8_t* row = static_cast<const uint8_t*>(w.data) + (r0 + i) * rb;
    // The blocks this row's next chunk reads (or, after the last chunk, those of the same row of
    // the next weight tile, which this thread's static schedule often takes next): spread over
    // the dequantisation so that few line fills are outstanding at once. PREFETCHT0 never
    // faults; the address is formed as an integer.
    {
      const int64_t next_c = c0 + nc < w.cols ? c0 + nc : 0, next_r = c0 + nc < w.cols ? r0 + i : r0 + i + kAmxWRows;
      if (next_r < w.rows) {
        const uintptr_t p = reinterpret_cast<uintptr_t>(w.data) + static_cast<uintptr_t>(next_r * rb + weight_row_bytes(w.format, next_c));
        const int64_t bytes = weight_row_bytes(w.format, std::min(kAmxKChunk, w.cols - next_c));
        for (int64_t o = 0; o < bytes; o += 64) _mm_prefetch(reinterpret_cast<const char*>(p + o), _MM_HINT_T0);
      }
    }
    switch (w.format) {
      case WeightFormat::kQ4_1: {
        const uint8_t* b = row + c0 / 32 * 20;
        for (int64_t c = 0; c < nc; c += 32, b += 20) _mm512_storeu_si512(o + c, q4_1_block_bf16(b));
        break;
      }
      case WeightFormat::kQ8_0: {
        const uint8_t* b = row + c0 / 32 * 34;
        for (int64_t c = 0; c < nc; c += 32, b += 34) {
          uint16_t hd;
          std::memcpy(&hd, b, 2);
          const __m512 d = _mm512_set1_ps(_cvtsh_ss(hd));
          const __m512 flo = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 2)))));
          const __m512 fhi = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 18)))));
          _mm512_storeu_si512(o + c, bf16x32(flo, fhi));
        }
        break;
      }
      default: {
        const float* f = reinterpret_cast<const float*>(row) + c0;
        for (int64_t c = 0; c < nc; c += 32) _mm512_storeu_si512(o + c, bf16x32(_mm512_loadu_ps(f + c), _mm512_loadu_ps(f + c + 16)));
        break;
      }
    }
  }
}

// Block b (columns 32b .. 32b + 31) of weight rows [r0, r0 + nw) as bf16 into out[32][32]: the
// A tiles of one k step. Rows past nw are left as they are (the caller zeroes them once). Also
// prefetches the line each row reads kStepPrefetch blocks later.
constexpr int64_t kStepPrefetch = 8;
SPECSERVE_AMX inline void weight_step_bf16(const MatmulWeight& w, int64_t r0, int64_t nw, int64_t b, uint16_t* out) {
  const int64_t rb = weight_row_bytes(w.format, w.cols), nb = w.cols / 32;
  const uint8_t* base = static_cast<const uint8_t*>(w.data) + r0 * rb;
  // The target: the same row kStepPrefetch blocks on; near the row's end, that row of the next
  // weight tile (which this thread's static schedule, contiguous ranges, takes next), at the
  // block as far into it. Rows with no such block inside the weight get no prefetch. The address
  // is formed as an integer (PREFETCHT0 never faults) from offsets that stay inside the weight.
  const int64_t bb = format_block_bytes(w.format);
  const bool ahead = b + kStepPrefetch < nb;
  const int64_t next_block = ahead ? b + kStepPrefetch : b + kStepPrefetch - nb;
  const int64_t next_row0 = ahead ? r0 : r0 + kAmxWRows;
  const int64_t rows_ok = next_block < nb ? std::clamp<int64_t>(w.rows - next_row0, 0, nw) : 0;  // rows with a target
  const uintptr_t next = reinterpret_cast<uintptr_t>(w.data) + static_cast<uintptr_t>(next_row0 * rb + next_block * bb);
  switch (w.format) {
    case WeightFormat::kQ4_1: {
      for (int64_t i = 0; i < nw; ++i) {
        const uint8_t* p = base + i * rb + b * 20;
        if (i < rows_ok) _mm_prefetch(reinterpret_cast<const char*>(next + static_cast<uintptr_t>(i * rb)), _MM_HINT_T0);
        _mm512_store_si512(out + i * 32, q4_1_block_bf16(p));
      }
      break;
    }
    case WeightFormat::kQ8_0:
      for (int64_t i = 0; i < nw; ++i) {
        const uint8_t* p = base + i * rb + b * 34;
        if (i < rows_ok) _mm_prefetch(reinterpret_cast<const char*>(next + static_cast<uintptr_t>(i * rb)), _MM_HINT_T0);
        uint16_t hd;
        std::memcpy(&hd, p, 2);
        const __m512 d = _mm512_set1_ps(_cvtsh_ss(hd));
        const __m512 flo = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 2)))));
        const __m512 fhi = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 18)))));
        _mm512_store_si512(out + i * 32, bf16x32(flo, fhi));
      }
      break;
    default:
      for (int64_t i = 0; i < nw; ++i) {
        const float* f = reinterpret_cast<const float*>(base + i * rb) + b * 32;
        _mm512_store_si512(out + i * 32, bf16x32(_mm512_loadu_ps(f), _mm512_loadu_ps(f + 16)));
      }
      break;
  }
}

// x rows per B tile for a product of n rows: n itself when one tile holds them all (decode,
// verification: a narrower tile moves fewer bytes), else 16 with the last group padded.
inline int64_t amx_tile_cols(int64_t n) { return n <= kAmxXRows ? n : kAmxXRows; }

// x rows [0, n) as the B operand, nc = amx_tile_cols(n) rows per group: group g, pair p = k / 2
// holds (x[m][2p], x[m][2p+1]) as bf16 at out[((g * cols / 2) + p) * nc + m] (32-bit units).
// The padding rows of a last, partial group of 16 are not written: they hold whatever finite
// bf16 an earlier call left (the buffer starts zeroed), and their results are never read; a
// C element's products involve only its own x row.
SPECSERVE_AMX void pack_x_bf16(const float* x, int64_t n, int64_t cols, uint32_t* out) {
  const int64_t pairs = cols / 2, nc = amx_tile_cols(n);
  alignas(64) uint32_t tmp[16];
  for (int64_t r = 0; r < n; ++r) {
    uint32_t* g = out + (r / nc) * pairs * nc + (r % nc);
    const float* xr = x + r * cols;
    for (int64_t k = 0; k < cols; k += 32) {
      _mm512_store_si512(tmp, bf16x32(_mm512_loadu_ps(xr + k), _mm512_loadu_ps(xr + k + 16)));
#pragma GCC unroll 16
      for (int j = 0; j < 16; ++j) g[(k / 2 + j) * nc] = tmp[j];
    }
  }
}

// Tiles 0, 1: C (16 weight rows x nc x rows, fp32); 2: B (16 k pairs x nc x rows); 3, 4: A
// (16 weight rows x 32 k). Per thread; TILERELEASE ends it.
// NOTE: GCC 12's AMX intrinsics are asm statements that do not tell the compiler they read
// memory (_tile_loadd names only the address; _tile_loadconfig 8 of the 64 bytes). A compiler
// barrier before each one keeps the stores they read (the config, the dequantised weights, x)
// from being sunk past or dropped.
#define SPECSERVE_TILE_BARRIER() asm volatile("" ::: "memory")

SPECSERVE_AMX void amx_tile_config(int64_t nc) {
  TileConfig cfg;
  for (int t = 0; t < 5; ++t) {
    cfg.rows[t] = 16;
    cfg.colsb[t] = static_cast<uint16_t>(t <= 2 ? 4 * nc : 64);
  }
  SPECSERVE_TILE_BARRIER();
  _tile_loadconfig(&cfg);
}

// A per-thread buffer that only grows: a call's buffers would otherwise be allocated and zeroed
// hundreds of times per decode step (unlike matmul_with's small per-call tile buffer). NOTE: the
// packed x stays as large as the largest product the thread has run (cols x rows x 2 bytes: 6 MiB
// after a 2,048-token prefill of the 1,536-wide MLP), held by the thread for the process's life.
template <typename T>
T* scratch(std::vector<T>& v, size_t n) {
  if (v.size() < n) v.resize(n);
  return v.data();
}

// y[n, rows] for the weight tile of rows [r0, r0 + nw). acc holds each group's two C tiles
// (2 x 16 x nc floats per group). The k order and the values do not depend on n.
SPECSERVE_AMX void amx_weight_tile(const MatmulWeight& w, const uint32_t* xb, float* y, int64_t n, int64_t r0, int64_t nw,
                                   uint16_t* wchunk, float* acc) {
  const int64_t cols = w.cols, pairs = cols / 2, nc = amx_tile_cols(n), groups = (n + nc - 1) / nc;
  const int64_t cstride = 4 * nc, csize = 16 * nc;  // C row bytes, floats per C tile
  if (groups == 1) {
    // One x group (decode, verification): one 32-wide k step at a time, so the tile unit
    // multiplies step s while the vector units dequantise a later one; the C tiles stay in
    // registers. Three buffers: step b's tiles are loaded two steps after they were written,
    // when those stores have left the store buffer (a tile load waits for stores to its lines).
    constexpr int kBufs = 3;
    alignas(64) uint16_t steps[kBufs][kAmxWRows * 32];
    if (nw < kAmxWRows)
      for (auto& st : steps) std::memset(st + nw * 32, 0, static_cast<size_t>(kAmxWRows - nw) * 64);
    const int64_t nb = cols / 32;
    _tile_zero(0);
    _tile_zero(1);
    for (int64_t b = 0; b < std::min<int64_t>(kBufs - 1, nb); ++b) weight_step_bf16(w, r0, nw, b, steps[b]);
    for (int64_t b = 0; b < nb; ++b) {
      const uint16_t* cur = steps[b % kBufs];
      SPECSERVE_TILE_BARRIER();
      _tile_loadd(2, xb + b * 16 * nc, cstride);
      _tile_loadd(3, cur, 64);
      _tile_dpbf16ps(0, 3, 2);
      _tile_loadd(4, cur + 16 * 32, 64);
      _tile_dpbf16ps(1, 4, 2);
      if (b + kBufs - 1 < nb) weight_step_bf16(w, r0, nw, b + kBufs - 1, steps[(b + kBufs - 1) % kBufs]);
    }
    _tile_stored(0, acc, cstride);
    _tile_stored(1, acc + csize, cstride);
    SPECSERVE_TILE_BARRIER();  // the scatter below reads what the tile stores wrote
  } else {
    // Several groups (prefill): a 256-wide k chunk is dequantised once and multiplied into every
    // group's C tiles, which wait in acc between chunks (an exact fp32 round trip).
    for (int64_t c0 = 0; c0 < cols; c0 += kAmxKChunk) {
      const int64_t kc = std::min(kAmxKChunk, cols - c0);
      weight_chunk_bf16(w, r0, nw, c0, kc, wchunk);
      for (int64_t g = 0; g < groups; ++g) {
        float* cg = acc + g * 2 * csize;
        SPECSERVE_TILE_BARRIER();
        if (c0 == 0) {
          _tile_zero(0);
          _tile_zero(1);
        } else {
          _tile_loadd(0, cg, cstride);
          _tile_loadd(1, cg + csize, cstride);
        }
        const uint32_t* xg = xb + g * pairs * nc;
        for (int64_t k = 0; k < kc; k += 32) {
          _tile_loadd(2, xg + ((c0 + k) / 2) * nc, cstride);
          _tile_loadd(3, wchunk + k, kc * 2);
          _tile_dpbf16ps(0, 3, 2);
          _tile_loadd(4, wchunk + 16 * kc + k, kc * 2);
          _tile_dpbf16ps(1, 4, 2);
        }
        _tile_stored(0, cg, cstride);
        _tile_stored(1, cg + csize, cstride);
        SPECSERVE_TILE_BARRIER();
      }
    }
  }
  // C tile j of group g holds y^T: element [weight row i][x row m] at acc[g][j][i * nc + m].
  for (int64_t r = 0; r < n; ++r) {
    const float* cg = acc + (r / nc) * 2 * csize;
    const int64_t m = r % nc;
    float* yr = y + r * w.rows + r0;
    for (int64_t j = 0; j < nw; ++j) yr[j] = cg[(j / 16) * csize + (j % 16) * nc + m];
  }
}

}  // namespace

SPECSERVE_AMX void matmul_amx(const float* x, const MatmulWeight& w, float* y, int64_t n) {
  if (n <= 0) return;
  const int64_t rows = w.rows, cols = w.cols, nc = amx_tile_cols(n);
  const int64_t groups = (n + nc - 1) / nc;
  static thread_local std::vector<uint32_t> xb_buf;
  uint32_t* xb = scratch(xb_buf, static_cast<size_t>(groups * (cols / 2) * nc));
  pack_x_bf16(x, n, cols, xb);
  const int64_t num_wt = (rows + kAmxWRows - 1) / kAmxWRows;
#pragma omp parallel if (rows * n * cols > 3 * 32768)  // matmul_with's threshold
  {
    static thread_local std::vector<uint16_t> wchunk_buf;
    static thread_local std::vector<float> acc_buf;
    uint16_t* wchunk = scratch(wchunk_buf, static_cast<size_t>(kAmxWRows * kAmxKChunk));
    float* acc = scratch(acc_buf, static_cast<size_t>(groups * 2 * 16 * nc));
    amx_tile_config(nc);
#pragma omp for schedule(static)
    for (int64_t t = 0; t < num_wt; ++t) {
      const int64_t r0 = t * kAmxWRows, nw = std::min(kAmxWRows, rows - r0);
      amx_weight_tile(w, xb, y, n, r0, nw, wchunk, acc);
    }
    _tile_release();
  }
}

#pragma GCC diagnostic pop
#undef SPECSERVE_TILE_BARRIER
#undef SPECSERVE_AMX

}  // namespace specserve
