#include "piper/base/status.h"

#include <cstdio>
#include <cstdlib>

namespace piper {

const char* status_code_name(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "OK";
    case StatusCode::kInvalidArgument: return "INVALID_ARGUMENT";
    case StatusCode::kNotFound: return "NOT_FOUND";
    case StatusCode::kOutOfRange: return "OUT_OF_RANGE";
    case StatusCode::kFailedPrecondition: return "FAILED_PRECONDITION";
    case StatusCode::kDataLoss: return "DATA_LOSS";
    case StatusCode::kDeadlineExceeded: return "DEADLINE_EXCEEDED";
    case StatusCode::kUnavailable: return "UNAVAILABLE";
    case StatusCode::kResourceExhausted: return "RESOURCE_EXHAUSTED";
    case StatusCode::kUnimplemented: return "UNIMPLEMENTED";
    case StatusCode::kInternal: return "INTERNAL";
  }
  return "UNKNOWN";
}

std::string Status::to_string() const {
  if (ok()) return "OK";
  return std::string(status_code_name(code_)) + ": " + message_;
}

Status Status::with_context(const std::string& context) const {
  if (ok()) return *this;
  return Status(code_, context + ": " + message_);
}

Status invalid_argument(std::string message) { return Status(StatusCode::kInvalidArgument, std::move(message)); }
Status not_found(std::string message) { return Status(StatusCode::kNotFound, std::move(message)); }
Status out_of_range(std::string message) { return Status(StatusCode::kOutOfRange, std::move(message)); }
Status failed_precondition(std::string message) {
  return Status(StatusCode::kFailedPrecondition, std::move(message));
}
Status data_loss(std::string message) { return Status(StatusCode::kDataLoss, std::move(message)); }
Status deadline_exceeded(std::string message) { return Status(StatusCode::kDeadlineExceeded, std::move(message)); }
Status unavailable(std::string message) { return Status(StatusCode::kUnavailable, std::move(message)); }
Status resource_exhausted(std::string message) {
  return Status(StatusCode::kResourceExhausted, std::move(message));
}
Status unimplemented(std::string message) { return Status(StatusCode::kUnimplemented, std::move(message)); }
Status internal_error(std::string message) { return Status(StatusCode::kInternal, std::move(message)); }

void result_access_failed(const Status& status) {
  std::fprintf(stderr, "piper: FATAL: value() of a failed Result: %s\n", status.to_string().c_str());
  std::fflush(stderr);
  std::abort();
}

}  // namespace piper
