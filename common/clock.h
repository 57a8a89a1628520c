// Time behind an interface so that state machines (rendezvous, supervision) are tested with a
// fake clock and no sleeps, and event loops (common/event_loop.h) on simulated time.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <functional>
#include <mutex>
#include <vector>

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
  // A thread's timed wait, made by the clock (Envoy's waitFor): waits on `cv`, `lock` held on
  // entry and on return, until `done()` (true) or `d` has passed on this clock (false). On real
  // time, cv.wait_for; on simulated time, until a test (or a loop) moves the clock past it.
  virtual bool WaitFor(std::unique_lock<std::mutex>& lock, std::condition_variable& cv, Duration d,
                       const std::function<bool()>& done) const {
    return cv.wait_for(lock, d, done);
  }
};

class SystemClock : public Clock {
 public:
  TimePoint Now() const override { return std::chrono::steady_clock::now(); }
};

// Moved only by Advance; safe to read from other threads (a coordinator's gRPC threads).
class FakeClock : public Clock {
 public:
  TimePoint Now() const override { return TimePoint(TimePoint::duration(now_.load())); }
  void Advance(std::chrono::nanoseconds d) {
    now_ += std::chrono::duration_cast<TimePoint::duration>(d).count();
    Moved();
  }

 protected:
  // After every move of the clock.
  virtual void Moved() const {}
  mutable std::atomic<TimePoint::rep> now_{0};
};

// A fake clock that event loops advance whenever they would otherwise wait for a timer: a test of
// a loop with a 30 s grace or a 40 ms hang timeout runs in microseconds, the same way every time.
// Descriptors that are ready are always handled before time moves.
class SimulatedClock : public FakeClock {
 public:
  bool simulated() const override { return true; }
  void AdvanceTo(TimePoint t) const override;
  // Returns when `d` has passed on this clock (moved by Advance or AdvanceTo from another thread),
  // or at done(); never waits on real time for time.
  bool WaitFor(std::unique_lock<std::mutex>& lock, std::condition_variable& cv, Duration d,
               const std::function<bool()>& done) const override;
  // Blocks until WaitFor has been entered `n` times in all, so that a test moves the clock once
  // the thread it drives waits. An event, not a time: false only past a generous real-time
  // bound, for a thread that never came to wait.
  bool AwaitWaits(size_t n) const;
  // How many times WaitFor was entered.
  size_t waits() const;

 private:
  struct Waiter {
    std::mutex* mu;
    std::condition_variable* cv;
  };
  void Moved() const override;

  mutable std::mutex mu_;
  mutable std::condition_variable changed_;
  mutable std::vector<Waiter*> waiters_;  // under mu_
  mutable size_t entered_ = 0;            // under mu_
  mutable int waking_ = 0;                // under mu_: Moved is notifying waiters_
};

// Seconds as a double, for durations in logs and summaries.
double SecondsBetween(Clock::TimePoint a, Clock::TimePoint b);

}  // namespace launch
