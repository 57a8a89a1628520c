// An epoll loop of handlers (gloo's Loop/Handler, Envoy's dispatcher): each descriptor's owner
// registers what to do when it is ready, and timers are made by the loop from its clock, so that
// on simulated time (SimulatedClock) a test fires them without waiting on a real timer.
#pragma once

#include <sys/epoll.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/clock.h"
#include "common/unique_fd.h"

namespace launch {

class EventLoop {
 public:
  // Called with the ready events (EPOLLIN, EPOLLOUT, EPOLLHUP, ...) each turn its descriptor is
  // ready: level-triggered, so a handler may read a part and be called again.
  using Handler = std::function<void(uint32_t events)>;

  // A one-shot timer of the loop; its callback runs on the loop's thread. Destroying it disarms it.
  class Timer {
   public:
    ~Timer();
    Timer(const Timer&) = delete;
    Timer& operator=(const Timer&) = delete;
    // Due `after` from now on the loop's clock; replaces an earlier arming. A zero or negative
    // delay fires on the next turn.
    void Arm(Clock::Duration after);
    void Disarm() { due_.reset(); }
    bool armed() const { return due_.has_value(); }

   private:
    friend class EventLoop;
    Timer(EventLoop* loop, std::function<void()> fire) : loop_(loop), fire_(std::move(fire)) {}
    EventLoop* loop_;
    std::function<void()> fire_;
    std::optional<Clock::TimePoint> due_;
  };

  static absl::StatusOr<std::unique_ptr<EventLoop>> Create(const Clock* clock);
  EventLoop(const EventLoop&) = delete;
  EventLoop& operator=(const EventLoop&) = delete;

  // Adds `fd` to the set with `events`, its events going to `handler`; a descriptor already in
  // the set gets the new events and handler.
  void Watch(int fd, uint32_t events, Handler handler);
  // Changes the events `fd` is watched for (0: kept in the set, never ready).
  void Modify(int fd, uint32_t events);
  // Takes `fd` out of the set (before it is closed); events already read for it are dropped.
  void Unwatch(int fd);
  bool watching(int fd) const { return handlers_.count(fd) > 0; }

  std::unique_ptr<Timer> MakeTimer(std::function<void()> fire);

  // One turn: waits until a descriptor is ready or a timer is due, then runs their handlers
  // (descriptors first, then the timers due, earliest first). With no timer armed it waits for a
  // descriptor however long that takes. On simulated time a turn with nothing ready moves the
  // clock to the next timer.
  absl::Status RunOnce();

  const Clock& clock() const { return *clock_; }

 private:
  explicit EventLoop(const Clock* clock) : clock_(clock) {}
  std::optional<Clock::TimePoint> NextDue() const;
  void FireDue();

  struct Entry {
    uint32_t generation = 0;  // tells an fd's events from those of an earlier fd of that number
    Handler handler;
  };
  const Clock* clock_;
  UniqueFd ep_;
  std::unordered_map<int, Entry> handlers_;
  uint32_t next_generation_ = 1;
  std::vector<Timer*> timers_;
};

}  // namespace launch
