// specserve model: text <-> token ids, built from GGUF tokenizer metadata.
//
// Two algorithms, both reproducing llama.cpp's tokenizer (src/llama-vocab.cpp, src/unicode.cpp)
// token for token, because the target model was trained on — and llama.cpp users compare
// against — exactly that segmentation:
//   - byte-level BPE ("gpt2" in tokenizer.ggml.model): GPT-2 byte->unicode mapping, a chain of
//     pre-tokenizer regexes chosen by tokenizer.ggml.pre (run with PCRE2), then rank-ordered
//     merges from tokenizer.ggml.merges (Sennrich et al. 2016; Radford et al. 2019).
//   - SentencePiece-style ("llama"): spaces escaped to U+2581, greedy score-ordered merges of
//     adjacent pieces, <0xNN> byte fallback for anything not in the vocabulary (Kudo 2018).
// Special tokens (control / user-defined / unknown) are cut out of the text before either
// algorithm runs, longest first, like llama.cpp's tokenizer_st_partition.
//
// Thread-safety: a Tokenizer is immutable after construction; all const methods may be called
// concurrently. StreamDecoder is single-threaded (one per request).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace specserve {

class GgufFile;

/// Token types as numbered in GGUF's tokenizer.ggml.token_type (llama.cpp's llama_token_type).
enum class TokenType : int32_t {
  kUndefined = 0,
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,
  kUserDefined = 4,
  kUnused = 5,
  kByte = 6,
};

/// Which algorithm a vocabulary uses.
enum class TokenizerKind { kBpe, kSpm };

/// Special token ids; an unset field takes llama.cpp's default for the tokenizer kind
/// (SPM: bos 1, eos 2, unk 0; BPE: bos 11, eos 11 — a default outside the vocabulary is
/// dropped). Ids outside [0, vocab size) given here are ignored with a warning.
struct SpecialTokenIds {
  std::optional<int32_t> bos, eos, eot, eom, unk, sep, pad, mask;
  std::optional<int32_t> fim_pre, fim_suf, fim_mid, fim_pad, fim_rep, fim_sep;
};

/// Everything a Tokenizer is built from: the GGUF tokenizer.* metadata as plain values, so
/// tests can build tiny vocabularies by hand.
struct TokenizerSpec {
  std::string model = "gpt2";              ///< tokenizer.ggml.model: "gpt2" (BPE) or "llama" (SPM)
  std::string pre;                         ///< tokenizer.ggml.pre; empty = "default"
  std::vector<std::string> tokens;         ///< id -> text (tokenizer.ggml.tokens)
  std::vector<float> scores;               ///< id -> score; empty = all 0 (SPM merge priority)
  std::vector<int32_t> token_types;        ///< id -> TokenType number; empty = all normal
  std::vector<std::string> merges;         ///< BPE merges "left right", rank = index
  SpecialTokenIds special;
  std::optional<bool> add_bos;             ///< tokenizer.ggml.add_bos_token; unset = kind default
  std::optional<bool> add_eos;             ///< tokenizer.ggml.add_eos_token; unset = false
  std::optional<bool> add_space_prefix;    ///< tokenizer.ggml.add_space_prefix (SPM; default true)
  std::string model_name;                  ///< general.name (phi-3 strip rules key off it)
};

/// A loaded vocabulary with encode/decode. Cheap to copy (shares immutable tables).
class Tokenizer {
 public:
  /// Builds from a GGUF file's tokenizer.* metadata (keys as written by llama.cpp's
  /// convert_hf_to_gguf.py). Errors: kNotFound when tokenizer.ggml.model or .tokens is missing,
  /// kInvalidArgument/kCorruptData for wrongly typed or short arrays, kUnsupported for a
  /// tokenizer model other than gpt2/llama. An unknown tokenizer.ggml.pre logs a warning and
  /// uses the "default" pre-tokenizer.
  static Expected<Tokenizer> from_gguf(const GgufFile& gguf);

  /// The TokenizerSpec that from_gguf builds from; lets callers and tests adjust a real
  /// vocabulary (e.g. another pre-tokenizer) before from_spec. Errors as from_gguf.
  static Expected<TokenizerSpec> spec_from_gguf(const GgufFile& gguf);

  /// Builds from plain values (see TokenizerSpec). Errors: kInvalidArgument when tokens is
  /// empty, scores/types are shorter than tokens, or the model kind is unknown (kUnsupported).
  static Expected<Tokenizer> from_spec(const TokenizerSpec& spec);

  /// Token ids for `text` (any bytes; invalid UTF-8 is handled as llama.cpp does: BPE replaces
  /// each bad byte by U+FFFD, SPM byte-falls-back). add_special: prepend BOS / append EOS per
  /// the vocabulary's add_bos/add_eos. parse_special: text of control tokens (e.g.
  /// "<|im_start|>") becomes that single token; user-defined tokens are always matched.
  /// Matches llama_tokenize(vocab, text, add_special, parse_special).
  std::vector<int32_t> encode(std::string_view text, bool add_special, bool parse_special) const;

  /// The bytes token `id` stands for (may be a partial UTF-8 sequence). Control/unknown
  /// tokens render as their text only when `special`, else as "". Out-of-range id -> "".
  /// Matches llama_token_to_piece(vocab, id, buf, len, lstrip = 0, special).
  std::string token_to_piece(int32_t id, bool special) const;

  /// Concatenated pieces of `ids` with the vocabulary's decode rules (SPM drops the leading
  /// space of the first piece; some BPE pre-tokenizers clean " ," -> ","). Matches
  /// llama_detokenize(vocab, ids, remove_special = false, unparse_special = special).
  std::string decode(const std::vector<int32_t>& ids, bool special) const;

  /// Special ids; -1 when the vocabulary has none.
  int32_t bos_id() const { return bos_id_; }
  int32_t eos_id() const { return eos_id_; }
  int32_t eot_id() const { return eot_id_; }
  int32_t unk_id() const { return unk_id_; }
  int32_t pad_id() const { return pad_id_; }
  bool add_bos() const { return add_bos_; }
  bool add_eos() const { return add_eos_; }
  /// SPM: a space is prefixed to the text (and dropped again from the first decoded piece).
  bool add_space_prefix() const { return add_space_prefix_; }

  /// True for every end-of-generation token: EOS, EOT, EOM and the tokens llama.cpp marks by
  /// text (<|im_end|>, <|endoftext|>, <|eot_id|>, <end_of_turn>, FIM pad/repo/sep, ...).
  bool is_eog(int32_t id) const { return eog_ids_.count(id) != 0; }
  const std::set<int32_t>& eog_ids() const { return eog_ids_; }

  int32_t vocab_size() const { return static_cast<int32_t>(tokens_->size()); }
  /// The vocabulary text of `id` (GPT-2 byte-encoded for BPE, U+2581 spaces for SPM).
  /// Aborts (SPECSERVE_CHECK) when id is out of range.
  const std::string& token_text(int32_t id) const;
  /// The effective type of `id` after llama.cpp's fix-ups (EOG-looking tokens become control).
  /// kUndefined for an out-of-range id.
  TokenType token_type(int32_t id) const;
  /// Vocabulary id whose text is exactly `text`, or -1.
  int32_t find_token(std::string_view text) const;

  TokenizerKind kind() const { return kind_; }
  /// The pre-tokenizer in use ("smollm", "llama3", ..., "default").
  const std::string& pre() const { return pre_name_; }

 private:
  struct Tables;   // vocabulary, merges, compiled regexes (shared, immutable)
  Tokenizer() = default;

  void encode_bpe(std::string_view text, std::vector<int32_t>& out) const;
  void encode_spm(std::string_view text, std::vector<int32_t>& out) const;
  int32_t spm_byte_token(uint8_t byte) const;

  std::shared_ptr<const std::vector<std::string>> tokens_;
  std::shared_ptr<const Tables> t_;
  TokenizerKind kind_ = TokenizerKind::kBpe;
  std::string pre_name_;
  int32_t bos_id_ = -1, eos_id_ = -1, eot_id_ = -1, eom_id_ = -1, unk_id_ = -1, pad_id_ = -1;
  bool add_bos_ = false;
  bool add_eos_ = false;
  bool add_space_prefix_ = false;
  bool clean_spaces_ = false;
  bool ignore_merges_ = false;
  std::set<int32_t> eog_ids_;
};

/// Turns a stream of token ids into text that is always whole UTF-8: bytes of a multi-byte
/// character split across tokens are held back until the character is complete. The
/// concatenation of every push() and the final flush() equals Tokenizer::decode(ids, special)
/// except for BPE vocabularies whose pre-tokenizer cleans spaces (" ," -> ","), which is not
/// applied while streaming. The Tokenizer must outlive the decoder.
class StreamDecoder {
 public:
  /// `special`: render control tokens (as Tokenizer::token_to_piece).
  explicit StreamDecoder(const Tokenizer& tokenizer, bool special = false)
      : tokenizer_(&tokenizer), special_(special) {}

  /// Appends token `id`; returns the text that became complete (may be empty).
  std::string push(int32_t id);
  /// Returns whatever is still held back (an incomplete UTF-8 tail, emitted as raw bytes) and
  /// resets the decoder for a new sequence.
  std::string flush();
  /// Bytes currently held back.
  size_t pending_bytes() const { return pending_.size(); }

 private:
  const Tokenizer* tokenizer_;
  bool special_;
  bool first_ = true;
  std::string pending_;
};

/// Length of the longest prefix of `bytes` that does not end inside an incomplete (but so far
/// valid) UTF-8 sequence. Bytes that can never become valid are not held back.
size_t utf8_complete_prefix(std::string_view bytes);

}  // namespace specserve
