// See request_body.h.
#include "server/request_body.h"

#include "core/json_reader.h"
#include "server/api_fields.h"

namespace specserve {

std::optional<ApiError> parse_request_body(const std::string& text, nlohmann::json* out, std::map<std::string, std::string>* number_text) {
  std::optional<JsonReadError> e = read_json(text, out, number_text);
  if (!e) return std::nullopt;
  return api_fields::bad(e->path, e->describe("the request body"));
}

}  // namespace specserve
