#include "model/transformer.h"

#include <cmath>

#include "core/logging.h"

namespace specserve {

Expected<std::unique_ptr<Transformer>> Transformer::load(const GgufFile& file, Backend& backend, LoadOptions opts) {
  auto cfg = ModelConfig::from_gguf(file);
  if (!cfg.ok()) return cfg.status();
  std::unique_ptr<Transformer> m(new Transformer(*cfg, backend));
  ModelConfig& c = m->config_;
  if (opts.max_layers > 0 && opts.max_layers < c.num_layers) c.num_layers = opts.max_layers;
  auto load = [&](const std::string& name, std::unique_ptr<Weight>* dst) -> Status {
    const GgufTensorInfo* t = file.find_tensor(name);
    if (!t) return corrupt_data(file.path() + ": tensor '" + name + "' is missing");
    auto w = backend.load_weight(*t);
    if (!w.ok()) return Status(w.status().code(), file.path() + ": " + w.status().message());
    *dst = std::move(*w);
    return Status();
  };
  SPECSERVE_RETURN_IF_ERROR(load("token_embd.weight", &m->tok_embd_));
  SPECSERVE_RETURN_IF_ERROR(load("output_norm.weight", &m->output_norm_));
  if (!c.tied_output) SPECSERVE_RETURN_IF_ERROR(load("output.weight", &m->output_));
  m->layers_.resize(static_cast<size_t>(c.num_layers));
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    Layer& L = m->layers_[static_cast<size_t>(l)];
    SPECSERVE_RETURN_IF_ERROR(load(p + "attn_norm.weight", &L.attn_norm));
    SPECSERVE_RETURN_IF_ERROR(load(p + "attn_q.weight", &L.wq));
    SPECSERVE_RETURN_IF_ERROR(load(p + "attn_k.weight", &L.wk));
    SPECSERVE_RETURN_IF_ERROR(load(p + "attn_v.weight", &L.wv));
    SPECSERVE_RETURN_IF_ERROR(load(p + "attn_output.weight", &L.wo));
    SPECSERVE_RETURN_IF_ERROR(load(p + "ffn_norm.weight", &L.ffn_norm));
    SPECSERVE_RETURN_IF_ERROR(load(p + "ffn_gate.weight", &L.w_gate));
    SPECSERVE_RETURN_IF_ERROR(load(p + "ffn_up.weight", &L.w_up));
    SPECSERVE_RETURN_IF_ERROR(load(p + "ffn_down.weight", &L.w_down));
    if (c.has_qkv_bias) {
      SPECSERVE_RETURN_IF_ERROR(load(p + "attn_q.bias", &L.bq));
      SPECSERVE_RETURN_IF_ERROR(load(p + "attn_k.bias", &L.bk));
      SPECSERVE_RETURN_IF_ERROR(load(p + "attn_v.bias", &L.bv));
    }
  }
  RopeParams& r = m->rope_;
  r.head_dim = c.head_dim;
  r.rope_dim = c.rope_dim;
  r.theta = c.rope_theta;
  r.neox = c.rope_style == RopeStyle::kNeox;
  if (c.rope_scaling.type == "linear" || c.rope_scaling.type == "yarn") r.freq_scale = 1.0f / c.rope_scaling.factor;
  if (c.rope_scaling.type == "yarn") {
    r.ext_factor = 1.0f;
    r.attn_factor = c.rope_scaling.attn_factor;
    r.original_context = c.rope_scaling.original_context;
  }
  return m;
}

Expected<std::unique_ptr<KvStorage>> Transformer::create_kv(int64_t num_blocks, int64_t block_size) const {
  return backend_.create_kv_storage(config_.num_layers, num_blocks, block_size, config_.kv_dim());
}

Buffer& Transformer::scratch(int idx, int64_t bytes) {
  if (static_cast<int>(scratch_.size()) <= idx) scratch_.resize(static_cast<size_t>(idx + 1));
  auto& b = scratch_[static_cast<size_t>(idx)];
  if (!b || b->bytes() < bytes) b = backend_.alloc(bytes + bytes / 4);
  return *b;
}

Status Transformer::forward(const ForwardBatch& batch, KvStorage& kv, ForwardOutput* out) {
  const ModelConfig& c = config_;
  const int64_t d = c.hidden_size, qd = c.q_dim(), kvd = c.kv_dim(), ff = c.ffn_size, bs = kv.block_size();
  const int64_t n_layers = batch.num_layers > 0 ? std::min(batch.num_layers, c.num_layers) : c.num_layers;

  // ---- validate and lay out rows (host side) ----
  std::vector<int32_t> tokens, positions, slots, logit_idx, hidden_idx;
  std::vector<AttentionSeq> attn(batch.seqs.size());
  out->seq_row_offset.assign(1, 0);
  out->seq_hidden_offset.assign(1, 0);
  bool hidden_is_logits = true;  // every sequence's hidden rows are its logit rows
  for (size_t si = 0; si < batch.seqs.size(); ++si) {
    const SequenceInput& s = batch.seqs[si];
    const std::string where = "sequence " + std::to_string(si) + ": ";
    const int64_t n = static_cast<int64_t>(s.tokens.size());
    if (n == 0) return invalid_argument(where + "tokens is empty");
    if (s.num_cached < 0) return invalid_argument(where + "num_cached " + std::to_string(s.num_cached) + " < 0");
    const int64_t need_blocks = (s.num_cached + n + bs - 1) / bs;
    if (static_cast<int64_t>(s.block_table.size()) < need_blocks) {
      return invalid_argument(where + "block_table has " + std::to_string(s.block_table.size()) + " blocks, " +
                              std::to_string(need_blocks) + " needed");
    }
    for (int64_t b = 0; b < need_blocks; ++b) {
      if (s.block_table[b] < 0 || s.block_table[b] >= kv.num_blocks()) {
        return invalid_argument(where + "block_table[" + std::to_string(b) + "] = " + std::to_string(s.block_table[b]) +
                                " is outside the " + std::to_string(kv.num_blocks()) + "-block cache");
      }
    }
    if (!s.parents.empty() && static_cast<int64_t>(s.parents.size()) != n) {
      return invalid_argument(where + "parents has " + std::to_string(s.parents.size()) + " entries for " + std::to_string(n) + " tokens");
    }
    std::vector<int32_t> depth(static_cast<size_t>(n), 0);
    for (int64_t j = 0; j < n; ++j) {
      const int32_t t = s.tokens[j];
      if (t < 0 || t >= c.vocab_size) {
        return invalid_argument(where + "token " + std::to_string(t) + " is outside the vocabulary of " + std::to_string(c.vocab_size));
      }
      if (!s.parents.empty()) {
        const int32_t p = s.parents[j];
        if (p < -1 || p >= j) return invalid_argument(where + "parents[" + std::to_string(j) + "] = " + std::to_string(p) + " is not an earlier node");
        depth[j] = p < 0 ? 0 : depth[p] + 1;
      } else {
        depth[j] = static_cast<int32_t>(j);
      }
      const int64_t pos = s.num_cached + depth[j];
      if (pos >= c.context_length) {
        return invalid_argument(where + "position " + std::to_string(pos) + " is past the model's context length " +
                                std::to_string(c.context_length));
      }
      const int64_t logical = s.num_cached + j;
      tokens.push_back(t);
      positions.push_back(static_cast<int32_t>(pos));
      slots.push_back(static_cast<int32_t>(s.block_table[logical / bs] * bs + logical % bs));
    }
    AttentionSeq& a = attn[si];
    a.row_begin = static_cast<int32_t>(tokens.size() - n);
    a.num_rows = static_cast<int32_t>(n);
    a.num_cached = s.num_cached;
    a.block_table = s.block_table.data();
    a.num_blocks = static_cast<int32_t>(s.block_table.size());
    a.parents = s.parents.empty() ? nullptr : s.parents.data();
    if (s.logit_rows.empty()) {
      logit_idx.push_back(a.row_begin + static_cast<int32_t>(n - 1));
    } else {
      for (int32_t r : s.logit_rows) {
        if (r < 0 || r >= n) return invalid_argument(where + "logit_rows entry " + std::to_string(r) + " is outside 0.." + std::to_string(n - 1));
        logit_idx.push_back(a.row_begin + r);
      }
    }
    out->seq_row_offset.push_back(static_cast<int32_t>(logit_idx.size()));
    if (batch.return_hidden) {
      if (s.hidden_rows.empty()) {
        hidden_idx.insert(hidden_idx.end(), logit_idx.begin() + out->seq_row_offset[si], logit_idx.end());
      } else {
        hidden_is_logits = false;
        for (int32_t r : s.hidden_rows) {
          if (r < 0 || r >= n) return invalid_argument(where + "hidden_rows entry " + std::to_string(r) + " is outside 0.." + std::to_string(n - 1));
          hidden_idx.push_back(a.row_begin + r);
        }
      }
      out->seq_hidden_offset.push_back(static_cast<int32_t>(hidden_idx.size()));
    }
  }
  const int64_t N = static_cast<int64_t>(tokens.size());
  const int64_t M = static_cast<int64_t>(logit_idx.size());
  if (N == 0) return invalid_argument("batch has no sequences");

  // ---- buffers ----
  Backend& B = backend_;
  Buffer& ids = scratch(0, N * 4);
  Buffer& pos = scratch(1, N * 4);
  Buffer& slot = scratch(2, N * 4);
  Buffer& x = scratch(3, N * d * 4);       // [N, d] residual stream
  Buffer& h = scratch(4, N * d * 4);       // [N, d] normed
  Buffer& q = scratch(5, N * qd * 4);      // [N, qd]
  Buffer& k = scratch(6, N * kvd * 4);     // [N, kvd]
  Buffer& v = scratch(7, N * kvd * 4);     // [N, kvd]
  Buffer& att = scratch(8, N * qd * 4);    // [N, qd]
  Buffer& g = scratch(9, N * ff * 4);      // [N, ff]
  Buffer& u = scratch(10, N * ff * 4);     // [N, ff]
  Buffer& o = scratch(11, N * d * 4);      // [N, d]
  B.upload(ids, tokens.data(), N * 4);
  B.upload(pos, positions.data(), N * 4);
  B.upload(slot, slots.data(), N * 4);

  B.embedding(*tok_embd_, ids.i32(), N, x.f32());
  for (int64_t l = 0; l < n_layers; ++l) {
    const Layer& L = layers_[static_cast<size_t>(l)];
    B.rms_norm(x.f32(), *L.attn_norm, c.norm_eps, N, d, h.f32());
    B.matmul(*L.wq, h.f32(), N, q.f32(), L.bq.get());
    B.matmul(*L.wk, h.f32(), N, k.f32(), L.bk.get());
    B.matmul(*L.wv, h.f32(), N, v.f32(), L.bv.get());
    B.rope(q.f32(), pos.i32(), N, c.num_heads, rope_);
    B.rope(k.f32(), pos.i32(), N, c.num_kv_heads, rope_);
    B.kv_write(kv, l, k.f32(), v.f32(), slot.i32(), N);
    B.attention(kv, l, q.f32(), attn, c.num_heads, c.num_kv_heads, c.head_dim, att.f32());
    B.matmul(*L.wo, att.f32(), N, o.f32());
    B.add(x.f32(), o.f32(), N * d);
    B.rms_norm(x.f32(), *L.ffn_norm, c.norm_eps, N, d, h.f32());
    B.matmul(*L.w_gate, h.f32(), N, g.f32());
    B.matmul(*L.w_up, h.f32(), N, u.f32());
    B.swiglu(g.f32(), u.f32(), N * ff, g.f32());
    B.matmul(*L.w_down, g.f32(), N, o.f32());
    B.add(x.f32(), o.f32(), N * d);
  }
  // Only the requested rows go through the final norm and the (large) output head.
  Buffer& sel = scratch(12, M * d * 4);
  Buffer& normed = scratch(13, M * d * 4);
  Buffer& logits = scratch(14, M * c.vocab_size * 4);
  B.gather_rows(x.f32(), logit_idx.data(), M, d, sel.f32());
  B.rms_norm(sel.f32(), *output_norm_, c.norm_eps, M, d, normed.f32());
  B.matmul(c.tied_output ? *tok_embd_ : *output_, normed.f32(), M, logits.f32());
  B.synchronize();
  out->vocab_size = c.vocab_size;
  out->hidden_size = d;
  out->logits.resize(static_cast<size_t>(M * c.vocab_size));
  B.download(out->logits.data(), logits, M * c.vocab_size * 4);
  if (batch.return_hidden && hidden_is_logits) {
    out->hidden.resize(static_cast<size_t>(M * d));
    B.download(out->hidden.data(), normed, M * d * 4);
  } else if (batch.return_hidden) {
    // Rows of their own: the same final norm, without the output head.
    const int64_t H = static_cast<int64_t>(hidden_idx.size());
    out->hidden.resize(static_cast<size_t>(H * d));
    if (H > 0) {
      Buffer& hsel = scratch(15, H * d * 4);
      Buffer& hnorm = scratch(16, H * d * 4);
      B.gather_rows(x.f32(), hidden_idx.data(), H, d, hsel.f32());
      B.rms_norm(hsel.f32(), *output_norm_, c.norm_eps, H, d, hnorm.f32());
      B.synchronize();
      B.download(out->hidden.data(), hnorm, H * d * 4);
    }
  } else {
    out->hidden.clear();
    out->seq_hidden_offset.clear();
  }
  return Status();
}

}  // namespace specserve
