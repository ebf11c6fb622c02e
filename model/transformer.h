// specserve model: the llama-family transformer, written once against Backend.
//
// Architecture: pre-norm decoder (RMSNorm), rotary position embedding, grouped-query
// attention over a paged KV cache, SwiGLU MLP, tied or untied output head — as llama.cpp's
// `llm_build_llama` computes it. Weights and hyper-parameters come from GGUF (ModelConfig).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/status.h"
#include "model/backend.h"
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
  std::vector<float> logits;            ///< [num_rows, vocab_size]
  std::vector<float> hidden;            ///< [num_hidden_rows, hidden_size] when asked
  std::vector<int32_t> seq_row_offset;  ///< first logit row of sequence i; size seqs + 1
  std::vector<int32_t> seq_hidden_offset;  ///< first hidden row of sequence i; size seqs + 1 (when asked)
  const float* row(int32_t seq, int32_t k) const { return logits.data() + (seq_row_offset[seq] + k) * vocab_size; }
  /// Hidden state of sequence `seq`'s k-th hidden row (its k-th hidden_rows entry, or k-th logit row).
  const float* hidden_row(int32_t seq, int32_t k) const {
    return hidden.data() + (seq_hidden_offset[seq] + k) * hidden_size;
  }
};

/// Loading options.
struct LoadOptions {
  int64_t max_layers = 0;  ///< 0: all; else load only the first N layers (tests, tools)
};

/// A loaded model on one backend. Not thread-safe: one forward at a time.
class Transformer {
 public:
  /// Reads config and weights from `file` onto `backend` (which must outlive the model).
  /// Errors: those of ModelConfig::from_gguf and Backend::load_weight.
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

  /// A KV store for this model: `num_blocks` blocks of `block_size` tokens in every layer.
  Expected<std::unique_ptr<KvStorage>> create_kv(int64_t num_blocks, int64_t block_size) const;

  /// Runs the batch, writing each new token's K/V into `kv` at the slots its block table
  /// gives, and returns logits for the requested rows.
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

  ModelConfig config_;
  Backend& backend_;
  std::unique_ptr<Weight> tok_embd_, output_norm_, output_;
  std::vector<Layer> layers_;
  RopeParams rope_;
  std::vector<std::unique_ptr<Buffer>> scratch_;
};

}  // namespace specserve
