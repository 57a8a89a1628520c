#include "launch_sdk/progress.h"

#include <sys/socket.h>

#include <cerrno>
#include <climits>
#include <cstdlib>

#include "launch_sdk/contract.h"

namespace launch_sdk {

namespace {
// A non-negative int, or `fallback` for anything else: progress is best effort and never stops
// a worker.
int NonNegative(const char* v, int fallback) {
  if (!v || !*v) return fallback;
  char* end = nullptr;
  errno = 0;
  const long n = std::strtol(v, &end, 10);
  return *end == '\0' && errno == 0 && n >= 0 && n <= INT_MAX ? static_cast<int>(n) : fallback;
}
}  // namespace

ProgressReporter ProgressReporter::FromEnv() {
  return ProgressReporter(NonNegative(std::getenv(kProgressFdEnv), -1), NonNegative(std::getenv("RANK"), 0));
}

void ProgressReporter::Report(int64_t step, double loss, double step_seconds, double wait_seconds) {
  if (fd_ < 0) return;
  ProgressRecord r;
  r.rank = rank_;
  r.step = step;
  r.loss = loss;
  r.step_seconds = step_seconds;
  r.wait_seconds = wait_seconds;
  // A full socket buffer drops the report: progress must never slow training down.
  if (send(fd_, &r, sizeof r, MSG_DONTWAIT | MSG_NOSIGNAL) < 0 && errno == EBADF) fd_ = -1;
}

}  // namespace launch_sdk
