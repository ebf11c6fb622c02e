#include "core/status.h"

namespace specserve {

const char* status_code_name(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "ok";
    case StatusCode::kInvalidArgument: return "invalid argument";
    case StatusCode::kNotFound: return "not found";
    case StatusCode::kCorruptData: return "corrupt data";
    case StatusCode::kUnsupported: return "unsupported";
    case StatusCode::kOutOfRange: return "out of range";
    case StatusCode::kResourceExhausted: return "resource exhausted";
    case StatusCode::kUnavailable: return "unavailable";
    case StatusCode::kDeadlineExceeded: return "deadline exceeded";
    case StatusCode::kCancelled: return "cancelled";
    case StatusCode::kInternal: return "internal";
  }
  return "unknown";
}

std::string Status::to_string() const {
  if (ok()) return "ok";
  return std::string(status_code_name(code_)) + ": " + message_;
}

}  // namespace specserve
