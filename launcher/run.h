// `launch [flags] PROGRAM`: gathers this machine's facts, plans the launch (launcher/plan.h: exit 2
// on bad input, before anything starts), then carries the plan out: coordinator, agent, workers.
#pragma once

#include "probes/process.h"
#include "probes/signals.h"
#include "launcher/options.h"

namespace launch {

// Returns launch's exit code.
int RunLaunch(const LaunchConfig& config, OrphanGuard* guard, SignalFd* signals);

// `launch coordinator`: serves until SIGINT/SIGTERM; returns the exit code.
int RunCoordinator(const CoordinatorConfig& config, SignalFd* signals);

// `launch status`: prints the job's screen (again every --interval with --watch, until the job
// ends or a signal); returns the exit code (1: the coordinator cannot be asked).
int RunStatus(const StatusConfig& config, SignalFd* signals);

// `launch doctor`: prints this machine's checks; returns 0 (all ok), 1 (a warning) or 2 (a failure).
int RunDoctor(const DoctorConfig& config, SignalFd* signals);

}  // namespace launch
