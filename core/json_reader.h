// specserve core: reading JSON text so that an error says where. The server's request bodies
// (server/request_body.h) and the CLI's JSON flags (--speculative-config) go through read_json.
#pragma once

#include <cstddef>
#include <map>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

namespace specserve {

/// Why read_json failed.
struct JsonReadError {
  std::string path;        ///< the value being read: "temperature", "messages[0].content"; "" at the top level
  size_t byte = 0;         ///< bytes read when the error was found
  std::string last_token;  ///< the lexer's last token (the number's text, for an overflow)
  std::string what;        ///< nlohmann's message (with line and column)
  int id = 0;              ///< nlohmann's exception id; 406: a number beyond the range of a double

  bool number_overflow() const { return id == 406; }
  /// One line for people, `source` naming the text ("the request body", "--speculative-config"):
  ///  - a number beyond a double: "PATH = 1e400: the number is beyond the range of a double (byte N
  ///    of SOURCE)" (the number at most 40 bytes as written);
  ///  - otherwise: "malformed JSON in SOURCE (in PATH): <nlohmann's message, at most 300 bytes>".
  std::string describe(const std::string& source) const;
};

/// Parses `text` (RFC 8259 JSON, exactly as nlohmann::json::parse reads it: same duplicate-key
/// (the last wins), depth and number rules) into *out; on an error returns where it happened.
/// `number_text` (optional): path ("seed", "stop_token_ids[0]", as JsonReadError::path) -> the
/// text as written of each number that parsed as a double (the first 256 paths; a text over 80
/// bytes is cut to 77 and "..."), so a message can show what was sent (18446744073709551616, not
/// 1.8446744073709552e19).
/// NOTE: built on nlohmann::detail::json_sax_dom_parser, the builder json::parse itself uses
/// (nlohmann 3.11); writing a second one would be the riskier copy.
std::optional<JsonReadError> read_json(const std::string& text, nlohmann::json* out,
                                       std::map<std::string, std::string>* number_text = nullptr);

}  // namespace specserve
