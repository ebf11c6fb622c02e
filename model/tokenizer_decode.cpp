// specserve model: token ids -> text (token_to_piece, decode with llama.cpp's space clean-up,
// StreamDecoder).
#include <string>
#include <string_view>
#include <vector>

#include "model/tokenizer.h"
#include "model/tokenizer_internal.h"

namespace specserve {

using tokenizer_internal::kAttrControl;
using tokenizer_internal::kAttrUnknown;

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
