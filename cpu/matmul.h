// specserve cpu: matrix multiply with a fixed per-element reduction order.
//
// y[n, R] = x[n, C] * W[R, C]^T. Under the fp32 kernels (avx2, avx512; the AMX kernel is
// described at the end of this comment) every y element is the dot product of one x row and one W row
// accumulated in SIMD lanes over k in ascending order, then summed lane by lane in a fixed
// tree — whatever n is and however the rows are tiled or split over threads. This makes the
// result of a row independent of the batch it is computed in (batch invariance), which the
// speculative engine needs for token-identical greedy output. Checked against OpenBLAS sgemm
// (tests/cpu/matmul_test.cpp).
//
// The order, exactly (tests/cpu/matmul_test.cpp MatmulSumsInTheDocumentedOrderBitForBit):
// lane l accumulates x[k] * W[r, k] for k = l, l + L, l + 2L, ... by fused multiply-adds, k
// ascending; with L = 16 lanes are then folded to 8 as l[i] + l[i + 8]; the result is
// ((l0 + l4) + (l1 + l5)) + ((l2 + l6) + (l3 + l7)).
//
// Two lane widths: AVX2 (L = 8) and AVX-512 (L = 16, used when the CPU has avx512f and C is a
// multiple of 16). They sum in different orders, so results differ in the last bits between
// them; within one process the choice is fixed (per C), which is all batch invariance needs.
// Processes that continue each other's sequences (migration, disaggregated prefill) match bit
// for bit only when they run the same kernel: set SPECSERVE_CPU_MATMUL=avx2 on every host of a
// cluster that mixes CPUs with and without AVX-512.
// Multi-row products (speculative verification, batched decode) are compute-bound on few cores:
// the AVX-512 kernel makes a decode step of 1 to 16 rows 0.71-0.83x as long as the AVX2 one on
// the 2-core development VM (bench/results/cpu_matmul_ab_2026-12-03.md).
// SPECSERVE_CPU_MATMUL=avx2 forces the AVX2 kernel (for A/B runs); the default is the widest
// the CPU has.
//
// SPECSERVE_CPU_MATMUL=amx (opt-in; Intel AMX, Sapphire Rapids and later, Linux >= 5.16; cpu/matmul_amx.cpp) runs
// matmul_weight on the tile unit in bf16: x and W are rounded to bf16 (round to nearest even,
// W from the same fp32 values dequantize_rows gives) and TDPBF16PS accumulates in fp32 (Intel
// SDM vol. 2, "TDPBF16PS"). Its results differ from the fp32 kernels by bf16 rounding (both
// operands rounded: relative error up to about 2^-8 of sum |x w|; tests/cpu/matmul_amx_test.cpp
// allows 2.5 * 2^-9), as llama.cpp's AMX and q8_1 paths differ from fp32. The tile unit's
// internal summation order is not documented, so there is no scalar statement of it; what holds,
// and is tested, is that each output element depends only on its own x row and weight row:
// batch invariance, thread-count invariance and blocks = their dequantised weight, bit for bit.
// The gain is for several rows per step: on the 2-core development VM a 16-row decode step
// costs 2.0x its 1-row step against 3.6x with AVX-512, a 9-row step 1.7x against 2.2x; the
// 1-row step is within the VM's noise of AVX-512's (bench/results/
// cpu_matmul_avx512_vs_amx_2026-12-03.md). dot_f32 and attention keep the AVX-512 order.
// Widths that are not a multiple of 32 fall back to the fp32 kernel the CPU has.
//
// SPECSERVE_CPU_MATMUL=vnni (opt-in; AVX512-VNNI: Intel Cascade Lake / Ice Lake and later, AMD
// Zen 4 and later; cpu/matmul_q8.cpp) computes Q4_1 and Q8_0 weights as llama.cpp's CPU backend
// does: each x row is quantised to int8 per 32-value block (block_q8_1: d = amax / 127,
// q = nearest-even of x * (127 / amax), s = d * sum(q); a block whose 127 / amax is not finite
// counts as zeros; a block holding a NaN or an infinity gets d = NaN, so the row's outputs are
// NaN: non-finite, as the fp32 kernels' are), each block's integer dot product with the
// weight's quants is exact (VPDPBUSD), and y = sum over blocks, k ascending, of fma(isum, d_w * d_x) (+ fma(m_w, s_x)
// for Q4_1) in fp32. Error against fp32: |y - y_fp32| <= sum over blocks of (amax_block(x) / 254)
// * sum |w| in the block, plus fp32 rounding (tests/cpu/matmul_q8_test.cpp). Each output depends
// only on its own x row and weight row (batch and thread invariance, bit for bit), but a
// last-bit change of an x value can move its quant one step (amax / 127): a tensor-parallel
// row-parallel sum, added in another order, then shifts later layers by far more than an ulp
// (tests/model/tensor_parallel_model_test.cpp measures it); fp32 weights
// (norms, F16/F32 heads) and dot_f32 / attention keep the AVX-512 fp32 kernel. The CPU backend
// repacks the weights 16 rows at a time as they load under this kernel; the token embedding,
// and every weight after a switch to it, at its first matmul (pack_weight_q8: 320 bytes per
// 16 x 32 Q4_1 values, 576 per 16 x 32 Q8_0; kept beside the GGUF blocks, which embedding
// lookups read).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace specserve {

/// The matmul kernel in use: fp32 with 8 or 16 lanes, bf16 AMX tiles, or int8 x against Q4_1 /
/// Q8_0 weights by AVX512-VNNI (see the file comment).
enum class MatmulIsa { kAvx2, kAvx512, kAmx, kVnni };

/// The kernel matmul_f32 and matmul_weight use in this process: SPECSERVE_CPU_MATMUL=avx2, amx
/// (when CPUID has amx-tile, amx-bf16 and avx512bf16 and Linux grants the tile state) or vnni
/// (when vnni_usable()), or else AVX-512 when CPUID reports avx512f. dot_f32 uses AVX-512 under
/// amx and vnni.
MatmulIsa matmul_isa();
const char* matmul_isa_name(MatmulIsa isa);  ///< "avx2", "avx512", "amx" or "vnni"

/// Whether this CPU can run MatmulIsa::kVnni (CPUID: avx512f, avx512bw, avx512vl, avx512vnni).
bool vnni_usable();

/// Why the process runs its kernel, for the log: "set by SPECSERVE_CPU_MATMUL=avx2" or "this CPU
/// has avx512f" / "... has no avx512f". The variable is read trimmed and in any case; another
/// value is warned about once and ignored; amx or vnni where it cannot run is warned about and
/// falls back to the widest fp32 kernel.
std::string matmul_isa_source();

/// Switches the kernel for the whole process (tests compare them; `--dtype`, actors/
/// backend_factory.h). Not thread-safe against running matmuls. Returns false (and changes
/// nothing) for AVX-512, AMX or vnni where it cannot run. A non-empty `source` is what
/// matmul_isa_source() says from then on (e.g. "set by --dtype bfloat16").
bool set_matmul_isa(MatmulIsa isa, const std::string& source = "");

/// Whether a Q4_1 / Q8_0 matmul of few x rows (decode, verification: at most 8 under avx512, 4
/// under avx2) dequantises each weight block in registers as the kernel reads it (default; same
/// bits as through the per-thread buffer, fewer instructions; amx unchanged). SPECSERVE_CPU_FUSED_DEQUANT=0 turns it off
/// at start-up (A/B runs); tests compare both. Not thread-safe against running matmuls.
bool fused_block_matmul();
void set_fused_block_matmul(bool on);

/// A kernel-choice environment variable (SPECSERVE_CPU_MATMUL, SPECSERVE_CPU_ATTENTION), trimmed
/// of spaces and tabs and lower-cased; "" when unset.
std::string cpu_kernel_env(const char* name);

/// See the file comment. C must be a multiple of 8 (every llama-family width is); x, W, y must
/// not alias. Uses the OpenMP thread team.
void matmul_f32(const float* x, const float* w, float* y, int64_t n, int64_t rows, int64_t cols);

/// How a matmul weight is stored. kF32: rows of cols floats. kQ4_1 / kQ8_0: GGUF blocks of 32
/// (ggml's block_q4_1: fp16 d, fp16 m, 16 bytes of nibbles, y = d * q + m; block_q8_0: fp16 d,
/// 32 int8, y = d * q), row after row, cols / 32 blocks per row.
enum class WeightFormat { kF32, kQ4_1, kQ8_0 };

/// A weight [rows, cols] as matmul_weight reads it. `data` is not owned. `packed_q8`, also not
/// owned: the same weight as pack_weight_q8 gives it, or null; matmul_weight uses it under
/// MatmulIsa::kVnni (without it a block weight takes the AVX-512 fp32 kernel).
struct MatmulWeight {
  WeightFormat format = WeightFormat::kF32;
  const void* data = nullptr;
  int64_t rows = 0, cols = 0;
  const void* packed_q8 = nullptr;
};

/// A Q4_1 or Q8_0 weight (cols a multiple of 32) repacked for the vnni kernel: groups of 16 rows
/// (the last padded with zero rows), each group block by block, a block's 16 x 32 quants
/// interleaved so that one 64-byte vector holds 4 consecutive k of each of the 16 rows (layout in
/// cpu/matmul_q8.cpp). packed_q8_bytes(w) bytes. Throws (SPECSERVE_CHECK) on another format.
std::vector<uint8_t> pack_weight_q8(const MatmulWeight& w);
int64_t packed_q8_bytes(const MatmulWeight& w);

/// Bytes of one row in `format` (cols a multiple of 32 for the block formats).
int64_t weight_row_bytes(WeightFormat format, int64_t cols);

/// Rows [r0, r0 + n) of w as floats, into out [n, cols]: exactly the values model/dequant.h's
/// dequantize gives for the same blocks (tests/cpu/matmul_test.cpp checks it bit for bit).
void dequantize_rows(const MatmulWeight& w, int64_t r0, int64_t n, float* out);

/// y[n, rows] = x[n, cols] * W^T for any WeightFormat. A block-format weight is dequantised
/// one weight tile at a time (3 or 4 rows, into a per-thread buffer that stays in L1) just
/// before matmul_f32's tile kernel reads it — or, for few x rows (fused_block_matmul), block by
/// block in registers inside the tile kernel — so the result is bit-identical to matmul_f32 on
/// the dequantised weight, while a decode step reads 20 (Q4_1) or 34 (Q8_0) bytes per 32
/// weights instead of 128. Same threading and reduction order as matmul_f32. Under amx, 32
/// weight rows at a time are dequantised to bf16 one 32-wide k step (up to 16 x rows: decode,
/// verification) or one 256-wide k chunk (more rows: prefill) at a time, overlapping the tile
/// unit's work on the previous step. Under vnni, a block weight given with its packed_q8 copy
/// takes the int8 kernel (see the file comment; not fp32's bits), anything else the AVX-512 one.
void matmul_weight(const float* x, const MatmulWeight& w, float* y, int64_t n);

/// ys[i][n, ws[i].rows] = x[n, cols] * W_i^T for `count` weights sharing x (a layer's Q, K and
/// V projections; its gate and up projections), each y bit for bit what matmul_weight gives it.
/// Weights of one format and width that would each take the same kernel run as one job: under
/// vnni with every one packed, x is quantised once and one parallel loop covers all their
/// 16-row groups; under the fp32 kernels (AVX-512, AVX2; vnni without packed copies) their
/// weight tiles form one parallel loop (a decode step's small matmuls were dominated by one
/// OpenMP fork/join, and under vnni one quantisation, each). Mixed formats or widths, a mix of
/// packed and unpacked copies under vnni, and the AMX kernel go through matmul_weight one weight
/// at a time. count 0 does nothing. The ys must not alias x or each other.
void matmul_weights(const float* x, const MatmulWeight* ws, float* const* ys, int64_t count, int64_t n);

/// One dot product in the same order as matmul_f32 (for attention and tests); any n >= 0, reading
/// a[0, n) and b[0, n) only (a last partial step of 8 loads its lanes masked: attention heads of
/// any width, e.g. 12 or 20, read no further than their head).
float dot_f32(const float* a, const float* b, int64_t n);

/// out[j] = dot_f32(a, b[j], n) for j < m, bit for bit; a and every b[j] hold n floats (any n,
/// as for dot_f32). The AVX2 order runs four keys at once (four independent FMA
/// chains, their reduce8 trees done together by horizontal adds): attention's scores.
void dot_f32_many(const float* a, const float* const* b, int64_t m, int64_t n, float* out);

}  // namespace specserve
