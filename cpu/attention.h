// specserve cpu: paged attention over the KV cache, for decode, chains and token trees.
//
// Each query row attends to its visible keys in logical order: the cached prefix, then its own
// new positions (a chain: the rows up to and including itself; a tree: its ancestors from the
// root, then itself; model/backend.h AttentionSeq). Per query head h of KV head g = h / (H / G):
//   s_t = dot(q_h, K_t[g]) * (1 / sqrt(head_dim))     dot_f32's order (cpu/matmul.h)
//   m   = max_t s_t;  p_t = exp(s_t - m)              a vectorised Cephes expf, rel. error ~1e-7
//   Z   = sum_t p_t                                   8 lanes (t mod 8) ascending, then a fixed tree
//   out = (sum over t ascending of fma(p_t, V_t[g], acc)) * (1 / Z)
// (softmax_numerator in cpu/attention.cpp says the exact order).
// A row's result depends only on its own query and visible keys, never on what else shares the
// call (batch invariance, which greedy identity of speculative decoding needs).
//
// Two implementations with the same arithmetic, bit for bit (tests/cpu/attention_test.cpp):
// - attention_f32_rowwise: one query row (or, for few rows, a range of its query heads) at a
//   time; every row streams its whole prefix.
// - the tiled AVX-512 kernel attention_f32 uses when matmul_isa() is AVX-512, AMX or vnni (all
//   imply avx512f) and head_dim is
//   16, 32, 64 or 128: the rows of one sequence (a verification step's k + 1 chain rows or tree
//   nodes, or a tile of a prefill) and the query heads of one KV group share each 16-key block of
//   the prefix while it is in L1, and 16 dot products are reduced together by a transposing
//   shuffle tree instead of one horizontal reduction each. Work items are (sequence, KV head,
//   row tile). A call with fewer such tiles than two per thread (a decode row or a verification
//   step of one sequence: SmolLM2 has 3 KV heads for 2 threads) runs in three phases over all
//   threads instead — scores by ranges of key blocks, softmax numerators by query vector, values
//   by slices of head_dim — which moves no operation, only which thread does it.
#pragma once

#include <cstdint>
#include <vector>

#include "model/backend.h"

namespace specserve {

/// Where one layer's cache lies: slot s's key row (all KV heads, kv_stride floats) starts at
/// k + s * kv_stride, its value row at v + s * kv_stride; logical position p of a sequence is
/// slot block_table[p / block_size] * block_size + p % block_size.
struct AttentionCache {
  const float* k = nullptr;
  const float* v = nullptr;
  int64_t kv_stride = 0;   ///< floats per slot, >= num_kv_heads * head_dim
  int64_t block_size = 0;  ///< slots per block
};

/// Attention of every row of `seqs` (see the file comment). q: [rows, num_heads, head_dim];
/// out: same shape, may not alias q. num_heads must be a multiple of num_kv_heads. Uses the
/// OpenMP thread team. Picks the tiled kernel where it applies, else the row-wise one; both give
/// the same bits.
void attention_f32(const AttentionCache& cache, const float* q, const std::vector<AttentionSeq>& seqs, int64_t num_heads,
                   int64_t num_kv_heads, int64_t head_dim, float* out);

/// The row-wise implementation (cpu/attention_rowwise.cpp; the oracle of the tiled one, and the path
/// for other widths).
void attention_f32_rowwise(const AttentionCache& cache, const float* q, const std::vector<AttentionSeq>& seqs,
                           int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, float* out);

/// The softmax numerator both implementations use, in place over s[0, n) (n >= 1, some s_t
/// finite, none NaN or +inf: attention scores of visible keys): s_t becomes
/// p_t = exp(s_t - m), m = max_t s_t; returns Z = sum_t p_t in the order of the file comment.
/// exp is a vectorised Cephes expf (relative error about 1e-7 for arguments in [-87.3, 0]);
/// an argument below -87.3365 (e^x below FLT_MIN), -inf included, gives exactly 0, and the
/// maximum gives exactly 1. Exposed for tests (tests/cpu/attention_test.cpp).
float softmax_numerator(float* s, int64_t n);

/// Which implementation attention_f32 prefers. Both give the same bits; the choice is for A/B
/// runs (bench/run_cpu_ab.sh). Read once from SPECSERVE_CPU_ATTENTION=tiled|rowwise
/// (trimmed, any case; default tiled; another value is warned about and ignored).
enum class AttentionKernel { kTiled, kRowwise };
AttentionKernel attention_kernel();
/// Switches it for the whole process (tests). Not thread-safe against running attention.
void set_attention_kernel(AttentionKernel kernel);

/// Whether attention_f32 runs the tiled kernel for this head width in this process: the kernel
/// choice is tiled, matmul_isa() is AVX-512, AMX or vnni, and head_dim is 16, 32, 64 or 128.
bool attention_tiled_applies(int64_t head_dim);

/// Calls that took the tiled kernel's phased path (fewer tiles than two per thread; cpu/
/// attention.cpp attention_phased) in this process so far: for tests, which must know the path ran.
int64_t attention_phased_calls();

/// "tiled" or "rowwise": what runs in this process for the head widths the tiled kernel covers
/// (for logs and benchmark records).
const char* attention_kernel_name();

}  // namespace specserve
