// See api_fields.h.
#include "server/api_fields.h"

#include <cmath>
#include <cstdio>

namespace specserve::api_fields {

using json = nlohmann::json;

namespace {

// Appends `v` to *out in JSON, stopping once *out holds more than `budget` bytes and writing
// containers deeper than `depth` as [...] / {...}.
// NOTE: not json::dump: dump recurses once per nesting level, so a request of 100000 nested
// arrays overflowed the HTTP thread's stack (the parser itself is iterative), and it would
// serialise a 32 MiB value to show 80 characters of it.
void render_bounded(const json& v, int depth, size_t budget, std::string* out) {
  if (out->size() > budget) return;
  if (v.is_array() || v.is_object()) {
    const bool arr = v.is_array();
    if (depth <= 0) {
      *out += arr ? "[...]" : "{...}";
      return;
    }
    *out += arr ? '[' : '{';
    bool first = true;
    for (auto it = v.begin(); it != v.end() && out->size() <= budget; ++it) {
      if (!first) *out += ',';
      first = false;
      if (!arr) *out += dump_json(it.key()) + ":";
      render_bounded(*it, depth - 1, budget, out);
    }
    *out += arr ? ']' : '}';
  } else if (v.is_string() && v.get_ref<const std::string&>().size() > budget) {
    *out += dump_json(v.get_ref<const std::string&>().substr(0, budget));  // cut UTF-8 is replaced
  } else {
    *out += dump_json(v);
  }
}

}  // namespace

ApiError bad(const std::string& param, const std::string& message, int status, const std::string& code) {
  ApiError e;
  e.http_status = status;
  e.param = param;
  e.message = message;
  e.code = code;
  return e;
}

// The JSON value as it appeared in the request, shortened, for error messages.
std::string shown(const json& v) {
  std::string s;
  render_bounded(v, 8, 80, &s);
  if (s.size() > 80) s = s.substr(0, 77) + "...";
  return s;
}

const char* type_name(const json& v) {
  switch (v.type()) {
    case json::value_t::null: return "null";
    case json::value_t::boolean: return "boolean";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned: return "integer";
    case json::value_t::number_float: return "number";
    case json::value_t::string: return "string";
    case json::value_t::array: return "array";
    case json::value_t::object: return "object";
    default: return "value";
  }
}

ApiError wrong_type(const std::string& field, const json& v, const char* expected) {
  return bad(field, std::string(field) + ": expected " + expected + ", got " + type_name(v) + " " + shown(v));
}

// Field readers: nullopt = fine (absent or null leaves *out unchanged), else the error.
std::optional<ApiError> read_bool(const json& body, const char* f, bool* out) {
  auto it = body.find(f);
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (!it->is_boolean()) return wrong_type(f, *it, "a boolean");
  *out = it->get<bool>();
  return std::nullopt;
}

// `written` (optional): top-level key -> a number's text as sent (parse_request_body), for the
// message about a whole number too large for an int64 (max_tokens 18446744073709551616 is the
// double 1.8446744073709552e19 by then).
std::optional<ApiError> read_int(const json& body, const char* f, int64_t lo, int64_t hi, int64_t* out, bool* given,
                                 const std::map<std::string, std::string>* written) {
  auto it = body.find(f);
  if (it == body.end() || it->is_null()) return std::nullopt;
  int64_t v = 0;
  auto out_of_range = [&](const std::string& shown_value) {
    return bad(f, std::string(f) + " = " + shown_value + ": must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  };
  // NOTE: unsigned first: is_number_integer() is true for unsigned values too, and get<int64_t>
  // wrapped 2^64 - 1 to -1 (top_k 18446744073709551615 became -1, "no top-k").
  if (it->is_number_unsigned()) {
    const uint64_t u = it->get<uint64_t>();
    if (hi < 0 || u > static_cast<uint64_t>(hi)) return out_of_range(std::to_string(u));
    v = static_cast<int64_t>(u);
  } else if (it->is_number_integer()) {
    v = it->get<int64_t>();
  } else if (it->is_number_float() && std::isfinite(it->get<double>()) && it->get<double>() == std::floor(it->get<double>())) {
    // 5.0 is 5; a whole number past 9e15 is beyond every integer field's range here (and a
    // double's exact integers): out of range, shown as sent.
    if (std::fabs(it->get<double>()) >= 9e15) {
      const auto w = written ? written->find(f) : std::map<std::string, std::string>::const_iterator();
      std::string text = written && w != written->end() ? w->second : shown(*it);
      if (text.size() > 80) text = text.substr(0, 77) + "...";
      return out_of_range(text);
    }
    v = static_cast<int64_t>(it->get<double>());
  } else {
    return wrong_type(f, *it, "an integer");
  }
  if (v < lo || v > hi) return out_of_range(std::to_string(v));
  *out = v;
  if (given) *given = true;
  return std::nullopt;
}

std::optional<ApiError> read_token_id(const json& t, const std::string& at, const std::string& param, int64_t limit,
                                      const std::string& why, const std::map<std::string, std::string>& number_text,
                                      int32_t* out) {
  const bool whole = t.is_number_float() && std::isfinite(t.get<double>()) && t.get<double>() == std::floor(t.get<double>());
  if (!t.is_number_integer() && !whole) return wrong_type(at, t, "a token id (an integer)");
  // NOTE: unsigned first: get<int64_t> of 2^64 - 1 is -1.
  const bool in_range = t.is_number_unsigned() ? t.get<uint64_t>() < static_cast<uint64_t>(limit)
                        : whole                ? t.get<double>() >= 0 && t.get<double>() < static_cast<double>(limit)
                                               : t.get<int64_t>() >= 0 && t.get<int64_t>() < limit;
  if (!in_range) {
    // Only a float has its text recorded (a duplicate key's earlier value may have left one).
    const auto w = t.is_number_float() ? number_text.find(at) : number_text.end();
    return bad(param, at + " = " + (w != number_text.end() ? w->second : shown(t)) + ": not a token id" + why);
  }
  *out = static_cast<int32_t>(whole ? static_cast<int64_t>(t.get<double>()) : t.get<int64_t>());
  return std::nullopt;
}

std::optional<ApiError> read_number(const json& body, const char* f, double lo, double hi, float* out) {
  auto it = body.find(f);
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (!it->is_number()) return wrong_type(f, *it, "a number");
  const double v = it->get<double>();
  if (!(v >= lo && v <= hi)) {
    char b[160];
    std::snprintf(b, sizeof b, "%s = %s: must be in [%g, %g]", f, shown(*it).c_str(), lo, hi);
    return bad(f, b);
  }
  *out = static_cast<float>(v);
  return std::nullopt;
}

bool valid_utf8(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    const size_t n = c < 0x80 ? 0 : (c & 0xE0) == 0xC0 ? 1 : (c & 0xF0) == 0xE0 ? 2 : (c & 0xF8) == 0xF0 ? 3 : 9;
    if (n == 9 || i + n >= s.size() + (n == 0 ? 1 : 0)) return false;  // a lead byte without all its continuation bytes
    for (size_t k = 1; k <= n; ++k) {
      if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return false;
    }
    i += n + 1;
  }
  return true;
}

}  // namespace specserve::api_fields
