// specserve model: SentencePiece-style tokenization (greedy score-ordered merges, <0xNN> byte
// fallback), matching llama.cpp's llm_tokenizer_spm.
#include <algorithm>
#include <string_view>
#include <vector>

#include "model/tokenizer.h"
#include "model/tokenizer_internal.h"

namespace specserve {

using tokenizer_internal::utf8_len_from_lead;

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

}  // namespace specserve
