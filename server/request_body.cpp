// See request_body.h.
#include "server/request_body.h"

#include <vector>

namespace specserve {

using json = nlohmann::json;

namespace {

// Builds a request body's JSON with nlohmann's own DOM builder (so that duplicate keys, depth
// and every other detail behave exactly as json::parse) while keeping the path to the value
// being read, so that a parse error can say in which field it happened, and the text as written
// of each top-level number that parsed as a double ("seed": 18446744073709551616 is the double
// 1.8446744073709552e19; an error should show what the client sent).
// NOTE: json_sax_dom_parser is in nlohmann's detail namespace; it is the builder json::parse
// itself uses (3.11), and writing a second one would be the riskier copy.
class BodySax {
 public:
  explicit BodySax(json* root) : dom_(*root, /*allow_exceptions=*/false) {}

  bool null() { return value_read() && dom_.null(); }
  bool boolean(bool v) { return value_read() && dom_.boolean(v); }
  bool number_integer(json::number_integer_t v) { return value_read() && dom_.number_integer(v); }
  bool number_unsigned(json::number_unsigned_t v) { return value_read() && dom_.number_unsigned(v); }
  bool number_float(json::number_float_t v, const std::string& text) {
    if (path_.size() == 1 && path_[0].object && path_[0].has_key) top_level_number_text_[path_[0].key] = text;
    return value_read() && dom_.number_float(v, text);
  }
  bool string(std::string& v) { return value_read() && dom_.string(v); }
  bool binary(json::binary_t& v) { return value_read() && dom_.binary(v); }
  bool start_object(std::size_t n) {
    path_.push_back(Level{true, false, {}, 0});
    return dom_.start_object(n);
  }
  bool key(std::string& k) {
    path_.back().key = k;
    path_.back().has_key = true;
    return dom_.key(k);
  }
  bool end_object() {
    path_.pop_back();
    return value_read() && dom_.end_object();
  }
  bool start_array(std::size_t n) {
    path_.push_back(Level{false, false, {}, 0});
    return dom_.start_array(n);
  }
  bool end_array() {
    path_.pop_back();
    return value_read() && dom_.end_array();
  }
  template <class Exception>
  bool parse_error(std::size_t byte, const std::string& last_token, const Exception& e) {
    error_ = ErrorInfo{byte, last_token, e.what(), e.id, where()};
    return dom_.parse_error(byte, last_token, e);
  }

  struct ErrorInfo {
    size_t byte = 0;          ///< bytes read when the error was found
    std::string last_token;   ///< the lexer's last token (the number, for an overflow)
    std::string what;         ///< nlohmann's message
    int id = 0;               ///< nlohmann's exception id (406: number overflow)
    std::string path;         ///< "temperature", "messages[0].content"; "" at the top level
  };
  const std::optional<ErrorInfo>& error() const { return error_; }
  /// Top-level key -> the number's text as written, for numbers that parsed as doubles.
  const std::map<std::string, std::string>& top_level_number_text() const { return top_level_number_text_; }

 private:
  struct Level {
    bool object;
    bool has_key;     // object: a key was read and its value is being read
    std::string key;  // object: that key
    size_t index;     // array: the index of the element being read
  };
  // A value was read (a scalar, or a container now closed): its parent moves on.
  bool value_read() {
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
  std::map<std::string, std::string> top_level_number_text_;
  std::optional<ErrorInfo> error_;
};

}  // namespace

std::optional<ApiError> parse_request_body(const std::string& text, json* out, std::map<std::string, std::string>* number_text) {
  BodySax sax(out);
  bool ok = false;
  try {
    ok = json::sax_parse(text, &sax);
  } catch (const json::exception& e) {  // not expected (allow_exceptions is off); never a 500
    return api_field_error("", std::string("malformed JSON in the request body: ") + e.what());
  }
  if (ok) {
    if (number_text) *number_text = sax.top_level_number_text();
    return std::nullopt;
  }
  if (!sax.error()) return api_field_error("", "malformed JSON in the request body");
  const BodySax::ErrorInfo& e = *sax.error();
  if (e.id == 406) {
    // A number beyond a double (1e400): valid JSON syntax, but no value this server can hold.
    std::string token = e.last_token.size() > 40 ? e.last_token.substr(0, 37) + "..." : e.last_token;
    return api_field_error(e.path, (e.path.empty() ? std::string("the request body") : e.path) + " = " + token +
                           ": the number is beyond the range of a double (byte " + std::to_string(e.byte) +
                           " of the request body)");
  }
  // nlohmann's message quotes the last token read, which can be a string of megabytes.
  const std::string what = e.what.size() > 300 ? e.what.substr(0, 297) + "..." : e.what;
  return api_field_error(e.path, "malformed JSON in the request body" + (e.path.empty() ? std::string() : " (in " + e.path + ")") + ": " + what);
}

}  // namespace specserve
