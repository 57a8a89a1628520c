// Time behind an interface so that state machines (rendezvous, supervision) are tested with a
// fake clock and no sleeps.
#pragma once

#include <chrono>

namespace launch {

class Clock {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;
  virtual ~Clock() = default;
  virtual TimePoint Now() const = 0;
};

class SystemClock : public Clock {
 public:
  TimePoint Now() const override { return std::chrono::steady_clock::now(); }
};

class FakeClock : public Clock {
 public:
  TimePoint Now() const override { return now_; }
  void Advance(std::chrono::nanoseconds d) { now_ += d; }

 private:
  TimePoint now_{};
};

// Seconds as a double, for durations in logs and summaries.
double SecondsBetween(Clock::TimePoint a, Clock::TimePoint b);

}  // namespace launch
