#include "common/clock.h"

#include <algorithm>

namespace launch {

double SecondsBetween(Clock::TimePoint a, Clock::TimePoint b) { return std::chrono::duration<double>(b - a).count(); }

void SimulatedClock::AdvanceTo(TimePoint t) const {
  const TimePoint::rep want = t.time_since_epoch().count();
  TimePoint::rep cur = now_.load();
  while (cur < want && !now_.compare_exchange_weak(cur, want)) {
  }
  Moved();
}

// Wakes every thread waiting on this clock to look at the time again. A waiter holds its own lock
// from registering until its condition variable releases it, so taking that lock here cannot
// miss it; a waiter leaves the list only while no wake is under way, so none is notified after
// it is gone. mu_ is never held while a waiter's lock is taken.
void SimulatedClock::Moved() const {
  std::vector<Waiter*> waiting;
  {
    std::lock_guard<std::mutex> lock(mu_);
    waiting = waiters_;
    ++waking_;
  }
  for (Waiter* w : waiting) {
    std::lock_guard<std::mutex> lock(*w->mu);
    w->cv->notify_all();
  }
  std::lock_guard<std::mutex> lock(mu_);
  --waking_;
  changed_.notify_all();
}

bool SimulatedClock::WaitFor(std::unique_lock<std::mutex>& lock, std::condition_variable& cv, Duration d,
                             const std::function<bool()>& done) const {
  const TimePoint deadline = Now() + d;
  Waiter self{lock.mutex(), &cv};
  {
    std::lock_guard<std::mutex> g(mu_);
    waiters_.push_back(&self);
    ++entered_;
    changed_.notify_all();
  }
  // Registered before the time is read: a move after this point wakes this wait.
  bool result = false;
  for (;;) {
    if (done()) {
      result = true;
      break;
    }
    if (Now() >= deadline) break;
    cv.wait(lock);
  }
  // Leaving the list waits for a wake under way, which may need this lock: release it meanwhile.
  lock.unlock();
  {
    std::unique_lock<std::mutex> g(mu_);
    changed_.wait(g, [&] { return waking_ == 0; });
    waiters_.erase(std::find(waiters_.begin(), waiters_.end(), &self));
  }
  lock.lock();
  return result || done();
}

bool SimulatedClock::AwaitWaits(size_t n) const {
  std::unique_lock<std::mutex> g(mu_);
  return changed_.wait_for(g, std::chrono::seconds(60), [&] { return entered_ >= n; });
}

size_t SimulatedClock::waits() const {
  std::lock_guard<std::mutex> g(mu_);
  return entered_;
}

}  // namespace launch
