#include "model/transformer.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/logging.h"
#include "model/dequant.h"
#include "model/tensor_slice.h"

namespace specserve {

Expected<TensorParallelShard> tensor_parallel_shard(const ModelConfig& c, int rank, int size, int64_t ffn_align) {
  if (size < 1) return invalid_argument("tensor_parallel_size = " + std::to_string(size) + ": must be >= 1");
  if (size > c.num_kv_heads) {
    return invalid_argument("tensor_parallel_size = " + std::to_string(size) + " exceeds the model's " +
                            std::to_string(c.num_kv_heads) + " kv heads (attention.head_count_kv); shards split by kv head");
  }
  if (rank < 0 || rank >= size) {
    return invalid_argument("tensor parallel rank " + std::to_string(rank) + " is outside [0, tensor_parallel_size = " +
                            std::to_string(size) + ")");
  }
  const int64_t kv = c.num_kv_heads, group = c.num_heads / c.num_kv_heads, ff = c.ffn_size;
  TensorParallelShard s;
  s.rank = rank;
  s.size = size;
  s.kv_head_begin = rank * kv / size;
  s.kv_head_end = (rank + 1) * kv / size;
  s.head_begin = s.kv_head_begin * group;
  s.head_end = s.kv_head_end * group;
  // MLP boundaries on ffn_align multiples when every rank keeps at least one unit.
  auto bound = [&](int64_t r, int64_t align) { return r == size ? ff : r * ff / size / align * align; };
  // NOTE: at least multiples of 8: the CPU matmul's widths are (cpu/matmul.h), as are every
  // llama-family width, so a shard's ffn_down never has an odd width.
  auto fits = [&](int64_t align) {
    for (int64_t r = 0; r < size; ++r) {
      if (bound(r + 1, align) <= bound(r, align)) return false;
    }
    return true;
  };
  int64_t align = std::max<int64_t>(ffn_align, 8);
  if (align % 8 != 0) align *= 8;
  if (!fits(align)) align = 8;
  if (!fits(align)) align = 1;
  s.ffn_begin = bound(rank, align);
  s.ffn_end = bound(rank + 1, align);
  return s;
}

Expected<std::unique_ptr<Transformer>> Transformer::load(const GgufFile& file, Backend& backend, LoadOptions opts) {
  auto cfg = ModelConfig::from_gguf(file);
  if (!cfg.ok()) return cfg.status();
  std::unique_ptr<Transformer> m(new Transformer(*cfg, backend));
  ModelConfig& c = m->config_;
  if (opts.max_layers > 0 && opts.max_layers < c.num_layers) c.num_layers = opts.max_layers;
  if (opts.tp_size > 1) {
    if (!opts.communicator) {
      return invalid_argument("tensor_parallel_size = " + std::to_string(opts.tp_size) + " needs a communicator");
    }
    if (opts.communicator->size() != opts.tp_size || opts.communicator->rank() != opts.tp_rank) {
      return invalid_argument("communicator is rank " + std::to_string(opts.communicator->rank()) + " of " +
                              std::to_string(opts.communicator->size()) + ", the model rank " + std::to_string(opts.tp_rank) +
                              " of tensor_parallel_size = " + std::to_string(opts.tp_size));
    }
  }
  // ffn_down's column slices stay whole quant blocks when the MLP split falls on them.
  int64_t ffn_align = 1;
  if (const GgufTensorInfo* down = file.find_tensor("blk.0.ffn_down.weight")) {
    if (auto tr = ggml_type_traits(down->raw_type)) ffn_align = tr->block_size;
  }
  auto shard = tensor_parallel_shard(c, opts.tp_rank, opts.tp_size, ffn_align);
  if (!shard.ok()) return shard.status();
  m->shard_ = *shard;
  m->comm_ = opts.tp_size > 1 ? opts.communicator : nullptr;
  const TensorParallelShard& sh = m->shard_;
  const bool split = opts.tp_size > 1;
  // Slice kinds: what part of a tensor this rank loads (see TensorParallelShard).
  enum class Part { kWhole, kRows, kCols };
  auto load_part = [&](const std::string& name, std::unique_ptr<Weight>* dst, Part part, int64_t begin,
                       int64_t end) -> Status {
    const GgufTensorInfo* t = file.find_tensor(name);
    if (!t) return corrupt_data(file.path() + ": tensor '" + name + "' is missing");
    // An infinite or NaN block scale is named here, not found later as a wrong logit. Rank 0
    // checks whole tensors for its group (a rank that fails to load fails the group).
    if (opts.tp_rank == 0) {
      if (Status st = check_block_scales(*t); !st.ok()) return Status(st.code(), file.path() + ": " + st.message());
    }
    Expected<TensorSlice> slice = TensorSlice();
    if (split && part == Part::kRows) slice = slice_rows(*t, begin, end);
    if (split && part == Part::kCols) slice = slice_cols(*t, begin, end);
    if (!slice.ok()) return Status(slice.status().code(), file.path() + ": " + slice.status().message());
    const bool sliced = split && part != Part::kWhole;
    auto w = backend.load_weight(sliced ? slice->info : *t);
    if (!w.ok()) return Status(w.status().code(), file.path() + ": " + w.status().message());
    // A backend that keeps quantised blocks may keep pointing at them.
    if (sliced && slice->owns_bytes() && backend.keeps_quantized()) m->sliced_bytes_.push_back(std::move(slice->bytes));
    *dst = std::move(*w);
    return Status();
  };
  auto load = [&](const std::string& name, std::unique_ptr<Weight>* dst) { return load_part(name, dst, Part::kWhole, 0, 0); };
  const int64_t hd = c.head_dim;
  const int64_t q0 = sh.head_begin * hd, q1 = sh.head_end * hd;
  const int64_t k0 = sh.kv_head_begin * hd, k1 = sh.kv_head_end * hd;
  SPECSERVE_RETURN_IF_ERROR(load("token_embd.weight", &m->tok_embd_));
  SPECSERVE_RETURN_IF_ERROR(load("output_norm.weight", &m->output_norm_));
  if (!c.tied_output) SPECSERVE_RETURN_IF_ERROR(load("output.weight", &m->output_));
  m->layers_.resize(static_cast<size_t>(c.num_layers));
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    Layer& L = m->layers_[static_cast<size_t>(l)];
    SPECSERVE_RETURN_IF_ERROR(load(p + "attn_norm.weight", &L.attn_norm));
    // Column-parallel: output rows of this rank's heads / MLP units.
    SPECSERVE_RETURN_IF_ERROR(load_part(p + "attn_q.weight", &L.wq, Part::kRows, q0, q1));
    SPECSERVE_RETURN_IF_ERROR(load_part(p + "attn_k.weight", &L.wk, Part::kRows, k0, k1));
    SPECSERVE_RETURN_IF_ERROR(load_part(p + "attn_v.weight", &L.wv, Part::kRows, k0, k1));
    // Row-parallel: input columns of the same heads / units; the all-reduce completes the sum.
    SPECSERVE_RETURN_IF_ERROR(load_part(p + "attn_output.weight", &L.wo, Part::kCols, q0, q1));
    SPECSERVE_RETURN_IF_ERROR(load(p + "ffn_norm.weight", &L.ffn_norm));
    SPECSERVE_RETURN_IF_ERROR(load_part(p + "ffn_gate.weight", &L.w_gate, Part::kRows, sh.ffn_begin, sh.ffn_end));
    SPECSERVE_RETURN_IF_ERROR(load_part(p + "ffn_up.weight", &L.w_up, Part::kRows, sh.ffn_begin, sh.ffn_end));
    SPECSERVE_RETURN_IF_ERROR(load_part(p + "ffn_down.weight", &L.w_down, Part::kCols, sh.ffn_begin, sh.ffn_end));
    if (c.has_qkv_bias) {
      SPECSERVE_RETURN_IF_ERROR(load_part(p + "attn_q.bias", &L.bq, Part::kRows, q0, q1));
      SPECSERVE_RETURN_IF_ERROR(load_part(p + "attn_k.bias", &L.bk, Part::kRows, k0, k1));
      SPECSERVE_RETURN_IF_ERROR(load_part(p + "attn_v.bias", &L.bv, Part::kRows, k0, k1));
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

Expected<std::unique_ptr<KvStorage>> Transformer::create_kv(int64_t num_blocks, int64_t block_size, int64_t num_layers) {
  if (num_layers < 0 || num_layers > config_.num_layers) {
    return invalid_argument("create_kv: num_layers = " + std::to_string(num_layers) + " is outside 0.." +
                            std::to_string(config_.num_layers));
  }
  const int64_t layers = num_layers > 0 ? num_layers : config_.num_layers;
  auto kv = backend_.create_kv_storage(layers, num_blocks, block_size, shard_.num_kv_heads() * config_.head_dim);
  if (!kv.ok() || !peers_) return kv;
  const int32_t id = next_kv_id_++;
  SPECSERVE_RETURN_IF_ERROR(peers_->create_kv(id, num_blocks, block_size, layers));
  peer_kv_ids_[kv->get()] = id;
  return kv;
}

Expected<int32_t> Transformer::peer_kv_id(const KvStorage& kv) const {
  auto it = peer_kv_ids_.find(&kv);
  if (it == peer_kv_ids_.end()) {
    return invalid_argument("kv storage was not created by this tensor-parallel model's create_kv, so its peers hold no copy");
  }
  return it->second;
}

Status Transformer::kv_copy_slots(KvStorage& kv, const int32_t* src, const int32_t* dst, int64_t n) {
  if (peers_) {
    auto id = peer_kv_id(kv);
    if (!id.ok()) return id.status();
    SPECSERVE_RETURN_IF_ERROR(peers_->kv_copy_slots(*id, src, dst, n));
  }
  backend_.kv_copy_slots(kv, src, dst, n);
  return Status();
}

Buffer& Transformer::scratch(int idx, int64_t bytes) {
  if (static_cast<int>(scratch_.size()) <= idx) scratch_.resize(static_cast<size_t>(idx + 1));
  auto& b = scratch_[static_cast<size_t>(idx)];
  if (!b || b->bytes() < bytes) b = backend_.alloc(bytes + bytes / 4);
  return *b;
}

Status Transformer::forward(const ForwardBatch& batch, KvStorage& kv, ForwardOutput* out) {
  if (!peers_) return forward_local(batch, kv, out);
  auto id = peer_kv_id(kv);
  if (!id.ok()) return id.status();
  // NOTE: every rank validates the same batch against a store of the same shape, so a bad
  // batch fails on every rank before the first all-reduce and no rank is left waiting.
  peers_->start_forward(*id, batch);
  Status own = forward_local(batch, kv, out);
  Status theirs = own.ok() ? peers_->finish_forward() : peers_->finish_forward_after_failure(own);
  if (!own.ok()) return own;
  return theirs;
}

Status Transformer::forward_local(const ForwardBatch& batch, KvStorage& kv, ForwardOutput* out) {
  const ModelConfig& c = config_;
  const TensorParallelShard& sh = shard_;
  // This rank's widths (the whole model's when tp_size is 1).
  const int64_t nh = sh.num_heads(), nkv = sh.num_kv_heads();
  const int64_t d = c.hidden_size, qd = nh * c.head_dim, kvd = nkv * c.head_dim, ff = sh.ffn_size(), bs = kv.block_size();
  if (kv.kv_dim() != kvd || kv.num_layers() < std::min(batch.num_layers > 0 ? batch.num_layers : c.num_layers, c.num_layers)) {
    return invalid_argument("kv storage holds " + std::to_string(kv.num_layers()) + " layers of kv_dim " +
                            std::to_string(kv.kv_dim()) + "; this model (rank " + std::to_string(sh.rank) + ") needs kv_dim " +
                            std::to_string(kvd) + " (create it with Transformer::create_kv)");
  }
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
    if (s.argmax_only && s.sample_temperature >= 1e-5f && !(s.sample_uniform >= 0.0 && s.sample_uniform < 1.0)) {
      return invalid_argument(where + "sample_uniform " + std::to_string(s.sample_uniform) + " is not in [0, 1)");
    }
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
    const Backend::MatmulOutput qkv[] = {{L.wq.get(), q.f32(), L.bq.get()}, {L.wk.get(), k.f32(), L.bk.get()},
                                         {L.wv.get(), v.f32(), L.bv.get()}};
    B.matmul_multi(qkv, 3, h.f32(), N);
    B.rope(q.f32(), pos.i32(), N, nh, rope_);
    B.rope(k.f32(), pos.i32(), N, nkv, rope_);
    B.kv_write(kv, l, k.f32(), v.f32(), slot.i32(), N);
    B.attention(kv, l, q.f32(), attn, nh, nkv, c.head_dim, att.f32());
    B.matmul(*L.wo, att.f32(), N, o.f32());
    if (comm_) {  // o is this rank's partial sum of the attention output
      B.synchronize();
      SPECSERVE_RETURN_IF_ERROR(comm_->all_reduce_sum(o.f32(), N * d));
    }
    B.add(x.f32(), o.f32(), N * d);
    B.rms_norm(x.f32(), *L.ffn_norm, c.norm_eps, N, d, h.f32());
    const Backend::MatmulOutput gate_up[] = {{L.w_gate.get(), g.f32()}, {L.w_up.get(), u.f32()}};
    B.matmul_multi(gate_up, 2, h.f32(), N);
    B.swiglu(g.f32(), u.f32(), N * ff, g.f32());
    B.matmul(*L.w_down, g.f32(), N, o.f32());
    if (comm_) {
      B.synchronize();
      SPECSERVE_RETURN_IF_ERROR(comm_->all_reduce_sum(o.f32(), N * d));
    }
    B.add(x.f32(), o.f32(), N * d);
  }
  out->vocab_size = c.vocab_size;
  out->hidden_size = d;
  // Rows of `logits` to download: those of the sequences without argmax_only.
  out->seq_logits_offset.assign(1, 0);
  bool any_argmax = false;
  for (size_t si = 0; si < batch.seqs.size(); ++si) {
    const bool full = !batch.seqs[si].argmax_only;
    any_argmax |= !full;
    const int32_t rows = out->seq_row_offset[si + 1] - out->seq_row_offset[si];
    out->seq_logits_offset.push_back(out->seq_logits_offset.back() + (full ? rows : 0));
  }
  out->argmax.clear();
  out->argmax_logprob.clear();
  if (sh.rank != 0) {  // the head and hidden states are rank 0's (see forward's contract)
    out->logits.clear();
    out->hidden.clear();
    return Status();
  }
  // Only the requested rows go through the final norm and the (large) output head.
  Buffer& sel = scratch(12, M * d * 4);
  Buffer& normed = scratch(13, M * d * 4);
  Buffer& logits = scratch(14, M * c.vocab_size * 4);
  B.gather_rows(x.f32(), logit_idx.data(), M, d, sel.f32());
  B.rms_norm(sel.f32(), *output_norm_, c.norm_eps, M, d, normed.f32());
  B.matmul(c.tied_output ? *tok_embd_ : *output_, normed.f32(), M, logits.f32());
  if (any_argmax) {
    Buffer& picks = scratch(17, M * 8);  // tokens [M] then logprobs [M]: one download
    // Rows of sequences that draw at a temperature (sample_temperature) take sample_rows.
    std::vector<float> temps;
    std::vector<double> uniforms;
    for (size_t si = 0; si < batch.seqs.size(); ++si) {
      const SequenceInput& s = batch.seqs[si];
      if (!s.argmax_only || !(s.sample_temperature >= 1e-5f)) continue;
      temps.assign(static_cast<size_t>(M), 0.0f);
      uniforms.assign(static_cast<size_t>(M), 0.0);
      break;
    }
    if (!temps.empty()) {
      for (size_t si = 0; si < batch.seqs.size(); ++si) {
        const SequenceInput& s = batch.seqs[si];
        if (!s.argmax_only) continue;
        for (int32_t r = out->seq_row_offset[si]; r < out->seq_row_offset[si + 1]; ++r) {
          temps[static_cast<size_t>(r)] = s.sample_temperature;
          uniforms[static_cast<size_t>(r)] = s.sample_uniform;
        }
      }
      Buffer& tb = scratch(18, M * 4);
      Buffer& ub = scratch(19, M * 8);
      B.upload(tb, temps.data(), M * 4);
      B.upload(ub, uniforms.data(), M * 8);
      B.sample_rows(logits.f32(), M, c.vocab_size, tb.f32(), static_cast<const double*>(ub.data()), picks.i32(),
                    picks.f32() + M);
    } else {
      B.argmax_rows(logits.f32(), M, c.vocab_size, picks.i32(), picks.f32() + M);
    }
    B.synchronize();
    out->argmax.resize(static_cast<size_t>(M));
    out->argmax_logprob.resize(static_cast<size_t>(M));
    std::vector<int32_t> both(static_cast<size_t>(2 * M));
    B.download(both.data(), picks, M * 8);
    std::copy(both.begin(), both.begin() + M, out->argmax.begin());
    std::memcpy(out->argmax_logprob.data(), both.data() + M, static_cast<size_t>(M) * 4);
  } else {
    B.synchronize();
  }
  out->vocab_size = c.vocab_size;
  out->hidden_size = d;
  const int64_t row_bytes = c.vocab_size * 4;
  out->logits.resize(static_cast<size_t>(out->seq_logits_offset.back() * c.vocab_size));
  if (!any_argmax) {
    B.download(out->logits.data(), logits, M * row_bytes);
  } else {
    // Each sequence's rows are consecutive on both sides: one copy per run of neighbouring
    // sequences that want them.
    const size_t S = batch.seqs.size();
    for (size_t si = 0; si < S;) {
      if (batch.seqs[si].argmax_only) {
        ++si;
        continue;
      }
      size_t end = si;
      while (end < S && !batch.seqs[end].argmax_only) ++end;
      const int64_t rows = out->seq_logits_offset[end] - out->seq_logits_offset[si];
      if (rows > 0) {
        B.download(out->logits.data() + out->seq_logits_offset[si] * c.vocab_size, logits, rows * row_bytes,
                   out->seq_row_offset[si] * row_bytes);
      }
      si = end;
    }
  }
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
