// MedusaProposer (spec/medusa_proposer.h): loader validation against corrupt and mismatched
// head files, the heads' logits against a host reference of the contract's formula, and the
// shape of the proposed trees (static tree, trimming, chains, the hidden hand-over, draft_p_min).
#include "spec/medusa_proposer.h"

#include <cmath>
#include <cstring>
#include <map>

#include <gtest/gtest.h>

#include <spdlog/sinks/ringbuffer_sink.h>

#include "actors/proposer_factory.h"
#include "core/logging.h"
#include "model/model_fingerprint.h"
#include "model/model_loader.h"

#include "tests/spec/spec_test_util.h"
#include "tests/spec/heads_test_util.h"

namespace specserve {
namespace {

using namespace heads_testing;
using spec_testing::backend;
using spec_testing::temp_path;

class MedusaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SyntheticModelSpec s;
    s.vocab_size = 512;
    s.hidden_size = 64;
    const std::string p = temp_path("medusa_target");
    ASSERT_TRUE(write_synthetic_llama(s, p).ok());
    target_ = open_target(p, backend());
    ASSERT_TRUE(target_.model);
  }
  MedusaFileSpec spec() const {
    MedusaFileSpec m;
    m.fingerprint = target_.fingerprint_hex;
    return m;
  }
  /// Writes `s`, loads it; returns the status (and the proposer in *out when given).
  Status load(const MedusaFileSpec& s, std::unique_ptr<MedusaProposer>* out = nullptr, MedusaOptions o = {},
              std::string* path_out = nullptr, MedusaWeights* w = nullptr) {
    const std::string p = temp_path("medusa_head_" + std::to_string(counter_++));
    MedusaWeights mw = write_medusa(p, s);
    if (w) *w = mw;
    if (path_out) *path_out = p;
    auto m = MedusaProposer::load(p, *target_.model, *target_.file, std::move(o));
    if (!m.ok()) return m.status();
    if (out) *out = std::move(*m);
    return Status();
  }
  void expect_error(const MedusaFileSpec& s, const std::vector<std::string>& parts) {
    std::string path;
    Status st = load(s, nullptr, {}, &path);
    ASSERT_FALSE(st.ok());
    EXPECT_NE(st.message().find(path), std::string::npos) << st.message();
    for (const auto& part : parts) EXPECT_NE(st.message().find(part), std::string::npos) << "'" << part << "' in " << st.message();
  }
  std::vector<float> random_hidden(int n, uint64_t seed) { return gaussian(static_cast<size_t>(n * 64), 1.0f, seed); }
  /// Sequence 1 with `tokens` (all prompt) asking for k tokens, `hidden` handed over from
  /// position 0; `sampling` must outlive the request.
  static DraftRequest request(const std::vector<int32_t>& tokens, const std::vector<float>& hidden, int32_t k,
                              const SamplingParams* sampling) {
    DraftRequest r;
    r.seq_id = 1;
    r.tokens = tokens;
    r.prompt_len = static_cast<int32_t>(tokens.size());
    r.num_tokens = k;
    r.sampling = sampling;
    r.hidden_begin = 0;
    r.hidden = hidden;
    r.hidden_size = 64;
    return r;
  }

  Target target_;
  int counter_ = 0;
};

TEST_F(MedusaTest, LoadsAValidFile) {
  std::unique_ptr<MedusaProposer> m;
  ASSERT_TRUE(load(spec(), &m).ok());
  EXPECT_EQ(m->num_heads(), 3);
  EXPECT_EQ(m->name(), "medusa");
  EXPECT_TRUE(m->needs_hidden());
  MedusaOptions o;
  o.max_heads = 2;
  ASSERT_TRUE(load(spec(), &m, o).ok());
  EXPECT_EQ(m->num_heads(), 2);
}

TEST_F(MedusaTest, RejectsMismatchedAndCorruptFiles) {
  auto s = spec();
  s.mutate = [](GgufWriter& w) { w.add_string("general.architecture", "llama"); };
  expect_error(s, {"general.architecture", "'llama'", "medusa"});
  s.mutate = [](GgufWriter& w) { w.remove("general.architecture"); };
  expect_error(s, {"general.architecture", "missing"});
  s.mutate = [](GgufWriter& w) { w.remove("medusa.num_heads"); };
  expect_error(s, {"medusa.num_heads", "missing"});
  s.mutate = [](GgufWriter& w) { w.add_u32("medusa.num_heads", 0); };
  expect_error(s, {"medusa.num_heads = 0"});
  s.mutate = [](GgufWriter& w) { w.add_string("medusa.num_heads", "three"); };
  expect_error(s, {"medusa.num_heads", "not an integer"});
  s.mutate = [](GgufWriter& w) { w.add_u32("medusa.hidden_size", 96); };
  expect_error(s, {"medusa.hidden_size = 96", "hidden size is 64"});
  s.mutate = [](GgufWriter& w) { w.add_u32("medusa.vocab_size", 49152); };
  expect_error(s, {"medusa.vocab_size = 49152", "vocabulary size is 512"});
  s.mutate = [](GgufWriter& w) { w.add_string("medusa.target_fingerprint", "0123456789abcdef"); };
  expect_error(s, {"medusa.target_fingerprint = '0123456789abcdef'", target_.fingerprint_hex});
  s.mutate = [](GgufWriter& w) { w.add_string("medusa.target_fingerprint", "xyz"); };
  expect_error(s, {"medusa.target_fingerprint = 'xyz'", "16 hex digits"});
  s.mutate = [](GgufWriter& w) { w.remove("medusa.target_fingerprint"); };
  expect_error(s, {"medusa.target_fingerprint", "missing"});
  // Tensors: a head more than the file says, a missing bias, a wrong shape, a wrong type.
  s.mutate = [](GgufWriter& w) { w.add_u32("medusa.num_heads", 4); };
  expect_error(s, {"medusa.3.weight", "missing"});
  s.mutate = [](GgufWriter& w) { w.add_u32("medusa.num_heads", 2); };
  expect_error(s, {"medusa.2.weight", "not part of a Medusa head"});
  s = spec();
  s.num_heads = 1;
  s.mutate = [](GgufWriter& w) {
    EXPECT_TRUE(w.add_tensor_f32("medusa.1.weight", {64, 32}, std::vector<float>(64 * 32, 0.0f)).ok());
    w.add_u32("medusa.num_heads", 2);
  };
  expect_error(s, {"medusa.1.weight", "[64, 32]", "[64, 64]"});
  s.mutate = [](GgufWriter& w) {
    std::vector<uint8_t> q(static_cast<size_t>(ggml_row_bytes(GgmlType::Q4_1, 64 * 64)), 0);
    EXPECT_TRUE(w.add_tensor("medusa.1.weight", {64, 64}, GgmlType::Q4_1, q.data(), q.size()).ok());
    w.add_u32("medusa.num_heads", 2);
  };
  expect_error(s, {"medusa.1.weight", "Q4_1", "F32 or F16 or Q8_0"});
  // A Q8_0 matrix with an infinite block scale (it would give a draft logit of +-inf).
  s.mutate = [](GgufWriter& w) {
    std::vector<uint8_t> q(static_cast<size_t>(ggml_row_bytes(GgmlType::Q8_0, 64 * 64)), 0);
    const uint16_t inf = 0x7c00;
    std::memcpy(q.data() + 5 * 34, &inf, 2);  // block 5: row 2, columns 32..63
    EXPECT_TRUE(w.add_tensor("medusa.1.weight", {64, 64}, GgmlType::Q8_0, q.data(), q.size()).ok());
    w.add_u32("medusa.num_heads", 2);
  };
  expect_error(s, {"medusa.1.weight", "block 5 of 128 (row 2, columns 32..63) has scale d = inf"});
  s.mutate = [](GgufWriter& w) {
    EXPECT_TRUE(w.add_tensor_f32("medusa.1.weight", {64, 64}, std::vector<float>(64 * 64, 0.0f)).ok());
    w.add_u32("medusa.num_heads", 2);
  };
  expect_error(s, {"medusa.1.bias", "missing"});
  // Not a GGUF at all.
  const std::string junk = temp_path("medusa_junk");
  {
    FILE* f = std::fopen(junk.c_str(), "wb");
    std::fputs("not a gguf file", f);
    std::fclose(f);
  }
  auto m = MedusaProposer::load(junk, *target_.model, *target_.file);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find(junk), std::string::npos) << m.status().message();
  auto missing = MedusaProposer::load("/nonexistent/medusa.gguf", *target_.model, *target_.file);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("/nonexistent/medusa.gguf"), std::string::npos);
  // A tree whose path has no prefix.
  MedusaOptions bad;
  bad.tree_paths = {{0}, {1, 0}};
  Status st = load(spec(), nullptr, bad);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("speculative_token_tree"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("(1,)"), std::string::npos) << st.message();
}

TEST_F(MedusaTest, HeadLogitsMatchTheContractFormula) {
  for (GgmlType type : {GgmlType::F32, GgmlType::F16, GgmlType::Q8_0}) {  // Q8_0: tools/train/quantize_head.py
    Fp32MatmulScope fp32;  // before the head loads (under vnni a weight is packed at load)
    auto s = spec();
    s.type = type;
    std::unique_ptr<MedusaProposer> m;
    MedusaWeights w;
    ASSERT_TRUE(load(s, &m, {}, nullptr, &w).ok());
    const int n = 3;
    std::vector<float> h = random_hidden(n, 5);
    std::vector<float> logits;
    ASSERT_TRUE(m->head_logits(h, n, &logits).ok());
    ASSERT_EQ(logits.size(), size_t{3} * n * 512);
    double worst = 0;
    for (int i = 0; i < 3; ++i) {
      for (int r = 0; r < n; ++r) {
        std::vector<float> ref = medusa_reference(w, i, h.data() + r * 64, 64, target_.out_head, 512);
        const float* got = logits.data() + (static_cast<size_t>(i) * n + r) * 512;
        for (int v = 0; v < 512; ++v) worst = std::max(worst, static_cast<double>(std::fabs(got[v] - ref[static_cast<size_t>(v)])));
        EXPECT_EQ(argmax(got, 512), argmax(ref.data(), 512)) << "head " << i << " row " << r;
      }
    }
    EXPECT_LT(worst, 2e-3) << ggml_type_name(static_cast<uint32_t>(type));
  }
  std::unique_ptr<MedusaProposer> m;
  ASSERT_TRUE(load(spec(), &m).ok());
  std::vector<float> logits;
  EXPECT_FALSE(m->head_logits(std::vector<float>(10), 1, &logits).ok());
}

TEST_F(MedusaTest, DraftVocabularyScoresAPrefixOfTheIds) {
  std::unique_ptr<MedusaProposer> full, part;
  ASSERT_TRUE(load(spec(), &full).ok());
  MedusaOptions o;
  o.draft_vocab_size = 100;
  ASSERT_TRUE(load(spec(), &part, o).ok());
  const int n = 2;
  std::vector<float> h = random_hidden(n, 17), lf, lp;
  ASSERT_TRUE(full->head_logits(h, n, &lf).ok());
  ASSERT_TRUE(part->head_logits(h, n, &lp).ok());
  ASSERT_EQ(lp.size(), size_t{3} * n * 100);
  for (int row = 0; row < 3 * n; ++row) {
    for (int v = 0; v < 100; ++v) EXPECT_NEAR(lp[static_cast<size_t>(row * 100 + v)], lf[static_cast<size_t>(row * 512 + v)], 1e-4);
  }
  SamplingParams greedy;
  greedy.temperature = 0;
  std::vector<int32_t> tokens = {300, 400, 500};
  DraftRequest r;
  r.seq_id = 1;
  r.tokens = tokens;
  r.num_tokens = 3;
  r.sampling = &greedy;
  r.hidden = std::span<const float>(h.data(), 64);
  r.hidden_begin = 1;
  r.hidden_size = 64;
  std::vector<DraftTree> out;
  ASSERT_TRUE(part->propose({r}, &out).ok());
  ASSERT_EQ(out[0].tokens.size(), 3u);
  for (int32_t t : out[0].tokens) EXPECT_LT(t, 100);
  o.draft_vocab_size = 513;
  Status st = load(spec(), nullptr, o);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("draft_vocab_size = 513"), std::string::npos) << st.message();
}

TEST_F(MedusaTest, ProposesTheStaticTreeFromEachHeadsRanks) {
  MedusaOptions o;
  o.tree_paths = {{0}, {1}, {0, 0}, {0, 1}, {1, 0}, {0, 0, 0}, {0, 0, 0, 0}};
  std::unique_ptr<MedusaProposer> m;
  MedusaWeights w;
  ASSERT_TRUE(load(spec(), &m, o, nullptr, &w).ok());
  std::vector<int32_t> tokens = {5, 6, 7, 8, 9};
  std::vector<float> hidden = random_hidden(4, 9);  // positions 0..3 (prefill rows)
  SamplingParams greedy;
  greedy.temperature = 0;
  DraftRequest r = request(tokens, hidden, 10, &greedy);
  std::vector<DraftTree> out;
  ASSERT_TRUE(m->propose({r}, &out).ok());
  ASSERT_EQ(out.size(), 1u);
  // Node (0,0,0,0) needs a 4th head: cut (the file has 3).
  ASSERT_EQ(out[0].tokens.size(), 6u);
  EXPECT_EQ(out[0].parents, (std::vector<int32_t>{-1, -1, 0, 0, 1, 2}));
  EXPECT_TRUE(out[0].probs.empty());
  // The reference: head j's ranked tokens on the hidden state of position n-2 = 3.
  std::vector<std::vector<int32_t>> ranked;
  for (int j = 0; j < 3; ++j) {
    std::vector<float> ref = medusa_reference(w, j, hidden.data() + 3 * 64, 64, target_.out_head, 512);
    std::vector<int32_t> t;
    top_k(ref.data(), 512, 2, &t);
    ranked.push_back(t);
  }
  EXPECT_EQ(out[0].tokens, (std::vector<int32_t>{ranked[0][0], ranked[0][1], ranked[1][0], ranked[1][1], ranked[1][0], ranked[2][0]}));

  // k trims in tree order; sampling requests get no q either (deterministic choices).
  SamplingParams sampled;
  sampled.temperature = 0.8f;
  r.num_tokens = 3;
  r.sampling = &sampled;
  r.hidden_begin = 0;
  ASSERT_TRUE(m->propose({r}, &out).ok());
  EXPECT_EQ(out[0].tokens, (std::vector<int32_t>{ranked[0][0], ranked[0][1], ranked[1][0]}));
  EXPECT_EQ(out[0].parents, (std::vector<int32_t>{-1, -1, 0}));
  EXPECT_TRUE(out[0].probs.empty());
}

// The speculative entry's max_model_len (the draft's limit): at most max_model_len - n nodes,
// none at or past it. NOTE: medusa accepted the key and ignored it.
TEST_F(MedusaTest, TheDraftsMaxModelLenCutsTheTree) {
  MedusaOptions o;
  o.tree_paths = {{0}, {1}, {0, 0}, {0, 1}, {1, 0}, {0, 0, 0}};
  std::vector<int32_t> tokens = {5, 6, 7, 8, 9};  // n = 5
  std::vector<float> hidden = random_hidden(4, 9);
  SamplingParams greedy;
  greedy.temperature = 0;
  for (const auto& [limit, want] : std::vector<std::pair<int32_t, size_t>>{{0, 6}, {8, 3}, {6, 1}, {5, 0}, {3, 0}}) {
    o.max_model_len = limit;
    std::unique_ptr<MedusaProposer> m;
    ASSERT_TRUE(load(spec(), &m, o).ok());
    DraftRequest r = request(tokens, hidden, 10, &greedy);
    std::vector<DraftTree> out;
    ASSERT_TRUE(m->propose({r}, &out).ok());
    EXPECT_EQ(out[0].tokens.size(), want) << "max_model_len " << limit;
  }
}

// The same through the factory (actors/proposer_factory.h): the parsed entry's max_model_len
// reaches the heads. NOTE: the factory did not pass it.
TEST_F(MedusaTest, TheEntrysMaxModelLenReachesTheHeadsThroughTheFactory) {
  SyntheticModelSpec s;
  s.vocab_size = 512;
  s.hidden_size = 64;
  const std::string tp = temp_path("medusa_factory_target");
  ASSERT_TRUE(write_synthetic_llama(s, tp).ok());
  auto lm = load_model(tp, backend(), /*quiet=*/true);
  ASSERT_TRUE(lm.ok()) << lm.status().to_string();
  MedusaFileSpec hs;
  hs.fingerprint = fingerprint_hex(model_fingerprint(*lm->file));
  const std::string hp = temp_path("medusa_factory_head");
  write_medusa(hp, hs);
  std::vector<int32_t> tokens = {5, 6, 7, 8, 9};  // n = 5
  std::vector<float> hidden = random_hidden(4, 9);
  SamplingParams greedy;
  greedy.temperature = 0;
  for (const auto& [limit, want] : std::vector<std::pair<int32_t, size_t>>{{0, 6}, {8, 3}, {5, 0}}) {
    SpeculativeSpec sp;
    sp.method = SpeculativeMethod::kMedusa;
    sp.model = hp;
    sp.num_speculative_tokens = 6;
    sp.speculative_token_tree = "[(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0)]";
    if (limit > 0) sp.max_model_len = limit;
    auto p = build_proposer(sp, *lm, backend(), ProposerBuildOptions{});
    ASSERT_TRUE(p.ok()) << p.status().to_string();
    DraftRequest r = request(tokens, hidden, 6, &greedy);
    std::vector<DraftTree> out;
    ASSERT_TRUE((*p)->propose({r}, &out).ok());
    EXPECT_EQ(out[0].tokens.size(), want) << "max_model_len " << limit;
  }
}

// draft_p_min: a node is drafted only when the product of the heads' probabilities along its
// path is at least the threshold; a node below it goes with its subtree, the rest keep their
// order and are re-parented; 0 changes nothing.
TEST_F(MedusaTest, DraftPMinDropsNodesBelowThePathProbability) {
  const std::vector<std::vector<int32_t>> paths = {{0}, {1}, {0, 0}, {0, 1}, {1, 0}, {0, 0, 0}, {2}, {0, 0, 1}};
  std::vector<int32_t> tokens = {5, 6, 7, 8, 9};
  std::vector<float> hidden = random_hidden(4, 11);
  SamplingParams greedy;
  greedy.temperature = 0;
  const DraftRequest r = request(tokens, hidden, 8, &greedy);
  int cut = 0, emptied = 0;
  for (float p_min : {0.0f, 1e-30f, 1e-5f, 1e-4f, 1e-3f, 0.01f, 0.05f, 0.3f, 1.0f}) {
    MedusaOptions o;
    o.tree_paths = paths;
    o.draft_p_min = p_min;
    std::unique_ptr<MedusaProposer> m;
    MedusaWeights w;
    ASSERT_TRUE(load(spec(), &m, o, nullptr, &w).ok());
    std::vector<DraftTree> out;
    ASSERT_TRUE(m->propose({r}, &out).ok());
    // The reference: each head's ranked tokens and their log-probabilities (double softmax).
    std::vector<std::vector<int32_t>> ranked;
    std::vector<std::vector<double>> lp;
    for (int j = 0; j < 3; ++j) {
      std::vector<float> ref = medusa_reference(w, j, hidden.data() + 3 * 64, 64, target_.out_head, 512);
      std::vector<int32_t> t;
      top_k(ref.data(), 512, 3, &t);
      double mx = -INFINITY, sum = 0;
      for (float x : ref) mx = std::max(mx, static_cast<double>(x));
      for (float x : ref) sum += std::exp(static_cast<double>(x) - mx);
      std::vector<double> l;
      for (int32_t tok : t) l.push_back(static_cast<double>(ref[static_cast<size_t>(tok)]) - mx - std::log(sum));
      ranked.push_back(t);
      lp.push_back(l);
    }
    std::vector<int32_t> want_tokens, want_parents;
    std::map<std::vector<int32_t>, std::pair<int32_t, double>> kept;  // path -> (draft index, log-probability)
    for (const auto& path : paths) {
      std::vector<int32_t> prefix(path.begin(), path.end() - 1);
      const int32_t depth = static_cast<int32_t>(path.size());
      const double parent_lp = prefix.empty() ? 0.0 : (kept.count(prefix) ? kept[prefix].second : 1.0);
      if (parent_lp > 0) continue;  // parent dropped
      const double node_lp = parent_lp + lp[static_cast<size_t>(depth - 1)][static_cast<size_t>(path.back())];
      if (p_min > 0 && node_lp < std::log(static_cast<double>(p_min))) continue;
      kept[path] = {static_cast<int32_t>(want_tokens.size()), node_lp};
      want_tokens.push_back(ranked[static_cast<size_t>(depth - 1)][static_cast<size_t>(path.back())]);
      want_parents.push_back(prefix.empty() ? -1 : kept[prefix].first);
    }
    bool chain = true;
    for (size_t v = 0; v < want_parents.size(); ++v) chain = chain && want_parents[v] == static_cast<int32_t>(v) - 1;
    if (chain) want_parents.clear();
    const std::string what = "draft_p_min " + std::to_string(p_min);
    EXPECT_EQ(out[0].tokens, want_tokens) << what;
    EXPECT_EQ(out[0].parents, want_parents) << what;
    if (p_min == 0.0f || p_min == 1e-30f) EXPECT_EQ(out[0].tokens.size(), paths.size()) << what;
    if (p_min > 1e-30f && !out[0].tokens.empty() && out[0].tokens.size() < paths.size()) ++cut;
    if (p_min > 1e-30f && out[0].tokens.empty()) ++emptied;
  }
  // The thresholds straddle these heads' probabilities (near-uniform over 512 ids).
  EXPECT_GT(cut, 0);
  EXPECT_GT(emptied, 0);
  MedusaOptions bad;
  bad.draft_p_min = 2.0f;
  EXPECT_NE(load(spec(), nullptr, bad).message().find("draft_p_min = "), std::string::npos);
}

TEST_F(MedusaTest, TreeBeyondTheHeadsOrTheDraftVocabularyIsCutAtLoadOrRefused) {
  // Deeper than the file's 3 heads: the 4th level is dropped once at load (with a warning), so
  // the deepest draft is 3 and a chain stays a chain.
  MedusaOptions deep;
  deep.tree_paths = {{0}, {0, 0}, {0, 0, 0}, {0, 0, 0, 0}};
  std::unique_ptr<MedusaProposer> m;
  ASSERT_TRUE(load(spec(), &m, deep).ok());
  EXPECT_EQ(m->max_draft_depth(10), 3);
  EXPECT_FALSE(m->drafts_trees());
  // Ranks past a 2-id draft vocabulary: (2,) and its child go; the rest is a tree of depth 2.
  MedusaOptions wide;
  wide.draft_vocab_size = 2;
  wide.tree_paths = {{0}, {1}, {2}, {0, 0}, {2, 0}};
  // Said once, at load, as a warning naming the count and the reason (it used to be silent).
  auto sink = std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(16);
  auto log = get_logger("spec");
  log->sinks().push_back(sink);
  const Status wide_st = load(spec(), &m, wide);
  log->sinks().pop_back();
  ASSERT_TRUE(wide_st.ok()) << wide_st.to_string();
  const std::vector<std::string> lines = sink->last_formatted();
  ASSERT_EQ(lines.size(), 1u);
  for (const char* w : {"warning", "2 of 5 nodes of speculative_token_tree dropped", "rank >= the draft vocabulary's 2 ids"}) {
    EXPECT_NE(lines[0].find(w), std::string::npos) << "'" << w << "' in " << lines[0];
  }
  EXPECT_TRUE(m->drafts_trees());
  EXPECT_EQ(m->max_draft_depth(10), 2);
  EXPECT_EQ(m->max_draft_depth(2), 1);  // k = 2 nodes: (0,), (1,)
  // Nothing left: refused, saying how many nodes went and why.
  MedusaOptions none;
  none.draft_vocab_size = 2;
  none.tree_paths = {{5}, {5, 0}};
  Status st = load(spec(), nullptr, none);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  for (const char* w : {"speculative_token_tree", "no node can be drafted", "2 of 2 nodes", "draft vocabulary's 2 ids"}) {
    EXPECT_NE(st.message().find(w), std::string::npos) << "'" << w << "' in " << st.message();
  }
}

TEST_F(MedusaTest, ChainsKeepsHiddenAcrossCallsAndBatches) {
  std::unique_ptr<MedusaProposer> m;
  MedusaWeights w;
  ASSERT_TRUE(load(spec(), &m, {}, nullptr, &w).ok());  // no tree: a chain
  SamplingParams greedy;
  greedy.temperature = 0;
  std::vector<int32_t> tokens = {1, 2, 3, 4, 5, 6, 7};
  std::vector<float> hidden = random_hidden(6, 3);
  auto req = [&](int64_t id, int32_t n, int32_t hb, int32_t rows) {
    DraftRequest r;
    r.seq_id = id;
    r.tokens = std::span<const int32_t>(tokens.data(), static_cast<size_t>(n));
    r.prompt_len = 3;
    r.num_tokens = 5;
    r.sampling = &greedy;
    r.hidden_begin = hb;
    r.hidden = std::span<const float>(hidden.data() + hb * 64, static_cast<size_t>(rows * 64));
    r.hidden_size = 64;
    return r;
  };
  auto chain_at = [&](int pos) {
    std::vector<int32_t> c;
    for (int j = 0; j < 3; ++j) {
      std::vector<float> ref = medusa_reference(w, j, hidden.data() + pos * 64, 64, target_.out_head, 512);
      c.push_back(argmax(ref.data(), 512));
    }
    return c;
  };
  std::vector<DraftTree> out;
  // Prefill of 4 tokens: hidden of positions 0..2; the draft uses position 2.
  ASSERT_TRUE(m->propose({req(1, 4, 0, 3)}, &out).ok());
  EXPECT_EQ(out[0].tokens, chain_at(2));  // k = 5 but only 3 heads
  EXPECT_TRUE(out[0].parents.empty());
  // Next step: 6 tokens, hidden of positions 3..4 handed over.
  ASSERT_TRUE(m->propose({req(1, 6, 3, 2)}, &out).ok());
  EXPECT_EQ(out[0].tokens, chain_at(4));
  // Called again with nothing new: the kept hidden state of position 4 still serves.
  ASSERT_TRUE(m->propose({req(1, 6, 5, 0)}, &out).ok());
  EXPECT_EQ(out[0].tokens, chain_at(4));
  // A gap (position 5 never handed over): no draft rather than a wrong one.
  ASSERT_TRUE(m->propose({req(1, 7, 6, 0)}, &out).ok());
  EXPECT_TRUE(out[0].tokens.empty());
  // After release the kept state is gone.
  m->release(1);
  ASSERT_TRUE(m->propose({req(1, 6, 5, 0)}, &out).ok());
  EXPECT_TRUE(out[0].tokens.empty());
  // A batch gives each sequence what it gets alone; one token only: nothing to draft from.
  ASSERT_TRUE(m->propose({req(2, 4, 0, 3), req(3, 1, 0, 0), req(4, 6, 0, 5)}, &out).ok());
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(out[0].tokens, chain_at(2));
  EXPECT_TRUE(out[1].tokens.empty());
  EXPECT_EQ(out[2].tokens, chain_at(4));
  // k = 1 and k = 0.
  DraftRequest one = req(5, 4, 0, 3);
  one.num_tokens = 1;
  DraftRequest none = req(6, 4, 0, 3);
  none.num_tokens = 0;
  ASSERT_TRUE(m->propose({one, none}, &out).ok());
  EXPECT_EQ(out[0].tokens, std::vector<int32_t>{chain_at(2)[0]});
  EXPECT_TRUE(out[1].tokens.empty());
  // A wrong hidden size is an error (a broken engine, not a bad guess).
  DraftRequest bad = req(7, 4, 0, 3);
  bad.hidden_size = 32;
  EXPECT_FALSE(m->propose({bad}, &out).ok());
}

}  // namespace
}  // namespace specserve
