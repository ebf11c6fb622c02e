#include "spec/medusa_proposer.h"

#include <algorithm>
#include <cmath>

#include "core/logging.h"
#include "model/model_fingerprint.h"

namespace specserve {

Expected<std::unique_ptr<MedusaProposer>> MedusaProposer::load(const std::string& path, Transformer& target,
                                                               const GgufFile& target_file, MedusaOptions o) {
  const uint64_t target_fingerprint = model_fingerprint(target_file);
  auto file = GgufFile::open(path);
  if (!file.ok()) return file.status();
  auto f = std::make_unique<GgufFile>(std::move(*file));
  const ModelConfig& tc = target.config();
  HeadFileChecker c(*f, "medusa");
  SPECSERVE_RETURN_IF_ERROR(c.check_architecture());
  auto num_heads = c.uint_key("medusa.num_heads", 1, 64);
  if (!num_heads.ok()) return num_heads.status();
  SPECSERVE_RETURN_IF_ERROR(c.equal_key("medusa.hidden_size", tc.hidden_size, "hidden size"));
  SPECSERVE_RETURN_IF_ERROR(c.equal_key("medusa.vocab_size", tc.vocab_size, "vocabulary size"));
  SPECSERVE_RETURN_IF_ERROR(c.check_fingerprint(target_fingerprint));
  const int64_t d = tc.hidden_size;
  std::vector<const GgufTensorInfo*> ws, bs;
  for (int64_t i = 0; i < *num_heads; ++i) {
    const std::string p = "medusa." + std::to_string(i) + ".";
    auto w = c.tensor(p + "weight", {d, d}, {GgmlType::F32, GgmlType::F16, GgmlType::Q8_0});  // Q8_0: tools/train/quantize_head.py
    if (!w.ok()) return w.status();
    auto b = c.tensor(p + "bias", {d}, {GgmlType::F32});
    if (!b.ok()) return b.status();
    ws.push_back(*w);
    bs.push_back(*b);
  }
  SPECSERVE_RETURN_IF_ERROR(c.check_no_other_tensors());
  if (o.max_heads < 0) return invalid_argument("max_heads = " + std::to_string(o.max_heads) + ": must be >= 0 (0: all heads)");
  StaticTree tree;
  if (o.tree_paths.empty()) {
    tree = chain_tree(64);
  } else {
    auto t = static_tree_from_paths(o.tree_paths, o.tree_name);
    if (!t.ok()) return t.status();
    tree = std::move(*t);
  }
  std::unique_ptr<MedusaProposer> m(new MedusaProposer(target, std::move(o)));
  m->file_ = std::move(f);
  m->tree_ = std::move(tree);
  m->d_ = d;
  m->vocab_ = tc.vocab_size;
  m->head_ = &target.output_head();
  SPECSERVE_RETURN_IF_ERROR(check_draft_p_min(m->opts_.draft_p_min));
  if (m->opts_.draft_vocab_size < 0) {
    return invalid_argument("draft_vocab_size = " + std::to_string(m->opts_.draft_vocab_size) + ": must be >= 0 (0: the whole vocabulary)");
  }
  if (m->opts_.draft_vocab_size > 0 && m->opts_.draft_vocab_size != tc.vocab_size) {
    auto w = load_output_head_rows(target_file, target.backend(), m->opts_.draft_vocab_size);
    if (!w.ok()) return w.status();
    m->draft_head_ = std::move(*w);
    m->head_ = m->draft_head_.get();
    m->vocab_ = m->opts_.draft_vocab_size;
  }
  const int64_t use = m->opts_.max_heads > 0 ? std::min<int64_t>(m->opts_.max_heads, *num_heads) : *num_heads;
  // NOTE: a tree deeper than the heads, or asking for ranks past the draft vocabulary, used to be
  // cut silently each step; the user now hears once, at load, what is dropped and why.
  if (!m->opts_.tree_paths.empty()) {
    StaticTreeFit fit = fit_static_tree(m->tree_, static_cast<int32_t>(use), m->vocab_);
    const std::string why = fit.describe(m->tree_.num_nodes(), m->opts_.tree_name, "the " + std::to_string(use) + " Medusa heads of " + path,
                                         "the draft vocabulary's " + std::to_string(m->vocab_) + " ids (draft_vocab_size)");
    if (fit.tree.num_nodes() == 0) return invalid_argument(m->opts_.tree_name + ": no node can be drafted: " + why);
    if (fit.dropped() > 0) get_logger("spec")->warn("medusa: {}", why);
    m->tree_ = std::move(fit.tree);
  }
  Backend& B = target.backend();
  for (int64_t i = 0; i < use; ++i) {
    Head h;
    auto w = B.load_weight(*ws[static_cast<size_t>(i)]);
    if (!w.ok()) return Status(w.status().code(), path + ": " + w.status().message());
    auto b = B.load_weight(*bs[static_cast<size_t>(i)]);
    if (!b.ok()) return Status(b.status().code(), path + ": " + b.status().message());
    h.w = std::move(*w);
    h.b = std::move(*b);
    m->heads_.push_back(std::move(h));
  }
  return m;
}

Buffer& MedusaProposer::scratch(int idx, int64_t bytes) {
  if (static_cast<int>(scratch_.size()) <= idx) scratch_.resize(static_cast<size_t>(idx + 1));
  auto& b = scratch_[static_cast<size_t>(idx)];
  if (!b || b->bytes() < bytes) b = target_.backend().alloc(bytes + bytes / 4);
  return *b;
}

void MedusaProposer::run_heads(const float* hidden, const std::vector<int32_t>& depth, std::vector<float>* logits) {
  Backend& B = target_.backend();
  const int64_t n = static_cast<int64_t>(depth.size()), d = d_;
  const int32_t max_depth = depth.empty() ? 0 : *std::max_element(depth.begin(), depth.end());
  int64_t total = 0;
  for (int32_t j : depth) total += j;
  Buffer& H = scratch(0, n * d * 4);       // [n, d] the target's hidden states
  Buffer& Hi = scratch(1, n * d * 4);      // [rows of head i, d]
  Buffer& T = scratch(2, n * d * 4);       // [rows of head i, d] SiLU(W_i h + b_i)
  Buffer& out = scratch(3, total * d * 4); // [total, d] h + SiLU(...), head-major
  if (ones_rows_ < n) {
    // SiLU(x) = swiglu(x, 1): the Backend has SwiGLU, not SiLU alone.
    Buffer& ones = scratch(4, n * d * 4);
    std::vector<float> one(static_cast<size_t>(n * d), 1.0f);
    B.upload(ones, one.data(), n * d * 4);
    ones_rows_ = n;
  }
  Buffer& ones = *scratch_[4];
  Buffer& L = scratch(5, total * vocab_ * 4);  // [total, vocab]
  B.upload(H, hidden, n * d * 4);
  std::vector<int32_t> rows;
  int64_t off = 0;
  for (int32_t i = 0; i < max_depth; ++i) {
    rows.clear();
    for (int64_t r = 0; r < n; ++r) {
      if (depth[static_cast<size_t>(r)] > i) rows.push_back(static_cast<int32_t>(r));
    }
    const int64_t m = static_cast<int64_t>(rows.size());
    float* dst = out.f32() + off * d;
    B.gather_rows(H.f32(), rows.data(), m, d, dst);  // h, the residual
    const float* x = dst;
    if (m != n) {
      B.gather_rows(H.f32(), rows.data(), m, d, Hi.f32());
      x = Hi.f32();
    }
    const Head& h = heads_[static_cast<size_t>(i)];
    B.matmul(*h.w, x, m, T.f32(), h.b.get());
    B.swiglu(T.f32(), ones.f32(), m * d, T.f32());
    B.add(dst, T.f32(), m * d);
    off += m;
  }
  // One pass of the (large) shared output head over every head's rows.
  B.matmul(*head_, out.f32(), total, L.f32());
  B.synchronize();
  logits->resize(static_cast<size_t>(total * vocab_));
  B.download(logits->data(), L, total * vocab_ * 4);
}

Status MedusaProposer::head_logits(std::span<const float> hidden, int32_t n, std::vector<float>* logits) {
  if (n < 0 || static_cast<int64_t>(hidden.size()) != n * d_) {
    return invalid_argument("hidden has " + std::to_string(hidden.size()) + " floats: expected n * hidden_size = " +
                            std::to_string(n) + " * " + std::to_string(d_));
  }
  logits->clear();
  if (n == 0) return Status();
  run_heads(hidden.data(), std::vector<int32_t>(static_cast<size_t>(n), num_heads()), logits);
  return Status();
}

Status MedusaProposer::propose(const std::vector<DraftRequest>& reqs, std::vector<DraftTree>* out) {
  out->assign(reqs.size(), DraftTree{});
  std::vector<float> hidden;           // [work, d]
  std::vector<int32_t> depth;          // [work]
  std::vector<size_t> which;           // request of each work row
  std::vector<StaticTree> trees;       // [work]
  for (size_t i = 0; i < reqs.size(); ++i) {
    const DraftRequest& r = reqs[i];
    const int32_t n = static_cast<int32_t>(r.tokens.size());
    if (r.hidden_begin == 0) last_.erase(r.seq_id);  // a fresh start: what we kept is stale
    if (!r.hidden.empty()) {
      if (r.hidden_size != d_) {
        return invalid_argument("seq " + std::to_string(r.seq_id) + ": hidden_size = " + std::to_string(r.hidden_size) +
                                ": the Medusa heads take " + std::to_string(d_));
      }
      const int32_t rows = static_cast<int32_t>(r.hidden.size() / static_cast<size_t>(d_));
      // Keep the row of position n-2 (this step's input), else the newest one.
      int32_t pos = n - 2;
      if (pos < r.hidden_begin || pos >= r.hidden_begin + rows) pos = r.hidden_begin + rows - 1;
      Last& l = last_[r.seq_id];
      l.pos = pos;
      const float* src = r.hidden.data() + static_cast<size_t>(pos - r.hidden_begin) * static_cast<size_t>(d_);
      l.h.assign(src, src + d_);
    }
    // The draft's own max_model_len: as EAGLE's, at most max_model_len - n nodes.
    const int32_t k = opts_.max_model_len > 0 ? std::min(r.num_tokens, opts_.max_model_len - n) : r.num_tokens;
    if (n < 2 || k <= 0) continue;
    auto it = last_.find(r.seq_id);
    if (it == last_.end() || it->second.pos != n - 2) continue;  // no feature for this step
    StaticTree t = trim_static_tree(tree_, k, num_heads());
    if (t.num_nodes() == 0) continue;
    hidden.insert(hidden.end(), it->second.h.begin(), it->second.h.end());
    depth.push_back(t.max_depth());
    which.push_back(i);
    trees.push_back(std::move(t));
  }
  if (which.empty()) return Status();
  std::vector<float> logits;
  run_heads(hidden.data(), depth, &logits);
  // Row of (work w, head j) in `logits`: heads are laid out head-major over the rows with depth > j.
  const int64_t W = static_cast<int64_t>(which.size());
  std::vector<int64_t> head_off(1, 0);
  for (int32_t j = 0; j < num_heads(); ++j) {
    int64_t m = 0;
    for (int32_t dd : depth) m += dd > j;
    head_off.push_back(head_off.back() + m);
  }
  std::vector<std::vector<int32_t>> best;  // [depth] top tokens of head j for this work row
  std::vector<std::vector<float>> best_lp;  // [depth][rank] log-probability of best[j][rank] (draft_p_min)
  std::vector<float> score;                // [nodes] path log-probability (draft_p_min)
  std::vector<int32_t> out_index;          // [nodes] index in the draft, -1: dropped
  const float min_score = min_path_logprob(opts_.draft_p_min);
  for (int64_t w = 0; w < W; ++w) {
    const StaticTree& t = trees[static_cast<size_t>(w)];
    best.assign(static_cast<size_t>(t.max_depth()), {});
    best_lp.assign(static_cast<size_t>(t.max_depth()), {});
    for (int32_t j = 0; j < t.max_depth(); ++j) {
      int32_t c = 0;
      for (int32_t v = 0; v < t.num_nodes(); ++v) {
        if (t.depths[static_cast<size_t>(v)] == j + 1) c = std::max(c, t.ranks[static_cast<size_t>(v)] + 1);
      }
      int64_t row = head_off[static_cast<size_t>(j)];
      for (int64_t u = 0; u < w; ++u) row += depth[static_cast<size_t>(u)] > j;
      const float* lrow = logits.data() + row * vocab_;
      top_k(lrow, static_cast<int32_t>(vocab_), c, &best[static_cast<size_t>(j)]);
      if (min_score > -INFINITY) {
        const float lse = static_cast<float>(log_sum_exp(lrow, static_cast<int32_t>(vocab_)));
        // NaN (a NaN row) stays NaN and fails the threshold below.
        for (int32_t tok : best[static_cast<size_t>(j)]) best_lp[static_cast<size_t>(j)].push_back(std::min(lrow[tok] - lse, 0.0f));
      }
    }
    DraftTree& dt = (*out)[which[static_cast<size_t>(w)]];
    score.assign(static_cast<size_t>(t.num_nodes()), 0.0f);
    out_index.assign(static_cast<size_t>(t.num_nodes()), -1);
    for (int32_t v = 0; v < t.num_nodes(); ++v) {
      const int32_t j = t.depths[static_cast<size_t>(v)] - 1;
      const auto& b = best[static_cast<size_t>(j)];
      const int32_t rank = t.ranks[static_cast<size_t>(v)];
      if (rank >= static_cast<int32_t>(b.size())) break;  // a rank past the vocabulary: cut here (prefix-closed)
      const int32_t parent = t.parents[static_cast<size_t>(v)];
      if (parent >= 0 && out_index[static_cast<size_t>(parent)] < 0) continue;  // its parent was dropped
      const int32_t tok = b[static_cast<size_t>(rank)];
      if (min_score > -INFINITY) {
        // draft_p_min: the product of the heads' probabilities along the path.
        const float s = (parent < 0 ? 0.0f : score[static_cast<size_t>(parent)]) + best_lp[static_cast<size_t>(j)][static_cast<size_t>(rank)];
        if (!(s >= min_score)) continue;
        score[static_cast<size_t>(v)] = s;
      }
      out_index[static_cast<size_t>(v)] = static_cast<int32_t>(dt.tokens.size());
      dt.tokens.push_back(tok);
      dt.parents.push_back(parent < 0 ? -1 : out_index[static_cast<size_t>(parent)]);
    }
    // A chain travels without parents (what a chain-only verifier accepts).
    bool chain = true;
    for (size_t v = 0; v < dt.parents.size(); ++v) chain = chain && dt.parents[v] == static_cast<int32_t>(v) - 1;
    if (chain) dt.parents.clear();
  }
  return Status();
}

}  // namespace specserve
