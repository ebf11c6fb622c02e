// specserve spec: verification of a draft token tree — the pure decisions the Engine takes after
// one target forward over the last known token (the root) and every tree node.
//
// Vertices: the root is vertex -1 (row 0 of the verify forward: the last known token); node i of
// the tree is vertex i (row i + 1). The target's distribution at a vertex is that of the token
// after it, so a vertex's children are checked against it.
//
// - Greedy: the longest path whose every node is the target's argmax at its parent (walk from
//   the root, take the child equal to the argmax, stop when there is none); the target's argmax
//   at the last accepted vertex is the bonus token. Token-for-token equal to plain decoding.
// - Sampling: multi-candidate recursive rejection sampling over the children of each vertex
//   (SpecInfer, Miao et al. 2024, Algorithm "multi-step speculative sampling"; EAGLE's
//   evaluate_posterior): child c (token x, drawn from q_c) is accepted with probability
//   min(1, p(x) / q_c(x)); on rejection p <- norm(max(0, p - q_c)) and the next child is tried;
//   if none is accepted the recovered token is drawn from what is left of p. A deterministic
//   proposer (no q) has q_c one-hot on x: siblings are then drawn without replacement. Lossless:
//   the emitted token follows p whatever the proposals, provided each child's token was drawn
//   from its q_c independently of its earlier siblings (or picked deterministically).
// - Typical acceptance (Medusa, Cai et al. 2024, section 2.3.1; medusa/model/utils.py
//   evaluate_posterior): a child passes when p(x) > min(posterior_threshold,
//   posterior_alpha * exp(-H(p))); the longest path of passing nodes wins (ties: the larger sum
//   of log p, then the earlier node). LOSSY: the output no longer follows the target's
//   distribution; it is an explicit option, off by default.
// - Compaction: the accepted path's KV is moved to consecutive rows after the root.
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "core/status.h"
#include "model/sampling.h"
#include "spec/proposer.h"

namespace specserve {

/// Children and depths of a draft tree given by its parents (spec/proposer.h DraftTree).
struct TreeIndex {
  /// [n + 1] children in node order: children[0] the root's, children[i + 1] node i's.
  std::vector<std::vector<int32_t>> children;
  /// [n] depth of each node, 1-based (a root child has depth 1).
  std::vector<int32_t> depth;
  /// [n] parent of each node (-1: the root).
  std::vector<int32_t> parent;
  int32_t num_nodes() const { return static_cast<int32_t>(depth.size()); }
  /// Children of vertex `v` (-1: the root).
  std::span<const int32_t> children_of(int32_t v) const { return children[static_cast<size_t>(v + 1)]; }
  /// Nodes from depth 1 down to `v` (empty for the root).
  std::vector<int32_t> path_to(int32_t v) const;
};

/// Checks a proposer's draft: at most `max_nodes` tokens, each in [0, vocab); parents empty (a
/// chain) or one per token with parents[i] in [-1, i); probs empty or one dense [vocab] row per
/// token. Errors: kInvalidArgument naming the field, index and value.
Status validate_draft_tree(const DraftTree& draft, int32_t max_nodes, int64_t vocab);

/// Indexes a tree whose parents passed validate_draft_tree (a broken one aborts).
TreeIndex index_tree(std::span<const int32_t> parents);

/// Greedy verification at vertex `v`: the first child whose token is `target_token` (the
/// target's argmax at v), or -1 when none is.
int32_t greedy_child(const TreeIndex& tree, std::span<const int32_t> tokens, int32_t v, int32_t target_token);

/// The whole greedy walk: `vertex_argmax` [n + 1] is the target's argmax at each vertex (index 0
/// the root, i + 1 node i). Returns the accepted nodes from depth 1 on; the bonus token is
/// vertex_argmax at the last of them (or the root's).
std::vector<int32_t> greedy_accept_path(const TreeIndex& tree, std::span<const int32_t> tokens,
                                        std::span<const int32_t> vertex_argmax);

/// What the verifier decided at one vertex.
struct NodeVerdict {
  int32_t child = -1;  ///< the accepted child, or -1: `token` is the recovered (or bonus) token
  int32_t token = -1;  ///< the token emitted after the vertex
};

/// Multi-candidate recursive rejection sampling over `children` (node indices into `tokens`) of
/// one vertex. `p` [vocab]: the target's distribution there (non-negative, summing to 1); it is
/// consumed (left as the residual). `probs`: the draft's q per node (dense [vocab] each), or
/// empty for a deterministic proposer (q one-hot on each child's token). Draws one uniform per
/// child tried, plus one (Sampler::sample_from) when no child is accepted — a leaf draws only
/// the bonus token. With one child this is Leviathan et al.'s rule exactly.
NodeVerdict rejection_sample_children(std::span<const int32_t> children, std::span<const int32_t> tokens,
                                      const std::vector<std::vector<float>>& probs, std::vector<float>* p, Sampler& sampler);

/// Medusa's typical acceptance settings (its defaults).
struct TypicalAcceptanceParams {
  float posterior_threshold = 0.09f;  ///< epsilon: the hard threshold, in (0, 1]
  float posterior_alpha = 0.3f;       ///< delta: weight of exp(-entropy), >= 0 (Medusa: sqrt(epsilon))
};

/// min(posterior_threshold, posterior_alpha * exp(-H(p))), H in nats of `p` [vocab].
double typical_threshold(std::span<const float> p, const TypicalAcceptanceParams& params);

/// Typical acceptance over the whole tree: `vertex_probs` [n + 1] the target's distribution at
/// each vertex (0 the root). Returns the accepted nodes from depth 1 on (see the file comment).
std::vector<int32_t> typical_accept_path(const TreeIndex& tree, std::span<const int32_t> tokens,
                                         const std::vector<std::vector<float>>& vertex_probs,
                                         const TypicalAcceptanceParams& params);

/// KV moves that compact an accepted path: node path[j] was computed at row path[j] + 1 after
/// the root and belongs at row j + 1. Returns (from_row, to_row) pairs relative to the root's
/// row, for the nodes not already in place, in path order. Sources never precede destinations
/// (a node's index is at least its depth - 1), and each source is read before any later move
/// writes it, so applying them one after the other in this order is safe.
std::vector<std::pair<int32_t, int32_t>> compaction_moves(std::span<const int32_t> path);

}  // namespace specserve
