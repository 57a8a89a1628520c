#include "common/exit_status.h"

namespace launch {

int ExitStatus(const LaunchOutcome& o) {
  using K = LaunchOutcome::Kind;
  switch (o.kind) {
    case K::kSucceeded:
      return 0;
    case K::kUsageError:
      return kUsageErrorExitCode;
    case K::kLaunchError:
    case K::kJobFailed:
      return 1;
    case K::kSignalled:
      return 128 + o.signal;
    case K::kWorkerFailed:
      if (o.hung) return kHungExitCode;
      if (o.signal != 0) return 128 + o.signal;
      return o.exit_code != 0 ? o.exit_code : 1;
  }
  return 1;
}

}  // namespace launch
