#include "spec/tree_verify.h"

#include <algorithm>
#include <cmath>
#include <string>

namespace specserve {

std::vector<int32_t> TreeIndex::path_to(int32_t v) const {
  std::vector<int32_t> path;
  for (; v >= 0; v = parent[static_cast<size_t>(v)]) path.push_back(v);
  std::reverse(path.begin(), path.end());
  return path;
}

Status validate_draft_tree(const DraftTree& d, int32_t max_nodes, int64_t vocab) {
  const size_t n = d.tokens.size();
  if (static_cast<int>(d.source) >= kNumDraftSources) {
    return invalid_argument("source = " + std::to_string(static_cast<int>(d.source)) + " is not a DraftSource");
  }
  if (static_cast<int64_t>(n) > max_nodes) {
    return invalid_argument("tokens: " + std::to_string(n) + " draft tokens exceed the budget of " + std::to_string(max_nodes));
  }
  for (size_t i = 0; i < n; ++i) {
    if (d.tokens[i] < 0 || d.tokens[i] >= vocab) {
      return invalid_argument("tokens[" + std::to_string(i) + "] = " + std::to_string(d.tokens[i]) +
                              " is outside the vocabulary (size " + std::to_string(vocab) + ")");
    }
  }
  if (!d.parents.empty()) {
    if (d.parents.size() != n) {
      return invalid_argument("parents: " + std::to_string(d.parents.size()) + " entries for " + std::to_string(n) + " tokens");
    }
    for (size_t i = 0; i < n; ++i) {
      if (d.parents[i] < -1 || d.parents[i] >= static_cast<int32_t>(i)) {
        return invalid_argument("parents[" + std::to_string(i) + "] = " + std::to_string(d.parents[i]) +
                                " is not -1 (the last known token) nor an earlier node");
      }
    }
  }
  if (!d.probs.empty()) {
    if (d.probs.size() != n) {
      return invalid_argument("probs: " + std::to_string(d.probs.size()) + " rows for " + std::to_string(n) + " tokens");
    }
    for (size_t i = 0; i < n; ++i) {
      if (static_cast<int64_t>(d.probs[i].size()) != vocab) {
        return invalid_argument("probs[" + std::to_string(i) + "]: " + std::to_string(d.probs[i].size()) +
                                " entries, the vocabulary has " + std::to_string(vocab));
      }
    }
  }
  return Status();
}

TreeIndex index_tree(std::span<const int32_t> parents) {
  TreeIndex t;
  const int32_t n = static_cast<int32_t>(parents.size());
  t.children.resize(static_cast<size_t>(n + 1));
  t.depth.resize(static_cast<size_t>(n));
  t.parent.assign(parents.begin(), parents.end());
  for (int32_t i = 0; i < n; ++i) {
    const int32_t p = parents[static_cast<size_t>(i)];
    SPECSERVE_CHECK(p >= -1 && p < i, "parents[" + std::to_string(i) + "] = " + std::to_string(p) + " is not an earlier node");
    t.depth[static_cast<size_t>(i)] = p < 0 ? 1 : t.depth[static_cast<size_t>(p)] + 1;
    t.children[static_cast<size_t>(p + 1)].push_back(i);
  }
  return t;
}

int32_t greedy_child(const TreeIndex& tree, std::span<const int32_t> tokens, int32_t v, int32_t target_token) {
  for (int32_t c : tree.children_of(v)) {
    if (tokens[static_cast<size_t>(c)] == target_token) return c;
  }
  return -1;
}

std::vector<int32_t> greedy_accept_path(const TreeIndex& tree, std::span<const int32_t> tokens,
                                        std::span<const int32_t> vertex_argmax) {
  std::vector<int32_t> path;
  int32_t v = -1;
  for (;;) {
    const int32_t c = greedy_child(tree, tokens, v, vertex_argmax[static_cast<size_t>(v + 1)]);
    if (c < 0) return path;
    path.push_back(c);
    v = c;
  }
}

NodeVerdict rejection_sample_children(std::span<const int32_t> children, std::span<const int32_t> tokens,
                                      const std::vector<std::vector<float>>& probs, std::vector<float>* p_io, Sampler& sampler) {
  std::vector<float>& p = *p_io;
  const size_t vocab = p.size();
  NodeVerdict v;
  // NOTE: if rounding ever leaves no residual mass (p == q up to float error), the untouched p
  // is the fallback, as the chain verifier does.
  std::vector<float> original;
  for (int32_t c : children) {
    const int32_t x = tokens[static_cast<size_t>(c)];
    const float qx = probs.empty() ? 1.0f : probs[static_cast<size_t>(c)][static_cast<size_t>(x)];
    const double u = sampler.next_uniform();
    if (qx > 0.0f && u * qx < p[static_cast<size_t>(x)]) {
      v.child = c;
      v.token = x;
      return v;
    }
    if (original.empty()) original = p;
    // Rejected: p <- norm(max(0, p - q_c)).
    if (probs.empty()) {
      p[static_cast<size_t>(x)] = 0.0f;
    } else {
      const std::vector<float>& q = probs[static_cast<size_t>(c)];
      for (size_t t = 0; t < vocab; ++t) p[t] = std::max(0.0f, p[t] - q[t]);
    }
    double mass = 0;
    for (float f : p) mass += f;
    if (!(mass > 0)) {
      p = original;
      break;
    }
    const float inv = static_cast<float>(1.0 / mass);
    for (float& f : p) f *= inv;
  }
  v.token = sampler.sample_from(p);
  return v;
}

double typical_threshold(std::span<const float> p, const TypicalAcceptanceParams& params) {
  double h = 0;
  for (float f : p) {
    if (f > 0) h -= static_cast<double>(f) * std::log(static_cast<double>(f));
  }
  return std::min(static_cast<double>(params.posterior_threshold), static_cast<double>(params.posterior_alpha) * std::exp(-h));
}

std::vector<int32_t> typical_accept_path(const TreeIndex& tree, std::span<const int32_t> tokens,
                                         const std::vector<std::vector<float>>& vertex_probs,
                                         const TypicalAcceptanceParams& params) {
  const int32_t n = tree.num_nodes();
  std::vector<double> thresh(static_cast<size_t>(n + 1));
  for (int32_t v = -1; v < n; ++v) thresh[static_cast<size_t>(v + 1)] = typical_threshold(vertex_probs[static_cast<size_t>(v + 1)], params);
  // Accepted nodes form a subtree of the root (a node counts only if its ancestors pass); node
  // order puts parents first, so one pass fills each node's score.
  std::vector<char> ok(static_cast<size_t>(n), 0);
  std::vector<double> loglik(static_cast<size_t>(n), 0.0);
  int32_t best = -1, best_depth = 0;
  double best_ll = 0;
  for (int32_t i = 0; i < n; ++i) {
    const int32_t par = tree.parent[static_cast<size_t>(i)];
    if (par >= 0 && !ok[static_cast<size_t>(par)]) continue;
    const float px = vertex_probs[static_cast<size_t>(par + 1)][static_cast<size_t>(tokens[static_cast<size_t>(i)])];
    if (!(px > thresh[static_cast<size_t>(par + 1)])) continue;
    ok[static_cast<size_t>(i)] = 1;
    loglik[static_cast<size_t>(i)] = (par >= 0 ? loglik[static_cast<size_t>(par)] : 0.0) + std::log(static_cast<double>(px));
    const int32_t d = tree.depth[static_cast<size_t>(i)];
    if (d > best_depth || (d == best_depth && loglik[static_cast<size_t>(i)] > best_ll)) {
      best = i;
      best_depth = d;
      best_ll = loglik[static_cast<size_t>(i)];
    }
  }
  return tree.path_to(best);
}

std::vector<std::pair<int32_t, int32_t>> compaction_moves(std::span<const int32_t> path) {
  std::vector<std::pair<int32_t, int32_t>> moves;
  for (size_t j = 0; j < path.size(); ++j) {
    const int32_t from = path[j] + 1, to = static_cast<int32_t>(j) + 1;
    SPECSERVE_CHECK(from >= to, "path node " + std::to_string(path[j]) + " lies before depth " + std::to_string(to));
    if (from != to) moves.push_back({from, to});
  }
  return moves;
}

}  // namespace specserve
