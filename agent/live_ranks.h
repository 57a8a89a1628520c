// The figures of this node's ranks while they run: the worker group writes them on every spawn,
// progress report and exit; the monitor reads them each interval from its own thread; the agent
// prints their totals over the whole run at its end.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "agent/worker_launch.h"
#include "common/clock.h"

namespace launch {

struct RankFigures {
  int rank = 0;
  int local_rank = 0;
  pid_t pid = -1;
  int gpu = -1;  // the GPU index it uses (-1: none, or not a plain index)
  bool running = false;
  bool exited = false;  // neither: starting (not spawned yet, or its standby not forked yet)
  // This attempt.
  int64_t last_step = -1;
  int64_t steps = 0;
  std::deque<double> step_window, busy_window;  // the last kWindow steps' times
  std::optional<Clock::TimePoint> last_progress;
  // The whole run, every attempt.
  int64_t total_steps = 0;
  double total_step_seconds = 0;
  int64_t timed_steps = 0;  // the steps that came with a time
  int straggler_episodes = 0;

  // Medians of the window (0 when empty): the whole step, and the rank's own work in it.
  double StepSeconds() const;
  double BusySeconds() const;
};

class LiveRanks {
 public:
  // Steps a rank's medians are taken over.
  static constexpr size_t kWindow = 20;

  // A new attempt of these workers (in the worker group's order). A local rank seen before keeps
  // its run totals.
  void StartAttempt(const std::vector<WorkerLaunch>& workers);
  void Spawned(size_t i, pid_t pid);
  // A progress report: the step, its time and the part of it spent waiting for other ranks.
  void Progress(size_t i, int64_t step, double step_seconds, double wait_seconds, Clock::TimePoint now);
  void Exited(size_t i);
  // The coordinator named this global rank a straggler (a new episode).
  void NoteStraggler(int rank);

  std::vector<RankFigures> Snapshot() const;
  // The end-of-run table: per rank its steps, mean step time, straggler episodes, and the job's
  // restarts; empty when no rank reported progress.
  std::string EndTable(const std::string& hostname, int restarts) const;

 private:
  mutable std::mutex mu_;
  std::vector<RankFigures> ranks_;  // this attempt's, in the worker group's order
};

// The GPU index a worker uses, from its environment: its CUDA_VISIBLE_DEVICES' only entry, or
// the LOCAL_RANK-th when it sees several (as torch picks cuda:LOCAL_RANK); -1 when that is not a
// plain index.
int WorkerGpu(const WorkerLaunch& w);

}  // namespace launch
