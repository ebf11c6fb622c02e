// specserve model: pre-tokenizer regexes (see pretokenizer.h).
#include "model/pretokenizer.h"

#include <algorithm>
#include <initializer_list>

#include "core/status.h"
#include "model/tokenizer_internal.h"

namespace specserve {
namespace tokenizer_internal {

namespace {

// ---------------------------------------------------------------------------------------------
// Pre-tokenizer regexes, written as in llama.cpp and translated for PCRE2.

// llama.cpp's \s is exactly Unicode White_Space (unicode_set_whitespace). PCRE2's UCP \s is
// defined differently across versions (\p{Zs}, \h, \v), so spell the class out.
constexpr const char* kWhitespaceClass =
    "\\t-\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}"
    "\\x{205F}\\x{3000}";

// NOTE: llama.cpp's category tables are Unicode 15; the PCRE2 we link (10.42) knows Unicode 14.
// These are exactly the code points llama.cpp puts in L / N / P and PCRE2 does not (computed
// by comparing both tables over U+0000..U+10FFFF; PCRE2 has none that llama.cpp lacks). A newer
// PCRE2 already contains them, which is harmless.
constexpr const char* kExtraLetters =
    "\\x{1123F}-\\x{11240}\\x{11F02}\\x{11F04}-\\x{11F10}\\x{11F12}-\\x{11F33}\\x{1342F}"
    "\\x{13441}-\\x{13446}\\x{1B132}\\x{1B155}\\x{1DF25}-\\x{1DF2A}\\x{1E030}-\\x{1E06D}"
    "\\x{1E4D0}-\\x{1E4EB}\\x{2B739}\\x{2EBF0}-\\x{2EE5D}\\x{31350}-\\x{323AF}";
constexpr const char* kExtraNumbers = "\\x{11F50}-\\x{11F59}\\x{1D2C0}-\\x{1D2D3}\\x{1E4F0}-\\x{1E4F9}";
constexpr const char* kExtraPunct = "\\x{11B00}-\\x{11B09}\\x{11F43}-\\x{11F4F}";

constexpr const char* kRegexGpt2 =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)";
constexpr const char* kRegexLlama3 =
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|"
    "\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
constexpr const char* kRegexQwen2 =
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|"
    "\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

}  // namespace

std::string to_pcre(std::string_view expr) {
  std::string out;
  bool inside = false;
  for (size_t i = 0; i < expr.size(); ++i) {
    const char c = expr[i];
    if (c == '\\' && i + 1 < expr.size()) {
      const char n = expr[i + 1];
      if (n == 's' || n == 'S') {
        SPECSERVE_CHECK(!(inside && n == 'S'), "\\S inside a class is not supported");
        if (inside) {
          out += kWhitespaceClass;
        } else {
          out += n == 's' ? "[" : "[^";
          out += kWhitespaceClass;
          out += "]";
        }
        ++i;
        continue;
      }
      if (n == 'p' && i + 4 < expr.size() && expr[i + 2] == '{' && expr[i + 4] == '}') {
        const char* extra = expr[i + 3] == 'L' ? kExtraLetters
                            : expr[i + 3] == 'N' ? kExtraNumbers
                            : expr[i + 3] == 'P' ? kExtraPunct
                                                 : nullptr;
        if (extra != nullptr) {
          if (!inside) out += "[";
          out += expr.substr(i, 5);
          out += extra;
          if (!inside) out += "]";
          i += 4;
          continue;
        }
      }
      out += c;
      out += n;
      ++i;
      continue;
    }
    if (c == '[' && !inside) inside = true;
    else if (c == ']' && inside) inside = false;
    out += c;
  }
  return out;
}

std::optional<PreConfig> lookup_pre(const std::string& pre) {
  const auto in = [&](std::initializer_list<const char*> names) {
    return std::any_of(names.begin(), names.end(), [&](const char* n) { return pre == n; });
  };
  PreConfig c;
  c.name = pre;
  if (pre.empty() || pre == "default") {
    c.name = "default";
    c.regexes = {"[\\p{P}\\$\\+<=>\\^~\\|]+", kRegexGpt2, "\\p{N}+", "[0-9][0-9][0-9]"};
  } else if (in({"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0",
                 "lfm2"})) {
    c.regexes = {kRegexLlama3};
    c.ignore_merges = true;
    c.add_bos = true;
  } else if (in({"dbrx", "smaug-bpe"})) {
    c.regexes = {kRegexLlama3};
  } else if (in({"smollm", "command-r"})) {
    c.regexes = {"\\p{N}", kRegexGpt2};
    c.clean_spaces = false;
  } else if (in({"starcoder", "refact", "codeshell", "exaone", "minerva-7b"})) {
    c.regexes = {"\\p{N}", kRegexGpt2};
  } else if (in({"gpt2", "gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es",
                 "jina-v2-de", "a.x-4.0", "mellum", "modern-bert", "jina-v1-en", "jina-v2-code",
                 "roberta-bpe", "exaone4", "mpt", "olmo"})) {
    c.regexes = {kRegexGpt2};
  } else if (in({"qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "megrez"})) {
    c.regexes = {kRegexQwen2};
    c.clean_spaces = false;
  } else if (pre == "stablelm2") {
    c.regexes = {kRegexQwen2};
  } else if (pre == "falcon") {
    c.regexes = {"[\\p{P}\\$\\+<=>\\^~\\|`]+", kRegexGpt2, "[0-9][0-9][0-9]"};
  } else {
    return std::nullopt;
  }
  return c;
}

void split_pieces(const pcre2_code* re, std::string_view text, pcre2_match_data* md,
                  std::vector<std::pair<size_t, size_t>>& pieces) {
  std::vector<std::pair<size_t, size_t>> out;
  out.reserve(pieces.size() * 2);
  for (const auto& [begin, end] : pieces) {
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data() + begin);
    const size_t len = end - begin;
    size_t pos = 0;
    size_t gap = 0;
    while (pos < len) {
      const int rc = pcre2_match(re, subject, len, pos, PCRE2_NO_UTF_CHECK, md, nullptr);
      if (rc < 0) break;
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
      if (ov[1] == ov[0]) {  // empty match: none of our patterns produce one; step over a char
        pos = ov[0] + utf8_len_from_lead(static_cast<uint8_t>(text[begin + ov[0]]));
        continue;
      }
      if (ov[0] > gap) out.emplace_back(begin + gap, begin + ov[0]);
      out.emplace_back(begin + ov[0], begin + ov[1]);
      pos = gap = ov[1];
    }
    if (gap < len) out.emplace_back(begin + gap, end);
  }
  pieces.swap(out);
}

}  // namespace tokenizer_internal
}  // namespace specserve
