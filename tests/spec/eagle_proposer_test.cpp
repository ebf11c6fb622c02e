// EagleProposer (spec/eagle_proposer.h): loader validation, the head against a host reference of
// the contract's formulas (teacher forcing), and the drafted trees — EAGLE-2 dynamic, static,
// chain — against a reference that recomputes every candidate's path from scratch (so the
// proposer's own KV, catch-up, tree attention and batching are all checked by it).
#include "spec/eagle_proposer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>

#include "tests/spec/heads_test_util.h"
#include "tests/spec/spec_test_util.h"

namespace specserve {
namespace {

using namespace heads_testing;
using spec_testing::backend;
using spec_testing::temp_path;

constexpr int64_t kD = 64, kVocab = 512;

class EagleTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SyntheticModelSpec s;
    s.vocab_size = kVocab;
    s.hidden_size = kD;
    const std::string p = temp_path("eagle_target");
    ASSERT_TRUE(write_synthetic_llama(s, p).ok());
    target_ = open_target(p, backend());
    ASSERT_TRUE(target_.model);
  }
  EagleFileSpec spec() const {
    EagleFileSpec e;
    e.fingerprint = target_.fingerprint_hex;
    return e;
  }
  Status load(const EagleFileSpec& s, std::unique_ptr<EagleProposer>* out = nullptr, EagleOptions o = {},
              std::string* path_out = nullptr, EagleWeights* w = nullptr) {
    const std::string p = temp_path("eagle_head_" + std::to_string(counter_++));
    EagleWeights ew = write_eagle(p, s);
    if (w) *w = ew;
    if (path_out) *path_out = p;
    auto m = EagleProposer::load(p, *target_.model, *target_.file, std::move(o));
    if (!m.ok()) return m.status();
    if (out) *out = std::move(*m);
    return Status();
  }
  void expect_error(const EagleFileSpec& s, const std::vector<std::string>& parts, EagleOptions o = {}) {
    std::string path;
    Status st = load(s, nullptr, o, &path);
    ASSERT_FALSE(st.ok());
    for (const auto& part : parts) EXPECT_NE(st.message().find(part), std::string::npos) << "'" << part << "' in " << st.message();
  }

  // ---- the reference drafter ----
  struct RefCand {
    int32_t token, parent, level, node;
    float score;
    std::vector<float> feature;  // f^ once expanded
  };
  /// f^ of the last row of: the confirmed entries (positions start..n-1) + `path` (tokens after
  /// the last known one, each fed with the previous row's predicted feature).
  std::vector<float> ref_feature(const EagleWeights& w, const std::vector<int32_t>& tokens, const std::vector<float>& feats,
                                 int32_t start, const std::vector<int32_t>& path) {
    const int32_t n = static_cast<int32_t>(tokens.size());
    std::vector<int32_t> toks, pos;
    std::vector<std::vector<float>> in;
    for (int32_t p = start; p <= n - 1; ++p) {
      toks.push_back(tokens[static_cast<size_t>(p)]);
      pos.push_back(p);
      in.emplace_back(feats.begin() + (p - 1) * kD, feats.begin() + p * kD);
    }
    std::vector<float> f = eagle_reference(w, target_.embed, toks, in, pos);
    std::vector<float> last(f.end() - kD, f.end());
    for (size_t j = 0; j < path.size(); ++j) {
      toks.push_back(path[j]);
      pos.push_back(n + static_cast<int32_t>(j));
      in.push_back(last);
      f = eagle_reference(w, target_.embed, toks, in, pos);
      last.assign(f.end() - kD, f.end());
    }
    return last;
  }
  std::vector<float> ref_logits(const std::vector<float>& f) { return matvec(target_.out_head, kVocab, kD, f.data()); }

  /// The draft the proposer should give (same rules, reference math).
  DraftTree ref_draft(const EagleWeights& w, const EagleOptions& o, const std::vector<int32_t>& tokens,
                      const std::vector<float>& feats, int32_t start, int32_t k) {
    std::vector<RefCand> cands;
    StaticTree tree;
    int32_t max_level = std::min(o.depth, k);
    if (o.mode == EagleOptions::Mode::kChain) tree = chain_tree(k);
    if (o.mode == EagleOptions::Mode::kStatic) tree = trim_static_tree(*static_tree_from_paths(o.tree_paths, "t"), k, 64);
    if (o.mode != EagleOptions::Mode::kDynamic) max_level = tree.max_depth();
    auto path_of = [&](int32_t c) {
      std::vector<int32_t> p;
      for (; c >= 0; c = cands[static_cast<size_t>(c)].parent) p.push_back(cands[static_cast<size_t>(c)].token);
      std::reverse(p.begin(), p.end());
      return p;
    };
    auto children = [&](int32_t parent, const std::vector<float>& lg) {
      const float ps = parent < 0 ? 0.0f : cands[static_cast<size_t>(parent)].score;
      const int32_t lvl = parent < 0 ? 1 : cands[static_cast<size_t>(parent)].level + 1;
      std::vector<int32_t> top;
      // Path log-probability; draft_p_min drops a child below it (with everything under it).
      const float lse = static_cast<float>(log_sum_exp(lg.data(), kVocab));
      const float min_score = o.draft_p_min > 0 ? std::log(o.draft_p_min) : -INFINITY;
      auto score_of = [&](int32_t t) { return ps + std::min(0.0f, lg[static_cast<size_t>(t)] - lse); };
      if (o.mode == EagleOptions::Mode::kDynamic) {
        top_k(lg.data(), kVocab, o.topk, &top);
        for (int32_t t : top) {
          if (score_of(t) >= min_score) cands.push_back({t, parent, lvl, -1, score_of(t), {}});
        }
        return;
      }
      const int32_t pn = parent < 0 ? -1 : cands[static_cast<size_t>(parent)].node;
      top_k(lg.data(), kVocab, 64, &top);
      for (int32_t v = 0; v < tree.num_nodes(); ++v) {
        const int32_t t = top[static_cast<size_t>(tree.ranks[static_cast<size_t>(v)])];
        if (tree.parents[static_cast<size_t>(v)] == pn && score_of(t) >= min_score) cands.push_back({t, parent, lvl, v, score_of(t), {}});
      }
    };
    children(-1, ref_logits(ref_feature(w, tokens, feats, start, {})));
    for (int32_t level = 1; level < max_level; ++level) {
      std::vector<int32_t> fr;
      for (int32_t c = 0; c < static_cast<int32_t>(cands.size()); ++c) {
        if (cands[static_cast<size_t>(c)].level == level) fr.push_back(c);
      }
      if (o.mode == EagleOptions::Mode::kDynamic) {
        std::stable_sort(fr.begin(), fr.end(), [&](int32_t a, int32_t b) { return cands[static_cast<size_t>(a)].score > cands[static_cast<size_t>(b)].score; });
        if (static_cast<int32_t>(fr.size()) > o.topk) fr.resize(static_cast<size_t>(o.topk));
        std::sort(fr.begin(), fr.end());
      } else {
        std::erase_if(fr, [&](int32_t c) {
          const int32_t v = cands[static_cast<size_t>(c)].node;
          return std::find(tree.parents.begin(), tree.parents.end(), v) == tree.parents.end();
        });
      }
      for (int32_t c : fr) children(c, ref_logits(ref_feature(w, tokens, feats, start, path_of(c))));
    }
    std::vector<int32_t> keep(cands.size());
    std::iota(keep.begin(), keep.end(), 0);
    if (o.mode == EagleOptions::Mode::kDynamic) {
      std::stable_sort(keep.begin(), keep.end(), [&](int32_t a, int32_t b) { return cands[static_cast<size_t>(a)].score > cands[static_cast<size_t>(b)].score; });
      if (static_cast<int32_t>(keep.size()) > k) keep.resize(static_cast<size_t>(k));
      std::sort(keep.begin(), keep.end());
    }
    DraftTree d;
    std::vector<int32_t> idx(cands.size(), -1);
    for (int32_t c : keep) {
      idx[static_cast<size_t>(c)] = static_cast<int32_t>(d.tokens.size());
      d.tokens.push_back(cands[static_cast<size_t>(c)].token);
      const int32_t p = cands[static_cast<size_t>(c)].parent;
      d.parents.push_back(p < 0 ? -1 : idx[static_cast<size_t>(p)]);
    }
    bool chain = true;
    for (size_t v = 0; v < d.parents.size(); ++v) chain = chain && d.parents[v] == static_cast<int32_t>(v) - 1;
    if (chain) d.parents.clear();
    return d;
  }

  DraftRequest request(int64_t id, const std::vector<int32_t>& tokens, const std::vector<float>& feats, int32_t hb,
                       int32_t rows, int32_t k) {
    DraftRequest r;
    r.seq_id = id;
    r.tokens = tokens;
    r.prompt_len = 2;
    r.num_tokens = k;
    r.sampling = &greedy_;
    r.hidden_begin = hb;
    r.hidden = std::span<const float>(feats.data() + hb * kD, static_cast<size_t>(rows * kD));
    r.hidden_size = static_cast<int32_t>(kD);
    return r;
  }
  std::vector<int32_t> random_tokens(int n, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::vector<int32_t> t(static_cast<size_t>(n));
    for (int32_t& x : t) x = static_cast<int32_t>(rng() % kVocab);
    return t;
  }

  Target target_;
  int counter_ = 0;
  SamplingParams greedy_{};
};

void expect_same(const DraftTree& got, const DraftTree& want, const std::string& what) {
  EXPECT_EQ(got.tokens, want.tokens) << what;
  EXPECT_EQ(got.parents, want.parents) << what;
  EXPECT_TRUE(got.probs.empty()) << what;
}

TEST_F(EagleTest, RejectsMismatchedAndCorruptFiles) {
  std::unique_ptr<EagleProposer> e;
  ASSERT_TRUE(load(spec(), &e).ok());
  EXPECT_EQ(e->name(), "eagle");
  EXPECT_TRUE(e->needs_hidden());
  auto s = spec();
  s.mutate = [](GgufWriter& w) { w.add_string("general.architecture", "medusa"); };
  expect_error(s, {"general.architecture = 'medusa'", "eagle"});
  s.mutate = [](GgufWriter& w) { w.add_u32("eagle.hidden_size", 32); };
  expect_error(s, {"eagle.hidden_size = 32", "64"});
  s.mutate = [](GgufWriter& w) { w.add_u32("eagle.vocab_size", 100); };
  expect_error(s, {"eagle.vocab_size = 100", "512"});
  s.mutate = [](GgufWriter& w) { w.add_u32("eagle.head_count", 5); };
  expect_error(s, {"eagle.head_count = 5", "divide"});
  s.mutate = [](GgufWriter& w) { w.add_u32("eagle.head_count_kv", 3); };
  expect_error(s, {"eagle.head_count_kv = 3"});
  s.mutate = [](GgufWriter& w) { w.remove("eagle.feed_forward_length"); };
  expect_error(s, {"eagle.feed_forward_length", "missing"});
  s.mutate = [](GgufWriter& w) { w.add_string("eagle.rope.freq_base", "big"); };
  expect_error(s, {"eagle.rope.freq_base", "not a float"});
  s.mutate = [](GgufWriter& w) { w.add_f32("eagle.layer_norm_rms_epsilon", -1.0f); };
  expect_error(s, {"eagle.layer_norm_rms_epsilon = -1"});
  s.mutate = [](GgufWriter& w) { w.add_string("eagle.target_fingerprint", "00000000000000ff"); };
  expect_error(s, {"eagle.target_fingerprint = '00000000000000ff'", target_.fingerprint_hex});
  s.mutate = [](GgufWriter& w) { w.add_u32("eagle.feed_forward_length", 128); };
  expect_error(s, {"blk.0.ffn_gate.weight", "[64, 96]", "[64, 128]"});
  s.mutate = [](GgufWriter& w) { EXPECT_TRUE(w.add_tensor_f32("blk.0.attn_norm.weight", {64}, std::vector<float>(64, 1.0f)).ok()); };
  expect_error(s, {"blk.0.attn_norm.weight", "not part of an EAGLE head"});
  // Missing tensor: a file written without fc.bias.
  {
    GgufWriter w;
    w.add_string("general.architecture", "eagle");
    w.add_u32("eagle.hidden_size", 64);
    w.add_u32("eagle.vocab_size", 512);
    w.add_u32("eagle.head_count", 4);
    w.add_u32("eagle.head_count_kv", 2);
    w.add_u32("eagle.feed_forward_length", 96);
    w.add_f32("eagle.rope.freq_base", 10000.0f);
    w.add_f32("eagle.layer_norm_rms_epsilon", 1e-5f);
    w.add_string("eagle.target_fingerprint", target_.fingerprint_hex);
    ASSERT_TRUE(w.add_tensor_f32("eagle.fc.weight", {128, 64}, std::vector<float>(128 * 64, 0.0f)).ok());
    const std::string p = temp_path("eagle_nobias");
    ASSERT_TRUE(w.write_file(p).ok());
    auto r = EagleProposer::load(p, *target_.model, *target_.file);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find(p + ": tensor 'eagle.fc.bias' is missing"), std::string::npos) << r.status().message();
  }
  // Options.
  EagleOptions o;
  o.topk = 0;
  expect_error(spec(), {"eagle_topk = 0"}, o);
  o = {};
  o.depth = 65;
  expect_error(spec(), {"eagle_depth = 65"}, o);
  o = {};
  o.mode = EagleOptions::Mode::kStatic;
  o.tree_paths = {{0}, {0, 0}, {1, 1}};
  expect_error(spec(), {"speculative_token_tree", "(1, 1)", "(1,)"}, o);
}

TEST_F(EagleTest, TeacherForcedMatchesTheContractFormulas) {
  for (GgmlType type : {GgmlType::F32, GgmlType::F16, GgmlType::Q8_0}) {  // Q8_0: tools/train/quantize_head.py
    Fp32MatmulScope fp32;  // before the head loads (under vnni a weight is packed at load)
    auto s = spec();
    s.type = type;
    std::unique_ptr<EagleProposer> e;
    EagleWeights w;
    ASSERT_TRUE(load(s, &e, {}, nullptr, &w).ok());
    const int n = 9;
    std::vector<int32_t> tokens = random_tokens(n + 1, 3);
    std::vector<float> feats = gaussian(static_cast<size_t>(n * kD), 1.0f, 4);
    std::vector<float> pred, logits;
    std::vector<int32_t> toks(tokens.begin() + 1, tokens.end()), pos(static_cast<size_t>(n));
    ASSERT_TRUE(e->teacher_forced(toks, feats, 5, &pred, &logits).ok());
    std::iota(pos.begin(), pos.end(), 5);
    std::vector<std::vector<float>> in;
    for (int j = 0; j < n; ++j) in.emplace_back(feats.begin() + j * kD, feats.begin() + (j + 1) * kD);
    std::vector<float> ref = eagle_reference(w, target_.embed, toks, in, pos);
    ASSERT_EQ(pred.size(), ref.size());
    double worst = 0;
    for (size_t i = 0; i < ref.size(); ++i) worst = std::max(worst, static_cast<double>(std::fabs(pred[i] - ref[i])));
    EXPECT_LT(worst, 1e-3) << ggml_type_name(static_cast<uint32_t>(type));
    for (int j = 0; j < n; ++j) {
      std::vector<float> rl = matvec(target_.out_head, kVocab, kD, ref.data() + j * kD);
      EXPECT_EQ(argmax(logits.data() + j * kVocab, kVocab), argmax(rl.data(), kVocab)) << j;
    }
  }
}

TEST_F(EagleTest, DraftsMatchTheReferenceInEveryMode) {
  EagleWeights w;
  std::vector<EagleOptions> modes(4);
  modes[0].topk = 3;
  modes[0].depth = 4;
  modes[1].topk = 2;
  modes[1].depth = 6;
  modes[2].mode = EagleOptions::Mode::kStatic;
  modes[2].tree_paths = {{0}, {1}, {0, 0}, {0, 1}, {1, 0}, {0, 0, 0}, {0, 2}, {0, 0, 0, 0}};
  modes[3].mode = EagleOptions::Mode::kChain;
  const std::vector<int32_t> t1 = random_tokens(7, 21), t2 = random_tokens(12, 22);
  const std::vector<float> f1 = gaussian(7 * kD, 1.0f, 23), f2 = gaussian(12 * kD, 1.0f, 24);
  for (size_t mi = 0; mi < modes.size(); ++mi) {
    std::unique_ptr<EagleProposer> e;
    ASSERT_TRUE(load(spec(), &e, modes[mi], nullptr, &w).ok());
    for (int32_t k : {1, 5, 10}) {
      const std::string what = "mode " + std::to_string(mi) + " k " + std::to_string(k);
      // Two sequences in one call (prefill hand-over: features 0..n-2).
      std::vector<DraftTree> out;
      ASSERT_TRUE(e->propose({request(1, t1, f1, 0, 6, k), request(2, t2, f2, 0, 11, k)}, &out).ok());
      ASSERT_EQ(out.size(), 2u);
      expect_same(out[0], ref_draft(w, modes[mi], t1, f1, 1, k), what + " seq 1");
      expect_same(out[1], ref_draft(w, modes[mi], t2, f2, 1, k), what + " seq 2");
      EXPECT_LE(static_cast<int32_t>(out[0].tokens.size()), k);
      e->release(1);
      e->release(2);
      EXPECT_EQ(e->num_used_blocks(), 0);
    }
  }
  // The dynamic tree's shape: k nodes, parents earlier, depth <= eagle_depth, siblings distinct.
  std::unique_ptr<EagleProposer> e;
  ASSERT_TRUE(load(spec(), &e, modes[0], nullptr, &w).ok());
  std::vector<DraftTree> out;
  ASSERT_TRUE(e->propose({request(1, t2, f2, 0, 11, 12)}, &out).ok());
  const DraftTree& d = out[0];
  ASSERT_EQ(d.tokens.size(), 12u);
  ASSERT_EQ(d.parents.size(), 12u);
  std::vector<int32_t> depth(12);
  for (int i = 0; i < 12; ++i) {
    ASSERT_LT(d.parents[static_cast<size_t>(i)], i);
    depth[static_cast<size_t>(i)] = d.parents[static_cast<size_t>(i)] < 0 ? 1 : depth[static_cast<size_t>(d.parents[static_cast<size_t>(i)])] + 1;
    EXPECT_LE(depth[static_cast<size_t>(i)], 4);
    for (int j = 0; j < i; ++j) {
      if (d.parents[static_cast<size_t>(j)] == d.parents[static_cast<size_t>(i)]) EXPECT_NE(d.tokens[static_cast<size_t>(j)], d.tokens[static_cast<size_t>(i)]);
    }
  }
  EXPECT_GT(*std::max_element(depth.begin(), depth.end()), 1);
}

// draft_p_min: every mode drops the nodes whose path probability under the head is below it
// (and their subtrees), exactly as the reference computes them; 0 changes nothing; a step may
// then draft fewer than k tokens or none.
TEST_F(EagleTest, DraftPMinDropsNodesBelowThePathProbability) {
  EagleWeights w;
  std::vector<EagleOptions> modes(3);
  modes[0].topk = 3;
  modes[0].depth = 4;
  modes[1].mode = EagleOptions::Mode::kStatic;
  modes[1].tree_paths = {{0}, {1}, {0, 0}, {0, 1}, {1, 0}, {0, 0, 0}, {0, 2}, {0, 0, 0, 0}};
  modes[2].mode = EagleOptions::Mode::kChain;
  const std::vector<int32_t> t1 = random_tokens(9, 31);
  const std::vector<float> f1 = gaussian(9 * kD, 1.0f, 32);
  int shorter = 0, empty = 0, unchanged = 0;
  for (size_t mi = 0; mi < modes.size(); ++mi) {
    size_t full_size = 0;
    for (float p_min : {0.0f, 1e-30f, 0.002f, 0.01f, 0.05f, 0.2f, 0.5f, 0.8f, 0.99f, 1.0f}) {
      EagleOptions o = modes[mi];
      o.draft_p_min = p_min;
      std::unique_ptr<EagleProposer> e;
      ASSERT_TRUE(load(spec(), &e, o, nullptr, &w).ok());
      const std::string what = "mode " + std::to_string(mi) + " draft_p_min " + std::to_string(p_min);
      std::vector<DraftTree> out;
      ASSERT_TRUE(e->propose({request(1, t1, f1, 0, 8, 8)}, &out).ok());
      expect_same(out[0], ref_draft(w, o, t1, f1, 1, 8), what);
      if (p_min == 0.0f) full_size = out[0].tokens.size();
      if (p_min == 1e-30f) EXPECT_EQ(out[0].tokens.size(), full_size) << what;
      if (p_min > 0.0f && p_min < 1.0f) {
        if (out[0].tokens.empty()) ++empty;
        else if (out[0].tokens.size() < full_size) ++shorter;
        else ++unchanged;
      }
    }
  }
  // The thresholds above straddle this head's probabilities: some drafts are cut, some emptied.
  EXPECT_GT(shorter, 0);
  EXPECT_GT(empty, 0);
  EagleOptions bad;
  for (float v : {-0.1f, 1.5f, std::nanf("")}) {
    bad.draft_p_min = v;
    expect_error(spec(), {"draft_p_min = "}, bad);
  }
  (void)unchanged;
}

TEST_F(EagleTest, DraftVocabularyKeepsDraftsBelowIt) {
  EagleOptions o;
  o.topk = 3;
  o.depth = 3;
  o.draft_vocab_size = 50;
  EagleWeights w;
  std::unique_ptr<EagleProposer> e;
  ASSERT_TRUE(load(spec(), &e, o, nullptr, &w).ok());
  const std::vector<int32_t> toks = random_tokens(8, 41);
  const std::vector<float> feats = gaussian(8 * kD, 1.0f, 42);
  std::vector<DraftTree> out;
  ASSERT_TRUE(e->propose({request(1, toks, feats, 0, 7, 8)}, &out).ok());
  ASSERT_EQ(out[0].tokens.size(), 8u);
  for (int32_t t : out[0].tokens) EXPECT_LT(t, 50);
  // The root's candidates are the best ids below 50 of the full head.
  std::vector<float> lg = ref_logits(ref_feature(w, toks, feats, 1, {}));
  std::vector<int32_t> best;
  top_k(lg.data(), 50, 3, &best);
  std::vector<int32_t> roots;
  for (size_t i = 0; i < out[0].tokens.size(); ++i) {
    if (out[0].parents[i] == -1) roots.push_back(out[0].tokens[i]);
  }
  EXPECT_EQ(roots[0], best[0]);
  for (int32_t t : roots) EXPECT_NE(std::find(best.begin(), best.end(), t), best.end());
}

TEST_F(EagleTest, CatchesUpIncrementallyAndRollsBackTreeEntries) {
  EagleOptions o;
  o.topk = 3;
  o.depth = 3;
  EagleWeights w;
  std::unique_ptr<EagleProposer> e;
  ASSERT_TRUE(load(spec(), &e, o, nullptr, &w).ok());
  const std::vector<int32_t> all = random_tokens(30, 31);
  const std::vector<float> feats = gaussian(30 * kD, 1.0f, 32);
  auto prefix = [&](int n) { return std::vector<int32_t>(all.begin(), all.begin() + n); };
  std::vector<DraftTree> out;
  // Steps as the engine hands them over: prefill of 6 (features 0..4), then each step the last
  // known token plus the accepted ones (1..4 new tokens).
  int n = 6, hb = 0;
  std::vector<int32_t> toks = prefix(n);
  ASSERT_TRUE(e->propose({request(9, toks, feats, hb, n - 1, 8)}, &out).ok());
  expect_same(out[0], ref_draft(w, o, toks, feats, 1, 8), "prefill");
  for (int step : {1, 3, 2, 4, 1}) {
    hb = n - 1;
    n += step;
    toks = prefix(n);
    ASSERT_TRUE(e->propose({request(9, toks, feats, hb, n - 1 - hb, 8)}, &out).ok());
    expect_same(out[0], ref_draft(w, o, toks, feats, 1, 8), "n = " + std::to_string(n));
  }
  // hidden_begin == 0: the sequence starts afresh (recomputed after preemption) — same draft.
  ASSERT_TRUE(e->propose({request(9, toks, feats, 0, n - 1, 8)}, &out).ok());
  expect_same(out[0], ref_draft(w, o, toks, feats, 1, 8), "restart");
  // A sequence first seen with hidden_begin > 0 (its prefix was a target prefix-cache hit): the
  // feature sequence starts at the first handed-over feature.
  ASSERT_TRUE(e->propose({request(10, toks, feats, 12, n - 1 - 12, 8)}, &out).ok());
  expect_same(out[0], ref_draft(w, o, toks, feats, 13, 8), "late start");
  // A gap in the hand-over restarts at the new features too.
  const int n2 = n + 4;
  toks = prefix(n2);
  ASSERT_TRUE(e->propose({request(10, toks, feats, n2 - 3, 2, 8)}, &out).ok());
  expect_same(out[0], ref_draft(w, o, toks, feats, n2 - 2, 8), "gap");
  // Nothing handed over for position n-2: no draft (rather than a wrong one).
  ASSERT_TRUE(e->propose({request(11, toks, feats, 0, 3, 8)}, &out).ok());
  EXPECT_TRUE(out[0].tokens.empty());
  EXPECT_GT(e->num_used_blocks(), 0);
  e->release(9);
  e->release(10);
  e->release(11);
  EXPECT_EQ(e->num_used_blocks(), 0);
  // Wrong hidden size: an error.
  DraftRequest bad = request(12, toks, feats, 0, 3, 8);
  bad.hidden_size = 32;
  EXPECT_FALSE(e->propose({bad}, &out).ok());
}

}  // namespace
}  // namespace specserve
