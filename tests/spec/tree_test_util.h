// Test doubles for token-tree speculation: a proposer that drafts a tree of a fixed shape from a
// recorded reference continuation (the target's own greedy output), hiding the right token
// among wrong siblings at a random rank, so that accepted paths leave the first branch.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "spec/proposer.h"
#include "spec/token_tree.h"

namespace specserve::tree_testing {

using Tokens = std::vector<int32_t>;

/// Drafts `shape` (trimmed to each request's budget) for sequences whose prompt it knows. At the
/// root, and under every node that carries the reference's next token, one child of a random rank
/// carries the reference's next token (with probability 1 - miss_rate; else none does); every
/// other node carries a token different from the reference's at its depth. Deterministic given
/// the seed, the prompt and the output length. Greedy output must not depend on any of it.
class OracleTreeProposer final : public Proposer {
 public:
  OracleTreeProposer(TokenTree shape, int32_t vocab, double miss_rate, uint64_t seed)
      : shape_(std::move(shape)), vocab_(vocab), miss_rate_(miss_rate), seed_(seed) {}
  /// Puts the right token on the LAST rank among each vertex's children instead of a random one
  /// (so the accepted path leaves the first branch whenever a vertex has several children).
  void set_last_rank(bool on) { last_rank_ = on; }
  void add(const Tokens& prompt, const Tokens& continuation) { refs_[prompt] = continuation; }
  std::string name() const override { return "oracle_tree"; }

  Status propose(const std::vector<DraftRequest>& reqs, std::vector<DraftTree>* out) override {
    out->assign(reqs.size(), DraftTree{});
    for (size_t i = 0; i < reqs.size(); ++i) {
      const DraftRequest& r = reqs[i];
      const Tokens prompt(r.tokens.begin(), r.tokens.begin() + r.prompt_len);
      auto it = refs_.find(prompt);
      if (it == refs_.end()) continue;
      const Tokens& ref = it->second;
      const size_t done = r.tokens.size() - static_cast<size_t>(r.prompt_len);
      const TokenTree t = trim_token_tree(shape_, r.num_tokens);
      std::mt19937_64 rng(seed_ ^ (std::hash<std::string>{}(std::string(reinterpret_cast<const char*>(prompt.data()),
                                                                            prompt.size() * sizeof(int32_t))) +
                                   done * 0x9E3779B97F4A7C15ull));
      // Which child (by rank) of each on-reference vertex carries the right token; -1: none.
      std::vector<int32_t> ranks_at_root, on_ref(static_cast<size_t>(t.num_nodes()), 0);
      auto pick_rank = [&](int32_t v) {
        std::vector<int32_t> ranks;
        for (int32_t c = 0; c < t.num_nodes(); ++c) {
          if (t.parents[static_cast<size_t>(c)] == v) ranks.push_back(t.rank(c));
        }
        if (ranks.empty() || std::uniform_real_distribution<double>(0, 1)(rng) < miss_rate_) return -1;
        const size_t r = rng() % ranks.size();
        return last_rank_ ? ranks.back() : ranks[r];
      };
      std::map<int32_t, int32_t> right_rank;  // vertex -> rank of its right child
      right_rank[-1] = pick_rank(-1);
      DraftTree& d = (*out)[i];
      for (int32_t c = 0; c < t.num_nodes(); ++c) {
        const int32_t par = t.parents[static_cast<size_t>(c)];
        const size_t at = done + static_cast<size_t>(t.depths[static_cast<size_t>(c)]) - 1;
        const int32_t want = at < ref.size() ? ref[at] : -1;
        const bool parent_ok = par < 0 || on_ref[static_cast<size_t>(par)];
        int32_t tok;
        if (parent_ok && want >= 0 && right_rank.at(par) == t.rank(c)) {
          tok = want;
          on_ref[static_cast<size_t>(c)] = 1;
          right_rank[c] = pick_rank(c);
          if (t.rank(c) > 0) ++num_right_off_first_;
        } else {
          do tok = static_cast<int32_t>(rng() % static_cast<uint64_t>(vocab_));
          while (tok == want);
        }
        d.tokens.push_back(tok);
        d.parents.push_back(par);
      }
    }
    ++calls_;
    return Status();
  }
  int calls() const { return calls_; }
  /// Right tokens placed at a rank > 0 (off the first branch) so far.
  int64_t num_right_off_first() const { return num_right_off_first_; }

 private:
  TokenTree shape_;
  int32_t vocab_;
  double miss_rate_;
  uint64_t seed_;
  bool last_rank_ = false;
  std::map<Tokens, Tokens> refs_;
  int calls_ = 0;
  int64_t num_right_off_first_ = 0;
};

}  // namespace specserve::tree_testing
