// Who is hung and who is to blame, as pure functions over what the worker group saw: each worker's
// progress reports and, once a hang is found, the stacks captured from every worker. No clocks,
// processes or files, so the decisions that matter most in a hang are tested as tables.
#pragma once

#include <chrono>
#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/tunables.h"

namespace launch {

// Hang detection from the workers' progress reports: a worker that has reported at least one
// step and then none for its timeout is hung (steps launch counted: only with an explicit one).
struct HangOptions {
  // --hang-timeout: nullopt: the larger of `factor` x the worker's median step time and `floor`;
  // zero: off.
  std::optional<std::chrono::milliseconds> timeout;
  std::chrono::milliseconds floor = kHangTimeoutFloor;
  int factor = kHangTimeoutFactor;
  // The debugger that captures native stacks (gdb); empty: only workers that dump their own.
  std::string debugger;

  bool enabled() const { return !timeout || timeout->count() > 0; }
  // How often the group looks for a hang: every second, or a quarter of an explicit timeout
  // under 4 s (at least every 10 ms).
  std::chrono::milliseconds CheckPeriod() const;
  // The hang timeout of a worker whose median step took `median_step_seconds`.
  std::chrono::milliseconds TimeoutFor(double median_step_seconds) const;
};

// One worker as the hang check sees it.
struct ProgressSeen {
  bool running = true;                            // not reaped yet
  std::optional<Clock::TimePoint> last_progress;  // its latest step report; nullopt: none came
  double median_step_seconds = 0;
  // Its steps are counted by launch (optimizer steps), not named by the program: only an explicit
  // timeout applies (a script that pauses its optimizer, e.g. to evaluate, is not hung).
  bool counted = false;
};

struct HungWorker {
  int worker = -1;                       // index into the workers
  std::chrono::milliseconds timeout{0};  // the timeout it ran past
  double silent_seconds = 0;             // how long it had been silent
};

// The running worker that reported a step and then none for longer than its timeout; of several,
// the one silent longest (the others more likely wait for it). nullopt: none.
std::optional<HungWorker> FindHung(const HangOptions& opts, const std::vector<ProgressSeen>& workers,
                                   Clock::TimePoint now);

// The hung worker as the captured stacks show it: when `hung` waits in a collective, the first
// other worker whose stacks were captured and show it outside any collective (a rank that waits
// for a hung peer stops reporting too); otherwise `hung`. `frames[i]`: worker i's main-thread
// frames (empty: not captured).
int BlameFromStacks(int hung, const std::vector<std::vector<std::string>>& frames);

// A stack file's frames of the thread that matters, each "function (file:line)" where known:
// gdb's "thread apply all bt" output (its Thread 1) or faulthandler's (the current thread).
std::vector<std::string> MainThreadFrames(const std::string& text);
// Whether frames show a wait in a collective (then the worker more likely waits for a hung rank).
bool WaitsInCollective(const std::vector<std::string>& frames);
// The first frame, then frames in program sources (.cc, .cpp, .cu, .py), at most `n`.
std::vector<std::string> TopFrames(const std::vector<std::string>& frames, size_t n);

}  // namespace launch
