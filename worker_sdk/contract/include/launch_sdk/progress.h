// Per-step progress to the node agent over the datagram socket it provides (LAUNCH_PROGRESS_FD):
// one non-blocking send per call, a no-op when not run under `launch`.
#pragma once

#include <cstddef>
#include <cstdint>

namespace launch_sdk {

// The wire format (host byte order; agent and workers share a machine). Records of the first
// version end after step_seconds (32 bytes); the agent reads both.
struct ProgressRecord {
  uint32_t magic = 0x4c50524fu;  // "LPRO"
  int32_t rank = 0;
  int64_t step = 0;
  double loss = 0;
  double step_seconds = 0;
  // Of step_seconds, the time spent waiting for the other ranks (in gradient all-reduces): the
  // rest is the rank's own work, which is what tells a straggler (under DDP every rank's step
  // takes as long as the slowest one's).
  double wait_seconds = 0;
};
constexpr size_t kProgressRecordV1Bytes = 32;
// A ProgressRecord with this magic is a step launch counted (a Python worker's optimizer steps),
// not one the program named: it feeds step rates, stragglers and an explicit --hang-timeout, but
// never arms the automatic one.
constexpr uint32_t kCountedProgressMagic = 0x4c505243u;  // "LPRC"

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
  void Report(int64_t step, double loss, double step_seconds, double wait_seconds = 0);

 private:
  int fd_;
  int rank_;
};

}  // namespace launch_sdk
