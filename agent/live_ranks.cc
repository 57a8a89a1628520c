#include "agent/live_ranks.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "agent/worker_launch.h"

namespace launch {

namespace {

double Median(const std::deque<double>& window) {
  if (window.empty()) return 0;
  std::vector<double> v(window.begin(), window.end());
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

void Keep(std::deque<double>* window, double v) {
  window->push_back(v);
  if (window->size() > LiveRanks::kWindow) window->pop_front();
}

}  // namespace

double RankFigures::StepSeconds() const { return Median(step_window); }
double RankFigures::BusySeconds() const { return Median(busy_window); }

int WorkerGpu(const WorkerLaunch& w) {
  absl::string_view visible;
  int local_rank = w.local_rank;
  for (const std::string& kv : w.env) {
    if (absl::StartsWith(kv, "CUDA_VISIBLE_DEVICES=")) visible = absl::string_view(kv).substr(21);
  }
  if (visible.empty()) return -1;
  std::vector<absl::string_view> list = absl::StrSplit(visible, ',');
  const absl::string_view pick = list.size() == 1                             ? list[0]
                                 : local_rank < static_cast<int>(list.size()) ? list[local_rank]
                                                                              : absl::string_view();
  int gpu;
  return absl::SimpleAtoi(pick, &gpu) && gpu >= 0 ? gpu : -1;
}

void LiveRanks::StartAttempt(const std::vector<WorkerLaunch>& workers) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<RankFigures> next(workers.size());
  for (size_t i = 0; i < workers.size(); ++i) {
    RankFigures& f = next[i];
    for (const RankFigures& before : ranks_) {
      if (before.local_rank != workers[i].local_rank) continue;
      f.total_steps = before.total_steps;
      f.total_step_seconds = before.total_step_seconds;
      f.timed_steps = before.timed_steps;
      f.straggler_episodes = before.straggler_episodes;
    }
    f.rank = workers[i].rank;
    f.local_rank = workers[i].local_rank;
    f.gpu = WorkerGpu(workers[i]);
  }
  ranks_ = std::move(next);
}

void LiveRanks::Spawned(size_t i, pid_t pid) {
  std::lock_guard<std::mutex> lock(mu_);
  if (i >= ranks_.size()) return;
  ranks_[i].pid = pid;
  ranks_[i].running = true;
}

void LiveRanks::Progress(size_t i, int64_t step, double step_seconds, double wait_seconds, Clock::TimePoint now) {
  std::lock_guard<std::mutex> lock(mu_);
  if (i >= ranks_.size()) return;
  RankFigures& f = ranks_[i];
  f.last_step = step;
  f.last_progress = now;
  ++f.steps;
  ++f.total_steps;
  // Figures from the worker are trusted only as far as they make sense.
  if (!(std::isfinite(step_seconds) && step_seconds > 0 && step_seconds < 1e7)) return;
  if (!(std::isfinite(wait_seconds) && wait_seconds >= 0)) wait_seconds = 0;
  f.total_step_seconds += step_seconds;
  ++f.timed_steps;
  Keep(&f.step_window, step_seconds);
  Keep(&f.busy_window, std::max(step_seconds - wait_seconds, 0.0));
}

void LiveRanks::Exited(size_t i) {
  std::lock_guard<std::mutex> lock(mu_);
  if (i >= ranks_.size()) return;
  ranks_[i].running = false;
  ranks_[i].exited = true;
}

void LiveRanks::NoteStraggler(int rank) {
  std::lock_guard<std::mutex> lock(mu_);
  for (RankFigures& f : ranks_)
    if (f.rank == rank) ++f.straggler_episodes;
}

std::vector<RankFigures> LiveRanks::Snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  return ranks_;
}

std::string LiveRanks::EndTable(const std::string& hostname, int restarts) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (std::none_of(ranks_.begin(), ranks_.end(), [](const RankFigures& f) { return f.total_steps > 0; })) return "";
  std::string out = absl::StrFormat("%-6s %-20s %8s %14s %10s %9s\n", "rank", "node", "steps", "mean step", "straggler",
                                    "restarts");
  for (const RankFigures& f : ranks_) {
    const std::string mean = f.timed_steps > 0 ? absl::StrFormat("%.1f ms", 1000 * f.total_step_seconds / f.timed_steps)
                                               : "-";
    out += absl::StrFormat("%-6d %-20s %8d %14s %10s %9d\n", f.rank, hostname.substr(0, 20), f.total_steps, mean,
                           f.straggler_episodes > 0 ? absl::StrFormat("%dx", f.straggler_episodes) : "-", restarts);
  }
  return out;
}

}  // namespace launch
