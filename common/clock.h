// Time behind an interface so that state machines (rendezvous, supervision) are tested with a
// fake clock and no sleeps, and event loops (common/event_loop.h) on simulated time.
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
  // Simulated time (Envoy's simulated time system): an event loop with nothing ready moves the
  // clock to its next timer instead of waiting for it, so its timers fire at once and in order.
  virtual bool simulated() const { return false; }
  virtual void AdvanceTo(TimePoint) const {}
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

 protected:
  mutable std::atomic<TimePoint::rep> now_{0};
};

// A fake clock that event loops advance whenever they would otherwise wait for a timer: a test of
// a loop with a 30 s grace or a 40 ms hang timeout runs in microseconds, the same way every time.
// Descriptors that are ready are always handled before time moves.
class SimulatedClock : public FakeClock {
 public:
  bool simulated() const override { return true; }
  void AdvanceTo(TimePoint t) const override {
    TimePoint::rep want = t.time_since_epoch().count();
    TimePoint::rep cur = now_.load();
    while (cur < want && !now_.compare_exchange_weak(cur, want)) {
    }
  }
};

// Seconds as a double, for durations in logs and summaries.
double SecondsBetween(Clock::TimePoint a, Clock::TimePoint b);

}  // namespace launch
