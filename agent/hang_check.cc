#include "agent/hang_check.h"

#include <algorithm>
#include <cstdint>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace launch {

std::chrono::milliseconds HangOptions::CheckPeriod() const {
  const std::chrono::milliseconds period(1000);
  if (!timeout) return period;
  return std::clamp(*timeout / 4, std::chrono::milliseconds(10), period);
}

std::chrono::milliseconds HangOptions::TimeoutFor(double median_step_seconds) const {
  if (timeout) return *timeout;
  return std::max(floor, std::chrono::milliseconds(static_cast<int64_t>(factor * median_step_seconds * 1000)));
}

std::optional<HungWorker> FindHung(const HangOptions& opts, const std::vector<ProgressSeen>& workers,
                                   Clock::TimePoint now) {
  std::optional<HungWorker> hung;
  std::optional<Clock::TimePoint> hung_since;
  for (size_t i = 0; i < workers.size(); ++i) {
    const ProgressSeen& w = workers[i];
    if (!w.running || !w.last_progress || (w.counted && !opts.timeout)) continue;
    const std::chrono::milliseconds timeout = opts.TimeoutFor(w.median_step_seconds);
    if (now - *w.last_progress <= timeout) continue;
    if (hung && *w.last_progress >= *hung_since) continue;
    hung = HungWorker{static_cast<int>(i), timeout, SecondsBetween(*w.last_progress, now)};
    hung_since = w.last_progress;
  }
  return hung;
}

int BlameFromStacks(int hung, const std::vector<std::vector<std::string>>& frames) {
  if (hung < 0 || static_cast<size_t>(hung) >= frames.size() || !WaitsInCollective(frames[hung])) return hung;
  for (size_t i = 0; i < frames.size(); ++i) {
    if (static_cast<int>(i) == hung || frames[i].empty() || WaitsInCollective(frames[i])) continue;
    return static_cast<int>(i);
  }
  return hung;
}

std::vector<std::string> MainThreadFrames(const std::string& text) {
  std::vector<std::string> frames;
  const std::vector<std::string> lines = absl::StrSplit(text, '\n');
  if (absl::StrContains(text, "(most recent call first)")) {
    // faulthandler: "Current thread 0x... (most recent call first):" (the one that took the
    // signal), else the first thread; frames are '  File "/path/x.py", line 12 in func'.
    const bool has_current = absl::StrContains(text, "\nCurrent thread ") || absl::StartsWith(text, "Current thread ");
    bool in = false, seen = false;
    for (const std::string& line : lines) {
      if (absl::StartsWith(line, "Current thread ") || (!has_current && absl::StartsWith(line, "Thread "))) {
        if (seen) break;
        in = seen = true;
        continue;
      }
      if (!in) continue;
      if (!absl::StartsWith(line, "  File \"")) {
        if (!frames.empty()) break;
        continue;
      }
      const size_t q = line.find('"', 8);
      const size_t at = q == std::string::npos ? q : line.find(", line ", q);
      const size_t fn = at == std::string::npos ? at : line.find(" in ", at);
      if (fn == std::string::npos) continue;
      std::string file = line.substr(8, q - 8);
      file = file.substr(file.rfind('/') + 1);
      frames.push_back(absl::StrCat(line.substr(fn + 4), " (", file, ":", line.substr(at + 7, fn - at - 7), ")"));
    }
    return frames;
  }
  // gdb: the main thread is "Thread 1 "; frames are
  // "#2  0x00007f... in std::this_thread::sleep_for<...> (__rtime=...) at /usr/include/...:371".
  bool in = false;
  for (const std::string& line : lines) {
    if (absl::StartsWith(line, "Thread 1 ")) {
      in = true;
      continue;
    }
    if (!in) continue;
    if (!absl::StartsWith(line, "#")) {
      if (!frames.empty()) break;
      continue;
    }
    const size_t space = line.find(' ');
    if (space == std::string::npos) continue;
    std::string f(absl::StripLeadingAsciiWhitespace(line.substr(space)));
    if (absl::StartsWith(f, "0x")) {
      const size_t in_pos = f.find(" in ");
      if (in_pos != std::string::npos) f = f.substr(in_pos + 4);
    }
    std::string name = f.substr(0, f.find(" ("));
    const size_t at = f.rfind(" at ");
    const size_t from = f.rfind(" from ");
    if (at != std::string::npos) {
      std::string where = f.substr(at + 4);
      name = absl::StrCat(name, " (", where.substr(where.rfind('/') + 1), ")");
    } else if (from != std::string::npos) {
      std::string lib = f.substr(from + 6);
      name = absl::StrCat(name, " (", lib.substr(lib.rfind('/') + 1), ")");
    }
    frames.push_back(name);
  }
  return frames;
}

bool WaitsInCollective(const std::vector<std::string>& frames) {
  // Collectives, process groups and data-parallel wrappers (whose Finish or backward hook waits
  // for the bucket allreduces).
  static const char* kMarks[] = {"allreduce", "all_reduce", "broadcast", "barrier", "allgather", "all_gather",
                                 "reduce_scatter", "alltoall", "processgroup", "c10d", "gloo", "nccl",
                                 "distributeddataparallel", "(ddp.cc:", "reducer", "(distributed.py:",
                                 // A Python rank in backward under DDP: its last bucket's all-reduce ends
                                 // there (torch's Tensor.backward, and launch's timing of it).
                                 "backward (_tensor.py:", "timed_backward (launch_progress.py:"};
  for (const std::string& f : frames) {
    const std::string lower = absl::AsciiStrToLower(f);
    for (const char* m : kMarks)
      if (absl::StrContains(lower, m)) return true;
  }
  return false;
}

std::vector<std::string> TopFrames(const std::vector<std::string>& frames, size_t n) {
  std::vector<std::string> top;
  for (size_t i = 0; i < frames.size() && top.size() < n; ++i) {
    const std::string& f = frames[i];
    // Program sources, not library templates in headers.
    const bool located = absl::StrContains(f, ".cc:") || absl::StrContains(f, ".cpp:") ||
                         absl::StrContains(f, ".cxx:") || absl::StrContains(f, ".cu:") || absl::StrContains(f, ".py:");
    if (i == 0 || located) top.push_back(f);
  }
  return top;
}

}  // namespace launch
