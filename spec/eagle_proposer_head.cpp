// specserve spec: the EAGLE head itself (see eagle_proposer.h) — load() (validating the head
// file against the target, its weights and KV), the head's forward pass over a batch of rows,
// and the teacher-forced test hook. Drafting with it (propose) is in eagle_proposer.cpp.
#include <algorithm>

#include "core/logging.h"
#include "model/model_fingerprint.h"
#include "spec/eagle_proposer.h"
#include "spec/eagle_proposer_internal.h"

namespace specserve {

EagleProposer::EagleProposer(Transformer& t, EagleOptions o) : target_(t), opts_(std::move(o)) {}

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
  const std::initializer_list<GgmlType> mat = {GgmlType::F32, GgmlType::F16, GgmlType::Q8_0};  // Q8_0: tools/train/quantize_head.py
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
    // The planned blocks hold the sequences' tokens, as the target's do; one step's tree entries
    // past a sequence's tokens (topk * (depth - 1) rows for the dynamic tree, at most 64 for a
    // static tree or a chain) get blocks of their own (one layer's K and V: small). NOTE: without
    // them a pool planned for one sequence (`generate`) drafted nothing once the sequence's
    // tokens filled it (the step's reservation failed), e.g. topk 64 never drafted.
    const int64_t scratch_rows = op.mode == EagleOptions::Mode::kDynamic ? int64_t{op.topk} * std::max(0, op.depth - 1) : 64;
    op.num_kv_blocks = *n + (scratch_rows + op.block_size - 1) / op.block_size + 1;
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
  // Q, K, V as one job, and gate / up below (Backend::matmul_multi: the bits of three matmuls).
  const Backend::MatmulOutput qkv[3] = {{L_.wq.get(), q.f32()}, {L_.wk.get(), k.f32()}, {L_.wv.get(), v.f32()}};
  B.matmul_multi(qkv, 3, x.f32(), R);
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
  const Backend::MatmulOutput gate_up[2] = {{L_.w_gate.get(), g.f32()}, {L_.w_up.get(), u.f32()}};
  B.matmul_multi(gate_up, 2, h.f32(), R);
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

}  // namespace specserve
