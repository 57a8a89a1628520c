// Per-step progress to the node agent over the datagram socket it provides (LAUNCH_PROGRESS_FD):
// one non-blocking send per call, a no-op when not run under `launch`.
#pragma once

#include <cstdint>

namespace launch_sdk {

// The wire format (host byte order; agent and workers share a machine).
struct ProgressRecord {
  uint32_t magic = 0x4c50524fu;  // "LPRO"
  int32_t rank = 0;
  int64_t step = 0;
  double loss = 0;
  double step_seconds = 0;
};

// Sent once by a worker that writes its own stacks to LAUNCH_STACK_FILE when it gets `signal`
// (the Python module does, through faulthandler): when the worker hangs, the agent sends it that
// signal instead of attaching a debugger. Same socket as ProgressRecord, told apart by size and
// magic.
struct StackDumpRecord {
  uint32_t magic = 0x4c53544bu;  // "LSTK"
  int32_t rank = 0;
  int32_t signal = 0;
  int32_t reserved = 0;
};

class ProgressReporter {
 public:
  // fd < 0: every Report is a no-op.
  ProgressReporter(int fd, int rank) : fd_(fd), rank_(rank) {}
  static ProgressReporter FromEnv();
  bool enabled() const { return fd_ >= 0; }
  void Report(int64_t step, double loss, double step_seconds);

 private:
  int fd_;
  int rank_;
};

}  // namespace launch_sdk
