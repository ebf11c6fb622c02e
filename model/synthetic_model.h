// specserve model: synthetic llama-architecture GGUF files with seeded random weights.
//
// For tests and tools that need a real model file without downloading one: the file is a valid
// llama GGUF (every key ModelConfig::from_gguf and Tokenizer::from_gguf read) whose weights are
// drawn from a seed, so the same spec always writes the same bytes. A *draft* can be derived
// from a target: the target's first N layers, embeddings, final norm and head, plus optional
// Gaussian noise — a cheap model whose greedy choices agree with the target's most of the time,
// which is what speculative decoding tests need (substantial but imperfect acceptance).
//
// Weight init (all Gaussian, drawn per tensor from seed + tensor name, so a draft regenerates
// exactly the target's tensors it shares):
//   token_embd            N(0, 1)
//   attn_q/k/v, ffn_gate/up   N(0, 1/sqrt(fan_in))
//   attn_output, ffn_down N(0, residual_scale/sqrt(fan_in))   how far each layer moves the residual
//   output                N(0, logit_scale/sqrt(hidden))       logits have std ~ logit_scale
//   *_norm                1 + N(0, 0.1)
// Tokenizer: byte-level BPE ("gpt2", pre "default") with no merges: id 0 is "<|endoftext|>"
// (control, EOS and BOS), ids 1..256 the 256 byte tokens (printable ASCII first, so a vocabulary
// under 257 still holds letters), then multi-letter words ("ab", " cd", ...) that only decode.
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "model/ggml_type.h"

namespace specserve {

/// Shape and content of a synthetic llama model.
struct SyntheticModelSpec {
  std::string name = "synthetic-llama";  ///< general.name
  int64_t num_layers = 2;
  int64_t hidden_size = 64;      ///< multiple of 8 (32 when quantised)
  int64_t num_heads = 4;         ///< hidden_size / num_heads must be even (RoPE pairs)
  int64_t num_kv_heads = 2;      ///< divides num_heads (grouped-query attention)
  int64_t ffn_size = 128;        ///< multiple of 8 (32 when quantised)
  int64_t vocab_size = 512;      ///< >= 2
  int64_t context_length = 256;
  float rope_theta = 10000.0f;
  float norm_eps = 1e-5f;
  uint64_t seed = 1;
  /// Storage of the 2-D weights (embeddings, projections, head): F32, Q8_0 or Q4_1.
  /// Norm vectors are always F32, as llama.cpp's quantiser leaves them.
  GgmlType storage = GgmlType::F32;
  bool tied_output = false;      ///< true: no output.weight (the head reuses token_embd)
  float residual_scale = 0.5f;   ///< see the file comment; small = later layers change little
  float logit_scale = 4.0f;      ///< std of the logits; small = a spread (high-entropy) distribution
};

/// How to derive a draft from a target spec.
struct SyntheticDraftSpec {
  int64_t num_layers = 1;        ///< the target's first N layers (1 .. target layers)
  /// Relative noise: every shared weight w gets + N(0, noise * init_std(w)). 0 = exact copy.
  float noise = 0.0f;
  uint64_t noise_seed = 2;
  int64_t context_length = 0;    ///< 0: the target's; else a (usually shorter) draft context
};

/// The token texts the synthetic tokenizer uses for `vocab_size` ids (GPT-2 byte-encoded).
std::vector<std::string> synthetic_vocab(int64_t vocab_size);

/// Id of "<|endoftext|>" (EOS, BOS) in every synthetic vocabulary.
inline constexpr int32_t kSyntheticEosId = 0;

/// Checks a spec: every size in range and the divisibility rules above (kInvalidArgument
/// naming the field and value); storage other than F32/Q8_0/Q4_1 is kUnsupported.
Status validate_synthetic_spec(const SyntheticModelSpec& spec);

/// Writes the model to `path` (atomically, via GgufWriter::write_file).
/// Errors: those of validate_synthetic_spec and GgufWriter::write_file.
Status write_synthetic_llama(const SyntheticModelSpec& spec, const std::string& path);

/// Writes a draft derived from `target` (see SyntheticDraftSpec) to `path`: same vocabulary,
/// embeddings and head, the first draft.num_layers layers, noise added, context_length
/// replaced when given. Errors: those of write_synthetic_llama; kInvalidArgument for
/// draft.num_layers outside 1..target.num_layers, negative noise or context_length.
Status write_synthetic_draft(const SyntheticModelSpec& target, const SyntheticDraftSpec& draft, const std::string& path);

}  // namespace specserve
