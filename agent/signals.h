// The launcher's signals as events: SIGCHLD, SIGINT, SIGTERM, SIGHUP and SIGQUIT are blocked in
// every thread (call BlockLauncherSignals first thing in main) and read from one signalfd.
// SIGPIPE and SIGTTIN launch ignores (workers start with them at their defaults).
#pragma once

#include "absl/status/statusor.h"
#include "common/unique_fd.h"

namespace launch {

void BlockLauncherSignals();

class SignalFd {
 public:
  static absl::StatusOr<SignalFd> Create();
  int fd() const { return fd_.get(); }
  // The next pending signal number, or 0 when none is pending.
  int Read();

 private:
  explicit SignalFd(UniqueFd fd) : fd_(std::move(fd)) {}
  UniqueFd fd_;
};

}  // namespace launch
