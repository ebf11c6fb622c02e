// specserve spec: static token trees — the shape of a speculative draft tree, written as a list
// of paths (Medusa's "choices", Cai et al. 2024; vLLM's `speculative_token_tree` string).
//
// A path (a, b, c) names the node reached from the last known token by taking the candidate of
// rank a at depth 1, then rank b among that node's children, then rank c: for Medusa the ranks
// are positions in each head's top-k, so node (0, 2) is "head 0's best token, then head 1's
// third best". The root (the last known token) is implicit and never written.
//
// Node order: a TokenTree keeps its nodes in the written order when every path's prefixes are
// written before it (true of Medusa's and vLLM's published trees, which list nodes by falling
// expected acceptance), otherwise in breadth-first order (a stable sort by depth, written order
// within a depth). Either way parents[i] < i, which is what the engine's DraftTree and the tree
// attention of the transformer need, and keeping the first N nodes keeps the tree prefix-closed
// (trim_token_tree).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace specserve {

/// A validated static tree of `num_nodes()` nodes.
struct TokenTree {
  /// [n] the path of each node (ranks, each >= 0), in node order; paths[i].size() = depths[i].
  std::vector<std::vector<int32_t>> paths;
  /// [n] the parent of each node: -1 for a child of the root (depth 1), else an earlier index.
  std::vector<int32_t> parents;
  /// [n] depth of each node, 1-based: a depth-d node's token is the d-th token after the last
  /// known one (so depth - 1 indexes SpecStats::accepted_per_pos).
  std::vector<int32_t> depths;

  int32_t num_nodes() const { return static_cast<int32_t>(paths.size()); }
  /// The deepest node's depth (0 for an empty tree).
  int32_t max_depth() const;
  /// The rank of node i among its parent's candidates (the last entry of its path).
  int32_t rank(int32_t i) const { return paths[static_cast<size_t>(i)].back(); }
  /// The tree in vLLM's syntax, e.g. "[(0,), (0, 0), (0, 1)]" (parses back to the same tree).
  std::string to_string() const;
};

/// Builds a tree from paths (Medusa choices). `what` names the setting in errors.
/// Errors (kInvalidArgument naming `what`, the path and its index): an empty path, a negative
/// rank, a path written twice, a path whose prefix is missing (e.g. (0, 1) without (0,)).
Expected<TokenTree> token_tree_from_paths(const std::vector<std::vector<int32_t>>& paths,
                                          std::string_view what = "token tree");

/// Parses vLLM's `speculative_token_tree` string, "[(0,), (0, 0), (0, 1)]", or Medusa's list of
/// lists, "[[0], [0, 0], [0, 1]]" (either brackets or parentheses at each level, Python's
/// trailing commas and whitespace allowed), then validates as token_tree_from_paths.
/// Errors (kInvalidArgument naming `what` and the offending text or value): syntax (with the
/// character offset), a rank that is not a non-negative integer, an empty list, and those of
/// token_tree_from_paths.
Expected<TokenTree> parse_token_tree(std::string_view text, std::string_view what = "speculative_token_tree");

/// Medusa's default 63-node tree `mc_sim_7b_63` (medusa/model/medusa_choices.py of
/// FasterDecoding/Medusa, found by simulating acceptance of Vicuna-7B heads), in its order.
const std::vector<std::vector<int32_t>>& medusa_mc_sim_7b_63();

/// The first `max_nodes` nodes of `tree` in its order (all of them when it has fewer; none when
/// max_nodes <= 0): still prefix-closed, since a node's ancestors come before it.
TokenTree trim_token_tree(const TokenTree& tree, int32_t max_nodes);

/// mc_sim_7b_63 trimmed to `max_nodes` nodes.
TokenTree default_medusa_tree(int32_t max_nodes);

/// A chain of `k` nodes: (0,), (0, 0), ... (what vLLM's speculative_token_tree defaults to).
TokenTree chain_token_tree(int32_t k);

}  // namespace specserve
