#include "common/check.h"

#include <cstdio>
#include <cstdlib>
#include <string>

namespace launch::check_internal {

CheckFailure::CheckFailure(const char* file, int line, const char* condition)
    : file_(file), line_(line), condition_(condition) {}

CheckFailure::~CheckFailure() {
  const std::string detail = detail_.str();
  std::fprintf(stderr, "launch: invariant violated at %s:%d: %s%s%s\n", file_, line_, condition_,
               detail.empty() ? "" : ": ", detail.c_str());
  std::fflush(stderr);
  std::abort();
}

}  // namespace launch::check_internal
