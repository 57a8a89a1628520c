// Time behind an interface so that state machines (rendezvous, supervision) are tested with a
// fake clock and no sleeps.
#pragma once

#include <atomic>
#include <chrono>

namespace launch {

class Clock {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;
  using Duration = std::chrono::steady_clock::duration;
  virtual ~Clock() = default;
  virtual TimePoint Now() const = 0;
};

class SystemClock : public Clock {
 public:
  TimePoint Now() const override { return std::chrono::steady_clock::now(); }
};

// Moved only by Advance; safe to read from other threads (a coordinator's gRPC threads).
class FakeClock : public Clock {
 public:
  TimePoint Now() const override { return TimePoint(TimePoint::duration(now_.load())); }
  void Advance(std::chrono::nanoseconds d) { now_ += std::chrono::duration_cast<TimePoint::duration>(d).count(); }

 private:
  std::atomic<TimePoint::rep> now_{0};
};

// Seconds as a double, for durations in logs and summaries.
double SecondsBetween(Clock::TimePoint a, Clock::TimePoint b);

}  // namespace launch
