// specserve model: what the tokenizer's .cpp files share (not part of the public API).
//
// tokenizer.cpp (construction, special tokens, encode dispatch, queries), tokenizer_bpe.cpp,
// tokenizer_spm.cpp and tokenizer_decode.cpp all work on Tokenizer::Tables, defined here, and
// on llama.cpp-compatible UTF-8 helpers. Include only from model/tokenizer*.cpp.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "model/pretokenizer.h"
#include "model/tokenizer.h"

namespace specserve {
namespace tokenizer_internal {

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

// ---------------------------------------------------------------------------------------------
// UTF-8 helpers with llama.cpp's exact leniency (unicode_cpt_from_utf8): overlong forms and
// surrogates decode; a bad byte becomes U+FFFD and decoding resumes at the next byte.

inline constexpr uint32_t kReplacement = 0xFFFD;

inline size_t utf8_len_from_lead(uint8_t lead) {
  static constexpr uint8_t kLookup[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  return kLookup[lead >> 4];
}

inline uint32_t decode_cpt(std::string_view s, size_t& off) {
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

inline void append_utf8(uint32_t cpt, std::string& out) {
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

// GPT-2's bytes_to_unicode() table (tokenizer_bpe.cpp).
std::array<uint32_t, 256> make_byte_to_cpt();

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

}  // namespace tokenizer_internal

struct Tokenizer::Tables {
  std::vector<float> scores;
  std::vector<uint32_t> attrs;
  // BPE: every vocabulary text (id < vocab size) plus every merge operand or result that is
  // not itself a token (ids from vocab size upwards), so the merge loop works on ints only.
  tokenizer_internal::PieceMap piece_ids;
  std::unordered_map<uint64_t, tokenizer_internal::BpeMerge> merges;  // key: left id << 32 | right id
  std::array<int32_t, 256> byte_piece{};           // raw byte -> piece id of its stand-in
  std::array<std::string, 256> byte_encoded;       // raw byte -> UTF-8 of its stand-in
  std::unordered_map<uint32_t, uint8_t> cpt_to_byte;
  std::vector<std::unique_ptr<pcre2_code, tokenizer_internal::PcreDeleter>> regexes;
  std::vector<int32_t> special_tokens;  // control/user-defined/unknown, longest text first
  std::vector<std::string> pieces;      // token_to_piece(id, special = true)
};

}  // namespace specserve
