// specserve model: the llama-family transformer, written once against Backend.
//
// Architecture: pre-norm decoder (RMSNorm), rotary position embedding, grouped-query
// attention over a paged KV cache, SwiGLU MLP, tied or untied output head — as llama.cpp's
// `llm_build_llama` computes it. Weights and hyper-parameters come from GGUF (ModelConfig).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "model/backend.h"
#include "model/communicator.h"
#include "model/gguf.h"
#include "model/model_config.h"

namespace specserve {

/// New tokens of one sequence in a forward call.
struct SequenceInput {
  std::vector<int32_t> tokens;       ///< new tokens (prefill chunk, one decode token, or tree nodes)
  int32_t num_cached = 0;            ///< tokens already in the KV cache before these
  std::vector<int32_t> block_table;  ///< KV block ids covering num_cached + tokens.size() slots
  /// Empty: a chain (token i at position num_cached + i). Else one parent per token (-1: the
  /// token follows the cached prefix; otherwise an earlier index) — a token tree whose node i
  /// sits at position num_cached + depth(i) and attends to the prefix and its ancestors only.
  std::vector<int32_t> parents;
  /// Which new tokens need logits (indices into tokens). Empty: only the last one.
  std::vector<int32_t> logit_rows;
  /// Which new tokens need their hidden state when ForwardBatch::return_hidden is set (indices
  /// into tokens, any order, may differ from logit_rows). Empty: those of logit_rows. A row that
  /// needs a hidden state but no logits skips the output head (the Medusa / EAGLE proposers
  /// read the hidden state of every prefill row; spec/proposer.h).
  std::vector<int32_t> hidden_rows;
  /// Only the argmax of each logit row and its raw logprob (Backend::argmax_rows, on the
  /// backend's device), not the rows: all that a greedy request without penalties or top
  /// logprobs needs, so a GPU step moves 8 bytes per row to the host instead of 4 * vocab.
  /// ForwardOutput::argmax / argmax_logprob then hold them; row() must not be asked for them.
  bool argmax_only = false;
  /// With argmax_only, >= 1e-5: each logit row's token is drawn at this temperature with the
  /// uniform `sample_uniform` in [0, 1) instead of taken as its argmax (Backend::sample_rows;
  /// model/sampling.h temperature_pick), the same token on every backend. The engine sets it for
  /// a plain step (one logit row) of a request with only a temperature.
  float sample_temperature = 0.0f;
  double sample_uniform = 0.0;
};

/// A batch of sequences for one forward call; prefill chunks and decode tokens mix freely.
struct ForwardBatch {
  std::vector<SequenceInput> seqs;
  /// Also return final-norm hidden states (output_norm(x), the vector the output head
  /// multiplies) of each sequence's hidden_rows (default: its logit rows).
  bool return_hidden = false;
  /// Run only the first `num_layers` layers (0 = all), then the final norm and head: the
  /// layer-skip self-speculative draft (shares every weight with the full model).
  int64_t num_layers = 0;
};

/// Results for the requested rows, in batch order: sequence 0's logit rows first.
struct ForwardOutput {
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  /// [num_logits_rows, vocab_size]: the logit rows of the sequences without argmax_only, in
  /// batch order (row() finds them).
  std::vector<float> logits;
  std::vector<float> hidden;            ///< [num_hidden_rows, hidden_size] when asked
  std::vector<int32_t> seq_row_offset;  ///< first logit row of sequence i (of all rows); size seqs + 1
  std::vector<int32_t> seq_hidden_offset;  ///< first hidden row of sequence i; size seqs + 1 (when asked)
  /// First row in `logits` of sequence i; size seqs + 1 (an argmax_only sequence has none).
  std::vector<int32_t> seq_logits_offset;
  /// [num_rows] (indexed as seq_row_offset) when some sequence asked argmax_only, else empty:
  /// every logit row's argmax, or its drawn token for a sequence with sample_temperature (-1:
  /// the row has a NaN or +inf, or no finite value), and the token's raw logprob
  /// (model/sampling.h greedy_pick, temperature_pick).
  std::vector<int32_t> argmax;
  std::vector<float> argmax_logprob;
  /// Sequence `seq`'s k-th logit row [vocab_size]. Aborts for a row that was not downloaded
  /// (an argmax_only sequence's: a caller bug).
  const float* row(int32_t seq, int32_t k) const {
    const int32_t r = seq_logits_offset[static_cast<size_t>(seq)] + k;
    SPECSERVE_CHECK(k >= 0 && r < seq_logits_offset[static_cast<size_t>(seq) + 1],
                    "ForwardOutput::row: sequence " + std::to_string(seq) + " row " + std::to_string(k) +
                        " has no logits (argmax_only, or out of range)");
    return logits.data() + static_cast<int64_t>(r) * vocab_size;
  }
  /// Argmax and raw logprob of sequence `seq`'s k-th logit row (argmax_only batches).
  /// Aborts when the batch asked for none (a caller bug).
  int32_t argmax_of(int32_t seq, int32_t k) const { return argmax[pick_index(seq, k)]; }
  float argmax_logprob_of(int32_t seq, int32_t k) const { return argmax_logprob[pick_index(seq, k)]; }
  size_t pick_index(int32_t seq, int32_t k) const {
    const int32_t r = seq_row_offset[static_cast<size_t>(seq)] + k;
    SPECSERVE_CHECK(k >= 0 && r < seq_row_offset[static_cast<size_t>(seq) + 1] && static_cast<size_t>(r) < argmax.size(),
                    "ForwardOutput::argmax_of: sequence " + std::to_string(seq) + " row " + std::to_string(k) +
                        " has no argmax (no argmax_only sequence in the batch, or out of range)");
    return static_cast<size_t>(r);
  }
  /// Hidden state of sequence `seq`'s k-th hidden row (its k-th hidden_rows entry, or k-th logit row).
  const float* hidden_row(int32_t seq, int32_t k) const {
    return hidden.data() + (seq_hidden_offset[seq] + k) * hidden_size;
  }
};

/// Loading options.
struct LoadOptions {
  int64_t max_layers = 0;  ///< 0: all; else load only the first N layers (tests, tools)
  /// Tensor parallelism (vLLM's tensor_parallel_size): load only shard `tp_rank` of `tp_size`
  /// (see TensorParallelShard). 1 <= tp_size <= num_kv_heads, 0 <= tp_rank < tp_size.
  int tp_rank = 0;
  int tp_size = 1;
  /// The group's communicator, required when tp_size > 1 (rank() == tp_rank, size() ==
  /// tp_size); it must outlive the model, which calls all_reduce_sum twice per layer in forward.
  Communicator* communicator = nullptr;
};

/// The part of the model one tensor-parallel rank holds (Megatron-LM's split, Shoeybi et al.
/// 2019): rank r owns kv heads [kv_head_begin, kv_head_end) = [floor(r KV / tp), floor((r+1) KV / tp))
/// and the query heads that read them (grouped-query attention), i.e. rows of attn_q/k/v (and
/// their biases: column-parallel) and the matching input columns of attn_output (row-parallel);
/// and MLP units [ffn_begin, ffn_end): rows of ffn_gate/up, columns of ffn_down. Embedding, norms
/// and output head are replicated. Splits may be uneven (SmolLM2-135M: 3 kv heads over 2 ranks
/// = 2 + 1). After attn_output and ffn_down each rank holds a partial sum of the residual update,
/// which Communicator::all_reduce_sum completes. No row-parallel layer of the llama family has a
/// bias, so no bias needs to be added on one rank only.
struct TensorParallelShard {
  int rank = 0, size = 1;
  int64_t head_begin = 0, head_end = 0;        ///< query heads
  int64_t kv_head_begin = 0, kv_head_end = 0;  ///< kv heads
  int64_t ffn_begin = 0, ffn_end = 0;          ///< MLP units (rows of ffn_gate / ffn_up)
  int64_t num_heads() const { return head_end - head_begin; }
  int64_t num_kv_heads() const { return kv_head_end - kv_head_begin; }
  int64_t ffn_size() const { return ffn_end - ffn_begin; }
};

/// The split of `config` for rank `rank` of `size`. MLP boundaries are rounded down to a
/// multiple of lcm(`ffn_align`, 8) (ffn_align: the quant block size of ffn_down, so its column
/// slices stay whole blocks; 8: the CPU matmul's width unit) when that leaves every rank at
/// least one unit; else of 8; else they are floor(r ff / size).
/// Errors (kInvalidArgument naming tensor_parallel_size and its value): size < 1, size above
/// the model's kv head count, rank outside [0, size).
Expected<TensorParallelShard> tensor_parallel_shard(const ModelConfig& config, int rank, int size, int64_t ffn_align = 1);

/// Rank 0's link to the other ranks of its tensor-parallel group, when rank 0's Transformer is
/// what callers (the Engine, proposers) use: each call makes every other rank do the same on its
/// shard, in the same order, so a tensor-parallel model is a drop-in Transformer.
/// Implementations: the ranks as threads of one process (cpu/tensor_parallel.h); later the
/// target-shard actors.
class TensorParallelPeers {
 public:
  virtual ~TensorParallelPeers() = default;
  /// Every other rank creates its KV store `kv_id` (Transformer::create_kv with these
  /// arguments). Errors: the first rank's error.
  virtual Status create_kv(int32_t kv_id, int64_t num_blocks, int64_t block_size, int64_t num_layers) = 0;
  /// Every other rank starts Transformer::forward(batch) on its store `kv_id` and returns at
  /// once: the ranks meet in the all-reduces. `batch` may be freed on return (peers copy it).
  virtual void start_forward(int32_t kv_id, const ForwardBatch& batch) = 0;
  /// Waits for the forward started last. Errors: the first failing rank's, naming the rank.
  virtual Status finish_forward() = 0;
  /// As finish_forward, after rank 0's own part failed with `own` (a collective broke: a peer
  /// died or stalled). Peers whose answer cannot come (a dead process) must not hold rank 0 for
  /// the whole command timeout: implementations may wait briefly and give up. Default:
  /// finish_forward().
  virtual Status finish_forward_after_failure(const Status& own) {
    (void)own;
    return finish_forward();
  }
  /// Every other rank runs Backend::kv_copy_slots on its store `kv_id` (src, dst: n host slots).
  virtual Status kv_copy_slots(int32_t kv_id, const int32_t* src, const int32_t* dst, int64_t n) = 0;
};

/// A loaded model on one backend. Not thread-safe: one forward at a time.
class Transformer {
 public:
  /// Reads config and weights from `file` onto `backend` (which must outlive the model).
  /// With opts.tp_size > 1, only shard opts.tp_rank (TensorParallelShard): its tensors are
  /// sliced (model/tensor_slice.h) before Backend::load_weight, so backends need nothing new.
  /// Errors: those of ModelConfig::from_gguf, Backend::load_weight, tensor_parallel_shard and
  /// slicing; kInvalidArgument naming tensor_parallel_size when tp_size > 1 comes without a
  /// communicator or with one of another rank or size.
  static Expected<std::unique_ptr<Transformer>> load(const GgufFile& file, Backend& backend, LoadOptions opts = {});

  const ModelConfig& config() const { return config_; }
  Backend& backend() { return backend_; }
  /// The weights a draft head shares with its target (Medusa, EAGLE: spec/*_proposer.h), on
  /// backend(): token embedding [vocab, hidden], output head [vocab, hidden] (the embedding
  /// when tied), final norm [1, hidden].
  const Weight& token_embedding() const { return *tok_embd_; }
  const Weight& output_head() const { return config_.tied_output ? *tok_embd_ : *output_; }
  const Weight& output_norm() const { return *output_norm_; }
  /// The RoPE parameters the model applies (a draft head's attention uses the same).
  const RopeParams& rope_params() const { return rope_; }

  /// A KV store for this model: `num_blocks` blocks of `block_size` tokens in the first
  /// `num_layers` layers (0: every layer; fewer for a layer-skip draft), holding this rank's kv
  /// heads only (kv_dim = shard().num_kv_heads() * head_dim). With peers attached, every rank
  /// creates its store and the result is tied to them (forward, kv_copy_slots).
  /// Errors: those of Backend::create_kv_storage and the peers'.
  Expected<std::unique_ptr<KvStorage>> create_kv(int64_t num_blocks, int64_t block_size, int64_t num_layers = 0);

  /// Backend::kv_copy_slots on this rank's store and, with peers attached, on theirs: the KV
  /// moves a caller of a tensor-parallel model makes (tree compaction) go through here.
  Status kv_copy_slots(KvStorage& kv, const int32_t* src, const int32_t* dst, int64_t n);

  /// This rank's part of the model (the whole model when tp_size is 1).
  const TensorParallelShard& shard() const { return shard_; }
  /// Makes this rank-0 model drive `peers` (see TensorParallelPeers); nullptr detaches. Call
  /// before create_kv. `peers` must outlive the model or be detached first.
  void set_tensor_parallel_peers(TensorParallelPeers* peers) { peers_ = peers; }

  /// Runs the batch, writing each new token's K/V into `kv` at the slots its block table
  /// gives, and returns logits for the requested rows.
  /// Tensor parallel: every rank of the group calls forward with the same batch (rank 0 does
  /// it for its peers when attached); only rank 0 computes the final norm, head and hidden
  /// states — `out` of another rank holds vocab_size and hidden_size but no rows. A communicator
  /// failure returns its error (kUnavailable / kDeadlineExceeded) and leaves `kv` undefined.
  /// Errors (kInvalidArgument, naming the sequence and field): empty tokens, a token id
  /// outside the vocabulary, a block table too short for num_cached + tokens, a block id
  /// outside kv, a parent index not earlier than its node, a position past context_length.
  Status forward(const ForwardBatch& batch, KvStorage& kv, ForwardOutput* out);

 private:
  struct Layer {
    std::unique_ptr<Weight> attn_norm, wq, wk, wv, wo, bq, bk, bv, ffn_norm, w_gate, w_up, w_down;
  };
  Transformer(ModelConfig c, Backend& b) : config_(std::move(c)), backend_(b) {}
  Buffer& scratch(int idx, int64_t bytes);
  Status forward_local(const ForwardBatch& batch, KvStorage& kv, ForwardOutput* out);
  Expected<int32_t> peer_kv_id(const KvStorage& kv) const;

  ModelConfig config_;
  Backend& backend_;
  std::unique_ptr<Weight> tok_embd_, output_norm_, output_;
  std::vector<Layer> layers_;
  RopeParams rope_;
  std::vector<std::unique_ptr<Buffer>> scratch_;
  TensorParallelShard shard_;
  Communicator* comm_ = nullptr;
  TensorParallelPeers* peers_ = nullptr;
  // KV stores created while peers were attached, and the id the peers know them by.
  // NOTE: a store destroyed by its owner keeps its peers' copies until the group goes away
  // (callers create a store once per engine); the map entry is replaced if its address returns.
  std::map<const KvStorage*, int32_t> peer_kv_ids_;
  int32_t next_kv_id_ = 0;
  // Column slices a backend that keeps quantised blocks may point into (see load()).
  std::vector<std::vector<uint8_t>> sliced_bytes_;
};

}  // namespace specserve
