#include "spec/eagle_proposer.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/logging.h"
#include "model/model_fingerprint.h"

namespace specserve {

/// A sequence's head state: its paged KV holds `tokens.size()` confirmed entries (positions
/// start, start + 1, ...: entry i is token `start + i` with the target's feature of the position
/// before), then this call's tree entries.
struct EagleProposer::SeqState {
  BlockTable blocks;
  int32_t start = 1;
  std::vector<int32_t> tokens;  ///< token of each confirmed entry
};

/// One input row of a head pass.
struct EagleProposer::Row {
  int32_t token = 0;
  int32_t position = 0;            ///< RoPE position (the token's position in the sequence)
  int32_t slot = 0;                ///< KV slot its K/V go to
  const float* feature = nullptr;  ///< host [d]: the feature of the position before
  bool want_logits = false;
};

EagleProposer::EagleProposer(Transformer& t, EagleOptions o) : target_(t), opts_(std::move(o)) {}

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

Expected<std::unique_ptr<EagleProposer>> EagleProposer::load(const std::string& path, Transformer& target,
                                                             const GgufFile& target_file, EagleOptions o) {
  const uint64_t target_fingerprint = model_fingerprint(target_file);
  if (o.topk < 1 || o.topk > 64) return invalid_argument("eagle_topk = " + std::to_string(o.topk) + ": must be in 1..64");
  if (o.depth < 1 || o.depth > 64) return invalid_argument("eagle_depth = " + std::to_string(o.depth) + ": must be in 1..64");
  if (o.block_size < 1) return invalid_argument("block_size = " + std::to_string(o.block_size) + ": must be >= 1");
  SPECSERVE_RETURN_IF_ERROR(check_draft_p_min(o.draft_p_min));
  if (o.draft_vocab_size < 0) {
    return invalid_argument("draft_vocab_size = " + std::to_string(o.draft_vocab_size) + ": must be >= 0 (0: the whole vocabulary)");
  }
  StaticTree tree;
  if (o.mode == EagleOptions::Mode::kStatic) {
    if (o.tree_paths.empty()) return invalid_argument("speculative_token_tree: a static EAGLE tree needs at least one node");
    auto t = static_tree_from_paths(o.tree_paths, "speculative_token_tree");
    if (!t.ok()) return t.status();
    tree = std::move(*t);
  }
  auto file = GgufFile::open(path);
  if (!file.ok()) return file.status();
  auto f = std::make_unique<GgufFile>(std::move(*file));
  const ModelConfig& tc = target.config();
  HeadFileChecker c(*f, "eagle");
  SPECSERVE_RETURN_IF_ERROR(c.check_architecture());
  SPECSERVE_RETURN_IF_ERROR(c.equal_key("eagle.hidden_size", tc.hidden_size, "hidden size"));
  SPECSERVE_RETURN_IF_ERROR(c.equal_key("eagle.vocab_size", tc.vocab_size, "vocabulary size"));
  const int64_t d = tc.hidden_size;
  auto heads = c.uint_key("eagle.head_count", 1, d);
  if (!heads.ok()) return heads.status();
  if (d % *heads != 0 || (d / *heads) % 2 != 0) {
    return invalid_argument(path + ": eagle.head_count = " + std::to_string(*heads) + ": must divide the hidden size " +
                            std::to_string(d) + " into heads of an even size (RoPE pairs)");
  }
  auto kv_heads = c.uint_key("eagle.head_count_kv", 1, *heads);
  if (!kv_heads.ok()) return kv_heads.status();
  if (*heads % *kv_heads != 0) {
    return invalid_argument(path + ": eagle.head_count_kv = " + std::to_string(*kv_heads) + ": must divide eagle.head_count = " +
                            std::to_string(*heads));
  }
  auto ffn = c.uint_key("eagle.feed_forward_length", 1, int64_t{1} << 20);
  if (!ffn.ok()) return ffn.status();
  auto theta = c.float_key("eagle.rope.freq_base", 1e-3, 1e12);
  if (!theta.ok()) return theta.status();
  auto eps = c.float_key("eagle.layer_norm_rms_epsilon", 0.0, 1.0);
  if (!eps.ok()) return eps.status();
  SPECSERVE_RETURN_IF_ERROR(c.check_fingerprint(target_fingerprint));
  const int64_t hd = d / *heads, qd = *heads * hd, kvd = *kv_heads * hd, ff = *ffn;
  const std::initializer_list<GgmlType> mat = {GgmlType::F32, GgmlType::F16};
  struct Want { const char* name; std::initializer_list<int64_t> shape; bool vec; std::unique_ptr<Weight> Layer::*dst; };
  const Want wants[] = {
      {"eagle.fc.weight", {2 * d, d}, false, &Layer::fc_w},
      {"eagle.fc.bias", {d}, true, &Layer::fc_b},
      {"blk.0.attn_q.weight", {d, qd}, false, &Layer::wq},
      {"blk.0.attn_k.weight", {d, kvd}, false, &Layer::wk},
      {"blk.0.attn_v.weight", {d, kvd}, false, &Layer::wv},
      {"blk.0.attn_output.weight", {qd, d}, false, &Layer::wo},
      {"blk.0.ffn_norm.weight", {d}, true, &Layer::ffn_norm},
      {"blk.0.ffn_gate.weight", {d, ff}, false, &Layer::w_gate},
      {"blk.0.ffn_up.weight", {d, ff}, false, &Layer::w_up},
      {"blk.0.ffn_down.weight", {ff, d}, false, &Layer::w_down},
  };
  std::vector<const GgufTensorInfo*> infos;
  for (const Want& w : wants) {
    auto t = w.vec ? c.tensor(w.name, w.shape, {GgmlType::F32}) : c.tensor(w.name, w.shape, mat);
    if (!t.ok()) return t.status();
    infos.push_back(*t);
  }
  SPECSERVE_RETURN_IF_ERROR(c.check_no_other_tensors());

  std::unique_ptr<EagleProposer> e(new EagleProposer(target, std::move(o)));
  EagleOptions& op = e->opts_;
  e->file_ = std::move(f);
  e->tree_ = std::move(tree);
  e->d_ = d;
  e->vocab_ = tc.vocab_size;
  e->head_ = &target.output_head();
  if (op.draft_vocab_size > 0 && op.draft_vocab_size != tc.vocab_size) {
    auto w = load_output_head_rows(target_file, target.backend(), op.draft_vocab_size);
    if (!w.ok()) return w.status();
    e->draft_head_ = std::move(*w);
    e->head_ = e->draft_head_.get();
    e->vocab_ = op.draft_vocab_size;
  }
  if (op.mode == EagleOptions::Mode::kStatic) {
    // Ranks past the draft vocabulary have no candidate: said once here, not cut silently per step.
    StaticTreeFit fit = fit_static_tree(e->tree_, 64, e->vocab_);
    const std::string why = fit.describe(e->tree_.num_nodes(), "speculative_token_tree", "64",
                                         "the draft vocabulary's " + std::to_string(e->vocab_) + " ids (draft_vocab_size)");
    if (fit.tree.num_nodes() == 0) return invalid_argument("speculative_token_tree: no node can be drafted: " + why);
    if (fit.dropped() > 0) get_logger("spec")->warn("eagle: {}", why);
    e->tree_ = std::move(fit.tree);
  }
  e->num_heads_ = *heads;
  e->num_kv_heads_ = *kv_heads;
  e->head_dim_ = hd;
  e->ffn_ = ff;
  e->eps_ = static_cast<float>(*eps);
  e->rope_ = target.rope_params();
  e->rope_.head_dim = hd;
  e->rope_.rope_dim = std::min<int64_t>(e->rope_.rope_dim > 0 ? e->rope_.rope_dim : hd, hd);
  e->rope_.theta = static_cast<float>(*theta);
  Backend& B = target.backend();
  for (size_t i = 0; i < infos.size(); ++i) {
    auto w = B.load_weight(*infos[i]);
    if (!w.ok()) return Status(w.status().code(), path + ": " + w.status().message());
    e->L_.*(wants[i].dst) = std::move(*w);
  }
  if (op.max_model_len <= 0 || op.max_model_len > tc.context_length) op.max_model_len = static_cast<int32_t>(tc.context_length);
  if (op.plan_kv) {
    auto n = op.plan_kv(2 * kvd * int64_t{op.block_size} * static_cast<int64_t>(sizeof(float)), 0);
    if (!n.ok()) return n.status();
    op.num_kv_blocks = *n;
  }
  if (op.num_kv_blocks <= 0) op.num_kv_blocks = (int64_t{op.max_model_len} * 4 + op.block_size - 1) / op.block_size;
  auto kv = B.create_kv_storage(1, op.num_kv_blocks, op.block_size, kvd);
  if (!kv.ok()) return kv.status();
  e->kv_ = std::move(*kv);
  e->pool_ = std::make_unique<BlockPool>(static_cast<int32_t>(op.num_kv_blocks), op.block_size);
  return e;
}

Buffer& EagleProposer::scratch(int idx, int64_t bytes) {
  if (static_cast<int>(scratch_.size()) <= idx) scratch_.resize(static_cast<size_t>(idx + 1));
  auto& b = scratch_[static_cast<size_t>(idx)];
  if (!b || b->bytes() < bytes) b = target_.backend().alloc(std::max<int64_t>(bytes + bytes / 4, 64));
  return *b;
}

void EagleProposer::run(const std::vector<Row>& rows, const std::vector<AttentionSeq>& attn, int64_t num_q_rows,
                        const std::vector<int32_t>& q_row_of, std::vector<float>* features, std::vector<float>* logits) {
  Backend& B = target_.backend();
  const int64_t R = static_cast<int64_t>(rows.size()), d = d_, qd = num_heads_ * head_dim_, kvd = num_kv_heads_ * head_dim_;
  const int64_t ff = ffn_;
  std::vector<int32_t> ids(static_cast<size_t>(R)), pos(static_cast<size_t>(R)), slots(static_cast<size_t>(R)), sel;
  std::vector<float> feat(static_cast<size_t>(R * d));
  for (int64_t r = 0; r < R; ++r) {
    const Row& w = rows[static_cast<size_t>(r)];
    ids[static_cast<size_t>(r)] = w.token;
    pos[static_cast<size_t>(r)] = w.position;
    slots[static_cast<size_t>(r)] = w.slot;
    std::copy(w.feature, w.feature + d, feat.begin() + r * d);
    if (w.want_logits) sel.push_back(static_cast<int32_t>(r));
  }
  Buffer& bid = scratch(0, R * 4);
  Buffer& bpos = scratch(1, R * 4);
  Buffer& bslot = scratch(2, R * 4);
  Buffer& S = scratch(3, 2 * R * d * 4);   // [2R, d]: embeddings, then features
  Buffer& X = scratch(4, 2 * R * d * 4);   // [R, 2d]: concat(embedding, feature) per row
  Buffer& x = scratch(5, R * d * 4);       // [R, d] the residual stream
  Buffer& q = scratch(6, R * qd * 4);
  Buffer& k = scratch(7, R * kvd * 4);
  Buffer& v = scratch(8, R * kvd * 4);
  Buffer& qa = scratch(9, num_q_rows * qd * 4);   // [Q, qd] queries of every attention row
  Buffer& aa = scratch(10, num_q_rows * qd * 4);  // [Q, qd]
  Buffer& att = scratch(11, R * qd * 4);
  Buffer& o = scratch(12, R * d * 4);
  Buffer& h = scratch(13, R * d * 4);
  Buffer& g = scratch(14, R * ff * 4);
  Buffer& u = scratch(15, R * ff * 4);
  B.upload(bid, ids.data(), R * 4);
  B.upload(bpos, pos.data(), R * 4);
  B.upload(bslot, slots.data(), R * 4);
  B.embedding(target_.token_embedding(), bid.i32(), R, S.f32());
  B.upload(S, feat.data(), R * d * 4, R * d * 4);
  // Row r of X = [S row r, S row R + r]: a [2R, d] gather viewed as [R, 2d].
  std::vector<int32_t> inter(static_cast<size_t>(2 * R));
  for (int64_t r = 0; r < R; ++r) {
    inter[static_cast<size_t>(2 * r)] = static_cast<int32_t>(r);
    inter[static_cast<size_t>(2 * r + 1)] = static_cast<int32_t>(R + r);
  }
  B.gather_rows(S.f32(), inter.data(), 2 * R, d, X.f32());
  B.matmul(*L_.fc_w, X.f32(), R, x.f32(), L_.fc_b.get());
  // EAGLE-1: no input norm before attention.
  B.matmul(*L_.wq, x.f32(), R, q.f32());
  B.matmul(*L_.wk, x.f32(), R, k.f32());
  B.matmul(*L_.wv, x.f32(), R, v.f32());
  B.rope(q.f32(), bpos.i32(), R, num_heads_, rope_);
  B.rope(k.f32(), bpos.i32(), R, num_kv_heads_, rope_);
  B.kv_write(*kv_, 0, k.f32(), v.f32(), bslot.i32(), R);
  if (q_row_of.empty()) {
    B.attention(*kv_, 0, q.f32(), attn, num_heads_, num_kv_heads_, head_dim_, att.f32());
  } else {
    // Tree passes: earlier tree nodes are attention rows too (AttentionSeq rows are contiguous
    // and include every node of the tree so far); only the new rows' results are used, the
    // others get any query (row 0) and are dropped.
    std::vector<int32_t> src(static_cast<size_t>(num_q_rows)), back(static_cast<size_t>(R), 0);
    for (int64_t i = 0; i < num_q_rows; ++i) {
      const int32_t r = q_row_of[static_cast<size_t>(i)];
      src[static_cast<size_t>(i)] = r < 0 ? 0 : r;
      if (r >= 0) back[static_cast<size_t>(r)] = static_cast<int32_t>(i);
    }
    B.gather_rows(q.f32(), src.data(), num_q_rows, qd, qa.f32());
    B.attention(*kv_, 0, qa.f32(), attn, num_heads_, num_kv_heads_, head_dim_, aa.f32());
    B.gather_rows(aa.f32(), back.data(), R, qd, att.f32());
  }
  B.matmul(*L_.wo, att.f32(), R, o.f32());
  B.add(x.f32(), o.f32(), R * d);
  B.rms_norm(x.f32(), *L_.ffn_norm, eps_, R, d, h.f32());
  B.matmul(*L_.w_gate, h.f32(), R, g.f32());
  B.matmul(*L_.w_up, h.f32(), R, u.f32());
  B.swiglu(g.f32(), u.f32(), R * ff, g.f32());
  B.matmul(*L_.w_down, g.f32(), R, o.f32());
  B.add(x.f32(), o.f32(), R * d);  // x = the predicted features (no final norm)
  const int64_t M = static_cast<int64_t>(sel.size());
  if (M > 0) {
    Buffer& bsel = scratch(16, M * d * 4);
    Buffer& bl = scratch(17, M * vocab_ * 4);
    B.gather_rows(x.f32(), sel.data(), M, d, bsel.f32());
    B.matmul(*head_, bsel.f32(), M, bl.f32());
    B.synchronize();
    logits->resize(static_cast<size_t>(M * vocab_));
    B.download(logits->data(), bl, M * vocab_ * 4);
  } else {
    B.synchronize();
    logits->clear();
  }
  features->resize(static_cast<size_t>(R * d));
  B.download(features->data(), x, R * d * 4);
}

Status EagleProposer::teacher_forced(std::span<const int32_t> tokens, std::span<const float> features, int32_t first_position,
                                     std::vector<float>* predicted, std::vector<float>* logits) {
  const int64_t n = static_cast<int64_t>(tokens.size());
  if (n < 1 || static_cast<int64_t>(features.size()) != n * d_ || first_position < 1) {
    return invalid_argument("teacher_forced: need tokens [n >= 1], features [n, " + std::to_string(d_) + "] and first_position >= 1, got " +
                            std::to_string(tokens.size()) + " tokens, " + std::to_string(features.size()) + " floats, position " +
                            std::to_string(first_position));
  }
  for (int32_t t : tokens) {
    if (t < 0 || t >= target_.config().vocab_size) return invalid_argument("teacher_forced: token " + std::to_string(t) + " is outside the vocabulary");
  }
  BlockTable bt;
  SPECSERVE_RETURN_IF_ERROR(bt.reserve(*pool_, static_cast<int32_t>(n)));
  const int64_t bs = opts_.block_size;
  std::vector<Row> rows(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    Row& r = rows[static_cast<size_t>(i)];
    r.token = tokens[static_cast<size_t>(i)];
    r.position = first_position + static_cast<int32_t>(i);
    r.slot = static_cast<int32_t>(bt.blocks()[static_cast<size_t>(i / bs)] * bs + i % bs);
    r.feature = features.data() + i * d_;
    r.want_logits = true;
  }
  AttentionSeq a;
  a.row_begin = 0;
  a.num_rows = static_cast<int32_t>(n);
  a.num_cached = 0;
  a.block_table = bt.blocks().data();
  a.num_blocks = static_cast<int32_t>(bt.blocks().size());
  run(rows, {a}, n, {}, predicted, logits);
  bt.release_all(*pool_);
  return Status();
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
