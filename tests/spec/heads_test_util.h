// Helpers for the Medusa / EAGLE proposer tests: head GGUF files with seeded random weights
// (contract section D), written with model/gguf_writer.h, and a plain host reference of both
// heads written from the contract's formulas (not from the proposers' code), used as the oracle.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cpu/matmul.h"
#include "model/dequant.h"
#include "model/gguf.h"
#include "model/gguf_writer.h"
#include "model/model_fingerprint.h"
#include "model/transformer.h"
#include "spec/head_common.h"
#include "tests/cpu/fp32_kernel_scope.h"

namespace specserve::heads_testing {

/// fp32 -> IEEE half, round to nearest even (for F16 head weights).
inline uint16_t to_half(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000u;
  int32_t exp = static_cast<int32_t>((x >> 23) & 0xff) - 127 + 15;
  uint32_t mant = x & 0x7fffffu;
  if (exp >= 31) return static_cast<uint16_t>(sign | 0x7c00u);
  if (exp <= 0) {
    if (exp < -10) return static_cast<uint16_t>(sign);
    mant |= 0x800000u;
    const int shift = 14 - exp;
    uint32_t h = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (h & 1))) ++h;
    return static_cast<uint16_t>(sign | h);
  }
  uint32_t h = (static_cast<uint32_t>(exp) << 10) | (mant >> 13);
  const uint32_t rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1))) ++h;
  return static_cast<uint16_t>(sign | h);
}

inline std::vector<float> gaussian(size_t n, float stddev, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.0f, stddev);
  std::vector<float> v(n);
  for (float& x : v) x = nd(rng);
  return v;
}

/// Adds an F32, F16 or Q8_0 matrix tensor (GGUF shape `shape`; Q8_0 needs shape[0] % 32 == 0);
/// values are returned as stored (F16 rounded, Q8_0 dequantised). Q8_0 is quantised here as
/// ggml's quantize_row_q8_0 does (d = amax / 127 as fp16, q = round(x / d)), the scheme of
/// tools/train/quantize_head.py.
inline std::vector<float> add_matrix(GgufWriter& w, const std::string& name, std::vector<int64_t> shape, float stddev,
                                     uint64_t seed, GgmlType type) {
  size_t n = 1;
  for (int64_t s : shape) n *= static_cast<size_t>(s);
  std::vector<float> v = gaussian(n, stddev, seed);
  if (type == GgmlType::F16) {
    std::vector<uint16_t> h(n);
    for (size_t i = 0; i < n; ++i) h[i] = to_half(v[i]);
    EXPECT_TRUE(w.add_tensor(name, shape, GgmlType::F16, h.data(), n * 2).ok());
    for (size_t i = 0; i < n; ++i) {
      float back = 0;
      EXPECT_TRUE(dequantize(GgmlType::F16, reinterpret_cast<const uint8_t*>(&h[i]), 1, &back).ok());
      v[i] = back;
    }
  } else if (type == GgmlType::Q8_0) {
    EXPECT_EQ(shape[0] % 32, 0) << name;
    std::vector<uint8_t> q(n / 32 * 34);
    for (size_t b = 0; b < n / 32; ++b) {
      float amax = 0;
      for (size_t j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(v[b * 32 + j]));
      const float d = amax / 127.0f, id = d > 0 ? 1.0f / d : 0.0f;
      const uint16_t dh = to_half(d);
      std::memcpy(q.data() + b * 34, &dh, 2);
      for (size_t j = 0; j < 32; ++j) q[b * 34 + 2 + j] = static_cast<uint8_t>(static_cast<int8_t>(std::lround(v[b * 32 + j] * id)));
    }
    EXPECT_TRUE(w.add_tensor(name, shape, GgmlType::Q8_0, q.data(), q.size()).ok());
    EXPECT_TRUE(dequantize(GgmlType::Q8_0, q.data(), static_cast<int64_t>(n), v.data()).ok());
  } else {
    EXPECT_TRUE(w.add_tensor_f32(name, shape, v).ok());
  }
  return v;
}

// Matmuls of block weights in fp32 even where the process chose the vnni kernel
// (SPECSERVE_CPU_MATMUL=vnni would give a Q8_0 head int8 x: not the fp32 contract formulas the
// head tests check; the vnni kernel with the real Q8_0 heads is heads_engine_amx_test's).
using specserve::testing::Fp32MatmulScope;

/// A Medusa head file's content.
struct MedusaFileSpec {
  int64_t d = 64, vocab = 512, num_heads = 3;
  std::string fingerprint;  ///< hex; required
  uint64_t seed = 7;
  float weight_std = 0.3f, bias_std = 0.1f;
  GgmlType type = GgmlType::F32;  ///< of the matrices: F32, F16 or Q8_0
  /// Changes the writer before it is written (corrupt files for the loader tests).
  std::function<void(GgufWriter&)> mutate;
};

/// Weights as written: w[i] is [d, d] row-major (row = output feature), b[i] is [d].
struct MedusaWeights {
  std::vector<std::vector<float>> w, b;
};

inline MedusaWeights write_medusa(const std::string& path, const MedusaFileSpec& s) {
  GgufWriter w;
  w.add_string("general.architecture", "medusa");
  w.add_string("general.name", "test-medusa");
  w.add_u32("medusa.num_heads", static_cast<uint32_t>(s.num_heads));
  w.add_u32("medusa.hidden_size", static_cast<uint32_t>(s.d));
  w.add_u32("medusa.vocab_size", static_cast<uint32_t>(s.vocab));
  w.add_string("medusa.target_fingerprint", s.fingerprint);
  MedusaWeights mw;
  for (int64_t i = 0; i < s.num_heads; ++i) {
    const std::string p = "medusa." + std::to_string(i) + ".";
    mw.w.push_back(add_matrix(w, p + "weight", {s.d, s.d}, s.weight_std / std::sqrt(static_cast<float>(s.d)) * 3, s.seed + 2 * i, s.type));
    mw.b.push_back(add_matrix(w, p + "bias", {s.d}, s.bias_std, s.seed + 2 * i + 1, GgmlType::F32));
  }
  if (s.mutate) s.mutate(w);
  Status st = w.write_file(path);
  EXPECT_TRUE(st.ok()) << st.to_string();
  return mw;
}

/// An EAGLE head file's content.
struct EagleFileSpec {
  int64_t d = 64, vocab = 512, heads = 4, kv_heads = 2, ffn = 96;
  float theta = 10000.0f, eps = 1e-5f;
  std::string fingerprint;
  uint64_t seed = 11;
  GgmlType type = GgmlType::F32;  ///< of the matrices: F32, F16 or Q8_0
  std::function<void(GgufWriter&)> mutate;
};

/// Weights as written, row-major [rows = out features, cols = in features].
struct EagleWeights {
  int64_t d = 0, heads = 0, kv_heads = 0, hd = 0, ffn = 0;
  float theta = 0, eps = 0;
  std::vector<float> fc_w, fc_b, wq, wk, wv, wo, ffn_norm, gate, up, down;
};

inline EagleWeights write_eagle(const std::string& path, const EagleFileSpec& s) {
  GgufWriter w;
  w.add_string("general.architecture", "eagle");
  w.add_u32("eagle.hidden_size", static_cast<uint32_t>(s.d));
  w.add_u32("eagle.head_count", static_cast<uint32_t>(s.heads));
  w.add_u32("eagle.head_count_kv", static_cast<uint32_t>(s.kv_heads));
  w.add_u32("eagle.feed_forward_length", static_cast<uint32_t>(s.ffn));
  w.add_f32("eagle.rope.freq_base", s.theta);
  w.add_f32("eagle.layer_norm_rms_epsilon", s.eps);
  w.add_u32("eagle.vocab_size", static_cast<uint32_t>(s.vocab));
  w.add_string("eagle.target_fingerprint", s.fingerprint);
  EagleWeights e;
  e.d = s.d;
  e.heads = s.heads;
  e.kv_heads = s.kv_heads;
  e.hd = s.d / s.heads;
  e.ffn = s.ffn;
  e.theta = s.theta;
  e.eps = s.eps;
  const int64_t d = s.d, qd = s.heads * e.hd, kvd = s.kv_heads * e.hd;
  auto sd = [](int64_t fan_in) { return 1.0f / std::sqrt(static_cast<float>(fan_in)); };
  uint64_t seed = s.seed;
  e.fc_w = add_matrix(w, "eagle.fc.weight", {2 * d, d}, sd(2 * d), seed++, s.type);
  e.fc_b = add_matrix(w, "eagle.fc.bias", {d}, 0.1f, seed++, GgmlType::F32);
  e.wq = add_matrix(w, "blk.0.attn_q.weight", {d, qd}, sd(d), seed++, s.type);
  e.wk = add_matrix(w, "blk.0.attn_k.weight", {d, kvd}, sd(d), seed++, s.type);
  e.wv = add_matrix(w, "blk.0.attn_v.weight", {d, kvd}, sd(d), seed++, s.type);
  e.wo = add_matrix(w, "blk.0.attn_output.weight", {qd, d}, 0.5f * sd(qd), seed++, s.type);
  e.ffn_norm = gaussian(static_cast<size_t>(d), 0.1f, seed++);
  for (float& x : e.ffn_norm) x += 1.0f;
  EXPECT_TRUE(w.add_tensor_f32("blk.0.ffn_norm.weight", {d}, e.ffn_norm).ok());
  e.gate = add_matrix(w, "blk.0.ffn_gate.weight", {d, s.ffn}, sd(d), seed++, s.type);
  e.up = add_matrix(w, "blk.0.ffn_up.weight", {d, s.ffn}, sd(d), seed++, s.type);
  e.down = add_matrix(w, "blk.0.ffn_down.weight", {s.ffn, d}, 0.5f * sd(s.ffn), seed++, s.type);
  if (s.mutate) s.mutate(w);
  Status st = w.write_file(path);
  EXPECT_TRUE(st.ok()) << st.to_string();
  return e;
}

// ---- host reference -------------------------------------------------------------------

/// y[rows] = W[rows, cols] x[cols] (+ b).
inline std::vector<float> matvec(const std::vector<float>& W, int64_t rows, int64_t cols, const float* x, const float* b = nullptr) {
  std::vector<float> y(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    double s = b ? b[r] : 0.0;
    for (int64_t c = 0; c < cols; ++c) s += static_cast<double>(W[static_cast<size_t>(r * cols + c)]) * x[c];
    y[static_cast<size_t>(r)] = static_cast<float>(s);
  }
  return y;
}

inline float silu(float x) { return x / (1.0f + std::exp(-x)); }

/// Medusa head i on h [d]: logits [vocab] = head(h + SiLU(W_i h + b_i)); `out_head` [vocab, d].
inline std::vector<float> medusa_reference(const MedusaWeights& mw, int i, const float* h, int64_t d,
                                           const std::vector<float>& out_head, int64_t vocab) {
  std::vector<float> t = matvec(mw.w[static_cast<size_t>(i)], d, d, h, mw.b[static_cast<size_t>(i)].data());
  for (int64_t j = 0; j < d; ++j) t[static_cast<size_t>(j)] = h[j] + silu(t[static_cast<size_t>(j)]);
  return matvec(out_head, vocab, d, t.data());
}

/// RoPE as the runtime applies it for llama GGUFs (neox = false): pairs (2i, 2i+1) of each head,
/// theta_i = pos * base^(-2i / hd).
inline void rope_ref(float* x, int64_t heads, int64_t hd, int32_t pos, float base) {
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t i = 0; i < hd / 2; ++i) {
      const double ang = pos * std::pow(static_cast<double>(base), -2.0 * static_cast<double>(i) / static_cast<double>(hd));
      const double c = std::cos(ang), s = std::sin(ang);
      float* p = x + h * hd + 2 * i;
      const double a = p[0], b = p[1];
      p[0] = static_cast<float>(a * c - b * s);
      p[1] = static_cast<float>(a * s + b * c);
    }
  }
}

/// The EAGLE head over one causal input sequence: row j has token tokens[j], input feature
/// feats[j] ([d]) and RoPE position positions[j]; returns the predicted features [n, d].
/// `embed` [vocab, d]. Straight from the contract's formulas.
inline std::vector<float> eagle_reference(const EagleWeights& e, const std::vector<float>& embed,
                                          const std::vector<int32_t>& tokens, const std::vector<std::vector<float>>& feats,
                                          const std::vector<int32_t>& positions) {
  const int64_t n = static_cast<int64_t>(tokens.size()), d = e.d, hd = e.hd, qd = e.heads * hd, kvd = e.kv_heads * hd;
  std::vector<std::vector<float>> xs, qs, ks, vs;
  for (int64_t j = 0; j < n; ++j) {
    std::vector<float> in(static_cast<size_t>(2 * d));
    std::copy(embed.begin() + tokens[static_cast<size_t>(j)] * d, embed.begin() + (tokens[static_cast<size_t>(j)] + 1) * d, in.begin());
    std::copy(feats[static_cast<size_t>(j)].begin(), feats[static_cast<size_t>(j)].end(), in.begin() + d);
    xs.push_back(matvec(e.fc_w, d, 2 * d, in.data(), e.fc_b.data()));
    qs.push_back(matvec(e.wq, qd, d, xs.back().data()));
    ks.push_back(matvec(e.wk, kvd, d, xs.back().data()));
    vs.push_back(matvec(e.wv, kvd, d, xs.back().data()));
    rope_ref(qs.back().data(), e.heads, hd, positions[static_cast<size_t>(j)], e.theta);
    rope_ref(ks.back().data(), e.kv_heads, hd, positions[static_cast<size_t>(j)], e.theta);
  }
  std::vector<float> out(static_cast<size_t>(n * d));
  const int64_t group = e.heads / e.kv_heads;
  for (int64_t j = 0; j < n; ++j) {
    std::vector<float> att(static_cast<size_t>(qd));
    for (int64_t h = 0; h < e.heads; ++h) {
      const int64_t kh = h / group;
      std::vector<double> sc(static_cast<size_t>(j + 1));
      double mx = -1e300;
      for (int64_t t = 0; t <= j; ++t) {
        double s = 0;
        for (int64_t c = 0; c < hd; ++c) s += static_cast<double>(qs[j][h * hd + c]) * ks[t][kh * hd + c];
        sc[static_cast<size_t>(t)] = s / std::sqrt(static_cast<double>(hd));
        mx = std::max(mx, sc[static_cast<size_t>(t)]);
      }
      double sum = 0;
      for (double& s : sc) sum += (s = std::exp(s - mx));
      for (int64_t c = 0; c < hd; ++c) {
        double a = 0;
        for (int64_t t = 0; t <= j; ++t) a += sc[static_cast<size_t>(t)] * vs[t][kh * hd + c];
        att[static_cast<size_t>(h * hd + c)] = static_cast<float>(a / sum);
      }
    }
    std::vector<float> x = xs[static_cast<size_t>(j)];
    std::vector<float> o = matvec(e.wo, d, qd, att.data());
    for (int64_t c = 0; c < d; ++c) x[c] += o[c];
    double ms = 0;
    for (float v : x) ms += static_cast<double>(v) * v;
    const double inv = 1.0 / std::sqrt(ms / d + e.eps);
    std::vector<float> nx(static_cast<size_t>(d));
    for (int64_t c = 0; c < d; ++c) nx[c] = static_cast<float>(x[c] * inv) * e.ffn_norm[c];
    std::vector<float> g = matvec(e.gate, e.ffn, d, nx.data()), u = matvec(e.up, e.ffn, d, nx.data());
    for (int64_t c = 0; c < e.ffn; ++c) g[c] = silu(g[c]) * u[c];
    std::vector<float> dn = matvec(e.down, d, e.ffn, g.data());
    for (int64_t c = 0; c < d; ++c) out[static_cast<size_t>(j * d + c)] = x[c] + dn[c];
  }
  return out;
}

/// A tensor of a GGUF file as fp32 (any stored type).
inline std::vector<float> tensor_f32(const GgufFile& f, const std::string& name) {
  const GgufTensorInfo* t = f.find_tensor(name);
  EXPECT_NE(t, nullptr) << name;
  if (!t) return {};
  auto v = dequantize_tensor(*t);
  EXPECT_TRUE(v.ok()) << v.status().to_string();
  return v.ok() ? *v : std::vector<float>{};
}

/// The index of the largest entry (lowest index on ties).
inline int32_t argmax(const float* x, int64_t n) {
  int32_t b = 0;
  for (int64_t i = 1; i < n; ++i) {
    if (x[i] > x[b]) b = static_cast<int32_t>(i);
  }
  return b;
}

}  // namespace specserve::heads_testing

namespace specserve::heads_testing {

/// A synthetic (or real) target: its GGUF kept open, the transformer, fingerprint and head.
struct Target {
  std::unique_ptr<GgufFile> file;
  std::unique_ptr<Transformer> model;
  uint64_t fingerprint = 0;
  std::string fingerprint_hex;
  std::vector<float> out_head;  ///< [vocab, d]
  std::vector<float> embed;     ///< [vocab, d]
};

inline Target open_target(const std::string& path, Backend& backend) {
  Target t;
  auto f = GgufFile::open(path);
  EXPECT_TRUE(f.ok()) << f.status().to_string();
  if (!f.ok()) return t;
  t.file = std::make_unique<GgufFile>(std::move(*f));
  auto m = Transformer::load(*t.file, backend);
  EXPECT_TRUE(m.ok()) << m.status().to_string();
  if (!m.ok()) return t;
  t.model = std::move(*m);
  t.fingerprint = model_fingerprint(*t.file);
  t.fingerprint_hex = fingerprint_hex(t.fingerprint);
  t.embed = tensor_f32(*t.file, "token_embd.weight");
  t.out_head = t.model->config().tied_output ? t.embed : tensor_f32(*t.file, "output.weight");
  return t;
}

}  // namespace specserve::heads_testing
