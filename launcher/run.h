// `launch [flags] PROGRAM`: checks everything that can be checked before starting anything
// (exit 2 on bad input), then runs an in-process coordinator and this node's agent.
#pragma once

#include "agent/process.h"
#include "agent/signals.h"
#include "launcher/options.h"

namespace launch {

// Returns launch's exit code.
int RunLaunch(const LaunchConfig& config, OrphanGuard* guard, SignalFd* signals);

// `launch coordinator`: serves until SIGINT/SIGTERM; returns the exit code.
int RunCoordinator(const CoordinatorConfig& config, SignalFd* signals);

// torchrun's default rendezvous port.
inline constexpr int kDefaultRendezvousPort = 29400;

}  // namespace launch
