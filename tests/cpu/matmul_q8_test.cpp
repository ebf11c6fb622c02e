// cpu/matmul.h, SPECSERVE_CPU_MATMUL=vnni: int8 x (llama.cpp's block_q8_1) against Q4_1 / Q8_0
// weights repacked 16 rows at a time. Checked bit for bit against a scalar statement of the
// scheme written from the header's description (so a wrong interleave, nibble order, the Q8_0
// offset or a padded row shows), in every batch size and thread count; within the quantisation
// bound of a double-precision product; and through the CPU backend, which packs a loaded
// weight at its first use under the kernel. Each test skips, saying so, on a CPU without
// avx512vnni.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "tests/cpu/cpu_test_util.h"
#include "tests/cpu/fp32_kernel_scope.h"

namespace specserve {
namespace {

using namespace specserve::testing;  // NOLINT: the shared CPU test helpers

#define SKIP_WITHOUT_VNNI(scope) \
  if (!(scope).ok()) GTEST_SKIP() << "the vnni kernel cannot run here: this CPU lacks avx512vnni (or avx512bw/vl)"

float half_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  const uint32_t sign = (h >> 15) & 1u, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
  float v = exp == 0 ? std::ldexp(static_cast<float>(man), -24) : std::ldexp(static_cast<float>(man | 0x400u), static_cast<int>(exp) - 25);
  return sign ? -v : v;
}

// The header's scheme in scalars: x row quantised per block (d = amax / 127, q = nearest-even of
// x * (127 / amax), s = d * sum q), then per output acc = fma(isum, d_w * d_x, acc) and, for Q4_1,
// acc = fma(m_w, s, acc), block by block.
std::vector<float> scheme_reference(const std::vector<float>& x, int64_t n, const std::vector<uint8_t>& blocks, WeightFormat f,
                                    int64_t rows, int64_t cols) {
  const int64_t nb = cols / 32, rb = weight_row_bytes(f, cols), bs = f == WeightFormat::kQ4_1 ? 20 : 34;
  std::vector<float> y(static_cast<size_t>(n * rows));
  std::vector<int> q(static_cast<size_t>(cols));
  std::vector<float> d(static_cast<size_t>(nb)), s(static_cast<size_t>(nb));
  for (int64_t i = 0; i < n; ++i) {
    const float* xi = x.data() + i * cols;
    for (int64_t b = 0; b < nb; ++b) {
      float amax = 0.0f;
      for (int k = 0; k < 32; ++k) amax = std::max(amax, std::fabs(xi[b * 32 + k]));
      const bool zero = !(amax > 0.0f) || !std::isfinite(127.0f / amax);  // all zero, or too small to scale
      d[b] = zero ? 0.0f : amax / 127.0f;
      const float id = zero ? 0.0f : 127.0f / amax;
      int sum = 0;
      for (int k = 0; k < 32; ++k) sum += q[b * 32 + k] = static_cast<int>(std::nearbyint(xi[b * 32 + k] * id));
      s[b] = d[b] * static_cast<float>(sum);
    }
    for (int64_t r = 0; r < rows; ++r) {
      float acc = 0.0f;
      for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* blk = blocks.data() + r * rb + b * bs;
        int isum = 0;
        for (int k = 0; k < 32; ++k) {
          const int wq = f == WeightFormat::kQ4_1 ? (k < 16 ? blk[4 + k] & 0x0f : blk[4 + k - 16] >> 4) : static_cast<int8_t>(blk[2 + k]);
          isum += wq * q[b * 32 + k];
        }
        acc = std::fma(static_cast<float>(isum), half_at(blk) * d[b], acc);
        if (f == WeightFormat::kQ4_1) acc = std::fma(half_at(blk + 2), s[b], acc);
      }
      y[static_cast<size_t>(i * rows + r)] = acc;
    }
  }
  return y;
}

// x with what LLM activations have: a few large channels; and one all-zero block (scale 0) and
// one of values so small that 127 / amax overflows (both quantise to zeros).
std::vector<float> activations(int64_t n, int64_t cols, uint32_t seed) {
  auto x = random_vec(static_cast<size_t>(n * cols), seed);
  for (int64_t i = 0; i < n; ++i) {
    x[static_cast<size_t>(i * cols + 3)] *= 40.0f;
    if (cols >= 64) std::fill(x.begin() + i * cols + 32, x.begin() + i * cols + 64, 0.0f);
    if (cols >= 96) {
      for (int64_t k = 64; k < 96; ++k) x[static_cast<size_t>(i * cols + k)] = (k % 2 ? 1e-38f : -2e-38f);
    }
  }
  return x;
}

struct Shape {
  int64_t rows, cols;
};
// One block; rows not a multiple of the 16-row group (the padded, masked last group); attention
// and MLP widths of the default model.
const Shape kShapes[] = {{5, 32}, {37, 64}, {48, 576}, {19, 1536}};

TEST(MatmulQ8, SumsInTheDocumentedSchemeBitForBitInAnyBatchAndThreadCount) {
  IsaScope scope(MatmulIsa::kVnni);
  SKIP_WITHOUT_VNNI(scope);
  ThreadsScope threads(1);
  for (const WeightFormat f : {WeightFormat::kQ4_1, WeightFormat::kQ8_0})
    for (const Shape sh : kShapes) {
      SCOPED_TRACE(std::string(f == WeightFormat::kQ4_1 ? "Q4_1 " : "Q8_0 ") + std::to_string(sh.rows) + " x " + std::to_string(sh.cols));
      const auto blocks = random_q_blocks(f, sh.rows, sh.cols, 21);
      MatmulWeight w{f, blocks.data(), sh.rows, sh.cols};
      const auto packed = pack_weight_q8(w);
      ASSERT_EQ(static_cast<int64_t>(packed.size()), packed_q8_bytes(w));
      w.packed_q8 = packed.data();
      // 17: two full x passes of 8 and one of 1; 48 x 1536 is quantised by the thread team.
      const int64_t n = sh.cols == 1536 ? 48 : 17;
      const auto x = activations(n, sh.cols, 22);
      const auto want = scheme_reference(x, n, blocks, f, sh.rows, sh.cols);
      for (const int t : {1, 2}) {
        threads.set(t);
        std::vector<int64_t> batches;  // every x-pass remainder: 1..17 rows at a time, and all at once
        for (int64_t m = 1; m <= 17 && m < n; ++m) batches.push_back(m);
        batches.push_back(n);
        for (const int64_t rows_at_once : batches) {
          std::vector<float> got(want.size());
          for (int64_t i0 = 0; i0 < n; i0 += rows_at_once) {
            const int64_t m = std::min(rows_at_once, n - i0);
            matmul_weight(x.data() + i0 * sh.cols, w, got.data() + i0 * sh.rows, m);
          }
          EXPECT_TRUE(bit_equal(got.data(), want.data(), got.size())) << rows_at_once << " x rows at a time, " << t << " threads";
        }
      }
    }
}

TEST(MatmulQ8, WithinTheQuantisationBoundOfADoubleProduct) {
  IsaScope scope(MatmulIsa::kVnni);
  SKIP_WITHOUT_VNNI(scope);
  for (const WeightFormat f : {WeightFormat::kQ4_1, WeightFormat::kQ8_0}) {
    const int64_t rows = 40, cols = 576, n = 3;
    const auto blocks = random_q_blocks(f, rows, cols, 31);
    const auto wf = dequantised(f, blocks, rows, cols);
    MatmulWeight w{f, blocks.data(), rows, cols};
    const auto packed = pack_weight_q8(w);
    w.packed_q8 = packed.data();
    const auto x = activations(n, cols, 32);
    std::vector<float> y(static_cast<size_t>(n * rows));
    matmul_weight(x.data(), w, y.data(), n);
    double worst = 0;  // error / bound
    for (int64_t i = 0; i < n; ++i)
      for (int64_t r = 0; r < rows; ++r) {
        double exact = 0, mag = 0, bound = 0;
        for (int64_t b = 0; b < cols / 32; ++b) {
          double amax = 0, wsum = 0;
          for (int64_t k = b * 32; k < b * 32 + 32; ++k) {
            const double xv = x[static_cast<size_t>(i * cols + k)], wv = wf[static_cast<size_t>(r * cols + k)];
            exact += xv * wv;
            mag += std::fabs(xv * wv);
            amax = std::max(amax, std::fabs(xv));
            wsum += std::fabs(wv);
          }
          bound += amax / 254.0 * wsum;  // |x - d q| <= d / 2 = amax / 254 per element
        }
        bound += 1e-5 * (mag + bound);  // fp32 scales and sums
        const double err = std::fabs(y[static_cast<size_t>(i * rows + r)] - exact);
        EXPECT_LE(err, bound) << "x row " << i << ", weight row " << r;
        worst = std::max(worst, err / bound);
        // Not only bounded but close: quantisation noise averages out over 576 terms.
        EXPECT_LE(err, 0.02 * mag + 1e-6) << "x row " << i << ", weight row " << r;
      }
    std::printf("[vnni %s] worst error / bound %.3f\n", f == WeightFormat::kQ4_1 ? "Q4_1" : "Q8_0", worst);
  }
}

TEST(MatmulQ8, ANonFiniteXValueMakesItsRowsOutputsNaN) {
  // A NaN or an infinity in x (a corrupt model's norm weight, an overflow) must reach the
  // output, as it does under the fp32 kernels, so the engine can report non-finite logits; int8
  // quantisation alone would turn a NaN into -128 (or a NaN block into zeros) and give finite
  // results. Rows without one keep the scheme's bits, in one batch with the others.
  IsaScope scope(MatmulIsa::kVnni);
  SKIP_WITHOUT_VNNI(scope);
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  for (const WeightFormat f : {WeightFormat::kQ4_1, WeightFormat::kQ8_0}) {
    SCOPED_TRACE(f == WeightFormat::kQ4_1 ? "Q4_1" : "Q8_0");
    const int64_t rows = 37, cols = 576, n = 6;
    const auto blocks = random_q_blocks(f, rows, cols, 71);
    MatmulWeight w{f, blocks.data(), rows, cols};
    const auto packed = pack_weight_q8(w);
    w.packed_q8 = packed.data();
    auto x = activations(n, cols, 72);
    const auto clean = scheme_reference(x, n, blocks, f, rows, cols);
    // Row 0: one NaN among finite values (max_ps would drop it); row 2: +inf; row 3: -inf in
    // the last block; row 4: all NaN (the whole row of a NaN norm weight). Rows 1 and 5 clean.
    x[static_cast<size_t>(0 * cols + 100)] = nan;
    x[static_cast<size_t>(2 * cols + 7)] = inf;
    x[static_cast<size_t>(3 * cols + cols - 1)] = -inf;
    std::fill(x.begin() + 4 * cols, x.begin() + 5 * cols, nan);
    std::vector<float> y(static_cast<size_t>(n * rows));
    matmul_weight(x.data(), w, y.data(), n);
    for (int64_t i : {0, 2, 3, 4})
      for (int64_t r = 0; r < rows; ++r) EXPECT_TRUE(std::isnan(y[static_cast<size_t>(i * rows + r)])) << "x row " << i << ", weight row " << r;
    for (int64_t i : {1, 5})
      EXPECT_TRUE(bit_equal(y.data() + i * rows, clean.data() + i * rows, static_cast<size_t>(rows))) << "x row " << i;
  }
}

TEST(MatmulQ8, IsChosenByNameAndLeavesFp32WorkToTheAvx512Kernel) {
  // fp32 weights (norms' neighbours: F16 / F32 heads), a block weight with no packed copy, and
  // dot_f32 (attention) give the AVX-512 kernel's bits under vnni.
  const int64_t rows = 20, cols = 576, n = 3;
  const auto fw = random_vec(static_cast<size_t>(rows * cols), 51);
  const auto blocks = random_q_blocks(WeightFormat::kQ4_1, rows, cols, 52);
  const auto x = random_vec(static_cast<size_t>(n * cols), 53);
  auto products = [&] {
    std::vector<float> y(static_cast<size_t>(2 * n * rows + 1));
    matmul_weight(x.data(), MatmulWeight{WeightFormat::kF32, fw.data(), rows, cols}, y.data(), n);
    matmul_weight(x.data(), MatmulWeight{WeightFormat::kQ4_1, blocks.data(), rows, cols}, y.data() + n * rows, n);
    y.back() = dot_f32(x.data(), fw.data(), cols);
    return y;
  };
  std::vector<float> want;
  {
    IsaScope avx512(MatmulIsa::kAvx512);
    if (!avx512.ok()) GTEST_SKIP() << "this CPU has no avx512f";
    want = products();
  }
  IsaScope scope(MatmulIsa::kVnni);
  SKIP_WITHOUT_VNNI(scope);
  EXPECT_EQ(matmul_isa(), MatmulIsa::kVnni);
  EXPECT_STREQ(matmul_isa_name(MatmulIsa::kVnni), "vnni");
  const auto got = products();
  EXPECT_TRUE(bit_equal(got.data(), want.data(), got.size()));
}

TEST(MatmulQ8, WeightsSharingXGiveEachItsOwnBits) {
  // matmul_weights: a layer's Q, K, V (and gate, up) in one job under vnni. Every output must be
  // the scheme's bits for its own weight in any batch and thread count (so a group given to the
  // wrong weight or row offset shows); a set it cannot fuse (formats mixed, a copy not packed)
  // goes weight by weight, with the same bits.
  IsaScope scope(MatmulIsa::kVnni);
  SKIP_WITHOUT_VNNI(scope);
  ThreadsScope threads(1);
  // (576 columns: large enough for the parallel loop to fork, so 2 threads split the groups.)
  for (const int64_t cols : {int64_t{64}, int64_t{576}})
  for (const WeightFormat f : {WeightFormat::kQ4_1, WeightFormat::kQ8_0}) {
    SCOPED_TRACE(std::string(f == WeightFormat::kQ4_1 ? "Q4_1, " : "Q8_0, ") + std::to_string(cols) + " columns");
    const Shape shapes[] = {{48, cols}, {16, cols}, {19, cols}};  // full groups, one group, a padded one
    std::vector<std::vector<uint8_t>> blocks, packed;
    std::vector<MatmulWeight> ws;
    for (const Shape sh : shapes) {
      blocks.push_back(random_q_blocks(f, sh.rows, cols, static_cast<uint32_t>(60 + ws.size())));
      ws.push_back(MatmulWeight{f, blocks.back().data(), sh.rows, cols});
      packed.push_back(pack_weight_q8(ws.back()));
      ws.back().packed_q8 = packed.back().data();
    }
    for (const int t : {1, 2})
      for (const int64_t n : {1, 3, 9, 17}) {
        threads.set(t);
        const auto x = activations(n, cols, 63);
        std::vector<std::vector<float>> ys;
        std::vector<float*> yp;
        for (const MatmulWeight& w : ws) ys.emplace_back(static_cast<size_t>(n * w.rows), -1.0f);
        for (auto& y : ys) yp.push_back(y.data());
        matmul_weights(x.data(), ws.data(), yp.data(), static_cast<int64_t>(ws.size()), n);
        for (size_t i = 0; i < ws.size(); ++i) {
          const auto want = scheme_reference(x, n, blocks[i], f, ws[i].rows, cols);
          EXPECT_TRUE(bit_equal(ys[i].data(), want.data(), want.size())) << "weight " << i << ", " << n << " x rows, " << t << " threads";
        }
      }
  }
  // Not one int8 job: Q4_1 beside Q8_0, and a block weight without its packed copy (the AVX-512
  // kernel's bits for that one): weight by weight.
  const int64_t n = 3, cols = 64;
  const auto x = activations(n, cols, 64);
  const auto b4 = random_q_blocks(WeightFormat::kQ4_1, 20, cols, 65), b8 = random_q_blocks(WeightFormat::kQ8_0, 20, cols, 66);
  MatmulWeight w4{WeightFormat::kQ4_1, b4.data(), 20, cols}, w8{WeightFormat::kQ8_0, b8.data(), 20, cols};
  const auto p4 = pack_weight_q8(w4), p8 = pack_weight_q8(w8);
  w4.packed_q8 = p4.data();
  w8.packed_q8 = p8.data();
  MatmulWeight unpacked = w8;
  unpacked.packed_q8 = nullptr;
  const MatmulWeight mixed[] = {w4, w8, unpacked};
  std::vector<float> y0(n * 20), y1(n * 20), y2(n * 20), want2(n * 20);
  float* yp[] = {y0.data(), y1.data(), y2.data()};
  matmul_weights(x.data(), mixed, yp, 3, n);
  matmul_weight(x.data(), unpacked, want2.data(), n);
  const auto want0 = scheme_reference(x, n, b4, WeightFormat::kQ4_1, 20, cols), want1 = scheme_reference(x, n, b8, WeightFormat::kQ8_0, 20, cols);
  EXPECT_TRUE(bit_equal(y0.data(), want0.data(), y0.size()));
  EXPECT_TRUE(bit_equal(y1.data(), want1.data(), y1.size()));
  EXPECT_TRUE(bit_equal(y2.data(), want2.data(), y2.size()));
  // One format, packed beside unpacked (weight by weight), and all unpacked (the AVX-512 kernel's
  // one loop): each what matmul_weight gives it.
  MatmulWeight unpacked2 = w8;
  unpacked2.packed_q8 = nullptr;
  unpacked2.rows = 17;  // (a prefix of w8's rows: a different weight shape)
  for (const auto& set : {std::vector<MatmulWeight>{w8, unpacked}, std::vector<MatmulWeight>{unpacked, unpacked2}}) {
    std::vector<std::vector<float>> got, want;
    std::vector<float*> gp;
    for (const MatmulWeight& w : set) {
      got.emplace_back(static_cast<size_t>(n * w.rows), -1.0f);
      want.emplace_back(static_cast<size_t>(n * w.rows));
      matmul_weight(x.data(), w, want.back().data(), n);
    }
    for (auto& g : got) gp.push_back(g.data());
    matmul_weights(x.data(), set.data(), gp.data(), static_cast<int64_t>(set.size()), n);
    for (size_t i = 0; i < set.size(); ++i)
      EXPECT_TRUE(bit_equal(got[i].data(), want[i].data(), want[i].size())) << "weight " << i << (set[0].packed_q8 ? " (packed first)" : " (none packed)");
  }
  matmul_weights(x.data(), mixed, yp, 0, n);  // nothing to do, nothing read
}

TEST(MatmulQ8DeathTest, PacksOnlyBlockFormats) {
  const std::vector<float> fw(64, 1.0f);
  EXPECT_DEATH(pack_weight_q8(MatmulWeight{WeightFormat::kF32, fw.data(), 2, 32}), "only Q4_1 and Q8_0 weights are packed");
}

class VnniBackendOps : public BackendOps {
 protected:
  void check_packed_at_first_use(WeightFormat f);
};

TEST_F(VnniBackendOps, KernelPacksALoadedWeightAtFirstUse) {
  // Loaded under the fp32 kernel, then switched: the backend packs at the first matmul under vnni
  // and gives the scheme's bits; switched back, the fp32 kernel's bits again.
  for (const WeightFormat f : {WeightFormat::kQ4_1, WeightFormat::kQ8_0}) {
    SCOPED_TRACE(f == WeightFormat::kQ4_1 ? "Q4_1" : "Q8_0");
    check_packed_at_first_use(f);
    if (HasFatalFailure() || IsSkipped()) return;
  }
}

void VnniBackendOps::check_packed_at_first_use(WeightFormat f) {
  if (std::string(cpu_weight_storage()) != "blocks") GTEST_SKIP() << "SPECSERVE_CPU_WEIGHTS=f32 is set: no blocks for the vnni kernel";
  const int64_t rows = 37, cols = 64, n = 4;
  const auto blocks = random_q_blocks(f, rows, cols, 41);
  GgufTensorInfo t;
  t.name = "blk.0.ffn_up.weight";
  t.raw_type = static_cast<uint32_t>(f == WeightFormat::kQ4_1 ? GgmlType::Q4_1 : GgmlType::Q8_0);
  t.shape = {cols, rows};
  t.num_elements = rows * cols;
  t.data = blocks.data();
  t.num_bytes = blocks.size();
  Fp32MatmulScope fp32_scope;  // loaded under an fp32 kernel also where the run set vnni
  auto wt = be_->load_weight(t);
  ASSERT_TRUE(wt.ok()) << wt.status().to_string();
  const auto x = activations(n, cols, 42);
  const auto fp32 = matmul(**wt, x, n);
  {
    IsaScope scope(MatmulIsa::kVnni);
    SKIP_WITHOUT_VNNI(scope);
    const auto q8 = matmul(**wt, x, n);
    const auto want = scheme_reference(x, n, blocks, f, rows, cols);
    EXPECT_TRUE(bit_equal(q8.data(), want.data(), q8.size()));
    EXPECT_FALSE(bit_equal(q8.data(), fp32.data(), q8.size())) << "the vnni kernel gave the fp32 kernel's bits: was it used?";
  }
  const bool fp32_kernel = matmul_isa() != MatmulIsa::kVnni;
  ASSERT_TRUE(fp32_kernel);
  const auto again = matmul(**wt, x, n);
  if (matmul_isa() != MatmulIsa::kAmx) EXPECT_TRUE(bit_equal(again.data(), fp32.data(), again.size()));
}

TEST_F(VnniBackendOps, MatmulMultiGivesEachOutputWhatMatmulGivesIt) {
  // Backend::matmul_multi (the transformer's Q/K/V and gate/up) against matmul() per output, bias
  // included, under the fp32 kernel and under vnni (one fused job there).
  const int64_t cols = 64, n = 5;
  std::vector<std::vector<uint8_t>> blocks;
  std::vector<std::unique_ptr<Weight>> ws;
  for (const int64_t rows : {40, 24, 24}) {
    blocks.push_back(random_q_blocks(WeightFormat::kQ4_1, rows, cols, static_cast<uint32_t>(70 + rows + ws.size())));
    GgufTensorInfo t;
    t.name = "blk.0.attn_q.weight";
    t.raw_type = static_cast<uint32_t>(GgmlType::Q4_1);
    t.shape = {cols, rows};
    t.num_elements = rows * cols;
    t.data = blocks.back().data();
    t.num_bytes = blocks.back().size();
    auto w = be_->load_weight(t);
    ASSERT_TRUE(w.ok()) << w.status().to_string();
    ws.push_back(std::move(*w));
  }
  const auto bias = weight(random_vec(24, 74), 0, 24);
  const auto x = activations(n, cols, 75);
  auto check = [&] {
    auto xb = buf(x);
    std::vector<std::unique_ptr<Buffer>> yb;
    std::vector<Backend::MatmulOutput> outs;
    for (size_t i = 0; i < ws.size(); ++i) {
      yb.push_back(buf_f32(static_cast<size_t>(n * ws[i]->rows())));
      outs.push_back({ws[i].get(), yb.back()->f32(), i == 1 ? bias.get() : nullptr});
    }
    be_->matmul_multi(outs.data(), static_cast<int64_t>(outs.size()), xb->f32(), n);
    for (size_t i = 0; i < ws.size(); ++i) {
      const auto want = matmul(*ws[i], x, n, i == 1 ? bias.get() : nullptr);
      const auto got = get(*yb[i], static_cast<size_t>(n * ws[i]->rows()));
      EXPECT_TRUE(bit_equal(got.data(), want.data(), want.size())) << "output " << i << " under " << matmul_isa_name(matmul_isa());
    }
  };
  check();
  IsaScope scope(MatmulIsa::kVnni);
  SKIP_WITHOUT_VNNI(scope);
  check();
}

}  // namespace
}  // namespace specserve
