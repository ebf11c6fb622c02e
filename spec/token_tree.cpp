#include "spec/token_tree.h"

#include <algorithm>
#include <cctype>
#include <map>
#include <numeric>

namespace specserve {
namespace {

std::string path_text(const std::vector<int32_t>& p) {
  std::string s = "(";
  for (size_t i = 0; i < p.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(p[i]);
  }
  if (p.size() == 1) s += ",";
  return s + ")";
}

/// Recursive-descent reader of a list of lists of integers (Python literal syntax).
class TreeParser {
 public:
  TreeParser(std::string_view text, std::string_view what) : t_(text), what_(what) {}

  Expected<std::vector<std::vector<int32_t>>> parse() {
    std::vector<std::vector<int32_t>> paths;
    skip_ws();
    char close = 0;
    if (!open(&close)) return error("expected '[' or '(' to start the list of paths");
    skip_ws();
    while (!at(close)) {
      char inner_close = 0;
      const size_t path_at = i_;
      if (!open(&inner_close)) return error("expected '(' or '[' to start a path");
      std::vector<int32_t> path;
      skip_ws();
      while (!at(inner_close)) {
        const size_t num_at = i_;
        bool neg = false;
        if (i_ < t_.size() && (t_[i_] == '-' || t_[i_] == '+')) neg = t_[i_++] == '-';
        if (i_ >= t_.size() || !std::isdigit(static_cast<unsigned char>(t_[i_]))) {
          return error("expected a rank (a non-negative integer)");
        }
        int64_t v = 0;
        while (i_ < t_.size() && std::isdigit(static_cast<unsigned char>(t_[i_]))) {
          v = v * 10 + (t_[i_++] - '0');
          if (v > 1000000) return invalid_argument(std::string(what_) + ": rank " + std::string(t_.substr(num_at, i_ - num_at)) + "... at offset " + std::to_string(num_at) + " is too large");
        }
        if (neg && v != 0) {
          return invalid_argument(std::string(what_) + ": rank -" + std::to_string(v) + " at offset " + std::to_string(num_at) +
                                  " is negative (ranks are >= 0)");
        }
        path.push_back(static_cast<int32_t>(v));
        skip_ws();
        if (at(',')) {
          ++i_;
          skip_ws();
        } else if (!at(inner_close)) {
          return error(std::string("expected ',' or '") + inner_close + "' in a path");
        }
      }
      ++i_;  // inner close
      if (path.empty()) {
        return invalid_argument(std::string(what_) + ": empty path at offset " + std::to_string(path_at) +
                                " (the root is implicit; every path names at least one rank)");
      }
      paths.push_back(std::move(path));
      skip_ws();
      if (at(',')) {
        ++i_;
        skip_ws();
      } else if (!at(close)) {
        return error(std::string("expected ',' or '") + close + "' after a path");
      }
    }
    ++i_;
    skip_ws();
    if (i_ != t_.size()) return error("unexpected text after the list");
    if (paths.empty()) return invalid_argument(std::string(what_) + ": \"" + std::string(t_) + "\" holds no path");
    return paths;
  }

 private:
  bool at(char c) const { return i_ < t_.size() && t_[i_] == c; }
  void skip_ws() {
    while (i_ < t_.size() && std::isspace(static_cast<unsigned char>(t_[i_]))) ++i_;
  }
  bool open(char* close) {
    if (at('[')) *close = ']';
    else if (at('(')) *close = ')';
    else return false;
    ++i_;
    return true;
  }
  Status error(const std::string& msg) const {
    const std::string near = i_ < t_.size() ? "'" + std::string(t_.substr(i_, 12)) + "'" : "the end";
    return invalid_argument(std::string(what_) + ": " + msg + " at offset " + std::to_string(i_) + " (at " + near + ") of \"" +
                            std::string(t_) + "\"");
  }

  std::string_view t_;
  std::string_view what_;
  size_t i_ = 0;
};

}  // namespace

int32_t TokenTree::max_depth() const {
  int32_t d = 0;
  for (int32_t x : depths) d = std::max(d, x);
  return d;
}

std::string TokenTree::to_string() const {
  std::string s = "[";
  for (size_t i = 0; i < paths.size(); ++i) {
    if (i) s += ", ";
    s += path_text(paths[i]);
  }
  return s + "]";
}

Expected<TokenTree> token_tree_from_paths(const std::vector<std::vector<int32_t>>& paths, std::string_view what) {
  const std::string w(what);
  std::map<std::vector<int32_t>, int32_t> index;  // path -> written index
  for (size_t i = 0; i < paths.size(); ++i) {
    const auto& p = paths[i];
    if (p.empty()) return invalid_argument(w + ": path " + std::to_string(i) + " is empty (the root is implicit)");
    for (int32_t r : p) {
      if (r < 0) {
        return invalid_argument(w + ": path " + std::to_string(i) + " " + path_text(p) + " has rank " + std::to_string(r) +
                                " (ranks are >= 0)");
      }
    }
    auto [it, fresh] = index.emplace(p, static_cast<int32_t>(i));
    if (!fresh) {
      return invalid_argument(w + ": path " + std::to_string(i) + " " + path_text(p) + " repeats path " +
                              std::to_string(it->second));
    }
  }
  bool prefix_first = true;
  for (size_t i = 0; i < paths.size(); ++i) {
    const auto& p = paths[i];
    if (p.size() < 2) continue;
    const std::vector<int32_t> prefix(p.begin(), p.end() - 1);
    auto it = index.find(prefix);
    if (it == index.end()) {
      return invalid_argument(w + ": path " + std::to_string(i) + " " + path_text(p) + " lacks its prefix " + path_text(prefix) +
                              " (every prefix of a path must be in the tree)");
    }
    if (it->second > static_cast<int32_t>(i)) prefix_first = false;
  }
  std::vector<size_t> order(paths.size());
  std::iota(order.begin(), order.end(), 0);
  // NOTE: the written order is kept when it already lists ancestors first: published trees are
  // written by falling acceptance, so their first N nodes are the best N-node tree. Otherwise
  // breadth-first keeps the written preference within each depth.
  if (!prefix_first) {
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return paths[a].size() < paths[b].size(); });
  }
  TokenTree t;
  std::map<std::vector<int32_t>, int32_t> node_of;
  for (size_t i : order) {
    const auto& p = paths[i];
    const int32_t node = static_cast<int32_t>(t.paths.size());
    t.paths.push_back(p);
    t.depths.push_back(static_cast<int32_t>(p.size()));
    t.parents.push_back(p.size() == 1 ? -1 : node_of.at(std::vector<int32_t>(p.begin(), p.end() - 1)));
    node_of[p] = node;
  }
  return t;
}

Expected<TokenTree> parse_token_tree(std::string_view text, std::string_view what) {
  auto paths = TreeParser(text, what).parse();
  if (!paths.ok()) return paths.status();
  return token_tree_from_paths(*paths, what);
}

const std::vector<std::vector<int32_t>>& medusa_mc_sim_7b_63() {
  // FasterDecoding/Medusa, medusa/model/medusa_choices.py (commit 5e98053), `mc_sim_7b_63`.
  static const std::vector<std::vector<int32_t>> t = {
      {0},       {0, 0},    {1},       {0, 1},       {2},          {0, 0, 0},    {1, 0},    {0, 2},    {3},
      {0, 3},    {4},       {0, 4},    {2, 0},       {0, 5},       {0, 0, 1},    {5},       {0, 6},    {6},
      {0, 7},    {0, 1, 0}, {1, 1},    {7},          {0, 8},       {0, 0, 2},    {3, 0},    {0, 9},    {8},
      {9},       {1, 0, 0}, {0, 2, 0}, {1, 2},       {0, 0, 3},    {4, 0},       {2, 1},    {0, 0, 4}, {0, 0, 5},
      {0, 0, 0, 0}, {0, 1, 1}, {0, 0, 6}, {0, 3, 0}, {5, 0},       {1, 3},       {0, 0, 7}, {0, 0, 8}, {0, 0, 9},
      {6, 0},    {0, 4, 0}, {1, 4},    {7, 0},       {0, 1, 2},    {2, 0, 0},    {3, 1},    {2, 2},    {8, 0},
      {0, 5, 0}, {1, 5},    {1, 0, 1}, {0, 2, 1},    {9, 0},       {0, 6, 0},    {0, 0, 0, 1}, {1, 6}, {0, 7, 0},
  };
  return t;
}

TokenTree trim_token_tree(const TokenTree& tree, int32_t max_nodes) {
  const size_t n = static_cast<size_t>(std::clamp(max_nodes, 0, tree.num_nodes()));
  TokenTree t;
  t.paths.assign(tree.paths.begin(), tree.paths.begin() + static_cast<std::ptrdiff_t>(n));
  t.parents.assign(tree.parents.begin(), tree.parents.begin() + static_cast<std::ptrdiff_t>(n));
  t.depths.assign(tree.depths.begin(), tree.depths.begin() + static_cast<std::ptrdiff_t>(n));
  return t;
}

TokenTree default_medusa_tree(int32_t max_nodes) {
  static const TokenTree full = [] {
    auto t = token_tree_from_paths(medusa_mc_sim_7b_63(), "mc_sim_7b_63");
    SPECSERVE_CHECK(t.ok(), "mc_sim_7b_63 is a valid tree");
    return *t;
  }();
  return trim_token_tree(full, max_nodes);
}

TokenTree chain_token_tree(int32_t k) {
  std::vector<std::vector<int32_t>> paths;
  for (int32_t d = 1; d <= k; ++d) paths.push_back(std::vector<int32_t>(static_cast<size_t>(d), 0));
  auto t = token_tree_from_paths(paths);
  SPECSERVE_CHECK(t.ok(), "a chain is a valid tree");
  return *t;
}

}  // namespace specserve
