// ModelDrafter with sparse draft distributions (DrafterOptions::sparse_keep_mass /
// sparse_max_entries): every reported q is the truncated distribution the token was drawn from —
// at most max_entries nonzeros, summing to 1, positive at the drafted token — so it can travel
// sparse between processes and speculative sampling stays lossless. And draft_p_min: where a
// draft stops.
#include "spec/model_drafter.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <numeric>
#include <random>
#include <vector>

#include "spec/sparse_probs.h"
#include "tests/spec/spec_test_util.h"

namespace specserve {
namespace {

using namespace spec_testing;
using Tokens = std::vector<int32_t>;

constexpr int32_t kVocab = 512;

SyntheticModelSpec target_spec() {
  SyntheticModelSpec s;
  s.name = "drafter-test-target";
  s.num_layers = 2;
  s.hidden_size = 64;
  s.num_heads = 4;
  s.num_kv_heads = 2;
  s.ffn_size = 128;
  s.vocab_size = kVocab;
  s.context_length = 128;
  s.logit_scale = 1.5f;  // spread: hundreds of tokens carry mass, so truncation really cuts
  s.seed = 77;
  return s;
}

Transformer& draft_model() {
  static LoadedModel* m = [] {
    SyntheticDraftSpec d;
    d.num_layers = 1;
    d.noise = 0.05f;
    return new LoadedModel(make_draft(target_spec(), d, "drafter_test_draft"));
  }();
  return *m->model;
}

std::unique_ptr<ModelDrafter> make_drafter(double keep_mass, int32_t max_entries) {
  DrafterOptions o;
  o.sparse_keep_mass = keep_mass;
  o.sparse_max_entries = max_entries;
  auto d = ModelDrafter::create(draft_model(), o);
  EXPECT_TRUE(d.ok()) << d.status().to_string();
  return d.ok() ? std::move(*d) : nullptr;
}

SamplingParams sampling(uint64_t seed, float temperature = 1.0f) {
  SamplingParams sp;
  sp.temperature = temperature;
  sp.seed = seed;
  sp.has_seed = true;
  return sp;
}

struct Seq {
  int64_t id;
  Tokens tokens;
  int32_t prompt_len;
  SamplingParams sp;
};

/// One propose() call over `seqs` with k draft tokens each.
std::vector<DraftTree> propose(ModelDrafter& d, const std::vector<Seq>& seqs, int32_t k) {
  std::vector<DraftRequest> reqs;
  for (const Seq& s : seqs) {
    DraftRequest r;
    r.seq_id = s.id;
    r.tokens = s.tokens;
    r.prompt_len = s.prompt_len;
    r.num_tokens = k;
    r.sampling = &s.sp;
    reqs.push_back(r);
  }
  std::vector<DraftTree> out;
  Status st = d.propose(reqs, &out);
  EXPECT_TRUE(st.ok()) << st.to_string();
  return out;
}

int count_nonzero(const std::vector<float>& q) {
  return static_cast<int>(std::count_if(q.begin(), q.end(), [](float x) { return x != 0.0f; }));
}

void check_sparse_draft(const DraftTree& t, int32_t k, int32_t max_entries, const std::string& where) {
  ASSERT_EQ(t.tokens.size(), static_cast<size_t>(k)) << where;
  ASSERT_EQ(t.probs.size(), t.tokens.size()) << where;
  for (size_t j = 0; j < t.tokens.size(); ++j) {
    const std::vector<float>& q = t.probs[j];
    ASSERT_EQ(q.size(), static_cast<size_t>(kVocab)) << where;
    if (max_entries > 0) EXPECT_LE(count_nonzero(q), max_entries) << where << " token " << j;
    EXPECT_GE(count_nonzero(q), 1) << where;
    EXPECT_NEAR(std::accumulate(q.begin(), q.end(), 0.0), 1.0, 1e-5) << where << " token " << j;
    EXPECT_GT(q[static_cast<size_t>(t.tokens[j])], 0.0f) << where << ": drafted token " << t.tokens[j] << " has q = 0";
    // What crosses the process boundary round-trips exactly.
    std::vector<float> back;
    ASSERT_TRUE(to_dense(to_sparse(q), kVocab, &back).ok());
    EXPECT_EQ(back, q) << where;
  }
}

TEST(ModelDrafterSparse, EveryReportedQIsSparseNormalisedAndHoldsItsToken) {
  constexpr int32_t kMax = 24, kK = 4;
  auto d = make_drafter(0.95, kMax);
  ASSERT_TRUE(d);
  std::vector<Seq> seqs;
  for (int i = 0; i < 4; ++i) seqs.push_back({i, {1 + i, 40 + i, 7, 300 + i}, 4, sampling(1000 + i)});
  std::mt19937 rng(5);
  // Several rounds: accept a random prefix of each draft plus one "target" token, as the engine
  // would, so the drafter rolls back and catches up between calls.
  for (int round = 0; round < 6; ++round) {
    const std::vector<DraftTree> out = propose(*d, seqs, kK);
    ASSERT_EQ(out.size(), seqs.size());
    for (size_t i = 0; i < seqs.size(); ++i) {
      check_sparse_draft(out[i], kK, kMax, "round " + std::to_string(round) + " seq " + std::to_string(i));
      const size_t accepted = std::uniform_int_distribution<size_t>(0, out[i].tokens.size())(rng);
      seqs[i].tokens.insert(seqs[i].tokens.end(), out[i].tokens.begin(), out[i].tokens.begin() + static_cast<std::ptrdiff_t>(accepted));
      seqs[i].tokens.push_back(static_cast<int32_t>(std::uniform_int_distribution<int>(1, kVocab - 1)(rng)));
    }
  }
}

TEST(ModelDrafterSparse, MassOnlyAndEntriesOnly) {
  for (auto [mass, max_entries] : {std::pair{0.8, 0}, std::pair{1.0, 8}, std::pair{0.5, 1}}) {
    auto d = make_drafter(mass, max_entries);
    ASSERT_TRUE(d);
    std::vector<Seq> seqs = {{1, {3, 9, 27}, 3, sampling(42)}};
    const std::vector<DraftTree> out = propose(*d, seqs, 3);
    check_sparse_draft(out[0], 3, max_entries, "mass " + std::to_string(mass) + " max " + std::to_string(max_entries));
    if (mass < 1.0) EXPECT_LT(count_nonzero(out[0].probs[0]), kVocab) << "keep_mass " << mass << " cut nothing";
  }
}

TEST(ModelDrafterSparse, FirstQIsTheTruncationOfTheDenseQ) {
  // Same context, so the first position's dense q is the same; the sparse drafter reports exactly
  // truncate_probs of it (and draws its token from that).
  auto dense = make_drafter(1.0, 0);
  auto sparse = make_drafter(0.9, 32);
  ASSERT_TRUE(dense && sparse);
  const std::vector<Seq> seqs = {{1, {5, 6, 7, 8}, 4, sampling(9)}};
  const std::vector<DraftTree> a = propose(*dense, seqs, 1), b = propose(*sparse, seqs, 1);
  ASSERT_EQ(a[0].probs.size(), 1u);
  ASSERT_EQ(b[0].probs.size(), 1u);
  EXPECT_GT(count_nonzero(a[0].probs[0]), 32) << "the dense q is too peaked for this test";
  std::vector<float> want = a[0].probs[0];
  truncate_probs(&want, 0.9, 32);
  EXPECT_EQ(b[0].probs[0], want);
}

TEST(ModelDrafterSparse, OffByDefaultAndGreedyUnaffected) {
  auto dense = make_drafter(1.0, 0);
  ASSERT_TRUE(dense);
  const std::vector<Seq> seqs = {{1, {5, 6, 7, 8}, 4, sampling(9)}};
  const std::vector<DraftTree> a = propose(*dense, seqs, 2);
  EXPECT_GT(count_nonzero(a[0].probs[0]), 64);  // dense: nothing truncated
  // Greedy: no q, and the same tokens with or without sparse options.
  auto sparse = make_drafter(0.5, 2);
  const std::vector<Seq> greedy = {{2, {5, 6, 7, 8}, 4, sampling(0, 0.0f)}};
  const std::vector<DraftTree> g1 = propose(*make_drafter(1.0, 0), greedy, 4), g2 = propose(*sparse, greedy, 4);
  EXPECT_EQ(g1[0].tokens, g2[0].tokens);
  EXPECT_TRUE(g2[0].probs.empty());
}

// The draft above with `output_norm.weight` set to NaN: every logit it gives is NaN.
Transformer& nan_draft_model() {
  static LoadedModel* m = [] {
    const std::string path = temp_path("drafter_test_nan_draft");
    SyntheticDraftSpec d;
    d.num_layers = 1;
    EXPECT_TRUE(write_synthetic_draft(target_spec(), d, path).ok());
    std::ifstream in(path, std::ios::binary);
    std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    auto g = GgufFile::from_memory(bytes.data(), bytes.size(), path);
    EXPECT_TRUE(g.ok());
    const GgufTensorInfo* t = g->find_tensor("output_norm.weight");
    EXPECT_TRUE(t != nullptr && t->type() == GgmlType::F32);
    const size_t at = static_cast<size_t>(t->data - bytes.data());
    const float nan = std::nanf("");
    for (int64_t i = 0; i < t->num_elements; ++i) std::memcpy(&bytes[at + 4 * static_cast<size_t>(i)], &nan, 4);
    std::ofstream(path, std::ios::binary | std::ios::trunc).write(reinterpret_cast<const char*>(bytes.data()),
                                                                   static_cast<std::streamsize>(bytes.size()));
    return new LoadedModel(load_file(path));
  }();
  return *m->model;
}

// Bug: a draft model whose logits were NaN aborted the process (the sampler's "no finite logit"
// check) on the first sampled request: `generate --speculative-model BAD.gguf --temperature 1`
// and a whole `serve` died. The proposer fails instead (the engine then decodes without drafts).
TEST(ModelDrafterSparse, NanDraftLogitsFailTheProposalInsteadOfAborting) {
  for (double keep_mass : {1.0, 0.999}) {
    DrafterOptions o;
    o.sparse_keep_mass = keep_mass;
    auto d = ModelDrafter::create(nan_draft_model(), o);
    ASSERT_TRUE(d.ok()) << d.status().to_string();
    DraftRequest r;
    const SamplingParams sp = sampling(3);
    const Tokens tokens = {5, 6, 7, 8};
    r.seq_id = 1;
    r.tokens = tokens;
    r.prompt_len = 4;
    r.num_tokens = 3;
    r.sampling = &sp;
    std::vector<DraftTree> out;
    Status st = (*d)->propose({r}, &out);
    ASSERT_FALSE(st.ok());
    EXPECT_NE(st.message().find("draft model"), std::string::npos) << st.message();
    // The next step of the same sequence fails the same way, and greedy drafting still works.
    EXPECT_FALSE((*d)->propose({r}, &out).ok());
    const SamplingParams greedy = sampling(0, 0.0f);
    r.seq_id = 2;
    r.sampling = &greedy;
    ASSERT_TRUE((*d)->propose({r}, &out).ok());
    EXPECT_EQ(out[0].tokens.size(), 3u);
  }
}

// draft_p_min: a draft stops before the first token whose path probability under the draft is
// below the threshold. Sampled: exactly the longest prefix of the unlimited draft (same seeds,
// same draws) whose product of q's stays >= p_min, each kept token reported with q restricted to
// the ids that would have been kept there (q >= p_min / the path so far), renormalised — the
// distribution it was drawn from given that it was kept (lossless; the chi-square test in
// spec_distribution_test.cpp). Greedy: a prefix of the unlimited draft, shorter as p_min grows,
// empty at 1. A second call on the same sequence gives the same draft (state left consistent).
TEST(ModelDrafterPMin, StopsBeforeTheFirstTokenBelowThePathProbability) {
  const int32_t k = 6;
  int cut = 0;
  for (uint64_t seed = 1; seed <= 12; ++seed) {
    const std::vector<Seq> seqs = {{static_cast<int64_t>(seed), {5, 6, 7, 8}, 4, sampling(seed)}};
    const std::vector<DraftTree> full = propose(*make_drafter(1.0, 0), seqs, k);
    ASSERT_EQ(full[0].tokens.size(), static_cast<size_t>(k));
    for (float p_min : {1e-6f, 0.001f, 0.01f, 0.05f}) {
      DrafterOptions o;
      o.draft_p_min = p_min;
      auto d = ModelDrafter::create(draft_model(), o);
      ASSERT_TRUE(d.ok());
      const std::vector<DraftTree> got = propose(**d, seqs, k);
      size_t want = 0;
      double logp = 0;
      std::vector<double> q_min;  // per kept position: p_min / (path probability before it)
      while (want < full[0].tokens.size()) {
        q_min.push_back(static_cast<double>(p_min) / std::exp(logp));
        logp += std::log(static_cast<double>(full[0].probs[want][static_cast<size_t>(full[0].tokens[want])]));
        if (logp < std::log(static_cast<double>(p_min)) - 1e-6) break;
        ++want;
      }
      const std::string where = "seed " + std::to_string(seed) + " p_min " + std::to_string(p_min);
      ASSERT_EQ(got[0].tokens.size(), want) << where;
      ASSERT_EQ(got[0].probs.size(), want) << where;
      for (size_t j = 0; j < want; ++j) {
        EXPECT_EQ(got[0].tokens[j], full[0].tokens[j]) << where;
        const std::vector<float>& q = full[0].probs[j];
        const std::vector<float>& qk = got[0].probs[j];
        ASSERT_EQ(qk.size(), q.size()) << where;
        double kept = 0;
        for (size_t x = 0; x < q.size(); ++x) kept += qk[x] > 0 ? q[x] : 0.0;
        EXPECT_NEAR(std::accumulate(qk.begin(), qk.end(), 0.0), 1.0, 1e-5) << where;
        EXPECT_GT(qk[static_cast<size_t>(got[0].tokens[j])], 0.0f) << where;
        int zeroed = 0;
        for (size_t x = 0; x < q.size(); ++x) {
          if (q[x] > q_min[j] * 1.001) EXPECT_NEAR(qk[x], q[x] / kept, 1e-6) << where << " id " << x;
          if (q[x] < q_min[j] * 0.999) EXPECT_EQ(qk[x], 0.0f) << where << " id " << x;
          zeroed += q[x] > 0 && qk[x] == 0;
        }
        if (p_min >= 0.01f) EXPECT_GT(zeroed, 0) << where << ": nothing below the threshold was cut from q";
      }
      cut += want < static_cast<size_t>(k);
      const std::vector<DraftTree> again = propose(**d, seqs, k);
      EXPECT_EQ(again[0].tokens, got[0].tokens) << where << ": second call";
    }
  }
  EXPECT_GT(cut, 0) << "no threshold cut a sampled draft";
  // Greedy (the drafter reduces rows on the backend): prefixes, monotone in p_min.
  const std::vector<Seq> greedy = {{100, {5, 6, 7, 8}, 4, sampling(0, 0.0f)}, {101, {9, 3, 2}, 3, sampling(0, 0.0f)}};
  const std::vector<DraftTree> full = propose(*make_drafter(1.0, 0), greedy, k);
  std::vector<size_t> last = {static_cast<size_t>(k), static_cast<size_t>(k)};
  int greedy_cut = 0;
  for (float p_min : {0.0f, 0.01f, 0.05f, 0.1f, 0.2f, 0.4f, 1.0f}) {
    DrafterOptions o;
    o.draft_p_min = p_min;
    auto d = ModelDrafter::create(draft_model(), o);
    ASSERT_TRUE(d.ok());
    const std::vector<DraftTree> got = propose(**d, greedy, k);
    const std::vector<DraftTree> again = propose(**d, greedy, k);
    for (size_t s = 0; s < greedy.size(); ++s) {
      EXPECT_EQ(again[s].tokens, got[s].tokens) << "greedy second call, p_min " << p_min;
      const std::string where = "greedy seq " + std::to_string(s) + " p_min " + std::to_string(p_min);
      ASSERT_LE(got[s].tokens.size(), last[s]) << where;
      EXPECT_TRUE(std::equal(got[s].tokens.begin(), got[s].tokens.end(), full[s].tokens.begin())) << where;
      EXPECT_TRUE(got[s].probs.empty()) << where;
      if (p_min == 0.0f) EXPECT_EQ(got[s].tokens.size(), static_cast<size_t>(k)) << where;
      if (p_min == 1.0f) EXPECT_TRUE(got[s].tokens.empty()) << where;
      greedy_cut += !got[s].tokens.empty() && got[s].tokens.size() < static_cast<size_t>(k);
      last[s] = got[s].tokens.size();
    }
  }
  EXPECT_GT(greedy_cut, 0) << "no threshold cut a greedy draft part-way";
}

TEST(ModelDrafterSparse, CreateRejectsBadOptions) {
  for (double mass : {0.0, -0.1, 1.5, std::nan("")}) {
    DrafterOptions o;
    o.sparse_keep_mass = mass;
    auto d = ModelDrafter::create(draft_model(), o);
    ASSERT_FALSE(d.ok()) << mass;
    EXPECT_EQ(d.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(d.status().message().find("sparse_keep_mass"), std::string::npos) << d.status().message();
  }
  DrafterOptions o;
  o.sparse_max_entries = -1;
  auto d = ModelDrafter::create(draft_model(), o);
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find("sparse_max_entries = -1"), std::string::npos) << d.status().message();
  for (float p_min : {-0.5f, 1.5f, std::nanf("")}) {
    DrafterOptions po;
    po.draft_p_min = p_min;
    auto bad = ModelDrafter::create(draft_model(), po);
    ASSERT_FALSE(bad.ok()) << p_min;
    EXPECT_NE(bad.status().message().find("draft_p_min = "), std::string::npos) << bad.status().message();
  }
}

}  // namespace
}  // namespace specserve
