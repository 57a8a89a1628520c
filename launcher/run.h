// `launch [flags] PROGRAM`: checks everything that can be checked before starting anything
// (exit 2 on bad input), then runs an in-process coordinator and this node's agent.
#pragma once

#include "agent/process.h"
#include "agent/signals.h"
#include "launcher/options.h"

namespace launch {

// Returns launch's exit code.
int RunLaunch(const LaunchConfig& config, OrphanGuard* guard, SignalFd* signals);

}  // namespace launch
