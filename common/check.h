// Invariant checks: LAUNCH_CHECK(cond) << "detail" logs the condition, where it failed and the
// detail, then aborts. For what the code itself assumes (an index a message was already checked
// against, a state machine's phase), never for input: input gets an absl::Status.
#pragma once

#include <sstream>

namespace launch::check_internal {

// Collects the detail; its destructor logs "launch: invariant violated at FILE:LINE: COND: detail"
// to stderr (directly: the console thread may be what is broken) and aborts.
class CheckFailure {
 public:
  CheckFailure(const char* file, int line, const char* condition);
  CheckFailure(const CheckFailure&) = delete;
  CheckFailure& operator=(const CheckFailure&) = delete;
  [[noreturn]] ~CheckFailure();
  template <typename T>
  CheckFailure& operator<<(const T& value) {
    detail_ << value;
    return *this;
  }

 private:
  const char* file_;
  int line_;
  const char* condition_;
  std::ostringstream detail_;
};

// Makes the failing branch a void expression, as the passing branch is (glog's LogMessageVoidify).
struct Voidify {
  void operator&(const CheckFailure&) {}
};

}  // namespace launch::check_internal

// `<<` binds tighter than `&`, which binds tighter than `?:`: the detail is streamed only when the
// condition is false, and the whole is one expression usable as a statement.
#define LAUNCH_CHECK(condition) \
  (condition)                   \
      ? static_cast<void>(0)    \
      : ::launch::check_internal::Voidify() & ::launch::check_internal::CheckFailure(__FILE__, __LINE__, #condition)
