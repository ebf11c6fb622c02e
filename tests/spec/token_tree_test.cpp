// Static token trees (spec/token_tree.h): parsing vLLM's speculative_token_tree and Medusa's
// choices, validation errors that name the offending value, parents/depths, node order,
// mc_sim_7b_63 and trimming to a node budget.
#include "spec/token_tree.h"

#include <gtest/gtest.h>

#include <set>

namespace specserve {
namespace {

using Paths = std::vector<std::vector<int32_t>>;

TEST(TokenTree, ParsesVllmSyntax) {
  auto t = parse_token_tree("[(0,), (0, 0), (0, 1)]");
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  EXPECT_EQ(t->paths, (Paths{{0}, {0, 0}, {0, 1}}));
  EXPECT_EQ(t->parents, (std::vector<int32_t>{-1, 0, 0}));
  EXPECT_EQ(t->depths, (std::vector<int32_t>{1, 2, 2}));
  EXPECT_EQ(t->num_nodes(), 3);
  EXPECT_EQ(t->max_depth(), 2);
  EXPECT_EQ(t->rank(2), 1);
  EXPECT_EQ(t->to_string(), "[(0,), (0, 0), (0, 1)]");
}

TEST(TokenTree, ParsesMedusaListsAndPythonLiterals) {
  for (const char* text : {"[[0],[0,0],[1],[0,1]]", " ( (0,) , [0,0,], (1), [0, 1] , ) ", "[(0,),(0,0),(1,),(0,1)]"}) {
    auto t = parse_token_tree(text);
    ASSERT_TRUE(t.ok()) << text << ": " << t.status().to_string();
    EXPECT_EQ(t->paths, (Paths{{0}, {0, 0}, {1}, {0, 1}})) << text;
    EXPECT_EQ(t->parents, (std::vector<int32_t>{-1, 0, -1, 0})) << text;
  }
}

TEST(TokenTree, RoundTripsThroughToString) {
  const TokenTree a = default_medusa_tree(63);
  auto b = parse_token_tree(a.to_string());
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  EXPECT_EQ(b->paths, a.paths);
  EXPECT_EQ(b->parents, a.parents);
}

void expect_error(const std::string& text, const std::vector<std::string>& needles) {
  auto t = parse_token_tree(text, "speculative_token_tree");
  ASSERT_FALSE(t.ok()) << text << " parsed";
  EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument) << text;
  const std::string msg = t.status().message();
  EXPECT_NE(msg.find("speculative_token_tree"), std::string::npos) << msg;
  for (const auto& n : needles) EXPECT_NE(msg.find(n), std::string::npos) << text << " -> " << msg << " lacks " << n;
}

TEST(TokenTree, ErrorsNameTheOffendingValue) {
  expect_error("[(0,), (0, 1, 0)]", {"(0, 1, 0)", "lacks its prefix (0, 1)"});
  expect_error("[(0, 0)]", {"(0, 0)", "prefix (0,)"});
  expect_error("[(0,), (0,)]", {"path 1 (0,)", "repeats path 0"});
  expect_error("[(0,), (0, -2)]", {"rank -2", "negative"});
  expect_error("[(0,), ()]", {"empty path"});
  expect_error("[]", {"no path"});
  expect_error("[(0,), (a,)]", {"expected a rank", "offset 8"});
  expect_error("[(0,) (1,)]", {"expected ','"});
  expect_error("[(0,), (1,)] x", {"unexpected text"});
  expect_error("(0,)", {"expected '(' or '['"});
  expect_error("[(0,), (1.5,)]", {"expected ','"});
  expect_error("[(0,), (99999999,)]", {"too large"});
  // token_tree_from_paths names the index too.
  auto t = token_tree_from_paths(Paths{{0}, {1, 3}}, "medusa choices");
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("medusa choices: path 1 (1, 3) lacks its prefix (1,)"), std::string::npos)
      << t.status().message();
}

TEST(TokenTree, PrefixAfterPathGivesBreadthFirstOrder) {
  // (0, 0) is written before its prefix (0,): the tree is reordered by depth (stable).
  auto t = parse_token_tree("[(0, 0), (1,), (0,), (1, 0), (0, 0, 0)]");
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  EXPECT_EQ(t->paths, (Paths{{1}, {0}, {0, 0}, {1, 0}, {0, 0, 0}}));
  EXPECT_EQ(t->parents, (std::vector<int32_t>{-1, -1, 1, 0, 2}));
  EXPECT_EQ(t->depths, (std::vector<int32_t>{1, 1, 2, 2, 3}));
}

/// Every node's parent is earlier, its path is its parent's path plus one rank, depth fits.
void expect_consistent(const TokenTree& t) {
  ASSERT_EQ(t.parents.size(), t.paths.size());
  ASSERT_EQ(t.depths.size(), t.paths.size());
  std::set<std::vector<int32_t>> seen;
  for (int32_t i = 0; i < t.num_nodes(); ++i) {
    const auto& p = t.paths[static_cast<size_t>(i)];
    EXPECT_TRUE(seen.insert(p).second);
    EXPECT_EQ(t.depths[static_cast<size_t>(i)], static_cast<int32_t>(p.size()));
    const int32_t par = t.parents[static_cast<size_t>(i)];
    EXPECT_LT(par, i);
    if (p.size() == 1) {
      EXPECT_EQ(par, -1);
    } else {
      ASSERT_GE(par, 0);
      EXPECT_EQ(t.paths[static_cast<size_t>(par)], std::vector<int32_t>(p.begin(), p.end() - 1));
    }
  }
}

TEST(TokenTree, MedusaDefaultTree) {
  const auto& choices = medusa_mc_sim_7b_63();
  ASSERT_EQ(choices.size(), 63u);
  EXPECT_EQ(choices.front(), (std::vector<int32_t>{0}));
  EXPECT_EQ(choices.back(), (std::vector<int32_t>{0, 7, 0}));
  const TokenTree t = default_medusa_tree(63);
  EXPECT_EQ(t.paths, choices) << "mc_sim_7b_63 lists ancestors first: its written order is kept";
  expect_consistent(t);
  EXPECT_EQ(t.max_depth(), 4);
  int depth1 = 0;
  for (int32_t d : t.depths) depth1 += d == 1;
  EXPECT_EQ(depth1, 10) << "top-10 of head 0";
  EXPECT_EQ(default_medusa_tree(100).num_nodes(), 63);
}

TEST(TokenTree, TrimKeepsPrefixClosedTrees) {
  for (int32_t n = 0; n <= 63; ++n) {
    const TokenTree t = default_medusa_tree(n);
    ASSERT_EQ(t.num_nodes(), n);
    expect_consistent(t);
    // Still a valid tree by the parser's rules.
    auto again = token_tree_from_paths(t.paths);
    if (n > 0) {
      ASSERT_TRUE(again.ok()) << n << ": " << again.status().to_string();
      EXPECT_EQ(again->parents, t.parents);
    }
  }
  const TokenTree t4 = default_medusa_tree(4);
  EXPECT_EQ(t4.paths, (Paths{{0}, {0, 0}, {1}, {0, 1}}));
  EXPECT_EQ(t4.parents, (std::vector<int32_t>{-1, 0, -1, 0}));
  EXPECT_EQ(trim_token_tree(t4, -3).num_nodes(), 0);
}

TEST(TokenTree, Chain) {
  const TokenTree c = chain_token_tree(4);
  EXPECT_EQ(c.parents, (std::vector<int32_t>{-1, 0, 1, 2}));
  EXPECT_EQ(c.depths, (std::vector<int32_t>{1, 2, 3, 4}));
  EXPECT_EQ(c.to_string(), "[(0,), (0, 0), (0, 0, 0), (0, 0, 0, 0)]");
}

}  // namespace
}  // namespace specserve
