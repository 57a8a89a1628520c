#include "launch_sdk/progress.h"

#include <sys/socket.h>

#include <cerrno>
#include <cstdlib>

namespace launch_sdk {

ProgressReporter ProgressReporter::FromEnv() {
  const char* fd = std::getenv("LAUNCH_PROGRESS_FD");
  const char* rank = std::getenv("RANK");
  return ProgressReporter(fd && *fd ? std::atoi(fd) : -1, rank ? std::atoi(rank) : 0);
}

void ProgressReporter::Report(int64_t step, double loss, double step_seconds) {
  if (fd_ < 0) return;
  ProgressRecord r;
  r.rank = rank_;
  r.step = step;
  r.loss = loss;
  r.step_seconds = step_seconds;
  // A full socket buffer drops the report: progress must never slow training down.
  if (send(fd_, &r, sizeof r, MSG_DONTWAIT | MSG_NOSIGNAL) < 0 && errno == EBADF) fd_ = -1;
}

}  // namespace launch_sdk
