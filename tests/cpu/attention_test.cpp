// cpu/attention.h: the tiled AVX-512 kernel against the row-wise one bit for bit, and both
// against a naive double-precision reference, over decode rows, verification chains, token
// trees and prefill tiles, several head layouts, widths and thread counts.
#include "cpu/attention.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "cpu/matmul.h"
#include "tests/cpu/cpu_test_util.h"

namespace specserve {
namespace {

using specserve::testing::IsaScope;
using specserve::testing::ThreadsScope;

struct Layout {
  int64_t num_heads, num_kv_heads, head_dim;
};

// One sequence of a call: its prefix length, rows, and parents (empty: a chain).
struct SeqSpec {
  int32_t num_cached, num_rows;
  std::vector<int32_t> parents;
};

// A random tree of n nodes: node i's parent is an earlier node or -1 (a root), as the drafters
// produce them (parents before children).
std::vector<int32_t> random_tree(int32_t n, std::mt19937& rng) {
  std::vector<int32_t> p(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) p[static_cast<size_t>(i)] = i == 0 ? -1 : static_cast<int32_t>(rng() % (i + 1)) - 1;
  return p;
}

// A cache with randomly scattered blocks, the sequences' block tables, and random queries.
class Problem {
 public:
  static constexpr int64_t kBlockSize = 16;

  Problem(const Layout& l, std::vector<SeqSpec> specs, uint32_t seed) : l_(l), specs_(std::move(specs)), rng_(seed) {
    int64_t blocks = 0;
    for (const auto& s : specs_) blocks += (s.num_cached + s.num_rows + kBlockSize - 1) / kBlockSize;
    blocks += 3;  // unused blocks between the tables
    std::vector<int32_t> ids(static_cast<size_t>(blocks));
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng_);
    stride_ = l.num_kv_heads * l.head_dim;
    // Keys scaled so the softmax is far from uniform (a wrong key set then shows).
    k_ = random(static_cast<size_t>(blocks * kBlockSize * stride_), -1.5f, 1.5f);
    v_ = random(static_cast<size_t>(blocks * kBlockSize * stride_), -1.0f, 1.0f);
    size_t next = 0;
    int32_t row = 0;
    tables_.resize(specs_.size());
    for (size_t i = 0; i < specs_.size(); ++i) {
      const auto& s = specs_[i];
      for (int64_t b = 0; b < (s.num_cached + s.num_rows + kBlockSize - 1) / kBlockSize; ++b) tables_[i].push_back(ids[next++]);
      AttentionSeq a;
      a.row_begin = row;
      a.num_rows = s.num_rows;
      a.num_cached = s.num_cached;
      a.block_table = tables_[i].data();
      a.num_blocks = static_cast<int32_t>(tables_[i].size());
      a.parents = s.parents.empty() ? nullptr : s.parents.data();
      seqs_.push_back(a);
      row += s.num_rows;
    }
    rows_ = row;
    q_ = random(static_cast<size_t>(rows_ * l.num_heads * l.head_dim), -1.5f, 1.5f);
  }

  AttentionCache cache() const { return {k_.data(), v_.data(), stride_, kBlockSize}; }

  std::vector<float> run(bool tiled) const {
    std::vector<float> out(q_.size(), NAN);
    if (tiled) {
      attention_f32(cache(), q_.data(), seqs_, l_.num_heads, l_.num_kv_heads, l_.head_dim, out.data());
    } else {
      attention_f32_rowwise(cache(), q_.data(), seqs_, l_.num_heads, l_.num_kv_heads, l_.head_dim, out.data());
    }
    return out;
  }

  size_t num_seqs() const { return seqs_.size(); }
  void scale_keys(float f) {
    for (float& x : k_) x *= f;
  }
  int32_t row_begin(size_t si) const { return seqs_[si].row_begin; }

  // attention_f32 over sequence si alone (its rows first in q and out).
  std::vector<float> run_alone(size_t si) const {
    AttentionSeq a = seqs_[si];
    const int64_t width = l_.num_heads * l_.head_dim;
    const std::vector<float> q(q_.begin() + a.row_begin * width, q_.begin() + (a.row_begin + a.num_rows) * width);
    a.row_begin = 0;
    std::vector<float> out(q.size(), NAN);
    attention_f32(cache(), q.data(), {a}, l_.num_heads, l_.num_kv_heads, l_.head_dim, out.data());
    return out;
  }

  // The row-wise order of cpu/attention.h's file comment, written out with one dot_f32 per key
  // and a scalar fma loop: what attention_f32_rowwise must give bit for bit.
  std::vector<float> documented_order() const {
    std::vector<float> out(q_.size());
    const int64_t hd = l_.head_dim, group = l_.num_heads / l_.num_kv_heads;
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    for (const AttentionSeq& a : seqs_) {
      for (int32_t j = 0; j < a.num_rows; ++j) {
        std::vector<int64_t> vis;
        for (int64_t p = 0; p < a.num_cached; ++p) vis.push_back(p);
        std::vector<int64_t> path;
        for (int32_t x = j; x >= 0; x = a.parents ? a.parents[x] : x - 1) path.insert(path.begin(), a.num_cached + x);
        vis.insert(vis.end(), path.begin(), path.end());
        for (int64_t h = 0; h < l_.num_heads; ++h) {
          const int64_t off = (h / group) * hd;
          const float* qh = &q_[static_cast<size_t>(((a.row_begin + j) * l_.num_heads + h) * hd)];
          std::vector<float> s;
          for (int64_t p : vis) s.push_back(dot_f32(qh, &k_[static_cast<size_t>(slot(a, p) * stride_ + off)], hd) * scale);
          const float z = softmax_numerator(s.data(), static_cast<int64_t>(s.size()));
          std::vector<float> acc(static_cast<size_t>(hd), 0.0f);
          for (size_t t = 0; t < vis.size(); ++t)
            for (int64_t e = 0; e < hd; ++e)
              acc[static_cast<size_t>(e)] = std::fma(s[t], v_[static_cast<size_t>(slot(a, vis[t]) * stride_ + off + e)], acc[static_cast<size_t>(e)]);
          const float inv = 1.0f / z;
          for (int64_t e = 0; e < hd; ++e) out[static_cast<size_t>(((a.row_begin + j) * l_.num_heads + h) * hd + e)] = acc[static_cast<size_t>(e)] * inv;
        }
      }
    }
    return out;
  }

  // Naive attention in double, row by row.
  std::vector<double> reference() const {
    std::vector<double> out(q_.size());
    const int64_t hd = l_.head_dim, group = l_.num_heads / l_.num_kv_heads;
    for (size_t si = 0; si < seqs_.size(); ++si) {
      const AttentionSeq& a = seqs_[si];
      for (int32_t j = 0; j < a.num_rows; ++j) {
        std::vector<int64_t> vis;  // logical positions
        for (int64_t p = 0; p < a.num_cached; ++p) vis.push_back(p);
        if (a.parents) {
          std::vector<int64_t> path;
          for (int32_t x = j; x >= 0; x = a.parents[x]) path.insert(path.begin(), a.num_cached + x);
          vis.insert(vis.end(), path.begin(), path.end());
        } else {
          for (int32_t x = 0; x <= j; ++x) vis.push_back(a.num_cached + x);
        }
        for (int64_t h = 0; h < l_.num_heads; ++h) {
          const int64_t off = (h / group) * hd;
          const float* qh = &q_[static_cast<size_t>(((a.row_begin + j) * l_.num_heads + h) * hd)];
          std::vector<double> sc;
          double mx = -INFINITY;
          for (int64_t p : vis) {
            const float* kr = &k_[static_cast<size_t>(slot(a, p) * stride_ + off)];
            double d = 0;
            for (int64_t e = 0; e < hd; ++e) d += static_cast<double>(qh[e]) * kr[e];
            sc.push_back(d / std::sqrt(static_cast<double>(hd)));
            mx = std::max(mx, sc.back());
          }
          double z = 0;
          for (double& x : sc) z += (x = std::exp(x - mx));
          for (int64_t e = 0; e < hd; ++e) {
            double acc = 0;
            for (size_t t = 0; t < vis.size(); ++t) acc += sc[t] * v_[static_cast<size_t>(slot(a, vis[t]) * stride_ + off + e)];
            out[static_cast<size_t>(((a.row_begin + j) * l_.num_heads + h) * hd + e)] = acc / z;
          }
        }
      }
    }
    return out;
  }

 private:
  std::vector<float> random(size_t n, float lo, float hi) {
    std::uniform_real_distribution<float> dist(lo, hi);
    std::vector<float> v(n);
    for (auto& x : v) x = dist(rng_);
    return v;
  }
  static int64_t slot(const AttentionSeq& a, int64_t p) { return static_cast<int64_t>(a.block_table[p / kBlockSize]) * kBlockSize + p % kBlockSize; }

  Layout l_;
  std::vector<SeqSpec> specs_;
  std::mt19937 rng_;
  int64_t stride_ = 0;
  std::vector<float> k_, v_, q_;
  std::vector<std::vector<int32_t>> tables_;
  std::vector<AttentionSeq> seqs_;
  int32_t rows_ = 0;
};

// Every shape of call the engine makes, in one batch: a decode row, a verification chain,
// token trees (with and without a prefix), a prefill, and a prefill continuing a prefix that
// spans several row tiles. Prefix lengths are not multiples of the 16-key block.
std::vector<SeqSpec> mixed_batch(std::mt19937& rng) {
  return {
      {37, 1, {}},
      {100, 5, {}},
      {50, 13, random_tree(13, rng)},
      {0, 9, random_tree(9, rng)},
      {0, 40, {}},
      {21, 35, {}},
      {200, 25, random_tree(25, rng)},
  };
}

const Layout kLayouts[] = {
    {9, 3, 64},   // SmolLM2-135M
    {4, 4, 16},   // no grouping
    {8, 2, 32},
    {8, 1, 128},  // one kv head: a single item per tile
};

// Head widths that are not a multiple of 8 (nor of 16): dot_f32's masked last step; no kernel
// may read the next head's keys or queries.
const Layout kOddWidths[] = {{4, 2, 12}, {3, 3, 20}, {2, 1, 4}, {6, 2, 40}};

std::string name(const Layout& l) {
  return std::to_string(l.num_heads) + "/" + std::to_string(l.num_kv_heads) + " heads x " + std::to_string(l.head_dim);
}

// The tiled kernel chosen for a scope (the default; also where the run set
// SPECSERVE_CPU_ATTENTION=rowwise for the whole suite), the process's choice restored after.
class TiledChoiceScope {
 public:
  TiledChoiceScope() { set_attention_kernel(AttentionKernel::kTiled); }
  ~TiledChoiceScope() { set_attention_kernel(saved_); }

 private:
  AttentionKernel saved_ = attention_kernel();
};

TEST(Attention, TiledKernelGivesTheRowWiseBitsForEveryShapeAndThreadCount) {
  TiledChoiceScope tiled_choice;
  IsaScope isa(MatmulIsa::kAvx512);
  if (!isa.ok()) GTEST_SKIP() << "this CPU has no avx512f: the tiled kernel never runs here";
  ThreadsScope threads_scope(1);
  std::mt19937 rng(7);
  for (const Layout& l : kLayouts) {
    ASSERT_TRUE(attention_tiled_applies(l.head_dim)) << name(l);
    const Problem p(l, mixed_batch(rng), static_cast<uint32_t>(rng()));
    threads_scope.set(1);
    const auto want = p.run(false);
    for (int threads : {1, 2, 3, 8}) {
      threads_scope.set(threads);
      const auto got = p.run(true);
      ASSERT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * sizeof(float))) << name(l) << ", " << threads << " threads";
    }
  }
}

// Calls with fewer tiles than two per thread take the phased path (scores split by key blocks,
// values by head_dim slices over the threads): a decode row, a verification chain, trees, a
// short prefill and two decode rows of two sequences, each against the row-wise bits for every
// layout and for 2, 3, 4 and 8 threads (1, 2, 4 or 8 slices of head_dim; key ranges shorter
// than one block and empty ones included).
TEST(Attention, PhasedPathForFewTilesGivesTheRowWiseBits) {
  TiledChoiceScope tiled_choice;
  IsaScope isa(MatmulIsa::kAvx512);
  if (!isa.ok()) GTEST_SKIP() << "this CPU has no avx512f: the tiled kernel never runs here";
  ThreadsScope threads_scope(1);
  std::mt19937 rng(23);
  const std::vector<std::vector<SeqSpec>> calls = {
      {{0, 1, {}}},      {{5, 1, {}}},     {{300, 1, {}}}, {{517, 1, {}}},
      {{100, 3, {}}},    {{63, 5, {}}},    {{200, 16, {}}},
      {{50, 7, random_tree(7, rng)}},      {{0, 9, random_tree(9, rng)}},
      {{0, 40, {}}},     {{33, 1, {}}, {90, 1, {}}},
  };
  for (const Layout& l : kLayouts) {
    for (size_t c = 0; c < calls.size(); ++c) {
      const Problem p(l, calls[c], static_cast<uint32_t>(rng()));
      const auto want = p.run(false);
      for (int threads : {2, 3, 4, 8}) {
        threads_scope.set(threads);
        const int64_t before = attention_phased_calls();
        const auto got = p.run(true);
        int64_t tiles = 0;  // (sequence, KV head, up to 16 rows)
        for (const SeqSpec& sp : calls[c]) tiles += l.num_kv_heads * ((sp.num_rows + 15) / 16);
        EXPECT_EQ(attention_phased_calls() - before, tiles < 2 * threads ? 1 : 0) << name(l) << ", call " << c << ", " << threads << " threads";
        ASSERT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * sizeof(float)))
            << name(l) << ", call " << c << ", " << threads << " threads";
      }
      threads_scope.set(1);
    }
  }
}

TEST(Attention, EachSequenceGetsTheSameBitsAloneAsInABatch) {
  // The tile split depends on how many sequences share the call; a row's bits may not. With 2
  // threads the batch takes the per-tile path and most sequences alone the phased one.
  std::mt19937 rng(11);
  const Layout l = kLayouts[0];
  const Problem p(l, mixed_batch(rng), 99);
  for (int threads : {1, 2}) {
    ThreadsScope threads_scope(threads);
    const int64_t before = attention_phased_calls();
    const auto all = p.run(true);
    EXPECT_EQ(attention_phased_calls(), before) << "the batch of " << p.num_seqs() << " sequences took the phased path";
    for (size_t si = 0; si < p.num_seqs(); ++si) {
      const auto alone = p.run_alone(si);
      const size_t begin = static_cast<size_t>(p.row_begin(si) * l.num_heads * l.head_dim);
      EXPECT_EQ(0, std::memcmp(alone.data(), all.data() + begin, alone.size() * sizeof(float)))
          << "sequence " << si << ", " << threads << " threads (" << matmul_isa_name(matmul_isa()) << ")";
    }
  }
}

TEST(Attention, RowwiseChoiceTurnsTheTiledKernelOffWithTheSameBits) {
  IsaScope isa(MatmulIsa::kAvx512);
  if (!isa.ok()) GTEST_SKIP() << "this CPU has no avx512f: the tiled kernel never runs here";
  std::mt19937 rng(5);
  const Problem p(kLayouts[0], mixed_batch(rng), 42);
  if (cpu_kernel_env("SPECSERVE_CPU_ATTENTION").empty()) {
    EXPECT_EQ(attention_kernel(), AttentionKernel::kTiled);  // the default
  }
  TiledChoiceScope restore;  // (restores the process's choice at the end)
  EXPECT_STREQ(attention_kernel_name(), "tiled");
  const auto tiled = p.run(true);
  set_attention_kernel(AttentionKernel::kRowwise);
  EXPECT_FALSE(attention_tiled_applies(64));
  EXPECT_STREQ(attention_kernel_name(), "rowwise");
  const auto rowwise = p.run(true);  // attention_f32, now taking the row-wise path
  EXPECT_EQ(0, std::memcmp(tiled.data(), rowwise.data(), tiled.size() * sizeof(float)));
  // The widths the tiled kernel does not cover, and AVX2, always take the row-wise path.
  EXPECT_FALSE(attention_tiled_applies(80));
  IsaScope avx2(MatmulIsa::kAvx2);
  EXPECT_FALSE(attention_tiled_applies(64));
}

TEST(Attention, SoftmaxHandlesExtremeScores) {
  // Scores far apart (exp underflows to 0 for all but the max) and a row of equal scores
  // (uniform weights), against double.
  const Layout l{1, 1, 16};
  Problem p(l, {{20, 1, {}}}, 8);
  p.scale_keys(1e4f);  // scores of thousands: all weight on one key
  const auto ref = p.reference();
  for (bool tiled : {false, true}) {
    const auto got = p.run(tiled);
    for (size_t i = 0; i < ref.size(); ++i) ASSERT_NEAR(got[i], ref[i], 1e-5) << i << (tiled ? " tiled" : " row-wise");
  }
  p.scale_keys(0.0f);  // every score 0: the mean of the values
  const auto ref0 = p.reference();
  for (bool tiled : {false, true}) {
    const auto got = p.run(tiled);
    for (size_t i = 0; i < ref0.size(); ++i) ASSERT_NEAR(got[i], ref0[i], 1e-6) << i << (tiled ? " tiled" : " row-wise");
  }
}

TEST(Attention, SoftmaxNumeratorEdgesAgainstDouble) {
  // Arguments s_t - max over [-87.3, 0] (every lane position, and tails of 1..7 after whole
  // groups of 8): relative error within 2e-7 of double exp, and Z the sum of what was written.
  for (int64_t n : {1, 7, 8, 9, 15, 16, 17, 1001}) {
    std::vector<float> s(static_cast<size_t>(n));
    for (int64_t t = 0; t < n; ++t) s[static_cast<size_t>(t)] = 3.0f - 90.3f * static_cast<float>(t) / static_cast<float>(n);
    const std::vector<float> in = s;
    const float z = softmax_numerator(s.data(), n);
    double sum = 0, zref = 0;
    for (int64_t t = 0; t < n; ++t) {
      const double x = static_cast<double>(in[static_cast<size_t>(t)]) - 3.0;
      const double want = std::exp(x);
      const float got = s[static_cast<size_t>(t)];
      if (x < -87.3365) {
        EXPECT_EQ(got, 0.0f) << "n " << n << " t " << t << ": e^" << x << " is below FLT_MIN";
      } else {
        EXPECT_NEAR(got, want, 2e-7 * want + 1e-45) << "n " << n << " t " << t << " x " << x;
      }
      sum += got;
      zref += want;
    }
    EXPECT_EQ(s[0], 1.0f) << "the maximum gives exactly 1";
    EXPECT_NEAR(z, sum, 1e-6 * sum) << n;
    EXPECT_NEAR(z, zref, 1e-6 * zref) << n;
  }
  // -inf (a masked key), the underflow boundary and huge gaps give exactly 0; the maximum 1.
  std::vector<float> s = {-INFINITY, 0.0f, -87.34f, -87.33f, -1e30f, -INFINITY, -std::numeric_limits<float>::max(), -0.0f, -1e-30f};
  const float z = softmax_numerator(s.data(), static_cast<int64_t>(s.size()));
  EXPECT_EQ(s[0], 0.0f);
  EXPECT_EQ(s[1], 1.0f);
  EXPECT_EQ(s[2], 0.0f);
  EXPECT_GT(s[3], 0.0f);
  EXPECT_EQ(s[4], 0.0f);
  EXPECT_EQ(s[5], 0.0f);
  EXPECT_EQ(s[6], 0.0f);
  EXPECT_EQ(s[7], 1.0f) << "-0 equals the maximum 0";
  EXPECT_EQ(s[8], 1.0f) << "e^-1e-30 rounds to 1";
  EXPECT_NEAR(z, 3.0f + s[3], 1e-6f);
  for (float v : s) EXPECT_FALSE(std::isnan(v));
  // One finite score among -inf ones: all the weight on it.
  std::vector<float> one(13, -INFINITY);
  one[11] = -5.0f;
  EXPECT_EQ(softmax_numerator(one.data(), 13), 1.0f);
  for (size_t t = 0; t < one.size(); ++t) EXPECT_EQ(one[t], t == 11 ? 1.0f : 0.0f) << t;
}

TEST(Attention, BothImplementationsMatchNaiveAttention) {
  std::mt19937 rng(3);
  for (MatmulIsa which : {MatmulIsa::kAvx2, MatmulIsa::kAvx512}) {
    IsaScope isa(which);
    if (!isa.ok()) {
      std::printf("[attention: %s not on this CPU; not compared]\n", matmul_isa_name(which));
      continue;
    }
    std::vector<Layout> layouts(std::begin(kLayouts), std::end(kLayouts));
    layouts.insert(layouts.end(), std::begin(kOddWidths), std::end(kOddWidths));
    for (const Layout& l : layouts) {
      const Problem p(l, mixed_batch(rng), static_cast<uint32_t>(rng()));
      const auto ref = p.reference();
      for (bool tiled : {false, true}) {
        const auto got = p.run(tiled);
        double worst = 0;
        for (size_t i = 0; i < ref.size(); ++i) worst = std::max(worst, std::abs(got[i] - ref[i]));
        EXPECT_LT(worst, 2e-6) << name(l) << (tiled && attention_tiled_applies(l.head_dim) ? ", tiled " : ", row-wise ")
                               << matmul_isa_name(which);
      }
    }
  }
}

// The row-wise kernel keeps its documented order bit for bit whatever splits its work: keys
// scored four at a time (dot_f32_many), values summed in registers, a decode row's heads spread
// over the threads. Batches of one and two rows split heads; the mixed batch does not.
TEST(Attention, RowwiseGivesTheDocumentedBitsForEveryShapeAndThreadCount) {
  std::mt19937 rng(11);
  const Layout layouts[] = {{9, 3, 64}, {4, 4, 16}, {8, 2, 32}, {8, 1, 128}, {6, 2, 48}, {4, 2, 12}, {3, 3, 20}};
  for (MatmulIsa which : {MatmulIsa::kAvx2, MatmulIsa::kAvx512}) {
    IsaScope isa(which);
    if (!isa.ok()) continue;
    for (const Layout& l : layouts) {
      const std::vector<std::vector<SeqSpec>> batches = {{{37, 1, {}}}, {{70, 1, {}}, {5, 1, {}}}, {{0, 3, random_tree(3, rng)}}, mixed_batch(rng)};
      for (const auto& batch : batches) {
        const Problem p(l, batch, static_cast<uint32_t>(rng()));
        const auto want = p.documented_order();
        for (int threads : {1, 2, 3, 8}) {
          ThreadsScope ts(threads);
          const auto got = p.run(/*tiled=*/false);
          ASSERT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * sizeof(float)))
              << name(l) << ", " << batch.size() << " sequence(s), " << threads << " threads, " << matmul_isa_name(which);
        }
      }
    }
  }
}

}  // namespace
}  // namespace specserve
