// Warm starts of C++ workers (launch --warm-start): a program that declares it may be started ahead
// of its attempt as a standby that has loaded its libraries (LibTorch: about 0.5 s) and waits, in
// AwaitWorkerStart, for the agent's go with its rank's environment and descriptors. No LibTorch here.
#pragma once

// Declares, at namespace scope in one source file of the program, that launch may start it ahead
// as a standby. The code that runs before the program's first AwaitWorkerStart (which
// ReadWorkerEnv and Context::Init call) then runs before its attempt is known: it must not read
// the round's variables (RANK, WORLD_SIZE, MASTER_*, TORCHELASTIC_*, LAUNCH_LR, LAUNCH_*_BATCH, ...)
// nor act on the world (write files, connect). launch finds this mark in the executable's file.
#define LAUNCH_SDK_WARM_START()                                                  \
  extern "C" __attribute__((used)) const char launch_sdk_warm_start_mark[] =     \
      "launch-sdk-warm-start/1"

namespace launch_sdk {

// Returns at once unless the agent started this process as a standby (LAUNCH_STANDBY_FD). A
// standby tells the agent it is ready and waits for its go; at each go it forks the worker (through
// a process that makes it the agent's child, as a worker started cold is) and waits for the next,
// or, when it cannot fork (other threads), becomes the worker itself. In the worker it returns with
// the worker's environment, stdin/stdout/stderr and progress descriptor in place, having written
// what the standby printed before its go to the worker's stdout and stderr. A standby's process
// name (comm: ps -o comm, top) is "launch-standby"; its workers have the program's. A forked
// worker's exit runs the atexit handlers registered after its go and flushes C stdio and the
// standard streams, then ends without the destructors of the static objects made before the go.
// Only the first call waits; a later one returns at once.
void AwaitWorkerStart();

// Whether this worker was started from a standby (AwaitWorkerStart returned from a go).
bool StartedWarm();

// Whether this process is a standby before its go: launch started it ahead (LAUNCH_STANDBY_FD)
// and AwaitWorkerStart has not been called yet.
bool IsStandby();

}  // namespace launch_sdk
