// specserve model: byte-level BPE pre-tokenizers, the regex chains that tokenizer.ggml.pre
// selects, written as in llama.cpp (src/llama-vocab.cpp, src/unicode.cpp) and run with PCRE2.
// Internal to model/tokenizer*.cpp.
#pragma once

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace specserve {
namespace tokenizer_internal {

// What tokenizer.ggml.pre selects (llama_vocab::impl::load and llm_tokenizer_bpe).
struct PreConfig {
  std::string name;
  std::vector<std::string> regexes;  // applied in sequence, each splitting the previous pieces
  bool clean_spaces = true;
  bool ignore_merges = false;
  bool add_bos = false;
};

/// The pre-tokenizer `pre` names (empty = "default"); nullopt for a name llama.cpp does not know.
std::optional<PreConfig> lookup_pre(const std::string& pre);

// Rewrites \s, \S, \p{L}, \p{N}, \p{P} of a llama.cpp regex into explicit PCRE2 classes.
std::string to_pcre(std::string_view expr);

struct PcreDeleter {
  void operator()(pcre2_code* c) const { pcre2_code_free(c); }
};
struct MatchDataDeleter {
  void operator()(pcre2_match_data* m) const { pcre2_match_data_free(m); }
};

// One pass of a pre-tokenizer regex over `pieces` (byte ranges of `text`): each piece is split
// into the regex matches and the unmatched stretches between them, as llama.cpp's
// unicode_regex_split does. Matching sees only the piece, so look-aheads stop at its end.
void split_pieces(const pcre2_code* re, std::string_view text, pcre2_match_data* md,
                  std::vector<std::pair<size_t, size_t>>& pieces);

}  // namespace tokenizer_internal
}  // namespace specserve
