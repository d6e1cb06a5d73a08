// Status and Result<T>: the error tier for everything a caller or user can get wrong.
//
// A Status is either OK or carries a code and a message. Messages name the bad value and the fix, e.g.
// "strategy: ep=6 does not divide num_experts=8; pick ep in {1,2,4,8}". Result<T> holds a T or a non-OK
// Status. Both are [[nodiscard]]: ignoring an error is a compile warning (an error under -Werror).
// Propagate with PIPER_RETURN_IF_ERROR(expr) and PIPER_ASSIGN_OR_RETURN(lhs, expr).
// Thread-safety: values; no shared state.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <variant>

namespace piper {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,  // bad user input: config, flag, strategy string, directive
  kNotFound,         // unknown preset, missing file
  kOutOfRange,       // value outside the allowed range (token id, index)
  kFailedPrecondition,
  kDataLoss,         // corrupt or truncated file
  kDeadlineExceeded,  // a wait that timed out
  kUnavailable,      // a peer rank is gone
  kResourceExhausted,  // does not fit in memory
  kUnimplemented,
  kInternal,
};

const char* status_code_name(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status ok_status() { return Status(); }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "INVALID_ARGUMENT: message" (or "OK").
  std::string to_string() const;

  // Prepends context: "context: message". No-op on OK.
  Status with_context(const std::string& context) const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status ok_status() { return Status(); }
Status invalid_argument(std::string message);
Status not_found(std::string message);
Status out_of_range(std::string message);
Status failed_precondition(std::string message);
Status data_loss(std::string message);
Status deadline_exceeded(std::string message);
Status unavailable(std::string message);
Status resource_exhausted(std::string message);
Status unimplemented(std::string message);
Status internal_error(std::string message);

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : value_(std::move(value)) {}  // NOLINT(google-explicit-constructor)
  Result(Status status) : status_(std::move(status)) {  // NOLINT(google-explicit-constructor)
    if (status_.ok()) status_ = Status(StatusCode::kInternal, "Result constructed from an OK status");
  }

  bool ok() const { return value_.has_value(); }
  const Status& status() const { return status_; }

  // Precondition: ok(). Checked: aborts with the status message otherwise.
  T& value() & {
    check_ok();
    return *value_;
  }
  const T& value() const& {
    check_ok();
    return *value_;
  }
  T&& value() && {
    check_ok();
    return std::move(*value_);
  }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  void check_ok() const;
  std::optional<T> value_;
  Status status_;
};

[[noreturn]] void result_access_failed(const Status& status);

template <typename T>
void Result<T>::check_ok() const {
  if (!value_.has_value()) result_access_failed(status_);
}

}  // namespace piper

#define PIPER_STATUS_CONCAT_INNER_(a, b) a##b
#define PIPER_STATUS_CONCAT_(a, b) PIPER_STATUS_CONCAT_INNER_(a, b)

#define PIPER_RETURN_IF_ERROR(expr)                   \
  do {                                                \
    ::piper::Status piper_status_tmp_ = (expr);       \
    if (!piper_status_tmp_.ok()) return piper_status_tmp_; \
  } while (0)

#define PIPER_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                 \
  if (!tmp.ok()) return tmp.status();                \
  lhs = std::move(tmp).value()

#define PIPER_ASSIGN_OR_RETURN(lhs, expr) \
  PIPER_ASSIGN_OR_RETURN_IMPL_(PIPER_STATUS_CONCAT_(piper_result_tmp_, __LINE__), lhs, expr)
