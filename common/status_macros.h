// Status propagation helpers in the style of Abseil-based codebases.
#pragma once

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define TRIBUTARY_CONCAT_INNER(a, b) a##b
#define TRIBUTARY_CONCAT(a, b) TRIBUTARY_CONCAT_INNER(a, b)

// Returns from the current function if `expr` yields a non-OK absl::Status.
#define RETURN_IF_ERROR(expr)          \
  do {                                 \
    ::absl::Status _status = (expr);   \
    if (!_status.ok()) return _status; \
  } while (0)

#define ASSIGN_OR_RETURN_IMPL(statusor, lhs, rexpr) \
  auto statusor = (rexpr);                          \
  if (!statusor.ok()) return statusor.status();     \
  lhs = std::move(statusor).value()

// `ASSIGN_OR_RETURN(auto x, MakeX());` assigns the value or returns the error.
#define ASSIGN_OR_RETURN(lhs, rexpr) \
  ASSIGN_OR_RETURN_IMPL(TRIBUTARY_CONCAT(_statusor_, __LINE__), lhs, rexpr)

// Invariant check: logs and aborts. For programming errors only, never for input.
#define TRIBUTARY_CHECK(cond)                                                 \
  do {                                                                        \
    if (!(cond)) ::tributary::common::CheckFailed(#cond, __FILE__, __LINE__); \
  } while (0)

namespace tributary::common {
[[noreturn]] void CheckFailed(const char* condition, const char* file, int line);
}  // namespace tributary::common
