// cpu/matmul.h: matmul_f32 and dot_f32 against a double-precision reference and OpenBLAS sgemm,
// their documented reduction order bit for bit, batch and thread-count invariance, for every
// lane width this CPU runs.
#include <cblas.h>
#include <gtest/gtest.h>
#include <omp.h>

#include <cfloat>
#include <cstdio>
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "model/dequant.h"
#include "tests/cpu/cpu_test_util.h"

namespace specserve {
namespace {

using namespace specserve::testing;  // NOLINT: the shared CPU test helpers

// ---------------------------------------------------------------------------------------------
// matmul

struct MatmulShape {
  int64_t n, rows, cols;
};

// Rows not a multiple of the weight tile (AVX2: 4 rows, AVX-512: 3), batch sizes not a multiple
// of the x tile (AVX2: 3 rows; AVX-512: groups of up to 8, split near-equally), widths that are
// not a multiple of 16 (the AVX2 kernel even where AVX-512 runs), and widths whose x chunk
// (256 KiB / row bytes) splits the batch (cols 2048 -> 30-row chunks).
const MatmulShape kMatmulShapes[] = {{1, 1, 8},    {2, 3, 16},    {5, 13, 64},  {7, 37, 136},
                                     {4, 6, 576},  {64, 11, 2048}, {250, 5, 576}, {3, 130, 96}};

TEST_F(BackendOps, MatmulMatchesDoubleReferenceAndSgemm) {
  for (const MatmulIsa isa : matmul_isas()) {
  IsaScope scope(isa);
  ASSERT_TRUE(scope.ok()) << matmul_isa_name(isa);
  SCOPED_TRACE(std::string("isa=") + matmul_isa_name(isa));
  uint32_t seed = 1;
  for (const auto& s : kMatmulShapes) {
    SCOPED_TRACE("n=" + std::to_string(s.n) + " rows=" + std::to_string(s.rows) + " cols=" + std::to_string(s.cols));
    const auto wh = random_vec(static_cast<size_t>(s.rows * s.cols), seed++);
    const auto xh = random_vec(static_cast<size_t>(s.n * s.cols), seed++);
    auto w = weight(wh, s.rows, s.cols);
    ASSERT_EQ(w->rows(), s.rows);
    ASSERT_EQ(w->cols(), s.cols);
    const auto y = matmul(*w, xh, s.n);

    std::vector<float> blas(static_cast<size_t>(s.n * s.rows));
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(s.n), static_cast<int>(s.rows),
                static_cast<int>(s.cols), 1.0f, xh.data(), static_cast<int>(s.cols), wh.data(), static_cast<int>(s.cols),
                0.0f, blas.data(), static_cast<int>(s.rows));

    double worst = 0;
    for (int64_t i = 0; i < s.n; ++i) {
      for (int64_t r = 0; r < s.rows; ++r) {
        double ref = 0, mag = 0;
        for (int64_t k = 0; k < s.cols; ++k) {
          const double p = static_cast<double>(xh[i * s.cols + k]) * wh[r * s.cols + k];
          ref += p;
          mag += std::fabs(p);
        }
        // Error bound of fp32 FMA accumulation: cols/8 terms per lane + 3 levels of lane sums,
        // each at most one rounding (2^-24) of the running magnitude; FLT_EPSILON gives 2x margin.
        const double bound = (static_cast<double>(s.cols) / 8 + 3) * FLT_EPSILON * mag + 1e-30;
        const double got = y[i * s.rows + r];
        const double bl = blas[i * s.rows + r];
        ASSERT_LE(std::fabs(got - ref), bound) << "row " << i << " out " << r;
        ASSERT_LE(std::fabs(bl - ref), bound) << "sgemm row " << i << " out " << r;
        ASSERT_LE(std::fabs(got - bl), 2 * bound) << "vs sgemm, row " << i << " out " << r;
        worst = std::max(worst, std::fabs(got - ref) / (mag + 1e-30));
      }
    }
    RecordProperty(std::string("worst_rel_err_") + matmul_isa_name(isa) + "_" + std::to_string(s.cols), std::to_string(worst));
  }
  }
}

TEST_F(BackendOps, MatmulAddsBias) {
  const int64_t n = 5, rows = 13, cols = 24;
  const auto wh = random_vec(rows * cols, 11);
  const auto bh = random_vec(rows, 12, -4.0f, 4.0f);
  const auto xh = random_vec(n * cols, 13);
  auto w = weight(wh, rows, cols);
  auto b = weight(bh, 0, rows);  // a GGUF vector: [1, rows]
  ASSERT_EQ(b->rows(), 1);
  ASSERT_EQ(b->cols(), rows);
  const auto plain = matmul(*w, xh, n);
  const auto with_bias = matmul(*w, xh, n, b.get());
  for (int64_t i = 0; i < n; ++i)
    for (int64_t r = 0; r < rows; ++r) {
      // Bias is added after the dot product, in fp32: exactly plain + bias.
      EXPECT_EQ(with_bias[i * rows + r], plain[i * rows + r] + bh[r]) << i << "," << r;
    }
}

TEST_F(BackendOps, MatmulRowIsBitIdenticalInAnyBatch) {
  for (const MatmulIsa isa : matmul_isas()) {
  IsaScope scope(isa);
  ASSERT_TRUE(scope.ok()) << matmul_isa_name(isa);
  SCOPED_TRACE(std::string("isa=") + matmul_isa_name(isa));
  for (const int64_t cols : {576, 2048, 136}) {
    const int64_t rows = cols == 576 ? 37 : 11, total = 64;
    SCOPED_TRACE("cols=" + std::to_string(cols));
    const auto wh = random_vec(rows * cols, 21 + static_cast<uint32_t>(cols));
    const auto xh = random_vec(total * cols, 22 + static_cast<uint32_t>(cols));
    auto w = weight(wh, rows, cols);
    // Each row alone.
    std::vector<float> alone(static_cast<size_t>(total * rows));
    for (int64_t i = 0; i < total; ++i) {
      std::vector<float> xi(xh.begin() + i * cols, xh.begin() + (i + 1) * cols);
      const auto yi = matmul(*w, xi, 1);
      std::copy(yi.begin(), yi.end(), alone.begin() + i * rows);
    }
    // The same rows inside batches of 2, 3, 5, 9, 17 and 64, starting at different offsets and in a
    // shuffled order, so a row sits at every position of the 3-row tile and the x chunk.
    std::mt19937 rng(5);
    for (const int64_t bsz : {2, 3, 5, 9, 17, 64}) {
      for (int rep = 0; rep < 3; ++rep) {
        std::vector<int64_t> pick(static_cast<size_t>(total));
        std::iota(pick.begin(), pick.end(), 0);
        std::shuffle(pick.begin(), pick.end(), rng);
        pick.resize(static_cast<size_t>(bsz));
        std::vector<float> xb;
        for (int64_t i : pick) xb.insert(xb.end(), xh.begin() + i * cols, xh.begin() + (i + 1) * cols);
        const auto yb = matmul(*w, xb, bsz);
        for (int64_t j = 0; j < bsz; ++j) {
          ASSERT_TRUE(bit_equal(&yb[j * rows], &alone[pick[j] * rows], rows))
              << "row " << pick[j] << " at position " << j << " of a batch of " << bsz;
        }
      }
    }
  }
  }
}

TEST_F(BackendOps, DotMatchesMatmulBitForBit) {
  // Attention uses dot_f32; matmul.h promises the same reduction order, for either lane width
  // and for widths that are and are not a multiple of 16.
  for (const MatmulIsa isa : matmul_isas()) {
    IsaScope scope(isa);
    ASSERT_TRUE(scope.ok()) << matmul_isa_name(isa);
    for (const int64_t cols : {64, 72, 576}) {
      const auto a = random_vec(cols, 31), b = random_vec(cols, 32);
      auto w = weight(b, 1, cols);
      const auto y = matmul(*w, a, 1);
      EXPECT_EQ(dot_f32(a.data(), b.data(), cols), y[0]) << matmul_isa_name(isa) << " cols " << cols;
    }
  }
}

// dot_f32_many (attention's scores, four keys at a time on AVX2) is dot_f32 for every key.
TEST_F(BackendOps, DotManyIsDotForEveryKey) {
  for (const MatmulIsa isa : matmul_isas()) {
    IsaScope scope(isa);
    ASSERT_TRUE(scope.ok()) << matmul_isa_name(isa);
    for (const int64_t cols : {8, 16, 48, 64, 128}) {
      const auto a = random_vec(cols, 41);
      for (const int64_t m : {1, 3, 4, 5, 8, 9}) {
        std::vector<std::vector<float>> keys;
        std::vector<const float*> ptrs;
        for (int64_t j = 0; j < m; ++j) keys.push_back(random_vec(cols, 50 + static_cast<uint32_t>(j)));
        for (const auto& k : keys) ptrs.push_back(k.data());
        std::vector<float> got(static_cast<size_t>(m), NAN);
        dot_f32_many(a.data(), ptrs.data(), m, cols, got.data());
        for (int64_t j = 0; j < m; ++j) {
          const float want = dot_f32(a.data(), ptrs[static_cast<size_t>(j)], cols);
          ASSERT_TRUE(bit_equal(&got[static_cast<size_t>(j)], &want, 1)) << matmul_isa_name(isa) << " cols " << cols << " m " << m << " key " << j;
        }
      }
    }
  }
}

// The reduction order matmul.h documents, written out in scalars: lane l of `lanes` accumulates
// x[k] * w[k] for k = l, l + lanes, ... with one fused multiply-add each, k ascending; 16 lanes
// are first folded to 8 (l[i] + l[i + 8]); then ((l0 + l4) + (l1 + l5)) + ((l2 + l6) + (l3 + l7)).
float documented_dot(const float* x, const float* w, int64_t cols, int lanes) {
  float l[16] = {};
  for (int64_t k = 0; k < cols; ++k) l[k % lanes] = std::fma(x[k], w[k], l[k % lanes]);
  if (lanes == 16)
    for (int i = 0; i < 8; ++i) l[i] = l[i] + l[i + 8];
  return ((l[0] + l[4]) + (l[1] + l[5])) + ((l[2] + l[6]) + (l[3] + l[7]));
}

// A width that is not a multiple of 8 (an attention head of 12 or 20): the masked last step reads
// nothing past the width (NaN placed right after it stays out) and sums in the documented order.
TEST_F(BackendOps, DotOfAnyWidthReadsOnlyThatWidth) {
  for (const MatmulIsa isa : matmul_isas()) {
    IsaScope scope(isa);
    ASSERT_TRUE(scope.ok()) << matmul_isa_name(isa);
    for (const int64_t cols : {1, 4, 7, 12, 20, 36, 44}) {
      auto a = random_vec(cols, 71);
      a.push_back(NAN);
      std::vector<std::vector<float>> keys;
      std::vector<const float*> ptrs;
      for (uint32_t j = 0; j < 5; ++j) {
        keys.push_back(random_vec(cols, 80 + j));
        keys.back().push_back(NAN);
      }
      for (const auto& k : keys) ptrs.push_back(k.data());
      std::vector<float> many(keys.size(), NAN);
      dot_f32_many(a.data(), ptrs.data(), static_cast<int64_t>(keys.size()), cols, many.data());
      for (size_t j = 0; j < keys.size(); ++j) {
        const float want = documented_dot(a.data(), keys[j].data(), cols, 8);
        const float one = dot_f32(a.data(), keys[j].data(), cols);
        ASSERT_TRUE(std::isfinite(one)) << matmul_isa_name(isa) << " cols " << cols;
        EXPECT_TRUE(bit_equal(&one, &want, 1)) << matmul_isa_name(isa) << " cols " << cols << ": " << one << " vs " << want;
        EXPECT_TRUE(bit_equal(&many[j], &want, 1)) << matmul_isa_name(isa) << " cols " << cols << " key " << j;
      }
    }
  }
}

TEST_F(BackendOps, MatmulSumsInTheDocumentedOrderBitForBit) {
  for (const MatmulIsa isa : matmul_isas()) {
    IsaScope scope(isa);
    ASSERT_TRUE(scope.ok()) << matmul_isa_name(isa);
    for (const int64_t cols : {64, 136, 576}) {
      const int64_t n = 9, rows = 7;
      const auto wh = random_vec(rows * cols, 61 + static_cast<uint32_t>(cols)), xh = random_vec(n * cols, 62);
      auto w = weight(wh, rows, cols);
      const auto y = matmul(*w, xh, n);
      const int lanes = isa == MatmulIsa::kAvx512 && cols % 16 == 0 ? 16 : 8;
      for (int64_t i = 0; i < n; ++i)
        for (int64_t r = 0; r < rows; ++r) {
          const float want = documented_dot(&xh[i * cols], &wh[r * cols], cols, lanes);
          ASSERT_TRUE(bit_equal(&y[i * rows + r], &want, 1))
              << matmul_isa_name(isa) << " cols " << cols << " row " << i << " out " << r << ": " << y[i * rows + r] << " vs " << want;
          const float d = dot_f32(&xh[i * cols], &wh[r * cols], cols);
          ASSERT_TRUE(bit_equal(&d, &want, 1)) << "dot_f32, " << matmul_isa_name(isa) << " cols " << cols;
        }
    }
  }
}

TEST_F(BackendOps, MatmulLaneWidthsAgreeToRounding) {
  // The two kernels sum in different orders (matmul.h): equal up to fp32 rounding, not bits.
  if (matmul_isas().size() < 2) GTEST_SKIP() << "this CPU has no avx512f: only the AVX2 kernel runs here";
  const int64_t n = 9, rows = 50, cols = 576;
  const auto wh = random_vec(rows * cols, 51), xh = random_vec(n * cols, 52);
  auto w = weight(wh, rows, cols);
  std::vector<float> y2, y5;
  {
    IsaScope s(MatmulIsa::kAvx2);
    ASSERT_TRUE(s.ok());
    y2 = matmul(*w, xh, n);
  }
  {
    IsaScope s(MatmulIsa::kAvx512);
    ASSERT_TRUE(s.ok());
    y5 = matmul(*w, xh, n);
  }
  int differ = 0;
  for (size_t i = 0; i < y2.size(); ++i) {
    EXPECT_NEAR(y2[i], y5[i], 1e-5f * (1.0f + std::fabs(y2[i]))) << i;
    differ += y2[i] != y5[i];
  }
  RecordProperty("elements_differing_in_bits", differ);
}

TEST_F(BackendOps, MatmulUsesAvx512WhereTheCpuHasIt) {
  if (!__builtin_cpu_supports("avx512f")) GTEST_SKIP() << "this CPU has no avx512f: the AVX2 kernel is the only one";
  const char* env = std::getenv("SPECSERVE_CPU_MATMUL");
  if (env && (cpu_kernel_env("SPECSERVE_CPU_MATMUL") == "avx2" || cpu_kernel_env("SPECSERVE_CPU_MATMUL") == "amx" ||
              cpu_kernel_env("SPECSERVE_CPU_MATMUL") == "vnni"))
    GTEST_SKIP() << "SPECSERVE_CPU_MATMUL=" << env << " chooses the kernel";
  EXPECT_EQ(matmul_isa(), MatmulIsa::kAvx512);
  EXPECT_TRUE(set_matmul_isa(MatmulIsa::kAvx512));
}

TEST_F(BackendOps, MatmulDoesNotDependOnThreadCount) {
  const int64_t n = 7, rows = 64, cols = 576;  // large enough for the parallel loop
  const auto wh = random_vec(rows * cols, 41), xh = random_vec(n * cols, 42);
  for (const MatmulIsa isa : matmul_isas()) {
    IsaScope scope(isa);
    ASSERT_TRUE(scope.ok()) << matmul_isa_name(isa);
    be_ = make_cpu_backend(1);
    auto w = weight(wh, rows, cols);
    const auto one = matmul(*w, xh, n);
    auto be2 = make_cpu_backend(2);  // thread counts are process-wide: the last backend sets them
    const auto two = matmul(*w, xh, n);
    be2.reset();
    be_ = make_cpu_backend(1);  // back to one thread for the rest of the process
    EXPECT_TRUE(bit_equal(one.data(), two.data(), one.size())) << matmul_isa_name(isa);
  }
}

// ---------------------------------------------------------------------------------------------
// Q4_1 / Q8_0 weights kept as blocks (matmul_weight, dequantize_rows)

// Random GGUF blocks of `format` for a [rows, cols] weight: random nibbles / int8, and scales
// from the whole finite fp16 range (subnormal, negative, large) so every conversion path shows.
std::vector<uint8_t> random_blocks(WeightFormat format, int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> b(static_cast<size_t>(rows * weight_row_bytes(format, cols)));
  for (auto& x : b) x = static_cast<uint8_t>(rng());
  const size_t block = format == WeightFormat::kQ4_1 ? 20 : 34;
  auto scale = [&](uint8_t* p, bool tiny) {
    // Finite fp16: exponent field below 31. Mostly moderate scales (a usable weight), some
    // subnormal (exponent 0) and some large.
    uint16_t h = static_cast<uint16_t>(rng());
    const int r = static_cast<int>(rng() % 8);
    const uint16_t exp = r == 0 ? 0 : r == 1 ? static_cast<uint16_t>(20 + rng() % 10) : static_cast<uint16_t>(tiny ? 5 + rng() % 8 : 8 + rng() % 8);
    h = static_cast<uint16_t>((h & 0x83ff) | (exp << 10));
    std::memcpy(p, &h, 2);
  };
  for (size_t o = 0; o < b.size(); o += block) {
    scale(&b[o], true);
    if (format == WeightFormat::kQ4_1) scale(&b[o + 2], false);
  }
  return b;
}

TEST(WeightBlocks, DequantizeRowsGivesModelDequantBitForBit) {
  for (const MatmulIsa isa : matmul_isas())
  for (const WeightFormat format : {WeightFormat::kQ4_1, WeightFormat::kQ8_0}) {
    IsaScope scope(isa);  // 8 or 16 values at a time
    ASSERT_TRUE(scope.ok());
    const int64_t rows = 40, cols = 576;
    const auto blocks = random_blocks(format, rows, cols, 61);
    std::vector<float> want(static_cast<size_t>(rows * cols)), got(want.size(), NAN);
    ASSERT_TRUE(dequantize(format == WeightFormat::kQ4_1 ? GgmlType::Q4_1 : GgmlType::Q8_0, blocks.data(), rows * cols, want.data()).ok());
    const MatmulWeight w{format, blocks.data(), rows, cols};
    dequantize_rows(w, 0, rows, got.data());
    EXPECT_TRUE(bit_equal(got.data(), want.data(), got.size())) << (format == WeightFormat::kQ4_1 ? "Q4_1 " : "Q8_0 ") << matmul_isa_name(isa);
    // A row range alone gives the same rows.
    std::vector<float> part(static_cast<size_t>(3 * cols));
    dequantize_rows(w, 17, 3, part.data());
    EXPECT_TRUE(bit_equal(part.data(), &want[static_cast<size_t>(17 * cols)], part.size()));
  }
}

TEST_F(BackendOps, MatmulOnBlocksIsBitIdenticalToMatmulOnTheDequantisedWeight) {
  // Through the backend, as the model loads them: a Q4_1 or Q8_0 tensor is kept as blocks
  // (unless SPECSERVE_CPU_WEIGHTS=f32), an F32 tensor of the same values is not; batches that
  // cover one decode row, a verification step, several x chunks; widths of attention, the MLP
  // down projection and one block.
  struct Case { int64_t n, rows, cols; };
  // Otherwise this would compare fp32 with fp32.
  if (std::string(cpu_weight_storage()) != "blocks") GTEST_SKIP() << "SPECSERVE_CPU_WEIGHTS=f32 is set: no weight stays in blocks";
  // Few x rows (up to 8 under avx512, 4 under avx2) are dequantised in registers
  // (fused_block_matmul), else through a buffer: both, weight tiles of every size (rows % 3 for
  // avx512, rows % 4 for avx2), one thread and the team (2 x 47 x 1536).
  struct Restore {
    bool on;
    ~Restore() { set_fused_block_matmul(on); }
  } restore{fused_block_matmul()};
  for (const bool fused : {true, false})
  for (const MatmulIsa isa : matmul_isas()) {
    set_fused_block_matmul(fused);
    IsaScope scope(isa);
    ASSERT_TRUE(scope.ok()) << matmul_isa_name(isa);
    for (const WeightFormat format : {WeightFormat::kQ4_1, WeightFormat::kQ8_0}) {
      const GgmlType type = format == WeightFormat::kQ4_1 ? GgmlType::Q4_1 : GgmlType::Q8_0;
      for (const Case c : {Case{1, 37, 576}, Case{9, 11, 1536}, Case{130, 5, 576}, Case{3, 64, 32}, Case{2, 38, 576},
                           Case{4, 40, 1536}, Case{5, 7, 64}, Case{8, 41, 576}, Case{6, 3, 1536}, Case{1, 39, 576},
                           Case{2, 47, 1536}, Case{3, 20, 576}}) {
        const auto blocks = random_blocks(format, c.rows, c.cols, 70 + static_cast<uint32_t>(c.n));
        std::vector<float> deq(static_cast<size_t>(c.rows * c.cols));
        ASSERT_TRUE(dequantize(type, blocks.data(), c.rows * c.cols, deq.data()).ok());
        GgufTensorInfo t;
        t.name = "test.blocks";
        t.shape = {c.cols, c.rows};
        t.raw_type = static_cast<uint32_t>(type);
        t.num_elements = c.rows * c.cols;
        t.num_bytes = blocks.size();
        t.data = blocks.data();
        auto wb = be_->load_weight(t);
        ASSERT_TRUE(wb.ok()) << wb.status().to_string();
        auto wf = weight(deq, c.rows, c.cols);
        const auto xh = random_vec(static_cast<size_t>(c.n * c.cols), 80);
        const auto yb = matmul(**wb, xh, c.n), yf = matmul(*wf, xh, c.n);
        EXPECT_TRUE(bit_equal(yb.data(), yf.data(), yb.size()))
            << ggml_type_name(t.raw_type) << " " << c.n << " x " << c.rows << " x " << c.cols << ", " << matmul_isa_name(isa);
        // The embedding lookup reads the same rows.
        const std::vector<int32_t> ids = {static_cast<int32_t>(c.rows - 1), 0};
        auto ib = buf(ids);
        auto eb = buf_f32(static_cast<size_t>(2 * c.cols));
        be_->embedding(**wb, ib->i32(), 2, eb->f32());
        const auto e = get(*eb, static_cast<size_t>(2 * c.cols));
        EXPECT_TRUE(bit_equal(e.data(), &deq[static_cast<size_t>((c.rows - 1) * c.cols)], static_cast<size_t>(c.cols)));
        EXPECT_TRUE(bit_equal(e.data() + c.cols, deq.data(), static_cast<size_t>(c.cols)));
      }
    }
  }
}

TEST(WeightBlocks, MatmulWeightOnBlocksIsBitIdenticalForAnyThreadCount) {
  // matmul_weight directly (no backend), 1 and 2 threads: each thread dequantises into its own
  // buffer, and the result equals matmul_f32 on the dequantised weight.
  const int64_t n = 7, rows = 64, cols = 576;  // large enough for the parallel loop
  ThreadsScope threads(1);
  for (const MatmulIsa isa : matmul_isas())
    for (const WeightFormat format : {WeightFormat::kQ4_1, WeightFormat::kQ8_0}) {
      IsaScope scope(isa);
      ASSERT_TRUE(scope.ok());
      const auto blocks = random_blocks(format, rows, cols, 95);
      std::vector<float> deq(static_cast<size_t>(rows * cols));
      ASSERT_TRUE(dequantize(format == WeightFormat::kQ4_1 ? GgmlType::Q4_1 : GgmlType::Q8_0, blocks.data(), rows * cols, deq.data()).ok());
      const auto x = random_vec(static_cast<size_t>(n * cols), 96);
      std::vector<float> want(static_cast<size_t>(n * rows)), one(want.size()), two(want.size());
      threads.set(1);
      matmul_f32(x.data(), deq.data(), want.data(), n, rows, cols);
      matmul_weight(x.data(), MatmulWeight{format, blocks.data(), rows, cols}, one.data(), n);
      threads.set(2);
      matmul_weight(x.data(), MatmulWeight{format, blocks.data(), rows, cols}, two.data(), n);
      EXPECT_TRUE(bit_equal(one.data(), want.data(), want.size())) << matmul_isa_name(isa) << ", 1 thread";
      EXPECT_TRUE(bit_equal(two.data(), want.data(), want.size())) << matmul_isa_name(isa) << ", 2 threads";
    }
}

TEST(WeightBlocks, WeightsSharingXGiveEachWhatMatmulWeightGivesIt) {
  // matmul_weights (a layer's Q/K/V, gate/up in one parallel loop) under every fp32 kernel this
  // CPU has: each output bit for bit what matmul_weight gives its weight alone, for fp32 and block
  // weights, in the fused-dequantisation row counts and past them (several x chunks at 1536
  // columns), 1 and 2 threads; weights of different formats go one by one, with the same bits.
  ThreadsScope threads(1);
  const int64_t row_counts[] = {40, 7, 24};  // tile remainders of 3 (AVX2 4) rows and 16-row groups
  // The fp32 kernels, and where the CPU has them AMX (weight by weight) and vnni (its fp32 path:
  // these weights have no packed copies).
  std::vector<MatmulIsa> isas = matmul_isas();
  isas.push_back(MatmulIsa::kAmx);
  isas.push_back(MatmulIsa::kVnni);
  for (const MatmulIsa isa : isas) {
    IsaScope scope(isa);
    if (!scope.ok()) {
      std::printf("[matmul_weights] %s: not on this CPU, not checked\n", matmul_isa_name(isa));
      continue;
    }
    for (const WeightFormat format : {WeightFormat::kF32, WeightFormat::kQ4_1, WeightFormat::kQ8_0})
      for (const int64_t cols : {int64_t{64}, int64_t{1536}})
        for (const int64_t n : {int64_t{1}, int64_t{3}, int64_t{9}, int64_t{70}}) {
          std::vector<std::vector<uint8_t>> blocks;
          std::vector<std::vector<float>> f32;
          std::vector<MatmulWeight> ws;
          for (const int64_t rows : row_counts) {
            const uint32_t seed = static_cast<uint32_t>(100 + ws.size());
            if (format == WeightFormat::kF32) {
              f32.push_back(random_vec(static_cast<size_t>(rows * cols), seed));
              ws.push_back(MatmulWeight{format, f32.back().data(), rows, cols});
            } else {
              blocks.push_back(random_blocks(format, rows, cols, seed));
              ws.push_back(MatmulWeight{format, blocks.back().data(), rows, cols});
            }
          }
          const auto x = random_vec(static_cast<size_t>(n * cols), 104);
          for (const int t : {1, 2}) {
            threads.set(t);
            std::vector<std::vector<float>> got, want;
            std::vector<float*> yp;
            for (const MatmulWeight& w : ws) {
              got.emplace_back(static_cast<size_t>(n * w.rows), -1.0f);
              want.emplace_back(static_cast<size_t>(n * w.rows));
              matmul_weight(x.data(), w, want.back().data(), n);
            }
            for (auto& y : got) yp.push_back(y.data());
            matmul_weights(x.data(), ws.data(), yp.data(), static_cast<int64_t>(ws.size()), n);
            for (size_t i = 0; i < ws.size(); ++i)
              EXPECT_TRUE(bit_equal(got[i].data(), want[i].data(), want[i].size()))
                  << matmul_isa_name(isa) << ", format " << static_cast<int>(format) << ", " << cols << " columns, " << n
                  << " x rows, weight " << i << ", " << t << " threads";
          }
        }
    // Different formats: one by one.
    const int64_t cols = 64, n = 2;
    const auto b4 = random_blocks(WeightFormat::kQ4_1, 9, cols, 110);
    const auto f = random_vec(static_cast<size_t>(5 * cols), 111);
    const MatmulWeight mixed[] = {{WeightFormat::kQ4_1, b4.data(), 9, cols}, {WeightFormat::kF32, f.data(), 5, cols}};
    const auto x = random_vec(static_cast<size_t>(n * cols), 112);
    std::vector<float> y0(n * 9), y1(n * 5), w0(y0.size()), w1(y1.size());
    float* yp[] = {y0.data(), y1.data()};
    matmul_weights(x.data(), mixed, yp, 2, n);
    matmul_weight(x.data(), mixed[0], w0.data(), n);
    matmul_weight(x.data(), mixed[1], w1.data(), n);
    EXPECT_TRUE(bit_equal(y0.data(), w0.data(), y0.size())) << matmul_isa_name(isa);
    EXPECT_TRUE(bit_equal(y1.data(), w1.data(), y1.size())) << matmul_isa_name(isa);
  }
}

TEST_F(BackendOps, BlocksOfTheWrongSizeAreRefused) {
  const auto blocks = random_blocks(WeightFormat::kQ4_1, 4, 64, 90);
  GgufTensorInfo t;
  t.name = "blk.0.attn_q.weight";
  t.shape = {64, 4};
  t.raw_type = static_cast<uint32_t>(GgmlType::Q4_1);
  t.num_elements = 256;
  t.num_bytes = blocks.size() - 20;  // one block short
  t.data = blocks.data();
  auto w = be_->load_weight(t);
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.status().message().find("blk.0.attn_q.weight"), std::string::npos) << w.status().to_string();
}

}  // namespace
}  // namespace specserve
