#include "cpu/matmul.h"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <cstdint>
#include <cstdlib>
#include <cctype>
#include <cstring>
#include <string>
#include <vector>

#include "core/logging.h"
#include "core/status.h"
#include "cpu/matmul_amx.h"
#include "cpu/matmul_internal.h"

namespace specserve {
namespace {

using matmul_internal::fp16_at;
using matmul_internal::kFusedMaxRows;
using matmul_internal::kFusedMaxRowsAvx2;
using matmul_internal::reduce16;
using matmul_internal::reduce8;
using matmul_internal::tile_blocks_avx2;
using matmul_internal::tile_blocks_avx512;
using matmul_internal::u8_to_ps;

// ---------------------------------------------------------------------------------------------
// AVX2: 8 lanes, k steps of 8.


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

// (SPECSERVE_AVX512: cpu/matmul_internal.h.)
// NOTE: GCC 12 warns "'__Y' is used uninitialized" inside its own avx512fintrin.h for the
// 512 -> 256 casts (they start from _mm256_undefined_ps); the upper lanes are never read.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

// Software prefetch of the weight tile this many tiles ahead (same k): the hardware prefetcher
// alone leaves multi-row tiles waiting on DRAM between tiles.
constexpr int kPrefetchTiles = 1;



// Prefetch: false for a tile the caller dequantised into a small buffer (no next tile behind it).
template <int NX, int NW, bool Prefetch>
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
      if constexpr (Prefetch && kPrefetchTiles > 0) {
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

template <int NW, int M, bool Prefetch>
SPECSERVE_AVX512 inline void group16(const float* x, const float* w, float* y, int64_t m, int64_t cols, int64_t ldy) {
  if constexpr (M >= 1) {
    if (m == M) return tile16<M, NW, Prefetch>(x, w, y, cols, ldy);
    return group16<NW, M - 1, Prefetch>(x, w, y, m, cols, ldy);
  } else {
    SPECSERVE_CHECK(false, "matmul: x row group outside 1..kMaxGroup");
  }
}

template <int NW, bool Prefetch>
SPECSERVE_AVX512 inline void rows16(const float* x, const float* w, float* y, int64_t nx, int64_t cols, int64_t ldy) {
  const int64_t groups = (nx + kMaxGroup - 1) / kMaxGroup;
  int64_t i = 0;
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t m = (nx - i) / (groups - g);  // near-equal split; sums to nx
    group16<NW, kMaxGroup, Prefetch>(x + i * cols, w, y + i * ldy, m, cols, ldy);
    i += m;
  }
}

template <bool Prefetch>
SPECSERVE_AVX512 __attribute__((noinline)) void tile_avx512(const float* x, const float* w, float* y, int64_t nx,
                                                             int64_t nw, int64_t cols, int64_t ldy) {
  switch (nw) {
    case 3: rows16<3, Prefetch>(x, w, y, nx, cols, ldy); break;
    case 2: rows16<2, Prefetch>(x, w, y, nx, cols, ldy); break;
    default: rows16<1, Prefetch>(x, w, y, nx, cols, ldy); break;
  }
}

SPECSERVE_AVX512 __attribute__((noinline)) float dot_avx512(const float* a, const float* b, int64_t n) {
  __m512 acc = _mm512_setzero_ps();
  for (int64_t i = 0; i < n; i += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc);
  return reduce16(acc);
}

// The block formats 16 values at a time: the same per-value arithmetic as the AVX2 functions
// below, half the instructions.
SPECSERVE_AVX512 __attribute__((noinline)) void dequant_row_q4_1_avx512(const uint8_t* b, int64_t cols, float* y) {
  const __m128i low4 = _mm_set1_epi8(0x0f);
  for (int64_t c = 0; c < cols; c += 32, b += 20, y += 32) {
    uint16_t hd, hm;
    std::memcpy(&hd, b, 2);
    std::memcpy(&hm, b + 2, 2);
    const __m512 d = _mm512_set1_ps(_cvtsh_ss(hd)), m = _mm512_set1_ps(_cvtsh_ss(hm));
    const __m128i qs = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 4));
    const __m128i lo = _mm_and_si128(qs, low4), hi = _mm_and_si128(_mm_srli_epi16(qs, 4), low4);
    _mm512_storeu_ps(y, _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(lo)), m));
    _mm512_storeu_ps(y + 16, _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(hi)), m));
  }
}

SPECSERVE_AVX512 __attribute__((noinline)) void dequant_row_q8_0_avx512(const uint8_t* b, int64_t cols, float* y) {
  for (int64_t c = 0; c < cols; c += 32, b += 34, y += 32) {
    uint16_t hd;
    std::memcpy(&hd, b, 2);
    const __m512 d = _mm512_set1_ps(_cvtsh_ss(hd));
    for (int i = 0; i < 2; ++i) {
      const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 2 + 16 * i));
      _mm512_storeu_ps(y + 16 * i, _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q))));
    }
  }
}

#pragma GCC diagnostic pop

// ---------------------------------------------------------------------------------------------

std::string env_kernel() { return cpu_kernel_env("SPECSERVE_CPU_MATMUL"); }


MatmulIsa detect_isa() {
  const bool has512 = __builtin_cpu_supports("avx512f");
  const MatmulIsa widest = has512 ? MatmulIsa::kAvx512 : MatmulIsa::kAvx2;
  const std::string env = env_kernel();
  if (env == "avx2") return MatmulIsa::kAvx2;
  if (env == "avx512") {
    if (!has512) get_logger("cpu")->warn("SPECSERVE_CPU_MATMUL = 'avx512': this CPU has no avx512f; using avx2");
    return widest;
  }
  if (env == "vnni") {
    if (vnni_usable()) return MatmulIsa::kVnni;
    get_logger("cpu")->warn("SPECSERVE_CPU_MATMUL = 'vnni': this CPU lacks avx512vnni (or avx512bw/vl); using {}", matmul_isa_name(widest));
    return widest;
  }
  if (env == "amx") {
    if (amx_usable()) return MatmulIsa::kAmx;
    get_logger("cpu")->warn("SPECSERVE_CPU_MATMUL = 'amx': {}; using {}", amx_refusal(), matmul_isa_name(widest));
    return widest;
  }
  if (!env.empty()) {
    get_logger("cpu")->warn("SPECSERVE_CPU_MATMUL = '{}' is not one of avx2, avx512, amx, vnni; using the widest fp32 kernel the CPU has ({})",
                            std::getenv("SPECSERVE_CPU_MATMUL"), matmul_isa_name(widest));
  }
  return widest;
}

std::atomic<MatmulIsa>& active_isa() {
  static std::atomic<MatmulIsa> isa{detect_isa()};
  return isa;
}

using TileFn = void (*)(const float*, const float*, float*, int64_t, int64_t, int64_t, int64_t);

std::atomic<bool>& fused_blocks() {
  static std::atomic<bool> on{cpu_kernel_env("SPECSERVE_CPU_FUSED_DEQUANT") != "0"};
  return on;
}
bool fused_blocks_enabled() { return fused_blocks().load(std::memory_order_relaxed); }

// ---------------------------------------------------------------------------------------------
// Block formats, dequantised 8 values at a time (AVX2, F16C for the scales), to the floats
// model/dequant.cpp's scalar loop gives. d is an fp16 (11 significant bits) and q an integer of 4
// or 8 bits, so d * q is exact in fp32: Q4_1's d * q + m rounds once whether fused or not, and
// Q8_0's d * q not at all.


void dequant_row_q4_1(const uint8_t* b, int64_t cols, float* y) {
  const __m128i low4 = _mm_set1_epi8(0x0f);
  for (int64_t c = 0; c < cols; c += 32, b += 20, y += 32) {
    const __m256 d = _mm256_set1_ps(fp16_at(b)), m = _mm256_set1_ps(fp16_at(b + 2));
    const __m128i qs = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 4));
    const __m128i lo = _mm_and_si128(qs, low4), hi = _mm_and_si128(_mm_srli_epi16(qs, 4), low4);
    // Element j < 16 is the low nibble of byte j, element j + 16 its high nibble.
    _mm256_storeu_ps(y, _mm256_fmadd_ps(d, u8_to_ps(lo), m));
    _mm256_storeu_ps(y + 8, _mm256_fmadd_ps(d, u8_to_ps(_mm_srli_si128(lo, 8)), m));
    _mm256_storeu_ps(y + 16, _mm256_fmadd_ps(d, u8_to_ps(hi), m));
    _mm256_storeu_ps(y + 24, _mm256_fmadd_ps(d, u8_to_ps(_mm_srli_si128(hi, 8)), m));
  }
}

void dequant_row_q8_0(const uint8_t* b, int64_t cols, float* y) {
  for (int64_t c = 0; c < cols; c += 32, b += 34, y += 32) {
    const __m256 d = _mm256_set1_ps(fp16_at(b));
    for (int i = 0; i < 4; ++i) {
      const __m128i q = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(b + 2 + 8 * i));
      _mm256_storeu_ps(y + 8 * i, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q))));
    }
  }
}

// Weight tiles ahead whose blocks are prefetched before a tile is dequantised.
constexpr int64_t kPrefetchBlockTiles = 4;

// x is processed in chunks that stay in L2 while every weight row streams past them. A
// block-format weight tile is dequantised into this thread's buffer first (once per x chunk:
// a prefill longer than one chunk dequantises each tile several times, a few percent of its time),
// or for few x rows (fused) inside the tile kernel, in one chunk.
// Several weights of one format and width sharing x (matmul_weights): their tiles form one
// parallel loop, weight after weight, so a decode step's small matmuls share one fork/join.
void matmul_with_multi(TileFn tile, int64_t w_tile, const float* x, const MatmulWeight* ws, float* const* ys, int64_t count,
                       int64_t n) {
  const WeightFormat format = ws[0].format;
  const int64_t cols = ws[0].cols;
  const bool blocks = (format == WeightFormat::kQ4_1 || format == WeightFormat::kQ8_0) && fused_blocks_enabled();
  const bool fused = blocks && ((tile == tile_avx512<false> && n <= kFusedMaxRows) || (tile == tile_avx2 && n <= kFusedMaxRowsAvx2));
  // (A fused call's few rows are one chunk: a second would read the whole weight again.)
  const int64_t x_chunk = fused ? std::max<int64_t>(n, 1) : std::max<int64_t>(3, (256 * 1024 / (cols * 4)) / 3 * 3);
  const UnitRanges tiles(ws, count, w_tile);  // weight i owns tiles [start(i), start(i + 1))
  const int64_t num_wt = tiles.total();
  const int64_t row_bytes = weight_row_bytes(format, cols);
  for (int64_t x0 = 0; x0 < n; x0 += x_chunk) {
    const int64_t nx = std::min(x_chunk, n - x0);
#pragma omp parallel if (num_wt * nx * cols > 32768)
    {
      // NOTE: a buffer per thread and call rather than thread_local: the OpenMP team's threads
      // live on, and a 3 x 1536 tile is 18 KiB.
      std::vector<float> tile_w(format == WeightFormat::kF32 || fused ? 0 : static_cast<size_t>(w_tile * cols));
#pragma omp for schedule(static)
      for (int64_t gt = 0; gt < num_wt; ++gt) {
        const int64_t i = tiles.weight_of(gt);
        const MatmulWeight& w = ws[i];
        float* y = ys[i];
        const int64_t rows = w.rows, r0 = (gt - tiles.start(i)) * w_tile, nw = std::min(w_tile, rows - r0);
        const float* wt = nullptr;
        if (format == WeightFormat::kF32) {
          wt = static_cast<const float*>(w.data) + r0 * cols;
        } else {
          // The blocks of the tile kPrefetchBlockTiles ahead in this weight (this thread's, under
          // the static schedule): the dequantisation otherwise stalls on DRAM at the start of
          // every tile.
          const int64_t ahead = r0 + kPrefetchBlockTiles * w_tile;
          if (ahead < rows) {
            const uint8_t* p = static_cast<const uint8_t*>(w.data) + ahead * row_bytes;
            const int64_t bytes = std::min(w_tile, rows - ahead) * row_bytes;
            for (int64_t o = 0; o < bytes; o += 64) _mm_prefetch(reinterpret_cast<const char*>(p + o), _MM_HINT_T0);
          }
          if (fused) {
            const uint8_t* wb = static_cast<const uint8_t*>(w.data) + r0 * row_bytes;
            if (tile == tile_avx2) {
              tile_blocks_avx2(format, x + x0 * cols, wb, row_bytes, y + x0 * rows + r0, nx, nw, cols, rows);
            } else {
              tile_blocks_avx512(format, x + x0 * cols, wb, row_bytes, y + x0 * rows + r0, nx, nw, cols, rows);
            }
            continue;
          }
          dequantize_rows(w, r0, nw, tile_w.data());
          wt = tile_w.data();
        }
        tile(x + x0 * cols, wt, y + x0 * rows + r0, nx, nw, cols, rows);
      }
    }
  }
}

void matmul_with(TileFn tile, int64_t w_tile, const float* x, const MatmulWeight& w, float* y, int64_t n) {
  matmul_with_multi(tile, w_tile, x, &w, &y, 1, n);
}


bool use_avx512(int64_t cols) { return active_isa().load(std::memory_order_relaxed) != MatmulIsa::kAvx2 && cols % 16 == 0; }

bool use_amx(int64_t cols) { return active_isa().load(std::memory_order_relaxed) == MatmulIsa::kAmx && cols % 32 == 0; }

}  // namespace

std::string cpu_kernel_env(const char* name) {
  const char* env = std::getenv(name);
  std::string v = env ? env : "";
  const auto b = v.find_first_not_of(" \t"), e = v.find_last_not_of(" \t");
  v = b == std::string::npos ? "" : v.substr(b, e - b + 1);
  for (char& c : v) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return v;
}

MatmulIsa matmul_isa() { return active_isa().load(std::memory_order_relaxed); }

const char* matmul_isa_name(MatmulIsa isa) {
  switch (isa) {
    case MatmulIsa::kAvx2: return "avx2";
    case MatmulIsa::kAvx512: return "avx512";
    case MatmulIsa::kAmx: return "amx";
    case MatmulIsa::kVnni: return "vnni";
  }
  return "?";
}

static std::mutex& isa_source_mutex() {
  static std::mutex m;
  return m;
}
static std::string& isa_source_override() {
  static std::string s;
  return s;
}

std::string matmul_isa_source() {
  {
    std::lock_guard<std::mutex> lock(isa_source_mutex());
    if (!isa_source_override().empty()) return isa_source_override();
  }
  const std::string env = env_kernel();
  if (env == "avx2" || env == "avx512") return "set by SPECSERVE_CPU_MATMUL=" + env;
  if (env == "amx") return amx_usable() ? "set by SPECSERVE_CPU_MATMUL=amx" : "SPECSERVE_CPU_MATMUL=amx, but " + amx_refusal();
  if (env == "vnni") return vnni_usable() ? "set by SPECSERVE_CPU_MATMUL=vnni" : "SPECSERVE_CPU_MATMUL=vnni, but this CPU lacks avx512vnni";
  return __builtin_cpu_supports("avx512f") ? "this CPU has avx512f" : "this CPU has no avx512f";
}

bool set_matmul_isa(MatmulIsa isa, const std::string& source) {
  if (isa == MatmulIsa::kAvx512 && !__builtin_cpu_supports("avx512f")) return false;
  if (isa == MatmulIsa::kAmx && !amx_usable()) return false;
  if (isa == MatmulIsa::kVnni && !vnni_usable()) return false;
  active_isa().store(isa, std::memory_order_relaxed);
  if (!source.empty()) {
    std::lock_guard<std::mutex> lock(isa_source_mutex());
    isa_source_override() = source;
  }
  return true;
}

namespace {
// Lanes [0, r) set, 0 < r < 8: the last k step of a width that is not a multiple of 8.
inline __m256i tail_mask8(int64_t r) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(r)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
}  // namespace

float dot_f32(const float* a, const float* b, int64_t n) {
  if (use_avx512(n)) return dot_avx512(a, b, n);
  __m256 acc = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
  if (i < n) {
    // The lanes past n load as zeros and leave their sums as they were (no read past a head).
    const __m256i m = tail_mask8(n - i);
    acc = _mm256_fmadd_ps(_mm256_maskload_ps(a + i, m), _mm256_maskload_ps(b + i, m), acc);
  }
  return reduce8(acc);
}

void dot_f32_many(const float* a, const float* const* b, int64_t m, int64_t n, float* out) {
  int64_t j = 0;
  if (!use_avx512(n)) {
    const int64_t whole = n / 8 * 8;
    const __m256i tail = tail_mask8(n - whole);  // unused when n is a multiple of 8
    for (; j + 4 <= m; j += 4) {
      __m256 c0 = _mm256_setzero_ps(), c1 = c0, c2 = c0, c3 = c0;
      for (int64_t i = 0; i < whole; i += 8) {
        const __m256 x = _mm256_loadu_ps(a + i);
        c0 = _mm256_fmadd_ps(x, _mm256_loadu_ps(b[j] + i), c0);
        c1 = _mm256_fmadd_ps(x, _mm256_loadu_ps(b[j + 1] + i), c1);
        c2 = _mm256_fmadd_ps(x, _mm256_loadu_ps(b[j + 2] + i), c2);
        c3 = _mm256_fmadd_ps(x, _mm256_loadu_ps(b[j + 3] + i), c3);
      }
      if (whole < n) {
        const __m256 x = _mm256_maskload_ps(a + whole, tail);
        c0 = _mm256_fmadd_ps(x, _mm256_maskload_ps(b[j] + whole, tail), c0);
        c1 = _mm256_fmadd_ps(x, _mm256_maskload_ps(b[j + 1] + whole, tail), c1);
        c2 = _mm256_fmadd_ps(x, _mm256_maskload_ps(b[j + 2] + whole, tail), c2);
        c3 = _mm256_fmadd_ps(x, _mm256_maskload_ps(b[j + 3] + whole, tail), c3);
      }
      // reduce8's tree for each: t = the halves lane by lane, then (t0 + t1) + (t2 + t3), here
      // as two rounds of horizontal adds over the four keys together.
      auto halves = [](__m256 v) { return _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1)); };
      const __m128 h01 = _mm_hadd_ps(halves(c0), halves(c1));
      const __m128 h23 = _mm_hadd_ps(halves(c2), halves(c3));
      _mm_storeu_ps(out + j, _mm_hadd_ps(h01, h23));
    }
  }
  for (; j < m; ++j) out[j] = dot_f32(a, b[j], n);
}

int64_t weight_row_bytes(WeightFormat format, int64_t cols) {
  switch (format) {
    case WeightFormat::kQ4_1: return cols / 32 * 20;
    case WeightFormat::kQ8_0: return cols / 32 * 34;
    default: return cols * static_cast<int64_t>(sizeof(float));
  }
}

void dequantize_rows(const MatmulWeight& w, int64_t r0, int64_t n, float* out) {
  SPECSERVE_CHECK(r0 >= 0 && n >= 0 && r0 + n <= w.rows, "dequantize_rows: rows outside the weight");
  const int64_t rb = weight_row_bytes(w.format, w.cols);
  const uint8_t* base = static_cast<const uint8_t*>(w.data) + r0 * rb;
  const bool wide = matmul_isa() != MatmulIsa::kAvx2;  // same floats either way
  for (int64_t i = 0; i < n; ++i) {
    float* y = out + i * w.cols;
    switch (w.format) {
      case WeightFormat::kQ4_1:
        if (wide) dequant_row_q4_1_avx512(base + i * rb, w.cols, y); else dequant_row_q4_1(base + i * rb, w.cols, y);
        break;
      case WeightFormat::kQ8_0:
        if (wide) dequant_row_q8_0_avx512(base + i * rb, w.cols, y); else dequant_row_q8_0(base + i * rb, w.cols, y);
        break;
      default: std::memcpy(y, base + i * rb, static_cast<size_t>(rb)); break;
    }
  }
}

bool fused_block_matmul() { return fused_blocks_enabled(); }
void set_fused_block_matmul(bool on) { fused_blocks().store(on, std::memory_order_relaxed); }

void matmul_weight(const float* x, const MatmulWeight& w, float* y, int64_t n) {
  SPECSERVE_CHECK(w.cols % 8 == 0 && (w.format == WeightFormat::kF32 || w.cols % 32 == 0),
                  "matmul width " + std::to_string(w.cols) + " is not a multiple of the format's block");
  if (w.packed_q8 != nullptr && (w.format == WeightFormat::kQ4_1 || w.format == WeightFormat::kQ8_0) &&
      active_isa().load(std::memory_order_relaxed) == MatmulIsa::kVnni) {
    matmul_q8(x, w, w.packed_q8, y, n);
  } else if (use_amx(w.cols)) {
    matmul_amx(x, w, y, n);
  } else if (use_avx512(w.cols)) {
    matmul_with(w.format == WeightFormat::kF32 ? tile_avx512<true> : tile_avx512<false>, kW16, x, w, y, n);
  } else {
    matmul_with(tile_avx2, 4, x, w, y, n);
  }
}

void matmul_weights(const float* x, const MatmulWeight* ws, float* const* ys, int64_t count, int64_t n) {
  if (count <= 0) return;
  // One job only where every weight would take the same kernel path on its own.
  bool same = count > 1;
  for (int64_t i = 1; i < count && same; ++i) same = ws[i].format == ws[0].format && ws[i].cols == ws[0].cols;
  const bool block = ws[0].format == WeightFormat::kQ4_1 || ws[0].format == WeightFormat::kQ8_0;
  const MatmulIsa isa = active_isa().load(std::memory_order_relaxed);
  if (same && isa == MatmulIsa::kVnni && block) {
    bool packed = true;
    for (int64_t i = 0; i < count; ++i) packed = packed && ws[i].packed_q8 != nullptr;
    if (packed && ws[0].cols % 32 == 0) return matmul_q8_multi(x, ws, ys, count, n);
    // (Without packed copies these are not vnni work: the AVX-512 kernel below, as matmul_weight.)
  }
  if (same && !use_amx(ws[0].cols)) {
    SPECSERVE_CHECK(ws[0].cols % 8 == 0 && (ws[0].format == WeightFormat::kF32 || ws[0].cols % 32 == 0),
                    "matmul width " + std::to_string(ws[0].cols) + " is not a multiple of the format's block");
    bool unpacked = true;  // under vnni, a mix of packed and unpacked copies goes one by one
    for (int64_t i = 0; i < count; ++i) unpacked = unpacked && (ws[i].packed_q8 == nullptr || isa != MatmulIsa::kVnni);
    if (unpacked) {
      if (use_avx512(ws[0].cols)) {
        return matmul_with_multi(ws[0].format == WeightFormat::kF32 ? tile_avx512<true> : tile_avx512<false>, kW16, x, ws, ys,
                                 count, n);
      }
      return matmul_with_multi(tile_avx2, 4, x, ws, ys, count, n);
    }
  }
  for (int64_t i = 0; i < count; ++i) matmul_weight(x, ws[i], ys[i], n);
}

void matmul_f32(const float* x, const float* w, float* y, int64_t n, int64_t rows, int64_t cols) {
  matmul_weight(x, MatmulWeight{WeightFormat::kF32, w, rows, cols}, y, n);
}

}  // namespace specserve
