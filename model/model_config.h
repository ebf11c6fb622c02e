// specserve model: llama-family hyper-parameters read from GGUF metadata.
#pragma once

#include <cstdint>
#include <string>

#include "core/status.h"
#include "model/gguf.h"

namespace specserve {

/// How RoPE pairs dimensions: kNorm rotates (x[2i], x[2i+1]) (llama in GGUF, whose converter
/// permutes Q/K); kNeox rotates (x[i], x[i + d/2]) (qwen2, gemma). Source: llama.cpp rope types.
enum class RopeStyle { kNorm, kNeox };

/// RoPE frequency scaling (none, linear, yarn) as GGUF's `<arch>.rope.scaling.*` keys describe it.
struct RopeScaling {
  std::string type = "none";     ///< none | linear | yarn
  float factor = 1.0f;           ///< context extension factor (freq_scale = 1 / factor)
  int64_t original_context = 0;  ///< yarn: original training context
  float attn_factor = 1.0f;      ///< yarn: attention magnitude factor
  float beta_fast = 32.0f, beta_slow = 1.0f;  ///< yarn ramp bounds (llama.cpp defaults)
};

/// Transformer shape. Every field comes from metadata; none is assumed.
struct ModelConfig {
  std::string arch;            ///< general.architecture (llama, qwen2, ...)
  std::string name;            ///< general.name
  int64_t num_layers = 0;      ///< <arch>.block_count
  int64_t hidden_size = 0;     ///< <arch>.embedding_length
  int64_t ffn_size = 0;        ///< <arch>.feed_forward_length
  int64_t num_heads = 0;       ///< <arch>.attention.head_count
  int64_t num_kv_heads = 0;    ///< <arch>.attention.head_count_kv (defaults to num_heads)
  int64_t head_dim = 0;        ///< <arch>.attention.key_length, else hidden_size / num_heads
  int64_t rope_dim = 0;        ///< <arch>.rope.dimension_count, else head_dim
  int64_t vocab_size = 0;      ///< rows of token_embd.weight
  int64_t context_length = 0;  ///< <arch>.context_length
  float rope_theta = 10000.0f; ///< <arch>.rope.freq_base
  float norm_eps = 1e-5f;      ///< <arch>.attention.layer_norm_rms_epsilon
  RopeStyle rope_style = RopeStyle::kNorm;
  RopeScaling rope_scaling;
  bool tied_output = false;    ///< true when output.weight is absent (token_embd is reused)
  bool has_qkv_bias = false;   ///< qwen2: attn_q/k/v biases

  int64_t q_dim() const { return num_heads * head_dim; }
  int64_t kv_dim() const { return num_kv_heads * head_dim; }

  /// Reads and validates the config; checks every tensor's shape against it.
  /// Errors: kUnsupported for an architecture outside the llama family (llama, qwen2,
  /// smollm, mistral); kCorruptData naming the key or tensor and the values for missing or
  /// inconsistent hyper-parameters and tensor shapes that do not match them.
  static Expected<ModelConfig> from_gguf(const GgufFile& file);
};

}  // namespace specserve
