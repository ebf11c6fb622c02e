// specserve model: byte-level BPE and SentencePiece-style tokenizers over GGUF metadata.
//
// Behaviour follows llama.cpp (src/llama-vocab.cpp, src/unicode.cpp) so that ids match
// llama_tokenize exactly; tests/data/tokenizer/ holds llama.cpp's output for a few hundred
// strings. Where llama.cpp would crash or throw we return something reasonable instead and say
// so in a NOTE.
#include "model/tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cstring>
#include <functional>

#include "core/logging.h"
#include "model/gguf.h"

namespace specserve {

namespace {

// llama_token_attr bits (llama.h). A token's type from GGUF maps to one of these; llama.cpp's
// fix-ups then add CONTROL / UNUSED / RSTRIP bits.
enum : uint32_t {
  kAttrUndefined = 0,
  kAttrUnknown = 1u << 0,
  kAttrUnused = 1u << 1,
  kAttrNormal = 1u << 2,
  kAttrControl = 1u << 3,
  kAttrUserDefined = 1u << 4,
  kAttrByte = 1u << 5,
  kAttrLstrip = 1u << 7,
  kAttrRstrip = 1u << 8,
};

uint32_t attr_from_type(int32_t type) {
  switch (static_cast<TokenType>(type)) {
    case TokenType::kUnknown: return kAttrUnknown;
    case TokenType::kUnused: return kAttrUnused;
    case TokenType::kNormal: return kAttrNormal;
    case TokenType::kControl: return kAttrControl;
    case TokenType::kUserDefined: return kAttrUserDefined;
    case TokenType::kByte: return kAttrByte;
    default: return kAttrUndefined;
  }
}

// ---------------------------------------------------------------------------------------------
// UTF-8 helpers with llama.cpp's exact leniency (unicode_cpt_from_utf8): overlong forms and
// surrogates decode; a bad byte becomes U+FFFD and decoding resumes at the next byte.

constexpr uint32_t kReplacement = 0xFFFD;

size_t utf8_len_from_lead(uint8_t lead) {
  static constexpr uint8_t kLookup[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  return kLookup[lead >> 4];
}

uint32_t decode_cpt(std::string_view s, size_t& off) {
  const auto b = [&](size_t i) { return static_cast<uint8_t>(s[off + i]); };
  const auto cont = [&](size_t i) { return (b(i) & 0xC0) == 0x80; };
  const uint8_t c0 = b(0);
  if (!(c0 & 0x80)) {
    off += 1;
    return c0;
  }
  if (!(c0 & 0x40)) {  // stray continuation byte
    off += 1;
    return kReplacement;
  }
  if (!(c0 & 0x20)) {
    if (off + 1 >= s.size() || !cont(1)) { off += 1; return kReplacement; }
    uint32_t r = ((c0 & 0x1Fu) << 6) | (b(1) & 0x3Fu);
    off += 2;
    return r;
  }
  if (!(c0 & 0x10)) {
    if (off + 2 >= s.size() || !cont(1) || !cont(2)) { off += 1; return kReplacement; }
    uint32_t r = ((c0 & 0x0Fu) << 12) | ((b(1) & 0x3Fu) << 6) | (b(2) & 0x3Fu);
    off += 3;
    return r;
  }
  if (!(c0 & 0x08)) {
    if (off + 3 >= s.size() || !cont(1) || !cont(2) || !cont(3)) { off += 1; return kReplacement; }
    uint32_t r = ((c0 & 0x07u) << 18) | ((b(1) & 0x3Fu) << 12) | ((b(2) & 0x3Fu) << 6) | (b(3) & 0x3Fu);
    off += 4;
    // NOTE: llama.cpp throws (and aborts the tokenize call) for code points past U+10FFFF; we
    // replace them like any other bad sequence.
    return r <= 0x10FFFF ? r : kReplacement;
  }
  off += 1;
  return kReplacement;
}

void append_utf8(uint32_t cpt, std::string& out) {
  if (cpt <= 0x7F) {
    out.push_back(static_cast<char>(cpt));
  } else if (cpt <= 0x7FF) {
    out.push_back(static_cast<char>(0xC0 | (cpt >> 6)));
    out.push_back(static_cast<char>(0x80 | (cpt & 0x3F)));
  } else if (cpt <= 0xFFFF) {
    out.push_back(static_cast<char>(0xE0 | (cpt >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cpt >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cpt & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cpt >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cpt >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cpt >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cpt & 0x3F)));
  }
}

// GPT-2's bytes_to_unicode(): printable Latin-1 bytes map to themselves, the other 68 bytes to
// U+0100.. in byte order, so every byte has a visible, non-space stand-in.
std::array<uint32_t, 256> make_byte_to_cpt() {
  std::array<uint32_t, 256> m{};
  std::array<bool, 256> direct{};
  for (int c = 0x21; c <= 0x7E; ++c) direct[c] = true;
  for (int c = 0xA1; c <= 0xAC; ++c) direct[c] = true;
  for (int c = 0xAE; c <= 0xFF; ++c) direct[c] = true;
  uint32_t n = 0;
  for (int c = 0; c < 256; ++c) m[c] = direct[c] ? static_cast<uint32_t>(c) : 256 + n++;
  return m;
}

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

// Rewrites \s, \S, \p{L}, \p{N}, \p{P} of a llama.cpp regex into explicit PCRE2 classes.
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

constexpr const char* kRegexGpt2 =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)";
constexpr const char* kRegexLlama3 =
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|"
    "\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
constexpr const char* kRegexQwen2 =
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|"
    "\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

// What tokenizer.ggml.pre selects (llama_vocab::impl::load and llm_tokenizer_bpe).
struct PreConfig {
  std::string name;
  std::vector<std::string> regexes;  // applied in sequence, each splitting the previous pieces
  bool clean_spaces = true;
  bool ignore_merges = false;
  bool add_bos = false;
};

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

struct PcreDeleter {
  void operator()(pcre2_code* c) const { pcre2_code_free(c); }
};
struct MatchDataDeleter {
  void operator()(pcre2_match_data* m) const { pcre2_match_data_free(m); }
};

// Heterogeneous lookup so string_views find std::string keys without a copy.
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using PieceMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

struct BpeMerge {
  int32_t rank;
  int32_t result;  // piece id of left+right
};

void replace_all(std::string& s, std::string_view from, std::string_view to) {
  if (from.empty()) return;
  std::string out;
  out.reserve(s.size());
  size_t pos = 0;
  for (size_t hit; (hit = s.find(from, pos)) != std::string::npos; pos = hit + from.size()) {
    out.append(s, pos, hit - pos);
    out += to;
  }
  out.append(s, pos, std::string::npos);
  s.swap(out);
}

constexpr std::string_view kSpmSpace = "\xe2\x96\x81";  // U+2581 LOWER ONE EIGHTH BLOCK

}  // namespace

// ---------------------------------------------------------------------------------------------

struct Tokenizer::Tables {
  std::vector<float> scores;
  std::vector<uint32_t> attrs;
  // BPE: every vocabulary text (id < vocab size) plus every merge operand or result that is
  // not itself a token (ids from vocab size upwards), so the merge loop works on ints only.
  PieceMap piece_ids;
  std::unordered_map<uint64_t, BpeMerge> merges;  // key: left id << 32 | right id
  std::array<int32_t, 256> byte_piece{};           // raw byte -> piece id of its stand-in
  std::array<std::string, 256> byte_encoded;       // raw byte -> UTF-8 of its stand-in
  std::unordered_map<uint32_t, uint8_t> cpt_to_byte;
  std::vector<std::unique_ptr<pcre2_code, PcreDeleter>> regexes;
  std::vector<int32_t> special_tokens;  // control/user-defined/unknown, longest text first
  std::vector<std::string> pieces;      // token_to_piece(id, special = true)
};

namespace {

// One pass of a pre-tokenizer regex over `pieces` (byte ranges of `text`): each piece is split
// into the regex matches and the unmatched stretches between them, as llama.cpp's
// unicode_regex_split does. Matching sees only the piece, so look-aheads stop at its end.
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

}  // namespace

Expected<Tokenizer> Tokenizer::from_spec(const TokenizerSpec& spec) {
  auto log = get_logger("model");
  const size_t n = spec.tokens.size();
  if (n == 0) return invalid_argument("tokenizer: empty vocabulary (tokenizer.ggml.tokens)");
  if (n > static_cast<size_t>(INT32_MAX / 2)) return invalid_argument("tokenizer: vocabulary too large");
  if (!spec.scores.empty() && spec.scores.size() < n) {
    return invalid_argument("tokenizer: " + std::to_string(spec.scores.size()) + " scores for " +
                            std::to_string(n) + " tokens");
  }
  if (!spec.token_types.empty() && spec.token_types.size() < n) {
    return invalid_argument("tokenizer: " + std::to_string(spec.token_types.size()) +
                            " token types for " + std::to_string(n) + " tokens");
  }

  Tokenizer tok;
  auto tables = std::make_shared<Tables>();
  auto texts = std::make_shared<std::vector<std::string>>(spec.tokens);
  Tables& t = *tables;

  PreConfig pre;
  if (spec.model == "gpt2") {
    tok.kind_ = TokenizerKind::kBpe;
    auto found = lookup_pre(spec.pre);
    if (!found) {
      log->warn("tokenizer: unknown pre-tokenizer '{}', using 'default' (token ids may differ "
                "from the model's own tokenizer)", spec.pre);
      found = lookup_pre("default");
    }
    pre = *found;
  } else if (spec.model == "llama") {
    tok.kind_ = TokenizerKind::kSpm;
    pre.name = "default";
    pre.clean_spaces = false;
    pre.add_bos = true;
  } else {
    return unsupported("tokenizer: tokenizer.ggml.model '" + spec.model +
                       "' is not supported (only 'gpt2' byte-level BPE and 'llama' SentencePiece)");
  }
  tok.pre_name_ = pre.name;
  tok.clean_spaces_ = pre.clean_spaces;
  tok.ignore_merges_ = pre.ignore_merges;
  tok.add_bos_ = spec.add_bos.value_or(pre.add_bos);
  tok.add_eos_ = spec.add_eos.value_or(false);
  tok.add_space_prefix_ = spec.add_space_prefix.value_or(tok.kind_ == TokenizerKind::kSpm);

  // Vocabulary. Duplicate texts: the last id wins, as in llama.cpp's token_to_id.
  t.scores.assign(n, 0.0f);
  if (!spec.scores.empty()) std::copy_n(spec.scores.begin(), n, t.scores.begin());
  t.attrs.assign(n, kAttrNormal);
  if (!spec.token_types.empty()) {
    for (size_t i = 0; i < n; ++i) t.attrs[i] = attr_from_type(spec.token_types[i]);
  }
  t.piece_ids.reserve(n + spec.merges.size() / 4);
  for (size_t i = 0; i < n; ++i) {
    std::string& word = (*texts)[i];
    if (word.empty()) word = "[EMPTY_" + std::to_string(i) + "]";  // as llama.cpp does
    t.piece_ids[word] = static_cast<int32_t>(i);
  }
  const int32_t n_vocab = static_cast<int32_t>(n);

  if (tok.kind_ == TokenizerKind::kBpe) {
    // Ids for extra pieces must not collide with vocabulary ids even when the vocabulary has
    // duplicate texts (fewer map entries than tokens), so count extras separately.
    int32_t next_extra = n_vocab;
    const auto intern_extra = [&](std::string_view s) -> int32_t {
      auto it = t.piece_ids.find(s);
      if (it != t.piece_ids.end()) return it->second;
      t.piece_ids.emplace(std::string(s), next_extra);
      return next_extra++;
    };
    t.merges.reserve(spec.merges.size());
    for (size_t rank = 0; rank < spec.merges.size(); ++rank) {
      const std::string& m = spec.merges[rank];
      const size_t sp = m.find(' ', 1);
      if (sp == std::string::npos) continue;  // llama.cpp files it under ("", ""): never matches
      const std::string_view left(m.data(), sp);
      const std::string_view right(m.data() + sp + 1, m.size() - sp - 1);
      const int32_t l = intern_extra(left);
      const int32_t r = intern_extra(right);
      const int32_t res = intern_extra(std::string(left) + std::string(right));
      const uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(l)) << 32) | static_cast<uint32_t>(r);
      t.merges.emplace(key, BpeMerge{static_cast<int32_t>(rank), res});  // first rank wins
    }
    const auto byte_to_cpt = make_byte_to_cpt();
    for (int b = 0; b < 256; ++b) {
      append_utf8(byte_to_cpt[b], t.byte_encoded[b]);
      t.cpt_to_byte[byte_to_cpt[b]] = static_cast<uint8_t>(b);
      auto it = t.piece_ids.find(t.byte_encoded[b]);
      t.byte_piece[b] = it == t.piece_ids.end() ? -1 : it->second;
    }
    for (const std::string& expr : pre.regexes) {
      const std::string pattern = to_pcre(expr);
      int err = 0;
      PCRE2_SIZE err_off = 0;
      pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                       PCRE2_UTF | PCRE2_UCP, &err, &err_off, nullptr);
      if (code == nullptr) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof(msg));
        return internal_error("tokenizer: pre-tokenizer regex '" + expr + "' does not compile at " +
                              std::to_string(err_off) + ": " + reinterpret_cast<const char*>(msg));
      }
      pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // falls back to the interpreter on failure
      t.regexes.emplace_back(code);
    }
  }

  // Special ids: kind defaults, dropped when outside the vocabulary, then metadata overrides.
  int32_t bos = -1, eos = -1, unk = -1;
  if (tok.kind_ == TokenizerKind::kSpm) {
    bos = 1; eos = 2; unk = 0;
  } else {
    bos = 11; eos = 11;
  }
  int32_t eot = -1, eom = -1, sep = -1, pad = -1, mask = -1;
  int32_t fim_pre = -1, fim_suf = -1, fim_mid = -1, fim_pad = -1, fim_rep = -1, fim_sep = -1;
  const auto apply = [&](const char* name, const std::optional<int32_t>& given, int32_t& id) {
    if (id >= n_vocab) id = -1;
    if (!given) return;
    if (*given < 0 || *given >= n_vocab) {
      log->warn("tokenizer: bad special token {} = {}, using default id {}", name, *given, id);
    } else {
      id = *given;
    }
  };
  const SpecialTokenIds& s = spec.special;
  apply("bos", s.bos, bos); apply("eos", s.eos, eos); apply("eot", s.eot, eot);
  apply("eom", s.eom, eom); apply("unk", s.unk, unk); apply("sep", s.sep, sep);
  apply("pad", s.pad, pad); apply("mask", s.mask, mask);
  apply("fim_pre", s.fim_pre, fim_pre); apply("fim_suf", s.fim_suf, fim_suf);
  apply("fim_mid", s.fim_mid, fim_mid); apply("fim_pad", s.fim_pad, fim_pad);
  apply("fim_rep", s.fim_rep, fim_rep); apply("fim_sep", s.fim_sep, fim_sep);

  // Ids found by text when the metadata has none (llama.cpp's "auto-detect special tokens by
  // text"). Such tokens become control tokens.
  // NOTE: llama.cpp walks an unordered_map, so with several candidates (SmolLM has both
  // <|im_end|> and <|endoftext|>) which one becomes the EOT id is unspecified; we take the first
  // candidate in list order. Both are end-of-generation either way.
  const auto detect = [&](int32_t& id, std::initializer_list<const char*> names) {
    if (id != -1) return;
    for (const char* name : names) {
      auto it = t.piece_ids.find(std::string_view(name));
      if (it == t.piece_ids.end() || it->second >= n_vocab) continue;
      id = it->second;
      t.attrs[id] |= kAttrControl;
      return;
    }
  };
  detect(eot, {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
               "<|end_of_text|>", "<EOT>", "_<EOT>", "[EOT]", "<｜end▁of▁sentence｜>",
               "<end_of_utterance>"});
  detect(eom, {"<|eom_id|>"});
  detect(fim_pre, {"<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>",
                   "▁<PRE>", "<|code_prefix|>", "<|prefix|>"});
  detect(fim_suf, {"<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>",
                   "▁<SUF>", "<|code_suffix|>", "<|suffix|>"});
  detect(fim_mid, {"<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>",
                   "▁<MID>", "<|code_middle|>", "<|middle|>"});
  detect(fim_pad, {"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"});
  detect(fim_rep, {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"});
  detect(fim_sep, {"<|file_sep|>"});

  // Control tokens whose text says "unused" are unused.
  for (int32_t i = 0; i < n_vocab; ++i) {
    if ((t.attrs[i] & kAttrControl) && (*texts)[i].find("unused") != std::string::npos) {
      t.attrs[i] |= kAttrUnused;
    }
  }

  // End-of-generation set.
  std::set<int32_t> eog;
  for (int32_t id : {fim_pad, fim_rep, fim_sep}) {
    if (id != -1) eog.insert(id);
  }
  static const std::set<std::string_view> kEogTexts = {
      "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
      "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
      "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
      "<｜end▁of▁sentence｜>", "[e~["};
  for (const auto& [text, id] : t.piece_ids) {
    if (id >= n_vocab || kEogTexts.count(text) == 0) continue;
    eog.insert(id);
    t.attrs[id] |= kAttrControl;
  }
  for (int32_t id : {eos, eot, eom}) {
    if (id != -1) eog.insert(id);
  }
  {
    // o200k_harmony / solar-open: <|end|> is not EOG when <|return|>+<|call|> (or
    // <|calls|>+<|flush|>) exist. gemma4 / plamo: </s> is an ordinary token.
    const auto has = [&](std::string_view txt) {
      return std::any_of(eog.begin(), eog.end(), [&](int32_t id) { return (*texts)[id] == txt; });
    };
    const auto find_in = [&](std::string_view txt) {
      for (int32_t id : eog) if ((*texts)[id] == txt) return id;
      return -1;
    };
    if (has("<|end|>") && ((has("<|return|>") && has("<|call|>")) ||
                           (has("<|calls|>") && has("<|flush|>")))) {
      const int32_t id = find_in("<|end|>");
      eog.erase(id);
      t.attrs[id] = kAttrUserDefined;
    }
    if (has("</s>") && (has("<|tool_response>") || has("<|plamo:eos|>"))) {
      const int32_t id = find_in("</s>");
      eog.erase(id);
      t.attrs[id] = kAttrNormal;
    }
  }

  tok.tokens_ = texts;
  tok.bos_id_ = bos;
  tok.eos_id_ = eos;
  tok.eot_id_ = eot;
  tok.eom_id_ = eom;
  tok.unk_id_ = unk;
  tok.pad_id_ = pad;
  tok.eog_ids_ = std::move(eog);

  // Special tokens, longest first, cut out of the text before tokenizing.
  for (int32_t i = 0; i < n_vocab; ++i) {
    if (t.attrs[i] & (kAttrControl | kAttrUserDefined | kAttrUnknown)) t.special_tokens.push_back(i);
  }
  std::stable_sort(t.special_tokens.begin(), t.special_tokens.end(), [&](int32_t a, int32_t b) {
    return (*texts)[a].size() > (*texts)[b].size();
  });

  // Per-model strip rules (llama.cpp keys these off general.name).
  std::string name_lower = spec.model_name;
  std::transform(name_lower.begin(), name_lower.end(), name_lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (name_lower.find("phi-3") != std::string::npos || name_lower.find("phi3") != std::string::npos) {
    for (int32_t id : t.special_tokens) t.attrs[id] |= kAttrRstrip;
    const auto set_rstrip = [&](std::string_view txt, bool on) {
      auto it = t.piece_ids.find(txt);
      if (it == t.piece_ids.end() || it->second >= n_vocab) return;
      if (on) t.attrs[it->second] |= kAttrRstrip;
      else t.attrs[it->second] &= ~kAttrRstrip;
    };
    set_rstrip("</s>", true);
    for (auto txt : {"<unk>", "<s>", "<|endoftext|>"}) set_rstrip(txt, false);
  }

  tok.t_ = tables;
  // Piece cache (special = true), as llama.cpp builds cache_token_to_piece.
  tables->pieces.resize(n);
  for (int32_t i = 0; i < n_vocab; ++i) {
    const std::string& text = (*texts)[i];
    const uint32_t attr = t.attrs[i];
    std::string piece;
    if (attr & (kAttrUnknown | kAttrControl | kAttrUserDefined)) {
      piece = text;
    } else if (attr & kAttrNormal) {
      if (tok.kind_ == TokenizerKind::kSpm) {
        piece = text;
        replace_all(piece, kSpmSpace, " ");
      } else {
        // Undo the byte->unicode mapping; a code point outside it is reported in-line the way
        // llama_decode_text does.
        size_t off = 0;
        while (off < text.size()) {
          const uint32_t cpt = decode_cpt(text, off);
          auto it = t.cpt_to_byte.find(cpt);
          if (it != t.cpt_to_byte.end()) {
            piece.push_back(static_cast<char>(it->second));
          } else {
            std::string utf8;
            append_utf8(cpt, utf8);
            piece += "[UNK_BYTE_0x";
            static const char* kHex = "0123456789abcdef";
            for (unsigned char c : utf8) {
              piece.push_back(kHex[c >> 4]);
              piece.push_back(kHex[c & 15]);
            }
            piece += text + "]";
          }
        }
      }
    } else if (attr & kAttrByte) {
      // "<0xNN>": the byte itself.
      if (text.size() >= 5) piece.push_back(static_cast<char>(std::strtol(text.substr(3, 2).c_str(), nullptr, 16)));
    }
    tables->pieces[i] = std::move(piece);
  }
  return tok;
}

Expected<Tokenizer> Tokenizer::from_gguf(const GgufFile& gguf) {
  auto spec = spec_from_gguf(gguf);
  if (!spec.ok()) return spec.status();
  return from_spec(*spec);
}

Expected<TokenizerSpec> Tokenizer::spec_from_gguf(const GgufFile& gguf) {
  TokenizerSpec spec;
  auto model = gguf.get_string("tokenizer.ggml.model");
  if (!model.ok()) return model.status();
  spec.model = *model;
  if (gguf.has("tokenizer.ggml.pre")) {
    auto pre = gguf.get_string("tokenizer.ggml.pre");
    if (!pre.ok()) return pre.status();
    spec.pre = *pre;
  }
  auto tokens = gguf.get_string_array("tokenizer.ggml.tokens");
  if (!tokens.ok()) return tokens.status();
  spec.tokens = std::move(*tokens);
  if (gguf.has("tokenizer.ggml.scores")) {
    auto scores = gguf.get_float_array("tokenizer.ggml.scores");
    if (!scores.ok()) return scores.status();
    spec.scores.assign(scores->begin(), scores->end());
  }
  if (gguf.has("tokenizer.ggml.token_type")) {
    auto types = gguf.get_int_array("tokenizer.ggml.token_type");
    if (!types.ok()) return types.status();
    spec.token_types.assign(types->begin(), types->end());
  }
  if (spec.model == "gpt2") {
    auto merges = gguf.get_string_array("tokenizer.ggml.merges");
    if (!merges.ok()) return merges.status();
    spec.merges = std::move(*merges);
  }
  const auto read_id = [&](const char* key, std::optional<int32_t>& out) -> Status {
    if (!gguf.has(key)) return Status();
    auto v = gguf.get_int(key);
    if (!v.ok()) return v.status();
    out = (*v < INT32_MIN || *v > INT32_MAX) ? -1 : static_cast<int32_t>(*v);
    return Status();
  };
  SpecialTokenIds& s = spec.special;
  SPECSERVE_RETURN_IF_ERROR(read_id("tokenizer.ggml.bos_token_id", s.bos));
  SPECSERVE_RETURN_IF_ERROR(read_id("tokenizer.ggml.eos_token_id", s.eos));
  SPECSERVE_RETURN_IF_ERROR(read_id("tokenizer.ggml.eot_token_id", s.eot));
  SPECSERVE_RETURN_IF_ERROR(read_id("tokenizer.ggml.eom_token_id", s.eom));
  SPECSERVE_RETURN_IF_ERROR(read_id("tokenizer.ggml.unknown_token_id", s.unk));
  SPECSERVE_RETURN_IF_ERROR(read_id("tokenizer.ggml.seperator_token_id", s.sep));  // sic (GGUF spelling)
  SPECSERVE_RETURN_IF_ERROR(read_id("tokenizer.ggml.padding_token_id", s.pad));
  SPECSERVE_RETURN_IF_ERROR(read_id("tokenizer.ggml.mask_token_id", s.mask));
  SPECSERVE_RETURN_IF_ERROR(read_id("tokenizer.ggml.fim_pre_token_id", s.fim_pre));
  SPECSERVE_RETURN_IF_ERROR(read_id("tokenizer.ggml.fim_suf_token_id", s.fim_suf));
  SPECSERVE_RETURN_IF_ERROR(read_id("tokenizer.ggml.fim_mid_token_id", s.fim_mid));
  SPECSERVE_RETURN_IF_ERROR(read_id("tokenizer.ggml.fim_pad_token_id", s.fim_pad));
  SPECSERVE_RETURN_IF_ERROR(read_id("tokenizer.ggml.fim_rep_token_id", s.fim_rep));
  SPECSERVE_RETURN_IF_ERROR(read_id("tokenizer.ggml.fim_sep_token_id", s.fim_sep));
  // Deprecated spellings of the FIM ids.
  if (!s.fim_pre) SPECSERVE_RETURN_IF_ERROR(read_id("tokenizer.ggml.prefix_token_id", s.fim_pre));
  if (!s.fim_suf) SPECSERVE_RETURN_IF_ERROR(read_id("tokenizer.ggml.suffix_token_id", s.fim_suf));
  if (!s.fim_mid) SPECSERVE_RETURN_IF_ERROR(read_id("tokenizer.ggml.middle_token_id", s.fim_mid));
  const auto read_bool = [&](const char* key, std::optional<bool>& out) -> Status {
    if (!gguf.has(key)) return Status();
    auto v = gguf.get_bool(key);
    if (!v.ok()) return v.status();
    out = *v;
    return Status();
  };
  SPECSERVE_RETURN_IF_ERROR(read_bool("tokenizer.ggml.add_bos_token", spec.add_bos));
  SPECSERVE_RETURN_IF_ERROR(read_bool("tokenizer.ggml.add_eos_token", spec.add_eos));
  SPECSERVE_RETURN_IF_ERROR(read_bool("tokenizer.ggml.add_space_prefix", spec.add_space_prefix));
  if (gguf.has("general.name")) {
    auto name = gguf.get_string("general.name");
    if (name.ok()) spec.model_name = *name;
  }
  return spec;
}

// ---------------------------------------------------------------------------------------------
// Encoding

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special, bool parse_special) const {
  const Tables& t = *t_;
  const auto& texts = *tokens_;

  // Cut special tokens out of the text (llama.cpp's tokenizer_st_partition). A fragment is a
  // token id, or (-1, offset, length) of raw text.
  struct Fragment {
    int32_t token;
    size_t off, len;
  };
  std::vector<Fragment> frags;
  if (!text.empty()) frags.push_back({-1, 0, text.size()});
  std::vector<Fragment> next;
  for (int32_t special : t.special_tokens) {
    const uint32_t attr = t.attrs[special];
    if (!parse_special && (attr & (kAttrControl | kAttrUnknown))) continue;
    const std::string& st = texts[special];
    bool any = false;
    for (const Fragment& f : frags) {
      if (f.token >= 0 || f.len < st.size()) continue;
      if (text.substr(f.off, f.len).find(st) != std::string_view::npos) { any = true; break; }
    }
    if (!any) continue;
    next.clear();
    for (const Fragment& f : frags) {
      if (f.token >= 0) { next.push_back(f); continue; }
      size_t base = f.off, len = f.len;
      while (true) {
        const size_t m = text.substr(0, base + len).find(st, base);
        if (m == std::string_view::npos) {
          if (len > 0) next.push_back({-1, base, len});
          break;
        }
        if (m > base) {
          size_t left_len = m - base;
          if (attr & kAttrLstrip) {
            while (left_len > 0 && std::isspace(static_cast<unsigned char>(text[base + left_len - 1]))) --left_len;
          }
          if (left_len > 0) next.push_back({-1, base, left_len});
        }
        next.push_back({special, 0, 0});
        if (m + st.size() >= base + len) break;
        size_t right = m + st.size();
        size_t right_len = base + len - right;
        if (attr & kAttrRstrip) {
          while (right_len > 0 && std::isspace(static_cast<unsigned char>(text[right]))) { ++right; --right_len; }
        }
        base = right;
        len = right_len;
      }
    }
    frags.swap(next);
  }

  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 4);
  if (kind_ == TokenizerKind::kSpm) {
    if (add_special && add_bos_ && bos_id_ >= 0) out.push_back(bos_id_);
    bool prev_special = true;  // a space is prefixed to the first raw fragment
    std::string piece;
    for (const Fragment& f : frags) {
      if (f.token >= 0) {
        out.push_back(f.token);
        prev_special = true;
        continue;
      }
      piece.clear();
      if (add_space_prefix_ && prev_special) piece.push_back(' ');
      piece.append(text.substr(f.off, f.len));
      replace_all(piece, " ", kSpmSpace);
      encode_spm(piece, out);
      prev_special = false;
    }
    if (add_special && add_eos_ && eos_id_ >= 0) out.push_back(eos_id_);
  } else {
    if (add_special && add_bos_ && bos_id_ >= 0) out.push_back(bos_id_);
    for (const Fragment& f : frags) {
      if (f.token >= 0) out.push_back(f.token);
      else encode_bpe(text.substr(f.off, f.len), out);
    }
    if (add_special && add_eos_ && eos_id_ >= 0) out.push_back(eos_id_);
  }
  return out;
}

void Tokenizer::encode_bpe(std::string_view raw, std::vector<int32_t>& out) const {
  const Tables& t = *t_;
  const int32_t n_vocab = vocab_size();

  // Normalise to llama.cpp's code point view: bad bytes become U+FFFD. `text` is what the
  // words are cut from; `rx` is the same bytes with surrogates (which llama.cpp decodes but
  // PCRE2 rejects) swapped for a private-use code point of the same length and category.
  std::string text, rx;
  text.reserve(raw.size());
  bool has_surrogate = false;
  for (size_t off = 0; off < raw.size();) {
    const uint32_t cpt = decode_cpt(raw, off);
    has_surrogate |= (cpt >= 0xD800 && cpt <= 0xDFFF);
    append_utf8(cpt, text);
  }
  if (has_surrogate) {
    rx.reserve(text.size());
    for (size_t off = 0; off < text.size();) {
      const uint32_t cpt = decode_cpt(text, off);
      append_utf8(cpt >= 0xD800 && cpt <= 0xDFFF ? 0xE000 : cpt, rx);
    }
  }
  const std::string_view match_text = has_surrogate ? std::string_view(rx) : std::string_view(text);

  std::vector<std::pair<size_t, size_t>> words{{0, text.size()}};
  std::unique_ptr<pcre2_match_data, MatchDataDeleter> md(pcre2_match_data_create(1, nullptr));
  for (const auto& re : t.regexes) split_pieces(re.get(), match_text, md.get(), words);

  struct Symbol {
    int32_t id;     // piece id, -1 when the text is no piece at all
    int32_t prev, next;
    uint32_t start, len;  // raw bytes of the word
  };
  struct Bigram {
    int32_t rank, left, right;
    uint32_t len;
  };
  const auto worse = [](const Bigram& a, const Bigram& b) {
    return a.rank > b.rank || (a.rank == b.rank && a.left > b.left);
  };
  std::vector<Symbol> symbols;
  std::vector<Bigram> heap;
  std::string encoded;

  for (const auto& [wb, we] : words) {
    const std::string_view word(text.data() + wb, we - wb);
    if (ignore_merges_) {
      encoded.clear();
      for (unsigned char c : word) encoded += t.byte_encoded[c];
      auto it = t.piece_ids.find(std::string_view(encoded));
      if (it != t.piece_ids.end() && it->second < n_vocab) {
        out.push_back(it->second);
        continue;
      }
    }
    // One symbol per byte: the byte->unicode stand-ins are whole code points, one per byte.
    symbols.clear();
    heap.clear();
    const int32_t n = static_cast<int32_t>(word.size());
    for (int32_t i = 0; i < n; ++i) {
      symbols.push_back({t.byte_piece[static_cast<unsigned char>(word[i])], i - 1, i + 1 < n ? i + 1 : -1,
                         static_cast<uint32_t>(i), 1});
    }
    const auto try_add = [&](int32_t left, int32_t right) {
      if (left < 0 || right < 0) return;
      const Symbol& l = symbols[left];
      const Symbol& r = symbols[right];
      if (l.id < 0 || r.id < 0) return;
      const uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(l.id)) << 32) | static_cast<uint32_t>(r.id);
      auto it = t.merges.find(key);
      if (it == t.merges.end()) return;
      heap.push_back({it->second.rank, left, right, l.len + r.len});
      std::push_heap(heap.begin(), heap.end(), worse);
    };
    for (int32_t i = 1; i < n; ++i) try_add(i - 1, i);
    while (!heap.empty()) {
      std::pop_heap(heap.begin(), heap.end(), worse);
      const Bigram b = heap.back();
      heap.pop_back();
      Symbol& l = symbols[b.left];
      Symbol& r = symbols[b.right];
      // Stale entry: one side was merged away or grew since it was queued.
      if (l.len == 0 || r.len == 0 || l.len + r.len != b.len) continue;
      const uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(l.id)) << 32) | static_cast<uint32_t>(r.id);
      l.id = t.merges.at(key).result;
      l.len += r.len;
      r.len = 0;
      l.next = r.next;
      if (r.next >= 0) symbols[r.next].prev = b.left;
      try_add(l.prev, b.left);
      try_add(b.left, l.next);
    }
    for (int32_t i = 0; i != -1 && n > 0; i = symbols[i].next) {
      const Symbol& sym = symbols[i];
      if (sym.len == 0) continue;
      if (sym.id >= 0 && sym.id < n_vocab) {
        out.push_back(sym.id);
        continue;
      }
      // Not a token: llama.cpp falls back to single bytes of the encoded text.
      encoded.clear();
      for (uint32_t k = 0; k < sym.len; ++k) encoded += t.byte_encoded[static_cast<unsigned char>(word[sym.start + k])];
      for (char c : encoded) {
        auto it = t.piece_ids.find(std::string_view(&c, 1));
        if (it != t.piece_ids.end() && it->second < n_vocab) out.push_back(it->second);
      }
    }
  }
}

int32_t Tokenizer::spm_byte_token(uint8_t byte) const {
  static const char* kHex = "0123456789ABCDEF";
  const char buf[6] = {'<', '0', 'x', kHex[byte >> 4], kHex[byte & 15], '>'};
  int32_t id = find_token(std::string_view(buf, 6));
  if (id >= 0) return id;
  const char raw = static_cast<char>(byte);
  id = find_token(std::string_view(&raw, 1));
  // NOTE: llama.cpp aborts when neither exists; we emit <unk> (or nothing without one).
  return id >= 0 ? id : unk_id_;
}

void Tokenizer::encode_spm(std::string_view text, std::vector<int32_t>& out) const {
  const Tables& t = *t_;
  struct Symbol {
    int32_t prev, next;
    uint32_t start, len;
  };
  struct Bigram {
    float score;
    int32_t left, right;
    uint32_t len;
  };
  std::vector<Symbol> symbols;
  for (size_t off = 0; off < text.size();) {
    const size_t len = std::min(utf8_len_from_lead(static_cast<uint8_t>(text[off])), text.size() - off);
    const auto idx = static_cast<int32_t>(symbols.size());
    symbols.push_back({idx - 1, off + len == text.size() ? -1 : idx + 1, static_cast<uint32_t>(off),
                       static_cast<uint32_t>(len)});
    off += len;
  }
  // Highest score first; ties to the leftmost pair.
  const auto worse = [](const Bigram& a, const Bigram& b) {
    return a.score < b.score || (a.score == b.score && a.left > b.left);
  };
  std::vector<Bigram> heap;
  const auto try_add = [&](int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    const uint32_t len = symbols[left].len + symbols[right].len;
    const int32_t id = find_token(text.substr(symbols[left].start, len));
    if (id < 0) return;
    heap.push_back({t.scores[id], left, right, len});
    std::push_heap(heap.begin(), heap.end(), worse);
  };
  for (int32_t i = 1; i < static_cast<int32_t>(symbols.size()); ++i) try_add(i - 1, i);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), worse);
    const Bigram b = heap.back();
    heap.pop_back();
    Symbol& l = symbols[b.left];
    Symbol& r = symbols[b.right];
    if (l.len == 0 || r.len == 0 || l.len + r.len != b.len) continue;
    l.len += r.len;
    r.len = 0;
    l.next = r.next;
    if (r.next >= 0) symbols[r.next].prev = b.left;
    try_add(l.prev, b.left);
    try_add(b.left, l.next);
  }
  // NOTE: llama.cpp's resegment() also consults a reverse-merge map for symbols that are not
  // tokens; every merged symbol is a token by construction and a single UTF-8 character can
  // never equal the text of a merged pair, so only the byte fallback is reachable.
  for (int32_t i = symbols.empty() ? -1 : 0; i != -1; i = symbols[i].next) {
    const Symbol& sym = symbols[i];
    const std::string_view piece = text.substr(sym.start, sym.len);
    const int32_t id = find_token(piece);
    if (id >= 0) {
      out.push_back(id);
      continue;
    }
    for (unsigned char c : piece) {
      const int32_t b = spm_byte_token(c);
      if (b >= 0) out.push_back(b);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Decoding and queries

int32_t Tokenizer::find_token(std::string_view text) const {
  auto it = t_->piece_ids.find(text);
  if (it == t_->piece_ids.end() || it->second >= vocab_size()) return -1;
  return it->second;
}

const std::string& Tokenizer::token_text(int32_t id) const {
  SPECSERVE_CHECK(id >= 0 && id < vocab_size(), "token id " + std::to_string(id) + " out of range");
  return (*tokens_)[id];
}

TokenType Tokenizer::token_type(int32_t id) const {
  if (id < 0 || id >= vocab_size()) return TokenType::kUndefined;
  const uint32_t a = t_->attrs[id];
  if (a & kAttrControl) return TokenType::kControl;
  if (a & kAttrUserDefined) return TokenType::kUserDefined;
  if (a & kAttrUnknown) return TokenType::kUnknown;
  if (a & kAttrByte) return TokenType::kByte;
  if (a & kAttrUnused) return TokenType::kUnused;
  if (a & kAttrNormal) return TokenType::kNormal;
  return TokenType::kUndefined;
}

std::string Tokenizer::token_to_piece(int32_t id, bool special) const {
  if (id < 0 || id >= vocab_size()) return {};
  if (!special && (t_->attrs[id] & (kAttrUnknown | kAttrControl))) return {};
  return t_->pieces[id];
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool special) const {
  std::string text;
  bool remove_space = add_space_prefix_;
  for (int32_t id : ids) {
    std::string piece = token_to_piece(id, special);
    if (remove_space && !piece.empty() && piece[0] == ' ') piece.erase(0, 1);
    remove_space = false;
    text += piece;
  }
  if (!clean_spaces_ || text.empty()) return text;

  // llama.cpp's clean_up_tokenization_spaces, three passes over bytes.
  // 1: " ?", " !", " .", " ," lose the space.
  std::string a;
  a.reserve(text.size());
  a.push_back(text[0]);
  for (size_t i = 1; i < text.size(); ++i) {
    const char x = text[i];
    if (text[i - 1] == ' ' && (x == '?' || x == '!' || x == '.' || x == ',')) a.pop_back();
    a.push_back(x);
  }
  // 2: " ' " -> "'".
  // llama.cpp overwrites the dropped space with NUL, so a following " '" is not stripped again.
  std::string b;
  b.reserve(a.size());
  b.push_back(a[0]);
  for (size_t i = 1; i < a.size(); ++i) {
    const char x = a[i];
    if (x == '\'' && i + 1 < a.size() && a[i - 1] == ' ' && a[i + 1] == ' ') {
      b.pop_back();
      a[++i] = '\0';  // drop the following space
    }
    b.push_back(x);
  }
  // 3: " 's", " 'm", " 're", " 've" lose the space.
  std::string c;
  c.reserve(b.size());
  if (!b.empty()) c.push_back(b[0]);
  for (size_t i = 1; i < b.size(); ++i) {
    const char x = b[i];
    if (b[i - 1] == ' ' && x == '\'' && i + 1 < b.size()) {
      const char x1 = b[i + 1];
      if (x1 == 's' || x1 == 'm') {
        c.pop_back();
      } else if (i + 2 < b.size()) {
        const char x2 = b[i + 2];
        if ((x1 == 'r' && x2 == 'e') || (x1 == 'v' && x2 == 'e')) c.pop_back();
      }
    }
    c.push_back(x);
  }
  return c;
}

size_t utf8_complete_prefix(std::string_view bytes) {
  const size_t n = bytes.size();
  // Look back at most 3 bytes for the lead byte of a sequence that runs past the end.
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    const auto c = static_cast<uint8_t>(bytes[n - back]);
    if ((c & 0xC0) == 0x80) continue;  // continuation byte: keep looking for the lead
    size_t need = 0;
    if (c >= 0xC2 && c <= 0xDF) need = 2;
    else if (c >= 0xE0 && c <= 0xEF) need = 3;
    else if (c >= 0xF0 && c <= 0xF4) need = 4;
    return (need > back) ? n - back : n;
  }
  return n;
}

std::string StreamDecoder::push(int32_t id) {
  std::string piece = tokenizer_->token_to_piece(id, special_);
  if (first_) {
    // Same rule as Tokenizer::decode: with a space prefix the first piece loses one space.
    if (tokenizer_->add_space_prefix() && !piece.empty() && piece[0] == ' ') {
      piece.erase(0, 1);
    }
    first_ = false;
  }
  pending_ += piece;
  const size_t done = utf8_complete_prefix(pending_);
  std::string out = pending_.substr(0, done);
  pending_.erase(0, done);
  return out;
}

std::string StreamDecoder::flush() {
  std::string out;
  out.swap(pending_);
  first_ = true;
  return out;
}

}  // namespace specserve
