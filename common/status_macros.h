// Small helpers for absl::Status plumbing across module boundaries.
// RETURN_IF_ERROR / ASSIGN_OR_RETURN keep error paths one line long.
#pragma once

#include <cerrno>
#include <cstring>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

#define LAUNCH_CONCAT_INNER(a, b) a##b
#define LAUNCH_CONCAT(a, b) LAUNCH_CONCAT_INNER(a, b)

#define RETURN_IF_ERROR(expr)    \
  do {                           \
    ::absl::Status _st = (expr); \
    if (!_st.ok()) return _st;   \
  } while (0)

#define ASSIGN_OR_RETURN(lhs, expr) ASSIGN_OR_RETURN_IMPL(LAUNCH_CONCAT(_statusor_, __LINE__), lhs, expr)
#define ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                          \
  if (!tmp.ok()) return tmp.status();         \
  lhs = std::move(tmp).value()

namespace launch {

// An error from a failed system call: "what: strerror(errno)".
inline absl::Status ErrnoStatus(const std::string& what, int err = errno) {
  return absl::Status(absl::ErrnoToStatusCode(err), absl::StrCat(what, ": ", std::strerror(err)));
}

}  // namespace launch
