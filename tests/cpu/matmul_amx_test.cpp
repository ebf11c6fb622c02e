// cpu/matmul.h, SPECSERVE_CPU_MATMUL=amx: the bf16 AMX kernel. Its sums cannot be written out in
// scalars (the tile unit's internal order is not documented), so it is checked for what the
// engine needs and what bf16 allows: a row's result is the same bits in any batch (one row, a
// verification step, several x groups) and with any thread count; Q4_1 / Q8_0 blocks give the
// bits of their dequantised fp32 weight; and every result is within bf16 rounding of a double
// reference. Each test skips, saying so, on a CPU or kernel without amx-bf16.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "cpu/attention.h"
#include "model/dequant.h"
#include "tests/cpu/cpu_test_util.h"

namespace specserve {
namespace {

using namespace specserve::testing;  // NOLINT: the shared CPU test helpers

#define SKIP_WITHOUT_AMX(scope)                                                                                 \
  if (!(scope).ok())                                                                                            \
  GTEST_SKIP() << "the AMX kernel cannot run here: this CPU lacks amx-tile, amx-bf16 or avx512bf16, or the kernel " \
                  "refused the tile state"

// Widths: one block, two blocks (the next-tile prefetch near a short row's end), attention (576 =
// two 256-wide k chunks and a 64-wide one), the MLP down projection; rows not a multiple of the
// 32-row weight tile.
struct Shape {
  int64_t rows, cols;
};
const Shape kShapes[] = {{5, 32}, {40, 64}, {50, 576}, {37, 1536}, {64, 256}};

TEST(MatmulAmx, RowIsBitIdenticalInAnyBatchAndThreadCount) {
  IsaScope scope(MatmulIsa::kAmx);
  SKIP_WITHOUT_AMX(scope);
  ThreadsScope threads(1);
  for (const WeightFormat format : {WeightFormat::kF32, WeightFormat::kQ4_1, WeightFormat::kQ8_0})
    for (const Shape s : kShapes) {
      SCOPED_TRACE("format " + std::to_string(static_cast<int>(format)) + ", " + std::to_string(s.rows) + " x " + std::to_string(s.cols));
      const auto fw = random_vec(static_cast<size_t>(s.rows * s.cols), 3);
      const auto blocks = random_q_blocks(format == WeightFormat::kF32 ? WeightFormat::kQ4_1 : format, s.rows, s.cols, 4);
      const MatmulWeight w{format, format == WeightFormat::kF32 ? static_cast<const void*>(fw.data()) : blocks.data(), s.rows, s.cols};
      // 40 rows: three x groups of 16 (the chunked path); 1 and 9 rows: one group (the k-step path).
      const int64_t n = 40;
      const auto x = random_vec(static_cast<size_t>(n * s.cols), 5);
      std::vector<float> all(static_cast<size_t>(n * s.rows)), all2(all.size());
      threads.set(1);
      matmul_weight(x.data(), w, all.data(), n);
      threads.set(2);
      matmul_weight(x.data(), w, all2.data(), n);
      EXPECT_TRUE(bit_equal(all.data(), all2.data(), all.size())) << "1 against 2 threads";
      // 1, 9, 16 rows: one B tile as wide as the rows; 17: two groups of 16, the second padded.
      for (const int64_t first : {int64_t{0}, int64_t{7}, int64_t{23}}) {
        for (const int64_t m : {int64_t{1}, int64_t{9}, int64_t{16}, int64_t{17}}) {
          std::vector<float> part(static_cast<size_t>(m * s.rows));
          matmul_weight(x.data() + first * s.cols, w, part.data(), m);
          EXPECT_TRUE(bit_equal(part.data(), &all[static_cast<size_t>(first * s.rows)], part.size()))
              << m << " rows from row " << first << " against the same rows in a batch of " << n;
        }
      }
    }
}

TEST(MatmulAmx, BlocksGiveTheBitsOfTheirDequantisedWeight) {
  IsaScope scope(MatmulIsa::kAmx);
  SKIP_WITHOUT_AMX(scope);
  for (const WeightFormat format : {WeightFormat::kQ4_1, WeightFormat::kQ8_0})
    for (const Shape s : kShapes)
      for (const int64_t n : {int64_t{1}, int64_t{9}, int64_t{33}}) {
        const auto blocks = random_q_blocks(format, s.rows, s.cols, 11);
        const auto deq = dequantised(format, blocks, s.rows, s.cols);
        const auto x = random_vec(static_cast<size_t>(n * s.cols), 12);
        std::vector<float> yb(static_cast<size_t>(n * s.rows)), yf(yb.size());
        matmul_weight(x.data(), MatmulWeight{format, blocks.data(), s.rows, s.cols}, yb.data(), n);
        matmul_f32(x.data(), deq.data(), yf.data(), n, s.rows, s.cols);
        EXPECT_TRUE(bit_equal(yb.data(), yf.data(), yb.size()))
            << (format == WeightFormat::kQ4_1 ? "Q4_1 " : "Q8_0 ") << n << " x " << s.rows << " x " << s.cols;
      }
}

TEST(MatmulAmx, ResultsAreWithinBf16RoundingOfADoubleReference) {
  // x and w are each rounded to bf16 (8 significant bits: relative error <= 2^-9), products and
  // sums in fp32: |y - exact| <= about 2 * 2^-9 * sum |x w|. A wrong pair order, tile row or k
  // offset gives errors of the order of sum |x w| itself.
  IsaScope scope(MatmulIsa::kAmx);
  SKIP_WITHOUT_AMX(scope);
  for (const Shape s : kShapes)
    for (const int64_t n : {int64_t{1}, int64_t{16}, int64_t{17}}) {
      const auto w = random_vec(static_cast<size_t>(s.rows * s.cols), 21);
      const auto x = random_vec(static_cast<size_t>(n * s.cols), 22);
      std::vector<float> y(static_cast<size_t>(n * s.rows));
      matmul_f32(x.data(), w.data(), y.data(), n, s.rows, s.cols);
      double worst = 0;
      for (int64_t i = 0; i < n; ++i)
        for (int64_t r = 0; r < s.rows; ++r) {
          double ref = 0, mag = 0;
          for (int64_t k = 0; k < s.cols; ++k) {
            const double p = static_cast<double>(x[i * s.cols + k]) * w[r * s.cols + k];
            ref += p;
            mag += std::fabs(p);
          }
          const double err = std::fabs(y[i * s.rows + r] - ref) / mag;
          worst = std::max(worst, err);
          ASSERT_LE(err, 2.5 * std::ldexp(1.0, -9)) << "row " << i << " out " << r << " of " << n << " x " << s.rows << " x " << s.cols
                                                    << ": " << y[i * s.rows + r] << " vs " << ref;
        }
      // bf16 really is in use: fp32 alone would be ~1e-7 here.
      if (s.cols >= 256) EXPECT_GT(worst, 1e-5) << n << " x " << s.rows << " x " << s.cols;
    }
}

TEST(MatmulAmx, StalePaddingFromAnEarlierCallDoesNotLeakIntoResults) {
  // A 32-row call whose last rows are NaN and infinity leaves them in this thread's packed x;
  // a 17-row call then pads its second group with them. Its rows must still be the rows a
  // batch of finite x gives.
  IsaScope scope(MatmulIsa::kAmx);
  SKIP_WITHOUT_AMX(scope);
  ThreadsScope threads(1);
  const int64_t rows = 64, cols = 576;
  const auto w = random_vec(static_cast<size_t>(rows * cols), 41);
  auto poison = random_vec(static_cast<size_t>(32 * cols), 42);
  for (size_t i = static_cast<size_t>(17 * cols); i < poison.size(); ++i) poison[i] = (i % 2) ? NAN : INFINITY;
  const auto x = random_vec(static_cast<size_t>(40 * cols), 43);
  std::vector<float> want(static_cast<size_t>(40 * rows)), junk(static_cast<size_t>(32 * rows)), got(static_cast<size_t>(17 * rows));
  matmul_f32(x.data(), w.data(), want.data(), 40, rows, cols);
  matmul_f32(poison.data(), w.data(), junk.data(), 32, rows, cols);
  matmul_f32(x.data(), w.data(), got.data(), 17, rows, cols);
  EXPECT_TRUE(bit_equal(got.data(), want.data(), got.size()));
  for (const float v : got) ASSERT_TRUE(std::isfinite(v));
}

TEST(MatmulAmx, WidthsNotAMultipleOf32UseTheFp32Kernel) {
  // 48 = 3 x 16: the AVX-512 kernel; 40: the AVX2 kernel (the widths matmul_weight refuses for
  // blocks never reach here).
  const int64_t n = 5, rows = 9;
  {
    // Only an AMX CPU has the path under test (and AMX implies AVX-512, which the 48 case uses).
    IsaScope probe(MatmulIsa::kAmx);
    SKIP_WITHOUT_AMX(probe);
  }
  for (const int64_t cols : {int64_t{48}, int64_t{40}}) {
    const auto w = random_vec(static_cast<size_t>(rows * cols), 51), x = random_vec(static_cast<size_t>(n * cols), 52);
    std::vector<float> want(static_cast<size_t>(n * rows)), got(want.size());
    {
      IsaScope fp32(cols % 16 == 0 ? MatmulIsa::kAvx512 : MatmulIsa::kAvx2);
      ASSERT_TRUE(fp32.ok());
      matmul_f32(x.data(), w.data(), want.data(), n, rows, cols);
    }
    IsaScope scope(MatmulIsa::kAmx);
    SKIP_WITHOUT_AMX(scope);
    matmul_f32(x.data(), w.data(), got.data(), n, rows, cols);
    EXPECT_TRUE(bit_equal(got.data(), want.data(), got.size())) << "cols " << cols;
  }
}

TEST(MatmulAmx, AnEmptyProductWritesNothing) {
  IsaScope scope(MatmulIsa::kAmx);
  SKIP_WITHOUT_AMX(scope);
  const auto w = random_vec(64 * 64, 61);
  float y = 7.0f;
  matmul_f32(nullptr, w.data(), &y, 0, 64, 64);
  EXPECT_EQ(y, 7.0f);
}

TEST(MatmulAmx, IsChosenByNameAndReported) {
  IsaScope scope(MatmulIsa::kAmx);
  SKIP_WITHOUT_AMX(scope);
  EXPECT_EQ(matmul_isa(), MatmulIsa::kAmx);
  EXPECT_STREQ(matmul_isa_name(MatmulIsa::kAmx), "amx");
  // Attention keeps its tiled AVX-512 kernel (unless SPECSERVE_CPU_ATTENTION says otherwise).
  if (cpu_kernel_env("SPECSERVE_CPU_ATTENTION") != "rowwise") EXPECT_TRUE(attention_tiled_applies(64));
  // dot_f32 (attention) keeps the AVX-512 order under amx.
  const auto a = random_vec(576, 31), b = random_vec(576, 32);
  const float d = dot_f32(a.data(), b.data(), 576);
  IsaScope avx512(MatmulIsa::kAvx512);
  ASSERT_TRUE(avx512.ok());
  const float d5 = dot_f32(a.data(), b.data(), 576);
  EXPECT_TRUE(bit_equal(&d, &d5, 1));
}

}  // namespace
}  // namespace specserve
