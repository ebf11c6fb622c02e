// Tree verification logic (spec/tree_verify.h) on hand-made distributions: draft validation,
// tree indexing, greedy longest path, multi-candidate recursive rejection sampling over the
// children of a vertex (the emitted token follows p exactly, for deterministic and for sampled
// siblings), Medusa's typical acceptance, and the KV moves of path compaction.
#include "spec/tree_verify.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>
#include <random>
#include <string>

namespace specserve {
namespace {

using Ints = std::vector<int32_t>;

TEST(TreeVerify, ValidatesDrafts) {
  DraftTree d;
  d.tokens = {1, 2, 3};
  EXPECT_TRUE(validate_draft_tree(d, 3, 10).ok());
  d.parents = {-1, -1, 1};
  EXPECT_TRUE(validate_draft_tree(d, 3, 10).ok());
  auto msg = [&](int32_t max_nodes, int64_t vocab) { return validate_draft_tree(d, max_nodes, vocab).message(); };
  EXPECT_NE(msg(2, 10).find("exceed the budget of 2"), std::string::npos) << msg(2, 10);
  d.source = static_cast<DraftSource>(kNumDraftSources);  // a value no proposer may send
  EXPECT_NE(msg(3, 10).find("source = 3"), std::string::npos) << msg(3, 10);
  d.source = DraftSource::kCachedRequests;
  EXPECT_NE(msg(3, 3).find("tokens[2] = 3"), std::string::npos) << msg(3, 3);
  d.parents = {-1, 1, 0};
  EXPECT_NE(msg(3, 10).find("parents[1] = 1"), std::string::npos) << msg(3, 10);
  d.parents = {-2, 0, 0};
  EXPECT_NE(msg(3, 10).find("parents[0] = -2"), std::string::npos) << msg(3, 10);
  d.parents = {-1, 0};
  EXPECT_NE(msg(3, 10).find("parents: 2 entries for 3 tokens"), std::string::npos) << msg(3, 10);
  d.parents = {-1, 0, 0};
  d.probs.assign(3, std::vector<float>(9, 0.0f));
  EXPECT_NE(msg(3, 10).find("probs[0]: 9 entries"), std::string::npos) << msg(3, 10);
  d.probs.assign(2, std::vector<float>(10, 0.0f));
  EXPECT_NE(msg(3, 10).find("probs: 2 rows for 3 tokens"), std::string::npos) << msg(3, 10);
  EXPECT_EQ(validate_draft_tree(d, 3, 10).code(), StatusCode::kInvalidArgument);
}

// Tree used below (node: token):      root
//                                  /    |     \
//                              0:5    1:7    2:5 (duplicate of node 0)
//                             /   \     |
//                          3:3   4:4   5:9
//                           |
//                          6:8
const Ints kParents = {-1, -1, -1, 0, 0, 1, 3};
const Ints kTokens = {5, 7, 5, 3, 4, 9, 8};

TEST(TreeVerify, IndexesChildrenDepthsAndPaths) {
  const TreeIndex t = index_tree(kParents);
  EXPECT_EQ(t.num_nodes(), 7);
  EXPECT_EQ(Ints(t.children_of(-1).begin(), t.children_of(-1).end()), (Ints{0, 1, 2}));
  EXPECT_EQ(Ints(t.children_of(0).begin(), t.children_of(0).end()), (Ints{3, 4}));
  EXPECT_TRUE(t.children_of(6).empty());
  EXPECT_EQ(t.depth, (Ints{1, 1, 1, 2, 2, 2, 3}));
  EXPECT_EQ(t.path_to(6), (Ints{0, 3, 6}));
  EXPECT_TRUE(t.path_to(-1).empty());
}

TEST(TreeVerify, GreedyTakesTheLongestMatchingPath) {
  const TreeIndex t = index_tree(kParents);
  // vertex_argmax: [root, node 0 .. node 6]
  EXPECT_EQ(greedy_accept_path(t, kTokens, Ints{5, 3, 0, 0, 8, 0, 0, 1}), (Ints{0, 3, 6}));  // full depth 3
  EXPECT_EQ(greedy_accept_path(t, kTokens, Ints{5, 4, 0, 0, 8, 0, 0, 1}), (Ints{0, 4}));     // second branch
  EXPECT_EQ(greedy_accept_path(t, kTokens, Ints{7, 3, 9, 0, 0, 0, 0, 0}), (Ints{1, 5}));     // off the first branch
  EXPECT_EQ(greedy_accept_path(t, kTokens, Ints{7, 3, 2, 0, 0, 0, 0, 0}), (Ints{1}));        // node 5 rejected
  EXPECT_EQ(greedy_accept_path(t, kTokens, Ints{6, 3, 9, 0, 0, 0, 0, 0}), Ints{});           // nothing
  EXPECT_EQ(greedy_child(t, kTokens, -1, 5), 0) << "duplicate siblings: the first wins";
  EXPECT_EQ(greedy_child(t, kTokens, 6, 8), -1) << "a leaf has no children";
}

/// Draws `n` verdicts at one vertex and checks that the emitted token follows `p`: every
/// count within 5 standard deviations (and 0 where p is 0). Returns how often each child was
/// accepted ([children.size() + 1], last = none).
std::vector<int64_t> check_emits_p(const std::vector<float>& p, const Ints& children, const Ints& tokens,
                                   const std::function<std::vector<std::vector<float>>(std::mt19937_64&, Ints*)>& draw,
                                   int n, uint64_t seed) {
  SamplingParams sp;
  sp.temperature = 1.0f;
  sp.seed = seed;
  sp.has_seed = true;
  Sampler smp(sp);
  std::mt19937_64 proposal_rng(seed * 7 + 1);
  std::vector<int64_t> counts(p.size(), 0), by_child(children.size() + 1, 0);
  Ints toks = tokens;
  for (int i = 0; i < n; ++i) {
    std::vector<std::vector<float>> probs = draw ? draw(proposal_rng, &toks) : std::vector<std::vector<float>>{};
    std::vector<float> pv = p;
    const NodeVerdict v = rejection_sample_children(children, toks, probs, &pv, smp);
    EXPECT_GE(v.token, 0);
    ++counts[static_cast<size_t>(v.token)];
    if (v.child >= 0) {
      EXPECT_EQ(v.token, toks[static_cast<size_t>(v.child)]);
      const auto it = std::find(children.begin(), children.end(), v.child);
      ++by_child[static_cast<size_t>(it - children.begin())];
    } else {
      ++by_child.back();
    }
  }
  for (size_t t = 0; t < p.size(); ++t) {
    const double e = n * static_cast<double>(p[t]);
    const double sd = std::sqrt(n * static_cast<double>(p[t]) * (1.0 - p[t]));
    EXPECT_LE(std::abs(static_cast<double>(counts[t]) - e), 5 * sd + 1e-9) << "token " << t << ": " << counts[t] << " vs " << e;
  }
  return by_child;
}

const std::vector<float> kP = {0.30f, 0.05f, 0.25f, 0.0f, 0.15f, 0.25f};

TEST(TreeVerify, RejectionOverDeterministicSiblingsIsLossless) {
  // Siblings 0, 1, 2 with tokens 2, 0, 3 (token 3 has p = 0): q one-hot on each, so the siblings
  // are drawn without replacement: child 0 with p(2), child 1 with p(0) / (1 - p(2)) of the rest...
  const Ints tokens = {2, 0, 3};
  const int n = 200000;
  const auto by_child = check_emits_p(kP, {0, 1, 2}, tokens, nullptr, n, 11);
  EXPECT_NEAR(by_child[0] / double(n), 0.25, 0.005);
  EXPECT_NEAR(by_child[1] / double(n), 0.30, 0.005);
  EXPECT_EQ(by_child[2], 0) << "a token the target rules out is never accepted";
  EXPECT_NEAR(by_child[3] / double(n), 0.45, 0.005);
}

TEST(TreeVerify, RejectionOverDuplicateSiblingsIsLossless) {
  // The same token twice: once rejected, its residual is 0, so the duplicate never passes.
  const auto by_child = check_emits_p(kP, {0, 1}, {0, 0}, nullptr, 100000, 12);
  EXPECT_EQ(by_child[1], 0);
  EXPECT_NEAR(by_child[0] / 100000.0, 0.30, 0.006);
}

TEST(TreeVerify, RejectionOverSampledSiblingsIsLossless) {
  // Each of three siblings drawn independently from its own q (two share one q, SpecInfer's
  // i.i.d. case; the third has another): the emitted token must still follow p.
  const std::vector<float> qa = {0.05f, 0.40f, 0.05f, 0.30f, 0.10f, 0.10f};
  const std::vector<float> qb = {0.50f, 0.0f, 0.0f, 0.0f, 0.0f, 0.50f};
  auto draw = [&](std::mt19937_64& rng, Ints* toks) {
    std::discrete_distribution<int32_t> da(qa.begin(), qa.end()), db(qb.begin(), qb.end());
    *toks = {da(rng), da(rng), db(rng)};
    return std::vector<std::vector<float>>{qa, qa, qb};
  };
  const int n = 200000;
  const auto by_child = check_emits_p(kP, {0, 1, 2}, {0, 0, 0}, draw, n, 13);
  EXPECT_GT(by_child[0], n / 10);
  EXPECT_GT(by_child[1], n / 50) << "the second sibling gets chances after the first is rejected";
  EXPECT_GT(by_child[2], n / 50);
  EXPECT_GT(by_child[3], n / 50) << "and sometimes none passes: recovered tokens";
}

TEST(TreeVerify, RejectionPowerCheck) {
  // The same check catches a verifier that does not update p after a rejection (it would
  // accept the second sibling with p(x) instead of the residual): emulated by verifying each
  // child against the original p and emitting the first accepted one.
  const Ints tokens = {2, 0};
  SamplingParams sp;
  sp.temperature = 1.0f;
  sp.seed = 99;
  sp.has_seed = true;
  Sampler smp(sp);
  const int n = 100000;
  int64_t zero = 0;
  for (int i = 0; i < n; ++i) {
    std::vector<float> pv = kP;
    NodeVerdict v = rejection_sample_children(Ints{0}, tokens, {}, &pv, smp);
    if (v.child < 0) {
      std::vector<float> again = kP;  // wrong: the original p, not the residual
      v = rejection_sample_children(Ints{1}, tokens, {}, &again, smp);
    }
    zero += v.token == 0;
  }
  // Correct: P(token 0) = 0.30. The broken variant gives 0.75 * 0.30 + (residual draws) > 0.30.
  const double sd = std::sqrt(n * 0.3 * 0.7);
  EXPECT_GT(std::abs(zero - n * 0.30), 5 * sd) << "the broken verifier is indistinguishable: the check has no power";
}

TEST(TreeVerify, LeafSamplesTheBonusFromP) {
  check_emits_p(kP, {}, {}, nullptr, 100000, 14);
}

TEST(TreeVerify, TypicalThreshold) {
  TypicalAcceptanceParams tp;  // 0.09, 0.3
  // One-hot: entropy 0 -> min(0.09, 0.3) = 0.09.
  EXPECT_NEAR(typical_threshold(std::vector<float>{1, 0, 0}, tp), 0.09, 1e-7);
  // Uniform over 8: entropy ln 8 -> 0.3 / 8 = 0.0375.
  EXPECT_NEAR(typical_threshold(std::vector<float>(8, 0.125f), tp), 0.0375, 1e-7);
}

TEST(TreeVerify, TypicalAcceptanceTakesTheLongestTypicalPath) {
  const TreeIndex t = index_tree(kParents);
  // Distributions over 10 tokens at each vertex; peaked ones (threshold 0.09).
  auto peaked = [](std::vector<std::pair<int, float>> mass) {
    std::vector<float> p(10, 0.0f);
    float rest = 1.0f;
    for (auto [tok, m] : mass) p[static_cast<size_t>(tok)] = m, rest -= m;
    for (float& x : p) if (x == 0.0f) x = rest / 10.0f;
    float s = 0;
    for (float x : p) s += x;
    for (float& x : p) x /= s;
    return p;
  };
  std::vector<std::vector<float>> vp(8, peaked({}));
  vp[0] = peaked({{5, 0.5f}, {7, 0.4f}});  // root: nodes 0 (5), 1 (7), 2 (5) pass
  vp[1] = peaked({{3, 0.6f}});             // node 0: node 3 (3) passes, node 4 (4) does not
  vp[2] = peaked({{9, 0.6f}});             // node 1: node 5 (9) passes
  vp[4] = peaked({{1, 0.9f}});             // node 3: node 6 (8) fails
  // Depth-2 paths 0-3 and 1-5; 0-3 has the larger likelihood (0.5 * 0.6 > 0.4 * 0.6).
  EXPECT_EQ(typical_accept_path(t, kTokens, vp, {}), (Ints{0, 3}));
  vp[4] = peaked({{8, 0.2f}});             // now node 6 passes: depth 3 wins
  EXPECT_EQ(typical_accept_path(t, kTokens, vp, {}), (Ints{0, 3, 6}));
  vp[0] = peaked({{7, 0.9f}});             // root: only node 1 passes
  EXPECT_EQ(typical_accept_path(t, kTokens, vp, {}), (Ints{1, 5}));
  vp[0] = peaked({{1, 0.95f}});            // nothing passes at the root
  EXPECT_EQ(typical_accept_path(t, kTokens, vp, {}), Ints{});
}

TEST(TreeVerify, CompactionMovesBringThePathToConsecutiveRows) {
  EXPECT_TRUE(compaction_moves(Ints{0, 1, 2}).empty()) << "a first-branch chain is in place";
  using Moves = std::vector<std::pair<int32_t, int32_t>>;
  EXPECT_EQ(compaction_moves(Ints{1, 2}), (Moves{{2, 1}, {3, 2}}));
  EXPECT_EQ(compaction_moves(Ints{0, 3}), (Moves{{4, 2}}));
  EXPECT_EQ(compaction_moves(Ints{1, 5}), (Moves{{2, 1}, {6, 2}}));
  // Every path of random trees: applying the moves in order to rows holding node ids leaves
  // rows 1..m = the path.
  std::mt19937 rng(5);
  for (int trial = 0; trial < 2000; ++trial) {
    const int n = 1 + static_cast<int>(rng() % 12);
    Ints parents;
    for (int i = 0; i < n; ++i) parents.push_back(static_cast<int32_t>(rng() % (i + 1)) - 1);
    const TreeIndex t = index_tree(parents);
    const int32_t leaf = static_cast<int32_t>(rng() % n);
    const Ints path = t.path_to(leaf);
    Ints rows(static_cast<size_t>(n + 1));
    std::iota(rows.begin(), rows.end(), -1);  // row r holds vertex r - 1
    for (auto [from, to] : compaction_moves(path)) rows[static_cast<size_t>(to)] = rows[static_cast<size_t>(from)];
    for (size_t j = 0; j < path.size(); ++j) ASSERT_EQ(rows[j + 1], path[j]) << "trial " << trial;
  }
}

}  // namespace
}  // namespace specserve
