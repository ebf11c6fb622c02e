#include "cpu/matmul.h"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cctype>
#include <cstring>
#include <string>

#include "core/logging.h"
#include "core/status.h"

namespace specserve {
namespace {

// ---------------------------------------------------------------------------------------------
// AVX2: 8 lanes, k steps of 8.

inline float reduce8(__m256 v) {
  // ((l0 + l4) + (l1 + l5)) + ((l2 + l6) + (l3 + l7)) in lanes l: the halves lane by lane, then
  // (t0 + t1) + (t2 + t3) by a horizontal add (fp32 addition is commutative, so this is the
  // same sum bit for bit as written out in scalars).
  const __m128 t = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 h = _mm_hadd_ps(t, t);
  return _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)));
}

// Tile of NX x rows by NW weight rows: NX*NW accumulators, k ascending.
template <int NX, int NW>
inline void tile8(const float* x, const float* w, float* y, int64_t cols, int64_t ldy) {
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
inline void rows8(const float* x, const float* w, float* y, int64_t nx, int64_t cols, int64_t ldy) {
  int64_t i = 0;
  for (; i + 3 <= nx; i += 3) tile8<3, NW>(x + i * cols, w, y + i * ldy, cols, ldy);
  for (; i < nx; ++i) tile8<1, NW>(x + i * cols, w, y + i * ldy, cols, ldy);
}

// One weight tile (nw <= 4 rows) against nx x rows.
void tile_avx2(const float* x, const float* w, float* y, int64_t nx, int64_t nw, int64_t cols, int64_t ldy) {
  switch (nw) {
    case 4: rows8<4>(x, w, y, nx, cols, ldy); break;
    case 3: rows8<3>(x, w, y, nx, cols, ldy); break;
    case 2: rows8<2>(x, w, y, nx, cols, ldy); break;
    default: rows8<1>(x, w, y, nx, cols, ldy); break;
  }
}

// ---------------------------------------------------------------------------------------------
// AVX-512: 16 lanes, k steps of 16. Compiled for avx512f by function attribute only (no
// -mavx512f on the file), so nothing shared with the rest of the program (inline functions,
// templates of the standard library) is built with instructions an older CPU lacks; it runs
// only after the CPUID check in the dispatcher below.

#define SPECSERVE_AVX512 __attribute__((target("avx512f,avx2,fma")))
// NOTE: GCC 12 warns "'__Y' is used uninitialized" inside its own avx512fintrin.h for the
// 512 -> 256 casts (they start from _mm256_undefined_ps); the upper lanes are never read.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

// Software prefetch of the weight tile this many tiles ahead (same k): the hardware prefetcher
// alone leaves multi-row tiles waiting on DRAM between tiles.
constexpr int kPrefetchTiles = 1;


SPECSERVE_AVX512 inline float reduce16(__m512 v) {
  // Fixed tree: the two 256-bit halves lane by lane (l[i] + l[i + 8]), then reduce8's order.
  const __m512 swapped = _mm512_shuffle_f32x4(v, v, 0x4E);  // 256-bit halves exchanged
  return reduce8(_mm256_add_ps(_mm512_castps512_ps256(v), _mm512_castps512_ps256(swapped)));
}

template <int NX, int NW>
SPECSERVE_AVX512 inline void tile16(const float* x, const float* w, float* y, int64_t cols, int64_t ldy) {
  __m512 acc[NX][NW];
#pragma GCC unroll 8
  for (int i = 0; i < NX; ++i)
#pragma GCC unroll 4
    for (int j = 0; j < NW; ++j) acc[i][j] = _mm512_setzero_ps();
  for (int64_t k = 0; k < cols; k += 16) {
    __m512 wv[NW];
#pragma GCC unroll 4
    for (int j = 0; j < NW; ++j) {
      if constexpr (kPrefetchTiles > 0) {
        // The address may lie past W's end on the last tile: PREFETCHT0 never faults, and the
        // address is formed as an integer, not as an out-of-range pointer.
        const uintptr_t ahead = reinterpret_cast<uintptr_t>(w + j * cols + k) + sizeof(float) * kPrefetchTiles * NW * cols;
        _mm_prefetch(reinterpret_cast<const char*>(ahead), _MM_HINT_T0);
      }
      wv[j] = _mm512_loadu_ps(w + j * cols + k);
    }
#pragma GCC unroll 8
    for (int i = 0; i < NX; ++i) {
      __m512 xv = _mm512_loadu_ps(x + i * cols + k);
      // NOTE: keeps xv in a register: otherwise GCC folds the load into every FMA, loading each
      // x vector NW times, and the kernel becomes load-bound (~0.45 of the FMA peak).
      asm("" : "+v"(xv));
#pragma GCC unroll 4
      for (int j = 0; j < NW; ++j) acc[i][j] = _mm512_fmadd_ps(xv, wv[j], acc[i][j]);
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < NX; ++i)
#pragma GCC unroll 4
    for (int j = 0; j < NW; ++j) y[i * ldy + j] = reduce16(acc[i][j]);
}

// Up to 8 x rows x 3 weight rows: 24 accumulators + 3 weight vectors + 1 x vector fill 28 of
// the 32 zmm registers, so each weight vector loaded from memory serves up to 8 rows, and a
// verification step's rows (<= 8) pass over the weights once.
constexpr int kMaxGroup = 8;
constexpr int kW16 = 3;

template <int NW, int M>
SPECSERVE_AVX512 inline void group16(const float* x, const float* w, float* y, int64_t m, int64_t cols, int64_t ldy) {
  if constexpr (M >= 1) {
    if (m == M) return tile16<M, NW>(x, w, y, cols, ldy);
    return group16<NW, M - 1>(x, w, y, m, cols, ldy);
  } else {
    SPECSERVE_CHECK(false, "matmul: x row group outside 1..kMaxGroup");
  }
}

template <int NW>
SPECSERVE_AVX512 inline void rows16(const float* x, const float* w, float* y, int64_t nx, int64_t cols, int64_t ldy) {
  const int64_t groups = (nx + kMaxGroup - 1) / kMaxGroup;
  int64_t i = 0;
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t m = (nx - i) / (groups - g);  // near-equal split; sums to nx
    group16<NW, kMaxGroup>(x + i * cols, w, y + i * ldy, m, cols, ldy);
    i += m;
  }
}

SPECSERVE_AVX512 __attribute__((noinline)) void tile_avx512(const float* x, const float* w, float* y, int64_t nx,
                                                             int64_t nw, int64_t cols, int64_t ldy) {
  switch (nw) {
    case 3: rows16<3>(x, w, y, nx, cols, ldy); break;
    case 2: rows16<2>(x, w, y, nx, cols, ldy); break;
    default: rows16<1>(x, w, y, nx, cols, ldy); break;
  }
}

SPECSERVE_AVX512 __attribute__((noinline)) float dot_avx512(const float* a, const float* b, int64_t n) {
  __m512 acc = _mm512_setzero_ps();
  for (int64_t i = 0; i < n; i += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc);
  return reduce16(acc);
}

#pragma GCC diagnostic pop
#undef SPECSERVE_AVX512

// ---------------------------------------------------------------------------------------------

// SPECSERVE_CPU_MATMUL, trimmed and lower-cased ("" when unset).
std::string env_kernel() {
  const char* env = std::getenv("SPECSERVE_CPU_MATMUL");
  std::string v = env ? env : "";
  const auto b = v.find_first_not_of(" \t"), e = v.find_last_not_of(" \t");
  v = b == std::string::npos ? "" : v.substr(b, e - b + 1);
  for (char& c : v) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return v;
}

MatmulIsa detect_isa() {
  const bool has512 = __builtin_cpu_supports("avx512f");
  const std::string env = env_kernel();
  if (env == "avx2") return MatmulIsa::kAvx2;
  if (env == "avx512") {
    if (!has512) get_logger("cpu")->warn("SPECSERVE_CPU_MATMUL = 'avx512': this CPU has no avx512f; using avx2");
    return has512 ? MatmulIsa::kAvx512 : MatmulIsa::kAvx2;
  }
  if (!env.empty()) {
    get_logger("cpu")->warn("SPECSERVE_CPU_MATMUL = '{}' is not one of avx2, avx512; using the widest the CPU has ({})",
                            std::getenv("SPECSERVE_CPU_MATMUL"), has512 ? "avx512" : "avx2");
  }
  return has512 ? MatmulIsa::kAvx512 : MatmulIsa::kAvx2;
}

std::atomic<MatmulIsa>& active_isa() {
  static std::atomic<MatmulIsa> isa{detect_isa()};
  return isa;
}

using TileFn = void (*)(const float*, const float*, float*, int64_t, int64_t, int64_t, int64_t);

void matmul_with(TileFn tile, int64_t w_tile, const float* x, const float* w, float* y, int64_t n, int64_t rows, int64_t cols) {
  // x is processed in chunks that stay in L2 while every weight row streams past them.
  const int64_t x_chunk = std::max<int64_t>(3, (256 * 1024 / (cols * 4)) / 3 * 3);
  const int64_t num_wt = (rows + w_tile - 1) / w_tile;
  for (int64_t x0 = 0; x0 < n; x0 += x_chunk) {
    const int64_t nx = std::min(x_chunk, n - x0);
#pragma omp parallel for schedule(static) if (num_wt * nx * cols > 32768)
    for (int64_t t = 0; t < num_wt; ++t) {
      const int64_t r0 = t * w_tile;
      tile(x + x0 * cols, w + r0 * cols, y + x0 * rows + r0, nx, std::min(w_tile, rows - r0), cols, rows);
    }
  }
}

bool use_avx512(int64_t cols) { return active_isa().load(std::memory_order_relaxed) == MatmulIsa::kAvx512 && cols % 16 == 0; }

}  // namespace

MatmulIsa matmul_isa() { return active_isa().load(std::memory_order_relaxed); }

const char* matmul_isa_name(MatmulIsa isa) { return isa == MatmulIsa::kAvx512 ? "avx512" : "avx2"; }

std::string matmul_isa_source() {
  const std::string env = env_kernel();
  if (env == "avx2" || env == "avx512") return "set by SPECSERVE_CPU_MATMUL=" + env;
  return __builtin_cpu_supports("avx512f") ? "this CPU has avx512f" : "this CPU has no avx512f";
}

bool set_matmul_isa(MatmulIsa isa) {
  if (isa == MatmulIsa::kAvx512 && !__builtin_cpu_supports("avx512f")) return false;
  active_isa().store(isa, std::memory_order_relaxed);
  return true;
}

float dot_f32(const float* a, const float* b, int64_t n) {
  if (use_avx512(n)) return dot_avx512(a, b, n);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < n; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
  return reduce8(acc);
}

void matmul_f32(const float* x, const float* w, float* y, int64_t n, int64_t rows, int64_t cols) {
  if (use_avx512(cols)) {
    matmul_with(tile_avx512, kW16, x, w, y, n, rows, cols);
  } else {
    matmul_with(tile_avx2, 4, x, w, y, n, rows, cols);
  }
}

}  // namespace specserve
