// See json_reader.h.
#include "core/json_reader.h"

#include <string_view>
#include <vector>

namespace specserve {

using json = nlohmann::json;

namespace {

// Builds the JSON with nlohmann's own DOM builder (so that duplicate keys, depth and every other
// detail behave exactly as json::parse) while keeping the path to the value being read, so that a
// parse error can say in which field it happened, and the text as written of each number that
// parsed as a double ("seed": 18446744073709551616 is the double
// 1.8446744073709552e19; an error should show what was sent).
// NOTE: json_sax_dom_parser is in nlohmann's detail namespace; it is the builder json::parse
// itself uses (3.11), and writing a second one would be the riskier copy.
class LocatingSax {
 public:
  explicit LocatingSax(json* root) : dom_(*root, /*allow_exceptions=*/false) {}

  bool null() { return value_read() && dom_.null(); }
  bool boolean(bool v) { return value_read() && dom_.boolean(v); }
  bool number_integer(json::number_integer_t v) { return number_read(std::to_string(v)) && dom_.number_integer(v); }
  bool number_unsigned(json::number_unsigned_t v) { return number_read(std::to_string(v)) && dom_.number_unsigned(v); }
  bool number_float(json::number_float_t v, const std::string& text) {
    if (std::string p = where(); number_text_.size() < 256 || number_text_.count(p)) {
      // At most 80 bytes: JSON allows a number of any length (a fraction of megabytes of zeros).
      number_text_[p] = text.size() > 80 ? text.substr(0, 77) + "..." : text;
    }
    return number_read(text) && dom_.number_float(v, text);
  }
  bool string(std::string& v) { return value_read() && dom_.string(v); }
  bool binary(json::binary_t& v) { return value_read() && dom_.binary(v); }
  bool start_object(std::size_t n) {
    last_number_path_.reset();
    path_.push_back(Level{true, false, {}, 0});
    return dom_.start_object(n);
  }
  bool key(std::string& k) {
    last_number_path_.reset();
    path_.back().key = k;
    path_.back().has_key = true;
    return dom_.key(k);
  }
  bool end_object() {
    path_.pop_back();
    return value_read() && dom_.end_object();
  }
  bool start_array(std::size_t n) {
    last_number_path_.reset();
    path_.push_back(Level{false, false, {}, 0});
    return dom_.start_array(n);
  }
  bool end_array() {
    path_.pop_back();
    return value_read() && dom_.end_array();
  }
  template <class Exception>
  bool parse_error(std::size_t byte, const std::string& last_token, const Exception& e) {
    // A number followed at once by what cannot follow it ("max_tokens": 0x10) reads as the number
    // 0, then a bad literal whose token starts with that number's text: the error is in that
    // number's value. (A malformed number itself, "1." or 1e999, gives no number event first.)
    const std::string_view what = e.what();
    const bool in_number = last_number_path_ && e.id == 101 && what.find("invalid literal") != std::string_view::npos &&
                           last_token.size() > last_number_text_.size() && last_token.rfind(last_number_text_, 0) == 0;
    error_ = JsonReadError{in_number ? *last_number_path_ : where(), byte, last_token, e.what(), e.id};
    return dom_.parse_error(byte, last_token, e);
  }

  const std::optional<JsonReadError>& error() const { return error_; }
  /// Path -> the number's text as written, for numbers that parsed as doubles (the first 256).
  const std::map<std::string, std::string>& number_text() const { return number_text_; }

 private:
  struct Level {
    bool object;
    bool has_key;     // object: a key was read and its value is being read
    std::string key;  // object: that key
    size_t index;     // array: the index of the element being read
  };
  // A number was read: remembered until the next event (see parse_error).
  bool number_read(std::string text) {
    std::string p = where();
    value_read();
    last_number_path_ = std::move(p);
    last_number_text_ = std::move(text);
    return true;
  }
  // A value was read (a scalar, or a container now closed): its parent moves on.
  bool value_read() {
    last_number_path_.reset();
    if (path_.empty()) return true;
    Level& l = path_.back();
    if (l.object) {
      l.has_key = false;
    } else {
      ++l.index;
    }
    return true;
  }
  // The path to the value being read, at most ~120 characters.
  std::string where() const {
    std::string p;
    for (const Level& l : path_) {
      if (p.size() > 120) return p + "...";
      if (l.object) {
        if (!l.has_key) break;
        if (!p.empty()) p += '.';
        p += l.key.size() > 60 ? l.key.substr(0, 57) + "..." : l.key;
      } else {
        p += "[" + std::to_string(l.index) + "]";
      }
    }
    return p;
  }

  nlohmann::detail::json_sax_dom_parser<json> dom_;
  std::vector<Level> path_;
  std::map<std::string, std::string> number_text_;
  std::optional<std::string> last_number_path_;  // the path of the number just read, until the next event
  std::string last_number_text_;                 // and its text
  std::optional<JsonReadError> error_;
};

}  // namespace

std::string JsonReadError::describe(const std::string& source) const {
  if (number_overflow()) {
    // Valid JSON syntax, but no value a double can hold.
    const std::string token = last_token.size() > 40 ? last_token.substr(0, 37) + "..." : last_token;
    return (path.empty() ? source : path) + " = " + token + ": the number is beyond the range of a double (byte " +
           std::to_string(byte) + " of " + source + ")";
  }
  // nlohmann's message quotes the last token read, which can be a string of megabytes.
  const std::string w = what.size() > 300 ? what.substr(0, 297) + "..." : what;
  return "malformed JSON in " + source + (path.empty() ? std::string() : " (in " + path + ")") + ": " + w;
}

std::optional<JsonReadError> read_json(const std::string& text, json* out, std::map<std::string, std::string>* number_text) {
  LocatingSax sax(out);
  bool ok = false;
  try {
    ok = json::sax_parse(text, &sax);
  } catch (const json::exception& e) {  // not expected: the builder's exceptions are off
    return JsonReadError{"", 0, "", e.what(), e.id};
  }
  if (ok) {
    if (number_text) *number_text = sax.number_text();
    return std::nullopt;
  }
  if (sax.error()) return *sax.error();
  return JsonReadError{"", 0, "", "the JSON text is incomplete", 0};
}

}  // namespace specserve
