// Every CpuBackend op but matmul (tests/cpu/matmul_test.cpp) against a naive double-precision
// reference written here (llm.c's habit: a plain reference per kernel as the oracle), and the
// determinism contract of model/backend.h: a row's result is bit-identical whatever else shares
// the call.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "model/sampling.h"
#include "tests/cpu/cpu_test_util.h"

namespace specserve {
namespace {

using namespace specserve::testing;  // NOLINT: the shared CPU test helpers

// ---------------------------------------------------------------------------------------------
// rms_norm, swiglu, embedding, add, gather_rows

TEST_F(BackendOps, RmsNormMatchesDoubleReference) {
  const int64_t n = 7, d = 576;
  const float eps = 1e-5f;
  auto xh = random_vec(n * d, 51, -3.0f, 3.0f);
  for (int64_t j = 0; j < d; ++j) xh[5 * d + j] = 0.0f;            // all zero: eps keeps it finite
  for (int64_t j = 0; j < d; ++j) xh[6 * d + j] *= 1e-3f;          // eps dominates
  const auto gh = random_vec(d, 52, 0.5f, 2.0f);
  auto g = weight(gh, 0, d);
  auto xb = buf(xh);
  auto ob = buf_f32(n * d);
  be_->rms_norm(xb->f32(), *g, eps, n, d, ob->f32());
  const auto out = get(*ob, n * d);
  for (int64_t i = 0; i < n; ++i) {
    double ss = 0;
    for (int64_t j = 0; j < d; ++j) ss += static_cast<double>(xh[i * d + j]) * xh[i * d + j];
    const double scale = 1.0 / std::sqrt(ss / d + eps);
    for (int64_t j = 0; j < d; ++j) {
      const double ref = xh[i * d + j] * scale * gh[j];
      ASSERT_NEAR(out[i * d + j], ref, 4 * FLT_EPSILON * std::fabs(ref) + 1e-30) << "row " << i << " col " << j;
    }
  }
}

TEST_F(BackendOps, SwigluMatchesDoubleReferenceAndWorksInPlace) {
  const int64_t n = 4096;
  auto g = random_vec(n, 61, -8.0f, 8.0f);
  const auto u = random_vec(n, 62, -2.0f, 2.0f);
  g[0] = -100.0f;  // exp overflows to inf: silu -> -0
  g[1] = 100.0f;
  g[2] = 0.0f;
  auto gb = buf(g), ub = buf(u);
  auto ob = buf_f32(n);
  be_->swiglu(gb->f32(), ub->f32(), n, ob->f32());
  const auto out = get(*ob, n);
  for (int64_t i = 0; i < n; ++i) {
    const double ref = g[i] / (1.0 + std::exp(-static_cast<double>(g[i]))) * u[i];
    ASSERT_TRUE(std::isfinite(out[i])) << i;
    ASSERT_NEAR(out[i], ref, 8 * FLT_EPSILON * std::fabs(ref) + 1e-37) << "i=" << i << " gate=" << g[i];
  }
  // In place (out == gate), as the transformer calls it.
  be_->swiglu(gb->f32(), ub->f32(), n, gb->f32());
  const auto inplace = get(*gb, n);
  EXPECT_TRUE(bit_equal(inplace.data(), out.data(), n));
}

TEST_F(BackendOps, EmbeddingCopiesRowsExactly) {
  const int64_t vocab = 50, d = 24;
  const auto table = random_vec(vocab * d, 71);
  auto w = weight(table, vocab, d);
  const std::vector<int32_t> ids = {0, 49, 7, 7, 23};
  auto ib = buf(ids);
  auto ob = buf_f32(ids.size() * d);
  be_->embedding(*w, ib->i32(), static_cast<int64_t>(ids.size()), ob->f32());
  const auto out = get(*ob, ids.size() * d);
  for (size_t i = 0; i < ids.size(); ++i) EXPECT_TRUE(bit_equal(&out[i * d], &table[ids[i] * d], d)) << i;
}

TEST_F(BackendOps, AddAndGatherRows) {
  const int64_t rows = 6, cols = 16;
  const auto a = random_vec(rows * cols, 81), b = random_vec(rows * cols, 82);
  auto ab = buf(a), bb = buf(b);
  be_->add(ab->f32(), bb->f32(), rows * cols);
  const auto sum = get(*ab, rows * cols);
  for (int64_t i = 0; i < rows * cols; ++i) ASSERT_EQ(sum[i], a[i] + b[i]);
  const std::vector<int32_t> idx = {5, 0, 5, 2};
  auto ob = buf_f32(idx.size() * cols);
  be_->gather_rows(ab->f32(), idx.data(), static_cast<int64_t>(idx.size()), cols, ob->f32());
  const auto g = get(*ob, idx.size() * cols);
  for (size_t i = 0; i < idx.size(); ++i) EXPECT_TRUE(bit_equal(&g[i * cols], &sum[idx[i] * cols], cols));
}

TEST_F(BackendOps, ArgmaxRowsIsRowPickOfEveryRow) {
  const int64_t cols = 3001;  // two full exp_sum chunks and a partial one, whose last lane group is short
  std::vector<float> x = random_vec(6 * cols, 91, -20.0f, 20.0f);
  x[1 * cols + 17] = std::numeric_limits<float>::quiet_NaN();     // row 1: NaN
  x[2 * cols + 2999] = std::numeric_limits<float>::infinity();    // row 2: +inf
  for (int64_t j = 0; j < cols; ++j) x[3 * cols + j] = -std::numeric_limits<float>::infinity();  // row 3: nothing finite
  x[4 * cols + 5] = x[4 * cols + 2900] = 30.0f;                    // row 4: a tie at the max
  auto xb = buf(x);
  auto tb = be_->alloc(6 * 4), lb = be_->alloc(6 * 4);
  be_->argmax_rows(xb->f32(), 6, cols, tb->i32(), lb->f32());
  std::vector<int32_t> tok(6);
  std::vector<float> lp(6);
  be_->download(tok.data(), *tb, 6 * 4);
  be_->download(lp.data(), *lb, 6 * 4);
  for (int64_t r = 0; r < 6; ++r) {
    const RowPick want = greedy_pick(&x[r * cols], static_cast<int32_t>(cols));  // the definition: model/sampling.h
    EXPECT_EQ(tok[r], want.token) << "row " << r;
    EXPECT_EQ(lp[r], want.logprob) << "row " << r;
  }
  EXPECT_EQ(tok[1], -1);
  EXPECT_EQ(tok[2], -1);
  EXPECT_EQ(tok[3], -1);
  EXPECT_EQ(tok[4], 5);
  // One row alone gives the same bits as in the batch (model/backend.h's determinism contract).
  be_->argmax_rows(xb->f32() + 5 * cols, 1, cols, tb->i32(), lb->f32());
  int32_t t5 = 0;
  float l5 = 0;
  be_->download(&t5, *tb, 4);
  be_->download(&l5, *lb, 4);
  EXPECT_EQ(t5, tok[5]);
  EXPECT_EQ(l5, lp[5]);
}

TEST_F(BackendOps, SampleRowsIsTemperaturePickOfEveryRow) {
  const int64_t rows = 8, cols = 2049;
  std::vector<float> x = random_vec(rows * cols, 93, -6.0f, 6.0f);
  x[3 * cols + 100] = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> temps = {0.0f, 0.5f, 1.0f, 1.0f, 2.0f, 1e-6f, 0.8f, 1.0f};
  const std::vector<double> us = {0.3, 0.0, 0.5, 0.5, 0.999999, 0.7, 0.25, std::nextafter(1.0, 0.0)};
  auto xb = buf(x), tb = buf(temps), ub = buf(us);
  auto kb = be_->alloc(rows * 4), lb = be_->alloc(rows * 4);
  be_->sample_rows(xb->f32(), rows, cols, tb->f32(), static_cast<const double*>(ub->data()), kb->i32(), lb->f32());
  std::vector<int32_t> tok(rows);
  std::vector<float> lp(rows);
  be_->download(tok.data(), *kb, rows * 4);
  be_->download(lp.data(), *lb, rows * 4);
  int drawn = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const RowPick want = temperature_pick(&x[r * cols], static_cast<int32_t>(cols), temps[r], us[r]);
    EXPECT_EQ(tok[r], want.token) << "row " << r;
    EXPECT_EQ(lp[r], want.logprob) << "row " << r;
    drawn += tok[r] >= 0 && tok[r] != greedy_pick(&x[r * cols], static_cast<int32_t>(cols)).token;
  }
  EXPECT_EQ(tok[3], -1);
  EXPECT_EQ(tok[0], greedy_pick(&x[0], static_cast<int32_t>(cols)).token);  // temperature 0: the argmax
  EXPECT_GE(drawn, 4) << "sampled rows should mostly not be the argmax";
}

// ---------------------------------------------------------------------------------------------
// rope

// RoPE (Su et al. 2021) in double from its definition: pair k of rope_dim/2 rotates by
// pos * base^(-2k / rope_dim), scaled by freq_scale (linear) or YaRN-mixed (Peng et al. 2023, as
// llama.cpp's rope_yarn); dims past rope_dim are untouched.
void rope_reference(std::vector<double>& x, const std::vector<int32_t>& pos, int64_t heads, const RopeParams& p) {
  const int64_t hd = p.head_dim, nr = p.rope_dim;
  double corr_lo = 0, corr_hi = 0;
  auto corr_dim = [&](double n_rot) {
    return nr * std::log(p.original_context / (n_rot * 2 * M_PI)) / (2 * std::log(static_cast<double>(p.theta)));
  };
  if (p.ext_factor != 0.0f) {
    corr_lo = std::max(0.0, std::floor(corr_dim(p.beta_fast)));
    corr_hi = std::min(static_cast<double>(nr - 1), std::ceil(corr_dim(p.beta_slow)));
  }
  for (size_t i = 0; i < pos.size(); ++i) {
    for (int64_t h = 0; h < heads; ++h) {
      double* v = &x[(i * heads + h) * hd];
      for (int64_t k = 0; k < nr / 2; ++k) {
        const double extrap = pos[i] * std::pow(static_cast<double>(p.theta), -2.0 * k / nr);
        double theta = p.freq_scale * extrap;
        double mscale = p.attn_factor;
        if (p.ext_factor != 0.0f) {
          const double y = (k - corr_lo) / std::max(0.001, corr_hi - corr_lo);
          const double ramp = (1 - std::min(1.0, std::max(0.0, y))) * p.ext_factor;
          theta = theta * (1 - ramp) + extrap * ramp;
          mscale *= 1.0 + 0.1 * std::log(1.0 / p.freq_scale);
        }
        const int64_t a = p.neox ? k : 2 * k, b = p.neox ? k + nr / 2 : 2 * k + 1;
        const double x0 = v[a], x1 = v[b], c = std::cos(theta) * mscale, s = std::sin(theta) * mscale;
        v[a] = x0 * c - x1 * s;
        v[b] = x0 * s + x1 * c;
      }
    }
  }
}

struct RopeCase {
  const char* name;
  bool neox;
  int64_t rope_dim;
  float freq_scale;
  float ext_factor;
};

TEST_F(BackendOps, RopeMatchesDoubleReference) {
  const int64_t heads = 3, hd = 64;
  const std::vector<int32_t> positions = {0, 1, 2, 17, 100, 1000, 4095, 8191};
  const RopeCase cases[] = {
      {"norm", false, 64, 1.0f, 0.0f},          {"neox", true, 64, 1.0f, 0.0f},
      {"norm_linear4", false, 64, 0.25f, 0.0f}, {"neox_linear2", true, 64, 0.5f, 0.0f},
      {"norm_partial", false, 32, 1.0f, 0.0f},  {"neox_partial", true, 32, 1.0f, 0.0f},
      {"neox_yarn4", true, 64, 0.25f, 1.0f},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    RopeParams p;
    p.head_dim = hd;
    p.rope_dim = c.rope_dim;
    p.theta = 10000.0f;
    p.neox = c.neox;
    p.freq_scale = c.freq_scale;
    p.ext_factor = c.ext_factor;
    p.original_context = 2048;
    const int64_t n = static_cast<int64_t>(positions.size());
    const auto xh = random_vec(n * heads * hd, 91);
    auto xb = buf(xh);
    auto pb = buf(positions);
    be_->rope(xb->f32(), pb->i32(), n, heads, p);
    const auto out = get(*xb, xh.size());
    std::vector<double> ref(xh.begin(), xh.end());
    rope_reference(ref, positions, heads, p);
    for (int64_t i = 0; i < n; ++i) {
      // The kernel forms each angle in fp32 as llama.cpp does (pos * theta_scale^k by repeated
      // multiplication, then fp32 cos/sin), so the error grows with the position: measured
      // worst |err| / (1 + pos) = 6e-8 over these cases (1.9e-4 at pos 8191); the bound is 3x
      // that. Without YaRN's magnitude scale, position 0 is the identity, exactly.
      const double tol = positions[i] == 0 && c.ext_factor == 0 ? 0.0 : 2e-7 * (1.0 + positions[i]);
      double worst = 0;
      for (int64_t j = 0; j < heads * hd; ++j) {
        const size_t e = static_cast<size_t>(i * heads * hd + j);
        worst = std::max(worst, std::fabs(out[e] - ref[e]));
        if (j % hd >= c.rope_dim) ASSERT_EQ(out[e], xh[e]) << "unrotated dim " << j % hd << " changed";
      }
      EXPECT_LE(worst, tol) << "position " << positions[i];
    }
  }
}

TEST_F(BackendOps, RopeRowDoesNotDependOnItsBatch) {
  RopeParams p;
  p.head_dim = 64;
  p.rope_dim = 64;
  const int64_t heads = 9;
  const std::vector<int32_t> positions = {3, 900, 5, 5, 77, 2047, 0, 12};
  const int64_t n = static_cast<int64_t>(positions.size());
  const auto xh = random_vec(n * heads * 64, 95);
  auto xb = buf(xh);
  auto pb = buf(positions);
  be_->rope(xb->f32(), pb->i32(), n, heads, p);
  const auto all = get(*xb, xh.size());
  for (int64_t i = 0; i < n; ++i) {
    std::vector<float> xi(xh.begin() + i * heads * 64, xh.begin() + (i + 1) * heads * 64);
    auto xib = buf(xi);
    auto pib = buf(std::vector<int32_t>{positions[i]});
    be_->rope(xib->f32(), pib->i32(), 1, heads, p);
    EXPECT_TRUE(bit_equal(get(*xib, xi.size()).data(), &all[i * heads * 64], xi.size())) << i;
  }
}

// ---------------------------------------------------------------------------------------------
// attention and kv

// Host copy of what one sequence put into the cache: K and V per logical position.
struct SeqKv {
  int32_t num_cached = 0;
  std::vector<int32_t> block_table;
  std::vector<int32_t> parents;  // empty: chain
  int32_t num_rows = 0;
  std::vector<float> k, v;       // [num_cached + num_rows, kv_dim]
};

class AttentionOps : public BackendOps {
 protected:
  static constexpr int64_t kLayers = 2, kBlocks = 16, kBs = 4, kHeads = 6, kKvHeads = 2, kHd = 16;
  static constexpr int64_t kKvDim = kKvHeads * kHd, kQDim = kHeads * kHd;

  void SetUp() override {
    BackendOps::SetUp();
    auto kv = be_->create_kv_storage(kLayers, kBlocks, kBs, kKvDim);
    ASSERT_TRUE(kv.ok()) << kv.status().to_string();
    kv_ = std::move(*kv);
    // A chain continuing a 5-token prefix, a 7-node tree (3 root-to-leaf paths sharing
    // prefixes, plus a second root) after a 6-token prefix, and a single decode token after
    // 10; block tables are scattered over the cache.
    seqs_.push_back({5, {9, 2}, {}, 3, {}, {}});
    seqs_.push_back({6, {3, 11, 0, 7}, {-1, 0, 0, 1, 2, -1, 5}, 7, {}, {}});
    seqs_.push_back({10, {5, 6, 12}, {}, 1, {}, {}});
    uint32_t seed = 100;
    for (auto& s : seqs_) {
      const int64_t total = s.num_cached + s.num_rows;
      s.k = random_vec(total * kKvDim, seed++);
      s.v = random_vec(total * kKvDim, seed++);
      // Layer 1 holds these values, layer 0 different ones (the op must read only its layer).
      for (int64_t layer = 0; layer < kLayers; ++layer) {
        const auto k = layer == 1 ? s.k : random_vec(total * kKvDim, seed + 1000);
        const auto v = layer == 1 ? s.v : random_vec(total * kKvDim, seed + 2000);
        std::vector<int32_t> slots;
        for (int64_t p = 0; p < total; ++p) slots.push_back(static_cast<int32_t>(s.block_table[p / kBs] * kBs + p % kBs));
        auto kb = buf(k), vb = buf(v), sb = buf(slots);
        be_->kv_write(*kv_, layer, kb->f32(), vb->f32(), sb->i32(), total);
      }
    }
  }

  // Attention over `which` sequences in one call; q rows laid out in that order.
  std::vector<float> run(const std::vector<size_t>& which, const std::vector<std::vector<float>>& q_per_seq) {
    std::vector<AttentionSeq> att;
    std::vector<float> q;
    int32_t row = 0;
    for (size_t w : which) {
      const SeqKv& s = seqs_[w];
      AttentionSeq a;
      a.row_begin = row;
      a.num_rows = s.num_rows;
      a.num_cached = s.num_cached;
      a.block_table = s.block_table.data();
      a.num_blocks = static_cast<int32_t>(s.block_table.size());
      a.parents = s.parents.empty() ? nullptr : s.parents.data();
      att.push_back(a);
      q.insert(q.end(), q_per_seq[w].begin(), q_per_seq[w].end());
      row += s.num_rows;
    }
    auto qb = buf(q);
    auto ob = buf_f32(static_cast<size_t>(row * kQDim));
    be_->attention(*kv_, 1, qb->f32(), att, kHeads, kKvHeads, kHd, ob->f32());
    return get(*ob, static_cast<size_t>(row * kQDim));
  }

  // Naive attention of one sequence's rows, in double.
  std::vector<double> reference(const SeqKv& s, const std::vector<float>& q) const {
    std::vector<double> out(static_cast<size_t>(s.num_rows * kQDim));
    for (int32_t j = 0; j < s.num_rows; ++j) {
      std::vector<int64_t> vis;
      for (int64_t p = 0; p < s.num_cached; ++p) vis.push_back(p);
      if (s.parents.empty()) {
        for (int32_t a = 0; a <= j; ++a) vis.push_back(s.num_cached + a);
      } else {
        for (int32_t a = j; a >= 0; a = s.parents[a]) vis.push_back(s.num_cached + a);
      }
      for (int64_t h = 0; h < kHeads; ++h) {
        const int64_t kvh = h / (kHeads / kKvHeads);
        std::vector<double> sc;
        double mx = -INFINITY;
        for (int64_t p : vis) {
          double d = 0;
          for (int64_t e = 0; e < kHd; ++e) d += static_cast<double>(q[(j * kHeads + h) * kHd + e]) * s.k[p * kKvDim + kvh * kHd + e];
          sc.push_back(d / std::sqrt(static_cast<double>(kHd)));
          mx = std::max(mx, sc.back());
        }
        double sum = 0;
        for (double& x : sc) sum += (x = std::exp(x - mx));
        for (int64_t e = 0; e < kHd; ++e) {
          double acc = 0;
          for (size_t t = 0; t < vis.size(); ++t) acc += sc[t] * s.v[vis[t] * kKvDim + kvh * kHd + e];
          out[(j * kHeads + h) * kHd + e] = acc / sum;
        }
      }
    }
    return out;
  }

  std::vector<std::vector<float>> make_queries() {
    std::vector<std::vector<float>> q;
    uint32_t seed = 300;
    // Scaled so the softmax is far from uniform (a wrong mask then shows).
    for (const auto& s : seqs_) q.push_back(random_vec(s.num_rows * kQDim, seed++, -3.0f, 3.0f));
    return q;
  }

  std::unique_ptr<KvStorage> kv_;
  std::vector<SeqKv> seqs_;
};

TEST_F(AttentionOps, ChainTreeAndDecodeMatchNaiveAttention) {
  const auto q = make_queries();
  const auto out = run({0, 1, 2}, q);
  int64_t row = 0;
  for (size_t si = 0; si < seqs_.size(); ++si) {
    SCOPED_TRACE("sequence " + std::to_string(si));
    const auto ref = reference(seqs_[si], q[si]);
    for (size_t e = 0; e < ref.size(); ++e) {
      ASSERT_NEAR(out[row * kQDim + e], ref[e], 2e-6) << "row " << e / kQDim << " head " << (e % kQDim) / kHd;
    }
    row += seqs_[si].num_rows;
  }
}

TEST_F(AttentionOps, RowsAreBitIdenticalAloneOrWithOtherSequences) {
  const auto q = make_queries();
  const auto all = run({0, 1, 2}, q);
  const auto reordered = run({2, 0, 1}, q);
  int64_t row = 0;
  for (size_t si = 0; si < seqs_.size(); ++si) {
    const auto alone = run({si}, q);
    const size_t n = static_cast<size_t>(seqs_[si].num_rows * kQDim);
    EXPECT_TRUE(bit_equal(alone.data(), &all[row * kQDim], n)) << "sequence " << si << " alone vs batched";
    row += seqs_[si].num_rows;
  }
  // In the reordered call sequence 2 comes first, then 0, then 1.
  EXPECT_TRUE(bit_equal(&reordered[(1 + 3) * kQDim], &all[3 * kQDim], 7 * kQDim));
  EXPECT_TRUE(bit_equal(&reordered[1 * kQDim], &all[0], 3 * kQDim));
}

TEST_F(AttentionOps, TreeRowEqualsItsPathRunAsAChain) {
  // Each node of the tree must see exactly what the last token of its root-to-node path sees
  // when that path is fed as a plain chain: same keys, same order -> bit-identical output.
  const auto q = make_queries();
  const auto tree_out = run({1}, q);
  const SeqKv& tree = seqs_[1];
  for (int32_t node = 0; node < tree.num_rows; ++node) {
    std::vector<int32_t> path;
    for (int32_t a = node; a >= 0; a = tree.parents[a]) path.insert(path.begin(), a);
    SeqKv chain;
    chain.num_cached = tree.num_cached;
    chain.num_rows = static_cast<int32_t>(path.size());
    const int64_t total = chain.num_cached + chain.num_rows;
    chain.block_table = {13, 14, 15};  // free blocks, 12 slots >= total
    ASSERT_LE(total, 12);
    chain.k.assign(tree.k.begin(), tree.k.begin() + tree.num_cached * kKvDim);
    chain.v.assign(tree.v.begin(), tree.v.begin() + tree.num_cached * kKvDim);
    std::vector<float> qc;
    for (int32_t a : path) {
      const int64_t p = tree.num_cached + a;
      chain.k.insert(chain.k.end(), tree.k.begin() + p * kKvDim, tree.k.begin() + (p + 1) * kKvDim);
      chain.v.insert(chain.v.end(), tree.v.begin() + p * kKvDim, tree.v.begin() + (p + 1) * kKvDim);
      qc.insert(qc.end(), q[1].begin() + a * kQDim, q[1].begin() + (a + 1) * kQDim);
    }
    std::vector<int32_t> slots;
    for (int64_t p = 0; p < total; ++p) slots.push_back(static_cast<int32_t>(chain.block_table[p / kBs] * kBs + p % kBs));
    auto kb = buf(chain.k), vb = buf(chain.v), sb = buf(slots);
    be_->kv_write(*kv_, 1, kb->f32(), vb->f32(), sb->i32(), total);
    seqs_.push_back(chain);
    std::vector<std::vector<float>> qs(seqs_.size());
    qs.back() = qc;
    const auto chain_out = run({seqs_.size() - 1}, qs);
    seqs_.pop_back();
    EXPECT_TRUE(bit_equal(&chain_out[(chain.num_rows - 1) * kQDim], &tree_out[node * kQDim], kQDim)) << "node " << node;
  }
}

TEST_F(BackendOps, KvCopySlotsMovesKAndVInEveryLayer) {
  // block_size 1, so a one-block table addresses any single slot. A probe reads slot s through
  // attention: with only s visible the output is V[s] exactly; with an anchor slot before it
  // the output mixes by softmax(q.K), so it also changes when K[s] does.
  const int64_t layers = 3, slots_n = 12, kv_dim = 8;
  auto kvs = be_->create_kv_storage(layers, slots_n, 1, kv_dim);
  ASSERT_TRUE(kvs.ok());
  KvStorage& kv = **kvs;
  std::vector<int32_t> all(slots_n);
  std::iota(all.begin(), all.end(), 0);
  for (int64_t l = 0; l < layers; ++l) {
    auto kb = buf(random_vec(slots_n * kv_dim, 500 + static_cast<uint32_t>(l), -2.0f, 2.0f));
    auto vb = buf(random_vec(slots_n * kv_dim, 600 + static_cast<uint32_t>(l)));
    auto sb = buf(all);
    be_->kv_write(kv, l, kb->f32(), vb->f32(), sb->i32(), slots_n);
  }
  const auto q = random_vec(kv_dim, 700, -2.0f, 2.0f);
  auto qb = buf(q);
  auto probe = [&](int64_t layer, int32_t slot, bool with_anchor) {
    const int32_t table[2] = {0, slot};  // slot 0 is the anchor; never copied below
    AttentionSeq a;
    a.num_rows = 1;
    a.num_cached = with_anchor ? 1 : 0;
    a.block_table = with_anchor ? table : table + 1;
    a.num_blocks = with_anchor ? 2 : 1;
    auto ob = buf_f32(kv_dim);
    be_->attention(kv, layer, qb->f32(), {a}, 1, 1, kv_dim, ob->f32());
    return get(*ob, kv_dim);
  };
  std::vector<std::vector<std::vector<float>>> before(layers);
  for (int64_t l = 0; l < layers; ++l)
    for (int32_t s = 0; s < slots_n; ++s) {
      before[l].push_back(probe(l, s, false));
      auto mixed = probe(l, s, true);
      before[l].back().insert(before[l].back().end(), mixed.begin(), mixed.end());
    }
  // Compaction of an accepted tree path: sources ascend and may be later destinations
  // (7 -> 4 then 9 -> 7); 3 -> 3 is a no-op.
  const std::vector<int32_t> src = {3, 7, 8, 9}, dst = {3, 4, 5, 7};
  be_->kv_copy_slots(kv, src.data(), dst.data(), static_cast<int64_t>(src.size()));
  std::vector<int32_t> expect_from(all);
  for (size_t i = 0; i < src.size(); ++i) expect_from[dst[i]] = src[i];
  for (int64_t l = 0; l < layers; ++l)
    for (int32_t s = 0; s < slots_n; ++s) {
      auto now = probe(l, s, false);
      auto mixed = probe(l, s, true);
      now.insert(now.end(), mixed.begin(), mixed.end());
      EXPECT_TRUE(bit_equal(now.data(), before[l][expect_from[s]].data(), now.size()))
          << "layer " << l << " slot " << s << " should hold old slot " << expect_from[s];
    }
  // The probe can tell slots apart (otherwise the check above proves nothing).
  EXPECT_FALSE(bit_equal(before[0][4].data(), before[0][7].data(), before[0][4].size()));
}

TEST_F(BackendOps, KvExportImportBlocksFollowsThePackedLayout) {
  // The packed layout of model/backend.h, checked against the values written with kv_write:
  // per block, per layer in the range, K [block_size, kv_dim] then V.
  const int64_t layers = 3, blocks_n = 6, bs = 2, kv_dim = 4;
  auto kvs = be_->create_kv_storage(layers, blocks_n, bs, kv_dim);
  ASSERT_TRUE(kvs.ok());
  KvStorage& kv = **kvs;
  std::vector<int32_t> all(blocks_n * bs);
  std::iota(all.begin(), all.end(), 0);
  std::vector<std::vector<float>> k(layers), v(layers);  // [slots, kv_dim] per layer
  for (int64_t l = 0; l < layers; ++l) {
    k[l] = random_vec(all.size() * kv_dim, 800 + static_cast<uint32_t>(l));
    v[l] = random_vec(all.size() * kv_dim, 900 + static_cast<uint32_t>(l));
    auto kb = buf(k[l]), vb = buf(v[l]), sb = buf(all);
    be_->kv_write(kv, l, kb->f32(), vb->f32(), sb->i32(), static_cast<int64_t>(all.size()));
  }
  const std::vector<int32_t> ids = {4, 1};
  const int64_t lb = 1, le = 3;
  const int64_t per_block = kv_block_bytes(kv, lb, le);
  ASSERT_EQ(per_block, (le - lb) * 2 * bs * kv_dim * 4);
  std::vector<float> packed(static_cast<size_t>(2 * per_block / 4), -7.0f);
  be_->kv_export_blocks(kv, lb, le, ids.data(), 2, packed.data());
  std::vector<float> expect;
  for (int32_t b : ids)
    for (int64_t l = lb; l < le; ++l) {
      expect.insert(expect.end(), k[l].begin() + b * bs * kv_dim, k[l].begin() + (b + 1) * bs * kv_dim);
      expect.insert(expect.end(), v[l].begin() + b * bs * kv_dim, v[l].begin() + (b + 1) * bs * kv_dim);
    }
  ASSERT_EQ(expect.size(), packed.size());
  EXPECT_TRUE(bit_equal(expect.data(), packed.data(), packed.size()));

  // Import into other ids (0 and 5): those blocks now equal the exported ones in layers 1..2;
  // layer 0 (outside the range) and the untouched blocks keep their values.
  const std::vector<int32_t> dst = {0, 5};
  be_->kv_import_blocks(kv, lb, le, dst.data(), 2, packed.data());
  std::vector<float> again(packed.size());
  be_->kv_export_blocks(kv, lb, le, dst.data(), 2, again.data());
  EXPECT_TRUE(bit_equal(again.data(), packed.data(), packed.size()));
  std::vector<float> layer0(static_cast<size_t>(kv_block_bytes(kv, 0, 1) / 4));
  const int32_t zero = 0;
  be_->kv_export_blocks(kv, 0, 1, &zero, 1, layer0.data());
  EXPECT_TRUE(bit_equal(layer0.data(), k[0].data(), bs * kv_dim)) << "layer 0 of block 0 was overwritten";
  std::vector<float> untouched(static_cast<size_t>(per_block / 4));
  const int32_t two = 2;
  be_->kv_export_blocks(kv, lb, le, &two, 1, untouched.data());
  EXPECT_TRUE(bit_equal(untouched.data(), k[1].data() + 2 * bs * kv_dim, bs * kv_dim));
}

TEST_F(BackendOps, KvStorageRejectsImpossibleSizes) {
  auto bad = be_->create_kv_storage(0, 4, 16, 64);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kResourceExhausted);
  auto huge = be_->create_kv_storage(1000, 1 << 20, 1024, 4096);
  ASSERT_FALSE(huge.ok());
  EXPECT_EQ(huge.status().code(), StatusCode::kResourceExhausted);
}

TEST_F(BackendOps, LoadWeightRejectsBadTensors) {
  std::vector<float> data(8);
  GgufTensorInfo t;
  t.name = "blk.0.w3d";
  t.shape = {2, 2, 2};
  t.raw_type = static_cast<uint32_t>(GgmlType::F32);
  t.num_elements = 8;
  t.num_bytes = 32;
  t.data = reinterpret_cast<const uint8_t*>(data.data());
  auto w = be_->load_weight(t);
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), StatusCode::kCorruptData);
  EXPECT_NE(w.status().message().find("blk.0.w3d"), std::string::npos);
  t.shape = {8};
  t.raw_type = static_cast<uint32_t>(GgmlType::Q8_K);
  EXPECT_FALSE(be_->supports_weight_type(GgmlType::Q8_K));
  w = be_->load_weight(t);
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), StatusCode::kUnsupported);
}

}  // namespace
}  // namespace specserve
