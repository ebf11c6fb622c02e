// specserve model: byte-level BPE (GPT-2 byte->unicode mapping, pre-tokenizer split, ranked
// merges), matching llama.cpp's llm_tokenizer_bpe.
#include <algorithm>
#include <array>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "model/pretokenizer.h"
#include "model/tokenizer.h"
#include "model/tokenizer_internal.h"

namespace specserve {
namespace tokenizer_internal {

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

}  // namespace tokenizer_internal

using tokenizer_internal::append_utf8;
using tokenizer_internal::decode_cpt;
using tokenizer_internal::MatchDataDeleter;
using tokenizer_internal::split_pieces;

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

}  // namespace specserve
