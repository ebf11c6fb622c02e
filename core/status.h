// specserve core: errors as values.
//
// `Status` carries an error code and a human-readable message; `Expected<T>` is a value or a
// Status. Operational failures (bad input, no free blocks, peer gone) travel as values; a
// broken invariant is a bug and aborts through SPECSERVE_CHECK.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <variant>

namespace specserve {

/// Error categories, coarse on purpose: callers branch on the code, people read the message.
enum class StatusCode {
  kOk = 0,
  kInvalidArgument,   ///< caller passed an impossible value (names the field and value)
  kNotFound,          ///< a file, tensor, token or key that does not exist
  kCorruptData,       ///< a file whose bytes break its format (names file, offset, field)
  kUnsupported,       ///< valid input this build does not handle yet
  kOutOfRange,        ///< a length, index or context size past its limit
  kResourceExhausted, ///< no free KV blocks, no memory
  kUnavailable,       ///< peer gone, worker not ready
  kDeadlineExceeded,
  kCancelled,
  kInternal,
};

/// Name of a status code, e.g. "invalid argument".
const char* status_code_name(StatusCode code);

/// The result of an operation that returns no value. Cheap to copy when ok.
class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status ok_status() { return Status(); }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  /// "invalid argument: <message>" or "ok".
  std::string to_string() const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status invalid_argument(std::string m) { return {StatusCode::kInvalidArgument, std::move(m)}; }
inline Status not_found(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
inline Status corrupt_data(std::string m) { return {StatusCode::kCorruptData, std::move(m)}; }
inline Status unsupported(std::string m) { return {StatusCode::kUnsupported, std::move(m)}; }
inline Status out_of_range(std::string m) { return {StatusCode::kOutOfRange, std::move(m)}; }
inline Status resource_exhausted(std::string m) { return {StatusCode::kResourceExhausted, std::move(m)}; }
inline Status internal_error(std::string m) { return {StatusCode::kInternal, std::move(m)}; }
inline Status unavailable(std::string m) { return {StatusCode::kUnavailable, std::move(m)}; }
inline Status deadline_exceeded(std::string m) { return {StatusCode::kDeadlineExceeded, std::move(m)}; }
inline Status cancelled(std::string m) { return {StatusCode::kCancelled, std::move(m)}; }

/// A value of type T or the Status explaining why there is none.
template <typename T>
class [[nodiscard]] Expected {
 public:
  Expected(T value) : v_(std::move(value)) {}                 // NOLINT: implicit by design
  Expected(Status status) : v_(std::move(status)) {           // NOLINT: implicit by design
    if (std::get<Status>(v_).ok()) std::get<Status>(v_) = internal_error("Expected built from ok Status");
  }

  bool ok() const { return std::holds_alternative<T>(v_); }
  explicit operator bool() const { return ok(); }
  /// The error; an ok Status when a value is held.
  Status status() const { return ok() ? Status() : std::get<Status>(v_); }

  T& value() & { check(); return std::get<T>(v_); }
  const T& value() const& { check(); return std::get<T>(v_); }
  T&& value() && { check(); return std::get<T>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  void check() const {
    if (!ok()) {
      std::fprintf(stderr, "specserve: value() on error: %s\n", std::get<Status>(v_).to_string().c_str());
      std::abort();
    }
  }
  std::variant<T, Status> v_;
};

}  // namespace specserve

/// Aborts with file:line and the message when an invariant is broken (a bug, not bad input).
#define SPECSERVE_CHECK(cond, msg)                                                         \
  do {                                                                                     \
    if (!(cond)) {                                                                         \
      std::fprintf(stderr, "specserve: check failed at %s:%d: %s (%s)\n", __FILE__, __LINE__, \
                   #cond, std::string(msg).c_str());                                       \
      std::abort();                                                                        \
    }                                                                                      \
  } while (0)

/// Returns the Status from the enclosing function when it is not ok.
#define SPECSERVE_RETURN_IF_ERROR(expr)          \
  do {                                           \
    ::specserve::Status _st = (expr);            \
    if (!_st.ok()) return _st;                   \
  } while (0)
