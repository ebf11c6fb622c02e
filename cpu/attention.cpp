#include "cpu/attention.h"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cmath>
#include <string>

#include "core/logging.h"
#include "core/status.h"
#include "cpu/attention_internal.h"
#include "cpu/matmul.h"

namespace specserve {

namespace attention_internal {

// Slot of every logical position of each sequence: [num_cached + num_rows] per sequence.
std::vector<std::vector<int32_t>> logical_slots(const std::vector<AttentionSeq>& seqs, int64_t block_size) {
  std::vector<std::vector<int32_t>> out(seqs.size());
  for (size_t si = 0; si < seqs.size(); ++si) {
    const AttentionSeq& sq = seqs[si];
    auto& v = out[si];
    v.resize(static_cast<size_t>(sq.num_cached + sq.num_rows));
    for (int64_t p = 0; p < static_cast<int64_t>(v.size()); ++p)
      v[static_cast<size_t>(p)] = static_cast<int32_t>(sq.block_table[p / block_size] * block_size + p % block_size);
  }
  return out;
}

void check_heads(int64_t num_heads, int64_t num_kv_heads, int64_t head_dim) {
  SPECSERVE_CHECK(num_kv_heads > 0 && num_heads % num_kv_heads == 0 && head_dim > 0,
                  "attention: " + std::to_string(num_heads) + " query heads over " + std::to_string(num_kv_heads) +
                      " kv heads of width " + std::to_string(head_dim));
}

}  // namespace attention_internal

using attention_internal::check_heads;
using attention_internal::logical_slots;

namespace {

// exp(x) in 8 lanes for x <= 0 (softmax arguments s_t - max): Cephes' expf (x = n ln2 + r,
// |r| <= ln2 / 2, a degree-7 polynomial for e^r, then 2^n through the exponent bits); relative
// error about 1e-7. x below -87.3365 (where e^x < FLT_MIN), -inf included, gives 0; NaN stays NaN.
// Lane-wise arithmetic only, so the result of a lane never depends on its neighbours.
inline __m256 exp_nonpositive8(__m256 x) {
  const __m256 lowest = _mm256_set1_ps(-87.33654f);
  const __m256 underflow = _mm256_cmp_ps(x, lowest, _CMP_LT_OQ);
  x = _mm256_max_ps(lowest, x);  // NOTE: operand order: max_ps returns its second operand for NaN
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);  // ln 2 in two parts (Cephes)
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  __m256 y = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r);
  y = _mm256_add_ps(y, _mm256_set1_ps(1.0f));
  const __m256i two_n = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_andnot_ps(underflow, _mm256_mul_ps(y, _mm256_castsi256_ps(two_n)));
}

}  // namespace

// Softmax numerator in place over s[0, n): p_t = exp(s_t - max), by exp_nonpositive8; returns
// Z = sum of p_t: lane l of 8 sums t = l, l + 8, ... ascending, then reduce8's tree
// ((l0 + l4) + (l1 + l5)) + ((l2 + l6) + (l3 + l7)). Both implementations call this one function,
// so their bits agree, whatever the lane width of the matmul kernel.
// NOTE: vectorised rather than std::exp and a running sum: on Spec-Bench's prompts a tree step
// computes about 0.7 M exponentials, and the scalar loop was a large share of attention's time.
float softmax_numerator(float* s, int64_t n) {
  const int64_t whole = n / 8 * 8;
  const __m256i tail_mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n - whole)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  __m256 mx = _mm256_set1_ps(-INFINITY);
  for (int64_t t = 0; t < whole; t += 8) mx = _mm256_max_ps(mx, _mm256_loadu_ps(s + t));
  if (whole < n) mx = _mm256_max_ps(mx, _mm256_blendv_ps(mx, _mm256_maskload_ps(s + whole, tail_mask), _mm256_castsi256_ps(tail_mask)));
  // Horizontal max (exact in any order).
  __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
  m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
  const __m256 m = _mm256_set1_ps(_mm_cvtss_f32(m4));
  __m256 z = _mm256_setzero_ps();
  for (int64_t t = 0; t < whole; t += 8) {
    const __m256 p = exp_nonpositive8(_mm256_sub_ps(_mm256_loadu_ps(s + t), m));
    _mm256_storeu_ps(s + t, p);
    z = _mm256_add_ps(z, p);
  }
  if (whole < n) {
    const __m256 p = _mm256_and_ps(exp_nonpositive8(_mm256_sub_ps(_mm256_maskload_ps(s + whole, tail_mask), m)), _mm256_castsi256_ps(tail_mask));
    _mm256_maskstore_ps(s + whole, tail_mask, p);
    z = _mm256_add_ps(z, p);
  }
  const __m128 t = _mm_add_ps(_mm256_castps256_ps128(z), _mm256_extractf128_ps(z, 1));
  const __m128 h = _mm_hadd_ps(t, t);
  return _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)));
}

namespace {

// ---------------------------------------------------------------------------------------------
// Tiled AVX-512 kernel. Compiled for avx512f by function attribute only, like cpu/matmul.cpp,
// and reached only when matmul_isa() is AVX-512, AMX or vnni (which imply the CPUID check).

#define SPECSERVE_AVX512 __attribute__((target("avx512f,avx2,fma")))
// NOTE: GCC 12 warns "'__Y' is used uninitialized" inside its own avx512fintrin.h for shuffles
// and permutes (their pass-through operand is _mm512_undefined_ps, under a full mask).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

// Keys scored together: one accumulator each, reduced by one shuffle tree.
constexpr int kKeyBlock = 16;
// Keys whose values are accumulated per pass over a chunk of query vectors (their V rows stay
// in L1 while every chunk passes).
constexpr int kValueBlock = 64;
// Rows of one sequence per work item at most: bounds the score scratch, and shares each key
// block among up to 16 * group query vectors.
constexpr int64_t kMaxTileRows = 16;

// a[k] holds the 16 lane partials of key k's dot product. Returns the 16 sums, lane k = key k,
// each summed in reduce16's tree (cpu/matmul.cpp): l[i] + l[i + 8], then t[i] + t[i + 4], then
// (u0 + u1) + (u2 + u3). fp32 addition is commutative, so pairing the same lanes in another
// operand order gives the same bits.
SPECSERVE_AVX512 inline __m512 reduce_16x16(const __m512 (&a)[kKeyBlock]) {
  __m512 b[8], c[4], d[2];
  // 256-bit halves: b[i] = [t of key 2i | t of key 2i + 1].
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i)
    b[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0x44), _mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0xEE));
  // 128-bit quarters: 128-bit lane L of c[i] = u of key 4i + L.
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i)
    c[i] = _mm512_add_ps(_mm512_shuffle_f32x4(b[2 * i], b[2 * i + 1], 0x88), _mm512_shuffle_f32x4(b[2 * i], b[2 * i + 1], 0xDD));
  // Within 128-bit lanes: adjacent pairs, twice.
#pragma GCC unroll 2
  for (int i = 0; i < 2; ++i)
    d[i] = _mm512_add_ps(_mm512_shuffle_ps(c[2 * i], c[2 * i + 1], 0x88), _mm512_shuffle_ps(c[2 * i], c[2 * i + 1], 0xDD));
  const __m512 e = _mm512_add_ps(_mm512_shuffle_ps(d[0], d[1], 0x88), _mm512_shuffle_ps(d[0], d[1], 0xDD));
  // Lane 4L + m of e holds key L + 4m.
  const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  return _mm512_permutexvar_ps(order, e);
}

// dst[t] = dot(q, key[t]) * scale for t < n (n in 1..16), q and each key HC * 16 floats, summed
// in dot_f32's AVX-512 order. Unused key pointers must still point at readable keys.
template <int HC>
SPECSERVE_AVX512 inline void score_block(const float* q, const float* const* key, float scale, float* dst, int n) {
  __m512 qv[HC];
#pragma GCC unroll 8
  for (int c = 0; c < HC; ++c) qv[c] = _mm512_loadu_ps(q + 16 * c);
  __m512 acc[kKeyBlock];
#pragma GCC unroll 16
  for (int t = 0; t < kKeyBlock; ++t) {
    acc[t] = _mm512_setzero_ps();
#pragma GCC unroll 8
    for (int c = 0; c < HC; ++c) acc[t] = _mm512_fmadd_ps(qv[c], _mm512_loadu_ps(key[t] + 16 * c), acc[t]);
  }
  const __m512 s = _mm512_mul_ps(reduce_16x16(acc), _mm512_set1_ps(scale));
  _mm512_mask_storeu_ps(dst, static_cast<__mmask16>((1u << n) - 1), s);
}

// acc[i] += w[i * ldw + t] * value[t], t ascending over [0, n), for NQ query vectors i; acc rows
// are HC * 16 floats, contiguous.
template <int HC, int NQ>
SPECSERVE_AVX512 inline void value_block(const float* const* value, int64_t n, const float* w, int64_t ldw, float* acc_mem) {
  __m512 acc[NQ][HC];
#pragma GCC unroll 8
  for (int i = 0; i < NQ; ++i)
#pragma GCC unroll 8
    for (int c = 0; c < HC; ++c) acc[i][c] = _mm512_loadu_ps(acc_mem + (i * HC + c) * 16);
  for (int64_t t = 0; t < n; ++t) {
#pragma GCC unroll 8
    for (int i = 0; i < NQ; ++i) {
      const __m512 wb = _mm512_set1_ps(w[i * ldw + t]);
#pragma GCC unroll 8
      for (int c = 0; c < HC; ++c) acc[i][c] = _mm512_fmadd_ps(wb, _mm512_loadu_ps(value[t] + 16 * c), acc[i][c]);
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < NQ; ++i)
#pragma GCC unroll 8
    for (int c = 0; c < HC; ++c) _mm512_storeu_ps(acc_mem + (i * HC + c) * 16, acc[i][c]);
}

// Query vectors whose accumulators fit in registers with the value vectors: <= 24 zmm.
template <int HC>
constexpr int max_nq() { return std::min(8, 24 / HC); }

template <int HC, int NQ>
SPECSERVE_AVX512 inline void value_block_n(int nq, const float* const* value, int64_t n, const float* w, int64_t ldw,
                                           float* acc_mem) {
  if constexpr (NQ >= 1) {
    if (nq == NQ) return value_block<HC, NQ>(value, n, w, ldw, acc_mem);
    return value_block_n<HC, NQ - 1>(nq, value, n, w, ldw, acc_mem);
  } else {
    SPECSERVE_CHECK(false, "attention: query chunk outside 1..max_nq");
  }
}

// Values of keys [0, n) (pointers) into the accumulators of query vectors [0, nq_total), in
// chunks that fit in registers.
template <int HC>
SPECSERVE_AVX512 void accumulate_values(const float* const* value, int64_t n, const float* w, int64_t ldw, int64_t nq_total,
                                        float* acc_mem) {
  constexpr int kNq = max_nq<HC>();
  for (int64_t q0 = 0; q0 < nq_total; q0 += kNq) {
    const int nq = static_cast<int>(std::min<int64_t>(kNq, nq_total - q0));
    value_block_n<HC, kNq>(nq, value, n, w + q0 * ldw, ldw, acc_mem + q0 * HC * 16);
  }
}

struct TileItem {
  int32_t seq, kv_head, row0, num_rows;
};

// Each row's own keys of a tile (a chain row: the tile's rows up to itself after the shared
// keys; a tree node: its ancestors from the root, then itself), concatenated in logical order
// into own_slots; own_begin / own_n [rows] say where each row's are. Returns the most any row has.
int64_t collect_own_keys(const AttentionSeq& sq, const std::vector<int32_t>& all, const TileItem& it, int64_t num_shared,
                         std::vector<int32_t>& own_slots, std::vector<int64_t>& own_begin, std::vector<int64_t>& own_n) {
  const int64_t cached = sq.num_cached;
  own_slots.clear();
  own_begin.resize(static_cast<size_t>(it.num_rows));
  own_n.resize(static_cast<size_t>(it.num_rows));
  int64_t max_own = 0;
  for (int32_t r = 0; r < it.num_rows; ++r) {
    const int32_t j = it.row0 + r;
    const size_t begin = own_slots.size();
    if (sq.parents) {
      for (int32_t a = j; a >= 0; a = sq.parents[a]) own_slots.push_back(all[static_cast<size_t>(cached + a)]);
      std::reverse(own_slots.begin() + static_cast<std::ptrdiff_t>(begin), own_slots.end());
    } else {
      for (int64_t p = num_shared; p <= cached + j; ++p) own_slots.push_back(all[static_cast<size_t>(p)]);
    }
    own_begin[static_cast<size_t>(r)] = static_cast<int64_t>(begin);
    own_n[static_cast<size_t>(r)] = static_cast<int64_t>(own_slots.size() - begin);
    max_own = std::max(max_own, own_n[static_cast<size_t>(r)]);
  }
  return max_own;
}

// Per-thread scratch of the tiled kernel.
struct TileScratch {
  std::vector<int32_t> own_slots;        // each row's own keys, concatenated
  std::vector<int64_t> own_begin, own_n;  // [rows]
  std::vector<float> scores;             // [query vectors, ld]
  std::vector<float> acc;                // [query vectors, head_dim]
  std::vector<float> z;                  // [query vectors]
  std::vector<const float*> ptrs;        // key or value pointers of one block
};

// Scores of each row's own keys (collect_own_keys' lists) for the query vectors of its group:
// row r's vector g (i = r * group + g) into scores[i * ld + num_shared + t]. `point(slots, n)` sets
// ptrs to the key rows of slots[0, n) (padded to a key block), `query(i)` gives vector i. Shared by
// the per-tile and the phased path, which must give the same bits.
template <int HC, class Point, class Query>
SPECSERVE_AVX512 inline void score_own_keys(const std::vector<int32_t>& own_slots, const std::vector<int64_t>& own_begin,
                                            const std::vector<int64_t>& own_n, int32_t num_rows, int64_t group,
                                            int64_t num_shared, int64_t ld, float scale, const float* const* ptrs,
                                            float* scores, Point point, Query query) {
  for (int32_t r = 0; r < num_rows; ++r) {
    const int32_t* own = own_slots.data() + own_begin[static_cast<size_t>(r)];
    const int64_t num_own = own_n[static_cast<size_t>(r)];
    for (int64_t t0 = 0; t0 < num_own; t0 += kKeyBlock) {
      const int n = static_cast<int>(std::min<int64_t>(kKeyBlock, num_own - t0));
      point(own + t0, n);
      for (int64_t g = 0; g < group; ++g) {
        const int64_t i = r * group + g;
        score_block<HC>(query(i), ptrs, scale, scores + i * ld + num_shared + t0, n);
      }
    }
  }
}

template <int HC>
SPECSERVE_AVX512 void attend_tile(const AttentionCache& cache, const float* q, const AttentionSeq& sq,
                                  const std::vector<int32_t>& all, const TileItem& it, int64_t num_heads, int64_t group,
                                  float scale, float* out, TileScratch& s) {
  constexpr int64_t hd = HC * 16;
  const int64_t num_q = it.num_rows * group;
  const int64_t cached = sq.num_cached;
  // Keys every row of the tile sees: the prefix, and in a chain also the rows up to the first.
  const int64_t num_shared = sq.parents ? cached : cached + it.row0 + 1;
  const int64_t max_own = collect_own_keys(sq, all, it, num_shared, s.own_slots, s.own_begin, s.own_n);
  const int64_t ld = num_shared + max_own;
  s.scores.resize(static_cast<size_t>(num_q * ld));
  s.acc.assign(static_cast<size_t>(num_q * hd), 0.0f);
  s.z.resize(static_cast<size_t>(num_q));
  s.ptrs.resize(kValueBlock);
  const float* kbase = cache.k + it.kv_head * hd;
  const float* vbase = cache.v + it.kv_head * hd;
  auto query = [&](int64_t i) {
    return q + ((sq.row_begin + it.row0 + i / group) * num_heads + it.kv_head * group + i % group) * hd;
  };
  // Pointers to rows of `base` for slots[0, n), padded to a whole key block with the last one.
  auto point = [&](const float* base, const int32_t* slots, int64_t n) {
    const int64_t padded = std::max<int64_t>(kKeyBlock, n);
    for (int64_t i = 0; i < padded; ++i) s.ptrs[static_cast<size_t>(i)] = base + static_cast<int64_t>(slots[std::min(i, n - 1)]) * cache.kv_stride;
  };

  // 1. Scores of the shared keys: each block of 16 keys serves every query vector of the tile.
  for (int64_t t0 = 0; t0 < num_shared; t0 += kKeyBlock) {
    const int n = static_cast<int>(std::min<int64_t>(kKeyBlock, num_shared - t0));
    point(kbase, all.data() + t0, n);
    for (int64_t i = 0; i < num_q; ++i) score_block<HC>(query(i), s.ptrs.data(), scale, s.scores.data() + i * ld + t0, n);
  }
  // 2. Each row's own keys, for the query heads of its group.
  score_own_keys<HC>(s.own_slots, s.own_begin, s.own_n, it.num_rows, group, num_shared, ld, scale, s.ptrs.data(),
                     s.scores.data(), [&](const int32_t* slots, int64_t n) { point(kbase, slots, n); }, query);
  // 3. Softmax numerators over each query vector's visible keys, in logical order.
  for (int64_t i = 0; i < num_q; ++i)
    s.z[static_cast<size_t>(i)] = softmax_numerator(s.scores.data() + i * ld, num_shared + s.own_n[static_cast<size_t>(i / group)]);
  // 4. Values, t ascending per query vector: the shared keys in blocks, then each row's own.
  for (int64_t t0 = 0; t0 < num_shared; t0 += kValueBlock) {
    const int64_t n = std::min<int64_t>(kValueBlock, num_shared - t0);
    point(vbase, all.data() + t0, n);
    accumulate_values<HC>(s.ptrs.data(), n, s.scores.data() + t0, ld, num_q, s.acc.data());
  }
  for (int32_t r = 0; r < it.num_rows; ++r) {
    const int32_t* own = s.own_slots.data() + s.own_begin[static_cast<size_t>(r)];
    const int64_t num_own = s.own_n[static_cast<size_t>(r)];
    for (int64_t t0 = 0; t0 < num_own; t0 += kValueBlock) {
      const int64_t n = std::min<int64_t>(kValueBlock, num_own - t0);
      point(vbase, own + t0, n);
      accumulate_values<HC>(s.ptrs.data(), n, s.scores.data() + r * group * ld + num_shared + t0, ld, group,
                            s.acc.data() + r * group * hd);
    }
  }
  // 5. Normalise.
  for (int64_t i = 0; i < num_q; ++i) {
    const float inv = 1.0f / s.z[static_cast<size_t>(i)];
    const int64_t row = sq.row_begin + it.row0 + i / group;
    float* o = out + (row * num_heads + it.kv_head * group + i % group) * hd;
    const float* a = s.acc.data() + i * hd;
    for (int64_t e = 0; e < hd; ++e) o[e] = a[e] * inv;
  }
}

// Values of every key into dims [off, off + HCP * 16) of the query vectors of one tile:
// accumulate_values of that slice of each value row (HCP = 1, 2, 4 or 8 chunks of 16 floats).
// Each output element sees the same fmas in the same key order as over the whole row.
SPECSERVE_AVX512 void accumulate_value_slice(int hcp, const float* const* value, int64_t n, const float* w, int64_t ldw,
                                             int64_t nq_total, float* acc_mem) {
  switch (hcp) {
    case 1: return accumulate_values<1>(value, n, w, ldw, nq_total, acc_mem);
    case 2: return accumulate_values<2>(value, n, w, ldw, nq_total, acc_mem);
    case 4: return accumulate_values<4>(value, n, w, ldw, nq_total, acc_mem);
    case 8: return accumulate_values<8>(value, n, w, ldw, nq_total, acc_mem);
    default: SPECSERVE_CHECK(false, "attention: a head_dim slice of " + std::to_string(hcp) + " x 16 floats");
  }
}

// One tile of the phased path: its item, its rows' own keys and its scores, shared by the
// threads of all three phases.
struct PhasedTile {
  TileItem it{};
  int64_t num_q = 0, num_shared = 0, ld = 0, shared_blocks = 0;
  std::vector<int32_t> own_slots;          // each row's own keys, concatenated
  std::vector<int64_t> own_begin, own_n;   // [rows]
  std::vector<float> scores;               // [num_q, ld]
  std::vector<float> z;                    // [num_q]
};

std::atomic<int64_t> g_phased_calls{0};

// The tiled kernel's arithmetic, for calls with fewer tiles than two per thread (a decode row or
// a verification step of one sequence: SmolLM2's 3 KV heads on 2 threads gave one thread two
// thirds of the work). Three parallel phases instead of one item per tile: (1) the scores, each
// tile's shared key blocks split in `num_parts` ranges (its rows' own keys with the last range);
// (2) each query vector's softmax numerator; (3) the values and the normalisation, each tile's
// head_dim split in up to `num_parts` slices of whole 16-float chunks. Every score is the same dot
// product, every softmax runs over the same scores in the same order, and every output element
// gets the same fmas in the same key order as in attend_tile: the same bits, on any thread count.
template <int HC>
SPECSERVE_AVX512 void attention_phased(const AttentionCache& cache, const float* q, const std::vector<AttentionSeq>& seqs,
                                       const std::vector<std::vector<int32_t>>& seq_slots, const std::vector<TileItem>& items,
                                       int64_t num_heads, int64_t group, float scale, float* out) {
  constexpr int64_t hd = HC * 16;
  g_phased_calls.fetch_add(1, std::memory_order_relaxed);
  const int64_t threads = omp_get_max_threads();
  const int64_t num_tiles = static_cast<int64_t>(items.size());
  const int64_t num_parts = std::max<int64_t>(1, (2 * threads + num_tiles - 1) / num_tiles);
  int64_t num_slices = 1;  // a power of two dividing HC
  while (num_slices * 2 <= std::min<int64_t>(num_parts, HC)) num_slices *= 2;
  const int hcp = static_cast<int>(HC / num_slices);
  // Kept by the calling thread from call to call (30 layers a step): no allocation once grown.
  // NOTE: the team reads them through these references; naming the thread_locals inside the
  // parallel region would give each thread its own, empty, copy.
  thread_local std::vector<PhasedTile> tiles_of_caller;
  thread_local std::vector<std::pair<int32_t, int32_t>> vectors_of_caller;
  std::vector<PhasedTile>& tiles = tiles_of_caller;
  std::vector<std::pair<int32_t, int32_t>>& vectors = vectors_of_caller;  // (tile, query vector) of the softmax phase
  if (static_cast<int64_t>(tiles.size()) < num_tiles) tiles.resize(static_cast<size_t>(num_tiles));
  vectors.clear();
  for (int64_t ti = 0; ti < num_tiles; ++ti) {
    PhasedTile& t = tiles[static_cast<size_t>(ti)];
    t.it = items[static_cast<size_t>(ti)];
    const AttentionSeq& sq = seqs[t.it.seq];
    t.num_q = t.it.num_rows * group;
    t.num_shared = sq.parents ? sq.num_cached : sq.num_cached + t.it.row0 + 1;
    t.shared_blocks = (t.num_shared + kKeyBlock - 1) / kKeyBlock;
    t.ld = t.num_shared + collect_own_keys(sq, seq_slots[t.it.seq], t.it, t.num_shared, t.own_slots, t.own_begin, t.own_n);
    t.scores.resize(static_cast<size_t>(t.num_q * t.ld));
    t.z.resize(static_cast<size_t>(t.num_q));
    for (int64_t i = 0; i < t.num_q; ++i) vectors.emplace_back(static_cast<int32_t>(ti), static_cast<int32_t>(i));
  }
  const int64_t num_vectors = static_cast<int64_t>(vectors.size());
  auto query = [&](const PhasedTile& t, int64_t i) {
    const AttentionSeq& sq = seqs[t.it.seq];
    return q + ((sq.row_begin + t.it.row0 + i / group) * num_heads + t.it.kv_head * group + i % group) * hd;
  };
#pragma omp parallel
  {
    // Per team thread, kept across calls (OpenMP's threads persist).
    thread_local std::vector<const float*> ptrs(static_cast<size_t>(std::max<int64_t>(kKeyBlock, kValueBlock)));
    thread_local std::vector<float> acc;  // [num_q, slice width] of the tile in hand
    // Pointers to rows of `base` for slots[0, n), padded to a whole key block with the last one.
    auto point = [&](const float* base, const int32_t* slots, int64_t n) {
      const int64_t padded = std::max<int64_t>(kKeyBlock, n);
      for (int64_t i = 0; i < padded; ++i) ptrs[static_cast<size_t>(i)] = base + static_cast<int64_t>(slots[std::min(i, n - 1)]) * cache.kv_stride;
    };
    // 1. Scores.
#pragma omp for schedule(dynamic, 1)
    for (int64_t u = 0; u < num_tiles * num_parts; ++u) {
      PhasedTile& t = tiles[static_cast<size_t>(u / num_parts)];
      const int64_t part = u % num_parts;
      const std::vector<int32_t>& all = seq_slots[t.it.seq];
      const float* kbase = cache.k + t.it.kv_head * hd;
      const int64_t b0 = t.shared_blocks * part / num_parts, b1 = t.shared_blocks * (part + 1) / num_parts;
      for (int64_t b = b0; b < b1; ++b) {
        const int64_t t0 = b * kKeyBlock;
        const int n = static_cast<int>(std::min<int64_t>(kKeyBlock, t.num_shared - t0));
        point(kbase, all.data() + t0, n);
        for (int64_t i = 0; i < t.num_q; ++i) score_block<HC>(query(t, i), ptrs.data(), scale, t.scores.data() + i * t.ld + t0, n);
      }
      if (part != num_parts - 1) continue;
      score_own_keys<HC>(t.own_slots, t.own_begin, t.own_n, t.it.num_rows, group, t.num_shared, t.ld, scale, ptrs.data(),
                         t.scores.data(), [&](const int32_t* slots, int64_t n) { point(kbase, slots, n); },
                         [&](int64_t i) { return query(t, i); });
    }
    // 2. Softmax numerators over each query vector's visible keys, in logical order.
#pragma omp for schedule(dynamic, 1)
    for (int64_t u = 0; u < num_vectors; ++u) {
      PhasedTile& t = tiles[static_cast<size_t>(vectors[static_cast<size_t>(u)].first)];
      const int64_t i = vectors[static_cast<size_t>(u)].second;
      t.z[static_cast<size_t>(i)] = softmax_numerator(t.scores.data() + i * t.ld, t.num_shared + t.own_n[static_cast<size_t>(i / group)]);
    }
    // 3. Values into one slice of head_dim, t ascending per query vector (shared keys in blocks,
    // then each row's own), then that slice of the output normalised.
#pragma omp for schedule(dynamic, 1)
    for (int64_t u = 0; u < num_tiles * num_slices; ++u) {
      const PhasedTile& t = tiles[static_cast<size_t>(u / num_slices)];
      const int64_t off = (u % num_slices) * hcp * 16, w = hcp * 16;
      const std::vector<int32_t>& all = seq_slots[t.it.seq];
      const float* vbase = cache.v + t.it.kv_head * hd + off;
      acc.assign(static_cast<size_t>(t.num_q * w), 0.0f);
      for (int64_t t0 = 0; t0 < t.num_shared; t0 += kValueBlock) {
        const int64_t n = std::min<int64_t>(kValueBlock, t.num_shared - t0);
        point(vbase, all.data() + t0, n);
        accumulate_value_slice(hcp, ptrs.data(), n, t.scores.data() + t0, t.ld, t.num_q, acc.data());
      }
      for (int32_t r = 0; r < t.it.num_rows; ++r) {
        const int32_t* own = t.own_slots.data() + t.own_begin[static_cast<size_t>(r)];
        const int64_t num_own = t.own_n[static_cast<size_t>(r)];
        for (int64_t t0 = 0; t0 < num_own; t0 += kValueBlock) {
          const int64_t n = std::min<int64_t>(kValueBlock, num_own - t0);
          point(vbase, own + t0, n);
          accumulate_value_slice(hcp, ptrs.data(), n, t.scores.data() + r * group * t.ld + t.num_shared + t0, t.ld, group,
                                 acc.data() + r * group * w);
        }
      }
      const AttentionSeq& sq = seqs[t.it.seq];
      for (int64_t i = 0; i < t.num_q; ++i) {
        const float inv = 1.0f / t.z[static_cast<size_t>(i)];
        const int64_t row = sq.row_begin + t.it.row0 + i / group;
        float* o = out + (row * num_heads + t.it.kv_head * group + i % group) * hd + off;
        const float* a = acc.data() + i * w;
        for (int64_t e = 0; e < w; ++e) o[e] = a[e] * inv;
      }
    }
  }
}

template <int HC>
void attention_tiled(const AttentionCache& cache, const float* q, const std::vector<AttentionSeq>& seqs, int64_t num_heads,
                     int64_t num_kv_heads, float* out) {
  const int64_t group = num_heads / num_kv_heads;
  const float scale = 1.0f / std::sqrt(static_cast<float>(HC * 16));
  const auto seq_slots = logical_slots(seqs, cache.block_size);
  const int64_t threads = omp_get_max_threads();
  if (threads > 1) {
    // Fewer whole tiles (up to kMaxTileRows rows) than two per thread: the phased path, which
    // splits each tile's keys and head_dim over the threads instead of its rows.
    std::vector<TileItem> whole;
    for (int32_t si = 0; si < static_cast<int32_t>(seqs.size()); ++si)
      for (int32_t h = 0; h < num_kv_heads; ++h)
        for (int64_t r0 = 0; r0 < seqs[si].num_rows; r0 += kMaxTileRows)
          whole.push_back({si, h, static_cast<int32_t>(r0), static_cast<int32_t>(std::min<int64_t>(kMaxTileRows, seqs[si].num_rows - r0))});
    if (!whole.empty() && static_cast<int64_t>(whole.size()) < 2 * threads) {
      return attention_phased<HC>(cache, q, seqs, seq_slots, whole, num_heads, group, scale, out);
    }
  }
  // NOTE: rows are split into more tiles than the 16-row cap only while there are fewer items
  // than two per thread: a verification step of one sequence then still uses every core, at the
  // cost of reading its prefix once per tile instead of once.
  const int64_t base_items = static_cast<int64_t>(seqs.size()) * num_kv_heads;
  const int64_t split = base_items > 0 ? std::max<int64_t>(1, (2 * threads + base_items - 1) / base_items) : 1;
  std::vector<TileItem> items;
  for (int32_t si = 0; si < static_cast<int32_t>(seqs.size()); ++si) {
    const int64_t rows = seqs[si].num_rows;
    const int64_t tile = std::clamp<int64_t>((rows + split - 1) / split, 1, kMaxTileRows);
    for (int32_t h = 0; h < num_kv_heads; ++h)
      for (int64_t r0 = 0; r0 < rows; r0 += tile)
        items.push_back({si, h, static_cast<int32_t>(r0), static_cast<int32_t>(std::min(tile, rows - r0))});
  }
  const int64_t num_items = static_cast<int64_t>(items.size());
#pragma omp parallel
  {
    TileScratch scratch;
#pragma omp for schedule(dynamic, 1)
    for (int64_t i = 0; i < num_items; ++i) {
      const TileItem& it = items[static_cast<size_t>(i)];
      attend_tile<HC>(cache, q, seqs[it.seq], seq_slots[it.seq], it, num_heads, group, scale, out, scratch);
    }
  }
}

#pragma GCC diagnostic pop
#undef SPECSERVE_AVX512

AttentionKernel attention_kernel_from_env() {
  const std::string v = cpu_kernel_env("SPECSERVE_CPU_ATTENTION");
  if (v == "rowwise") return AttentionKernel::kRowwise;
  if (!v.empty() && v != "tiled") {
    get_logger("cpu")->warn("SPECSERVE_CPU_ATTENTION = '{}' is not one of tiled, rowwise; using tiled where it applies",
                            std::getenv("SPECSERVE_CPU_ATTENTION"));
  }
  return AttentionKernel::kTiled;
}

std::atomic<AttentionKernel>& active_kernel() {
  static std::atomic<AttentionKernel> k{attention_kernel_from_env()};
  return k;
}

}  // namespace

AttentionKernel attention_kernel() { return active_kernel().load(std::memory_order_relaxed); }
void set_attention_kernel(AttentionKernel k) { active_kernel().store(k, std::memory_order_relaxed); }

bool attention_tiled_applies(int64_t head_dim) {
  return attention_kernel() == AttentionKernel::kTiled && matmul_isa() != MatmulIsa::kAvx2 &&
         (head_dim == 16 || head_dim == 32 || head_dim == 64 || head_dim == 128);
}

int64_t attention_phased_calls() { return g_phased_calls.load(std::memory_order_relaxed); }

const char* attention_kernel_name() { return attention_tiled_applies(64) ? "tiled" : "rowwise"; }

void attention_f32(const AttentionCache& cache, const float* q, const std::vector<AttentionSeq>& seqs, int64_t num_heads,
                   int64_t num_kv_heads, int64_t head_dim, float* out) {
  check_heads(num_heads, num_kv_heads, head_dim);
  if (!attention_tiled_applies(head_dim)) return attention_f32_rowwise(cache, q, seqs, num_heads, num_kv_heads, head_dim, out);
  switch (head_dim) {
    case 16: return attention_tiled<1>(cache, q, seqs, num_heads, num_kv_heads, out);
    case 32: return attention_tiled<2>(cache, q, seqs, num_heads, num_kv_heads, out);
    case 64: return attention_tiled<4>(cache, q, seqs, num_heads, num_kv_heads, out);
    default: return attention_tiled<8>(cache, q, seqs, num_heads, num_kv_heads, out);
  }
}

}  // namespace specserve
