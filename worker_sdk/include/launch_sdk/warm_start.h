// Warm starts of C++ workers (launch --warm-start): a program that declares it may be started ahead
// of its attempt as a standby that has loaded its libraries (LibTorch: about 0.5 s) and waits, in
// AwaitWorkerStart, for the agent's go with its rank's environment and descriptors. No LibTorch here.
#pragma once

#include <functional>

// Declares, at namespace scope in one source file of the program, that launch may start it ahead
// as a standby. The code that runs before the program's first AwaitWorkerStart (which
// ReadWorkerEnv and Context::Init call) then runs before its attempt is known: it must not read
// the round's variables (RANK, WORLD_SIZE, MASTER_*, TORCHELASTIC_*, LAUNCH_LR, LAUNCH_*_BATCH, ...)
// nor act on the world (write files, connect). launch finds this mark in the executable's file.
#define LAUNCH_SDK_WARM_START() \
  extern "C" __attribute__((used)) const char launch_sdk_warm_start_mark[] = "launch-sdk-warm-start/1"

namespace launch_sdk {

// Returns at once unless the agent started this process as a standby (LAUNCH_STANDBY_FD). A
// standby tells the agent it is ready and waits for its go; at the go it becomes the worker
// itself: it returns with the worker's environment, stdin/stdout/stderr and progress descriptor
// in place, having written what the standby printed before its go to the worker's stdout and
// stderr. (launch makes the next attempt's standby as a new process.) A standby's process name
// (comm: ps -o comm, top) is "launch-standby"; its worker's is the program's. Only the first call
// waits; a later one returns at once.
void AwaitWorkerStart();

// Whether this worker was started from a standby (AwaitWorkerStart returned from a go).
bool StartedWarm();

// Whether this process is a standby before its go: launch started it ahead (LAUNCH_STANDBY_FD)
// and AwaitWorkerStart has not been called yet.
bool IsStandby();

// While a standby waits in AwaitWorkerStart, the functions added here run, in order, every
// LAUNCH_STANDBY_KEEP_WARM_MS milliseconds (default 50; 0: never; at most 60000; anything else
// ends the standby with a one-line error, and ReadWorkerEnv rejects it in a cold worker alike),
// or less often when a pass takes longer than a twentieth of that (at most 5% of a core while
// passes take under 3 s). A go that comes during a pass waits for its end. Context::Init adds
// one that touches a byte of each page the worker will use first: the prefaulting allocator's
// cache (what the standby's warm-up left) and the checkpoint memory it mapped. Where pages go
// cold while their process sleeps (on this VM a page untouched for a fraction of a second costs
// a trap into the hypervisor on its next use: a 17 MB DDP bucket took 12 ms to zero instead of
// 3 ms), the worker then finds them warm. An empty function is ignored.
void AddStandbyKeepWarm(std::function<void()> keep_warm);

}  // namespace launch_sdk
