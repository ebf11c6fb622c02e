// specserve spec: EagleProposer's drafting (see eagle_proposer.h) — propose(): catch-up on the
// handed-over features, level-by-level tree expansion, then the rerank or the static tree — and
// its per-sequence state. Loading the head and its forward pass are in eagle_proposer_head.cpp.
#include "spec/eagle_proposer.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "spec/eagle_proposer_internal.h"

namespace specserve {

EagleProposer::~EagleProposer() {
  for (auto& [id, s] : seqs_) s->blocks.release_all(*pool_);
}

bool EagleProposer::drafts_trees() const {
  if (opts_.mode == EagleOptions::Mode::kChain) return false;
  if (opts_.mode == EagleOptions::Mode::kStatic) return !tree_.is_chain();
  return opts_.topk > 1;
}

int32_t EagleProposer::max_draft_depth(int32_t k) const {
  if (opts_.mode == EagleOptions::Mode::kDynamic) return std::min(opts_.depth, k);
  if (opts_.mode == EagleOptions::Mode::kStatic) return trim_static_tree(tree_, k, 64).max_depth();
  return k;
}

void EagleProposer::release(int64_t seq_id) {
  auto it = seqs_.find(seq_id);
  if (it == seqs_.end()) return;
  it->second->blocks.release_all(*pool_);
  seqs_.erase(it);
}

Status EagleProposer::propose(const std::vector<DraftRequest>& reqs, std::vector<DraftTree>* out) {
  out->assign(reqs.size(), DraftTree{});
  using Mode = EagleOptions::Mode;
  const int64_t d = d_;
  const int32_t bs = opts_.block_size;

  // A candidate draft token: a node of the tree being built.
  struct Cand {
    int32_t token = 0;
    int32_t parent = -1;  // candidate index, -1: the root (last known token)
    float score = 0;      // cumulative log-probability of the path (dynamic mode)
    int32_t level = 1;    // depth, 1-based
    int32_t node = -1;    // static mode: the tree node it is
    int32_t entry = -1;   // its tree entry in the head's KV once expanded
  };
  struct Work {
    size_t req;
    SeqState* st;
    int32_t n;            // known tokens
    int32_t confirmed;    // confirmed KV entries after catch-up
    StaticTree tree;      // static / chain modes: this step's tree
    int32_t max_level;    // deepest level drafted
    std::vector<float> root;        // f^(n-1) [d]
    std::vector<Cand> cands;
    std::vector<float> feats;       // [entries, d] predicted feature of each tree entry
    std::vector<int32_t> entry_parent;  // [entries] tree-attention parents (entries)
    std::vector<int32_t> frontier;  // candidates to expand next
  };
  std::vector<Work> work;
  std::vector<Row> rows;
  std::vector<AttentionSeq> attn;
  std::vector<int32_t> last_row;  // per work: its catch-up row holding f^(n-1)

  // ---- catch-up: the confirmed entries up to position n-1, all sequences in one pass ----
  for (size_t i = 0; i < reqs.size(); ++i) {
    const DraftRequest& r = reqs[i];
    const int32_t n = static_cast<int32_t>(r.tokens.size());
    if (r.hidden_begin == 0) release(r.seq_id);  // a fresh start
    if (!r.hidden.empty() && r.hidden_size != d) {
      return invalid_argument("seq " + std::to_string(r.seq_id) + ": hidden_size = " + std::to_string(r.hidden_size) +
                              ": the EAGLE head takes " + std::to_string(d));
    }
    const int32_t hb = r.hidden_begin;
    const int32_t hrows = static_cast<int32_t>(r.hidden.size() / static_cast<size_t>(d));
    auto& slot = seqs_[r.seq_id];
    if (!slot) {
      slot = std::make_unique<SeqState>();
      slot->start = hb + 1;  // its first entry uses the first feature handed over
    }
    SeqState& st = *slot;
    // Confirmed entries must still match the sequence (the target's tokens never change; this
    // guards against a caller that reuses an id).
    size_t keep = 0;
    while (keep < st.tokens.size() && st.start + static_cast<int32_t>(keep) < n &&
           st.tokens[keep] == r.tokens[static_cast<size_t>(st.start) + keep]) {
      ++keep;
    }
    st.tokens.resize(keep);
    int32_t next = st.start + static_cast<int32_t>(keep);  // next position to compute
    if (next <= n - 1 && hrows > 0 && next - 1 < hb) {
      // The feature of position next-1 was never handed over (a sequence whose early positions
      // the target did not compute, or a gap): start the feature sequence again at the first
      // feature we have; the head then sees a shorter context.
      st.blocks.release_all(*pool_);
      st.blocks = BlockTable();
      st.tokens.clear();
      st.start = hb + 1;
      next = st.start;
    }
    if (r.num_tokens <= 0 || n < 2 || next > n - 1 || next - 1 < hb || n - 2 >= hb + hrows) {
      // Nothing new to feed (f^(n-1) needs a pass), or features missing: no draft this step;
      // keep what is confirmed.
      st.blocks.truncate(*pool_, static_cast<int32_t>(st.tokens.size()));
      st.blocks.set_num_tokens(static_cast<int32_t>(st.tokens.size()));
      continue;
    }
    Work w;
    w.req = i;
    w.st = &st;
    w.n = n;
    // A draft never reaches past its own max_model_len (the speculative entry's, vLLM's draft
    // limit): a sequence near it gets a shorter draft, then none (plain decoding).
    const int32_t k = std::min(r.num_tokens, opts_.max_model_len - n);
    int32_t max_entries = 0;  // tree entries this step may write
    if (opts_.mode == Mode::kDynamic) {
      w.max_level = std::min(opts_.depth, k);
      max_entries = opts_.topk * (w.max_level - 1);
    } else {
      w.tree = opts_.mode == Mode::kChain ? chain_tree(k) : trim_static_tree(tree_, k, 64);
      w.max_level = w.tree.max_depth();
      std::vector<bool> has_child(static_cast<size_t>(w.tree.num_nodes()), false);
      for (int32_t p : w.tree.parents) {
        if (p >= 0) has_child[static_cast<size_t>(p)] = true;
      }
      max_entries = static_cast<int32_t>(std::count(has_child.begin(), has_child.end(), true));
    }
    if (w.max_level < 1) continue;
    const int32_t confirmed_before = static_cast<int32_t>(st.tokens.size());
    w.confirmed = n - st.start;  // entries for positions start .. n-1
    st.blocks.truncate(*pool_, confirmed_before);
    st.blocks.set_num_tokens(confirmed_before);
    if (!st.blocks.reserve(*pool_, w.confirmed + max_entries).ok()) continue;  // no room: no draft this step
    AttentionSeq a;
    a.row_begin = static_cast<int32_t>(rows.size());
    a.num_rows = n - next;
    a.num_cached = confirmed_before;
    for (int32_t p = next; p <= n - 1; ++p) {
      Row row;
      row.token = r.tokens[static_cast<size_t>(p)];
      row.position = p;
      const int32_t e = p - st.start;
      row.slot = st.blocks.blocks()[static_cast<size_t>(e / bs)] * bs + e % bs;
      row.feature = r.hidden.data() + static_cast<size_t>(p - 1 - hb) * static_cast<size_t>(d);
      row.want_logits = p == n - 1;
      rows.push_back(row);
      st.tokens.push_back(row.token);
    }
    st.blocks.set_num_tokens(w.confirmed);
    last_row.push_back(static_cast<int32_t>(rows.size()) - 1);
    work.push_back(std::move(w));
    attn.push_back(a);
  }
  if (work.empty()) return Status();
  for (size_t wi = 0; wi < work.size(); ++wi) {
    attn[wi].block_table = work[wi].st->blocks.blocks().data();
    attn[wi].num_blocks = static_cast<int32_t>(work[wi].st->blocks.blocks().size());
  }
  std::vector<float> feats, logits;
  run(rows, attn, static_cast<int64_t>(rows.size()), {}, &feats, &logits);

  // Children of a candidate (or of the root, parent = -1) from its logit row. A child whose path
  // probability is below draft_p_min is dropped (its descendants score lower still).
  const float min_score = min_path_logprob(opts_.draft_p_min);
  std::vector<int32_t> top;
  auto add_children = [&](Work& w, int32_t parent, const float* row) {
    const float parent_score = parent < 0 ? 0.0f : w.cands[static_cast<size_t>(parent)].score;
    const int32_t level = parent < 0 ? 1 : w.cands[static_cast<size_t>(parent)].level + 1;
    if (opts_.mode == Mode::kDynamic) {
      const float lse = static_cast<float>(log_sum_exp(row, static_cast<int32_t>(vocab_)));
      top_k(row, static_cast<int32_t>(vocab_), opts_.topk, &top);
      for (int32_t t : top) {
        Cand c;
        c.token = t;
        c.parent = parent;
        c.score = parent_score + std::min(0.0f, row[t] - lse);  // <= 0 despite rounding: a child never outscores its parent
        c.level = level;
        // Below draft_p_min (top is best first; a NaN row's scores count as below): neither
        // drafted nor expanded.
        if (min_score > -INFINITY && !(c.score >= min_score && !std::isnan(row[t] - lse))) break;
        w.cands.push_back(c);
      }
      return;
    }
    // Path scores for draft_p_min (the dynamic tree has them anyway).
    const float lse = min_score > -INFINITY ? static_cast<float>(log_sum_exp(row, static_cast<int32_t>(vocab_))) : 0.0f;
    const int32_t pnode = parent < 0 ? -1 : w.cands[static_cast<size_t>(parent)].node;
    int32_t need = 0;
    for (int32_t v = 0; v < w.tree.num_nodes(); ++v) {
      if (w.tree.parents[static_cast<size_t>(v)] == pnode) need = std::max(need, w.tree.ranks[static_cast<size_t>(v)] + 1);
    }
    if (need == 0) return;
    top_k(row, static_cast<int32_t>(vocab_), need, &top);
    for (int32_t v = 0; v < w.tree.num_nodes(); ++v) {
      if (w.tree.parents[static_cast<size_t>(v)] != pnode) continue;
      const int32_t rank = w.tree.ranks[static_cast<size_t>(v)];
      if (rank >= static_cast<int32_t>(top.size())) continue;
      Cand c;
      c.token = top[static_cast<size_t>(rank)];
      c.parent = parent;
      c.level = level;
      c.node = v;
      if (min_score > -INFINITY) {
        c.score = parent_score + std::min(0.0f, row[c.token] - lse);
        if (!(c.score >= min_score) || std::isnan(row[c.token] - lse)) continue;  // below draft_p_min (or NaN): neither drafted nor expanded
      }
      w.cands.push_back(c);
    }
  };
  // Which candidates of `level` to run through the head next.
  auto pick_frontier = [&](Work& w, int32_t level) {
    w.frontier.clear();
    if (level >= w.max_level) return;
    for (int32_t c = 0; c < static_cast<int32_t>(w.cands.size()); ++c) {
      if (w.cands[static_cast<size_t>(c)].level == level) w.frontier.push_back(c);
    }
    if (opts_.mode == Mode::kDynamic) {
      // EAGLE-2: expand the topk most probable paths of the newest level.
      std::stable_sort(w.frontier.begin(), w.frontier.end(), [&](int32_t a, int32_t b) {
        return w.cands[static_cast<size_t>(a)].score > w.cands[static_cast<size_t>(b)].score;
      });
      if (static_cast<int32_t>(w.frontier.size()) > opts_.topk) w.frontier.resize(static_cast<size_t>(opts_.topk));
      std::sort(w.frontier.begin(), w.frontier.end());
    } else {
      std::vector<bool> has_child(static_cast<size_t>(w.tree.num_nodes()), false);
      for (int32_t p : w.tree.parents) {
        if (p >= 0) has_child[static_cast<size_t>(p)] = true;
      }
      std::erase_if(w.frontier, [&](int32_t c) { return !has_child[static_cast<size_t>(w.cands[static_cast<size_t>(c)].node)]; });
    }
  };
  for (size_t wi = 0; wi < work.size(); ++wi) {
    Work& w = work[wi];
    const int32_t lr = last_row[wi];
    w.root.assign(feats.begin() + lr * d, feats.begin() + (lr + 1) * d);
    add_children(w, -1, logits.data() + static_cast<int64_t>(wi) * vocab_);
    pick_frontier(w, 1);
  }

  // ---- expansion: one head pass per level over every sequence's frontier (tree attention) ----
  for (int32_t level = 1;; ++level) {
    rows.clear();
    attn.clear();
    std::vector<int32_t> q_row_of;
    std::vector<std::pair<size_t, int32_t>> expanded;  // (work, candidate) per new row
    for (size_t wi = 0; wi < work.size(); ++wi) {
      Work& w = work[wi];
      if (w.frontier.empty()) continue;
      SeqState& st = *w.st;
      const int32_t old_entries = static_cast<int32_t>(w.entry_parent.size());
      AttentionSeq a;
      a.row_begin = static_cast<int32_t>(q_row_of.size());
      a.num_cached = w.confirmed;
      for (int32_t e = 0; e < old_entries; ++e) q_row_of.push_back(-1);
      for (int32_t c : w.frontier) {
        Cand& cd = w.cands[static_cast<size_t>(c)];
        const int32_t e = static_cast<int32_t>(w.entry_parent.size());
        cd.entry = e;
        w.entry_parent.push_back(cd.parent < 0 ? -1 : w.cands[static_cast<size_t>(cd.parent)].entry);
        Row row;
        row.token = cd.token;
        row.position = w.n - 1 + cd.level;
        const int32_t logical = w.confirmed + e;
        row.slot = st.blocks.blocks()[static_cast<size_t>(logical / bs)] * bs + logical % bs;
        row.feature = cd.parent < 0 ? w.root.data()
                                    : w.feats.data() + static_cast<size_t>(w.cands[static_cast<size_t>(cd.parent)].entry) * static_cast<size_t>(d);
        row.want_logits = true;
        q_row_of.push_back(static_cast<int32_t>(rows.size()));
        rows.push_back(row);
        expanded.emplace_back(wi, c);
      }
      a.num_rows = static_cast<int32_t>(w.entry_parent.size());
      a.block_table = st.blocks.blocks().data();
      a.num_blocks = static_cast<int32_t>(st.blocks.blocks().size());
      a.parents = w.entry_parent.data();
      attn.push_back(a);
    }
    if (rows.empty()) break;
    run(rows, attn, static_cast<int64_t>(q_row_of.size()), q_row_of, &feats, &logits);
    for (size_t r = 0; r < expanded.size(); ++r) {
      Work& w = work[expanded[r].first];
      w.feats.insert(w.feats.end(), feats.begin() + static_cast<int64_t>(r) * d, feats.begin() + static_cast<int64_t>(r + 1) * d);
    }
    for (size_t r = 0; r < expanded.size(); ++r) {
      add_children(work[expanded[r].first], expanded[r].second, logits.data() + static_cast<int64_t>(r) * vocab_);
    }
    for (Work& w : work) {
      if (!w.frontier.empty()) pick_frontier(w, level + 1);
    }
  }

  // ---- the draft: rerank (dynamic) or the tree as built (static), parents before children ----
  for (Work& w : work) {
    const DraftRequest& r = reqs[w.req];
    std::vector<int32_t> keep(w.cands.size());
    std::iota(keep.begin(), keep.end(), 0);
    if (opts_.mode == Mode::kDynamic) {
      // A child's score never exceeds its parent's and ties go to the earlier (the parent), so
      // the best k are prefix-closed.
      std::stable_sort(keep.begin(), keep.end(), [&](int32_t a, int32_t b) {
        return w.cands[static_cast<size_t>(a)].score > w.cands[static_cast<size_t>(b)].score;
      });
      if (static_cast<int32_t>(keep.size()) > r.num_tokens) keep.resize(static_cast<size_t>(r.num_tokens));
      std::sort(keep.begin(), keep.end());
    }
    std::vector<int32_t> out_index(w.cands.size(), -1);
    DraftTree& dt = (*out)[w.req];
    for (int32_t c : keep) {
      const Cand& cd = w.cands[static_cast<size_t>(c)];
      const int32_t p = cd.parent < 0 ? -1 : out_index[static_cast<size_t>(cd.parent)];
      if (cd.parent >= 0 && p < 0) continue;  // defensive: never a node without its parent
      out_index[static_cast<size_t>(c)] = static_cast<int32_t>(dt.tokens.size());
      dt.tokens.push_back(cd.token);
      dt.parents.push_back(p);
    }
    bool chain = true;
    for (size_t v = 0; v < dt.parents.size(); ++v) chain = chain && dt.parents[v] == static_cast<int32_t>(v) - 1;
    if (chain) dt.parents.clear();
    // Tree entries are dropped: the next call starts from the confirmed entries.
    w.st->blocks.truncate(*pool_, static_cast<int32_t>(w.st->tokens.size()));
    w.st->blocks.set_num_tokens(static_cast<int32_t>(w.st->tokens.size()));
  }
  return Status();
}

}  // namespace specserve
