#include "common/event_loop.h"

#include <algorithm>
#include <cerrno>
#include <climits>

#include "common/status_macros.h"

namespace launch {

namespace {

constexpr int kEventsPerTurn = 32;

uint64_t Encode(int fd, uint32_t generation) {
  return (static_cast<uint64_t>(generation) << 32) | static_cast<uint32_t>(fd);
}

}  // namespace

EventLoop::Timer::~Timer() {
  auto& timers = loop_->timers_;
  timers.erase(std::remove(timers.begin(), timers.end(), this), timers.end());
}

void EventLoop::Timer::Arm(Clock::Duration after) { due_ = loop_->clock_->Now() + after; }

absl::StatusOr<std::unique_ptr<EventLoop>> EventLoop::Create(const Clock* clock) {
  std::unique_ptr<EventLoop> loop(new EventLoop(clock));
  loop->ep_.Reset(::epoll_create1(EPOLL_CLOEXEC));
  if (!loop->ep_.valid()) return ErrnoStatus("epoll_create1");
  return loop;
}

void EventLoop::Watch(int fd, uint32_t events, Handler handler) {
  auto [it, added] = handlers_.try_emplace(fd);
  it->second.generation = next_generation_++;
  it->second.handler = std::move(handler);
  epoll_event ev{};
  ev.events = events;
  ev.data.u64 = Encode(fd, it->second.generation);
  // A descriptor closed without Unwatch left the kernel's set but not ours; one of that number
  // watched anew is added, not modified.
  if (::epoll_ctl(ep_.get(), added ? EPOLL_CTL_ADD : EPOLL_CTL_MOD, fd, &ev) != 0 && !added && errno == ENOENT) {
    ::epoll_ctl(ep_.get(), EPOLL_CTL_ADD, fd, &ev);
  }
}

void EventLoop::Modify(int fd, uint32_t events) {
  auto it = handlers_.find(fd);
  if (it == handlers_.end()) return;
  epoll_event ev{};
  ev.events = events;
  ev.data.u64 = Encode(fd, it->second.generation);
  ::epoll_ctl(ep_.get(), EPOLL_CTL_MOD, fd, &ev);
}

void EventLoop::Unwatch(int fd) {
  if (handlers_.erase(fd) == 0) return;
  ::epoll_ctl(ep_.get(), EPOLL_CTL_DEL, fd, nullptr);
}

std::unique_ptr<EventLoop::Timer> EventLoop::MakeTimer(std::function<void()> fire) {
  std::unique_ptr<Timer> timer(new Timer(this, std::move(fire)));
  timers_.push_back(timer.get());
  return timer;
}

std::optional<Clock::TimePoint> EventLoop::NextDue() const {
  std::optional<Clock::TimePoint> next;
  for (const Timer* t : timers_) {
    if (t->due_ && (!next || *t->due_ < *next)) next = t->due_;
  }
  return next;
}

absl::Status EventLoop::RunOnce() {
  const std::optional<Clock::TimePoint> next = NextDue();
  int timeout_ms = -1;
  if (next && clock_->simulated()) {
    timeout_ms = 0;  // what is ready is handled first; then time moves
  } else if (next) {
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(*next - clock_->Now()).count();
    timeout_ms = static_cast<int>(std::clamp<int64_t>(left, 0, INT_MAX));
  }
  epoll_event events[kEventsPerTurn];
  const int n = ::epoll_wait(ep_.get(), events, kEventsPerTurn, timeout_ms);
  if (n < 0) return errno == EINTR ? absl::OkStatus() : ErrnoStatus("epoll_wait");
  if (n == 0 && next && clock_->simulated()) clock_->AdvanceTo(*next);
  for (int i = 0; i < n; ++i) {
    const int fd = static_cast<int>(events[i].data.u64 & 0xffffffffu);
    const uint32_t generation = static_cast<uint32_t>(events[i].data.u64 >> 32);
    auto it = handlers_.find(fd);
    // Unwatched (or watched anew) by an earlier handler of this turn.
    if (it == handlers_.end() || it->second.generation != generation) continue;
    Handler handler = it->second.handler;  // the handler may unwatch its own descriptor
    handler(events[i].events);
  }
  FireDue();
  return absl::OkStatus();
}

void EventLoop::FireDue() {
  const Clock::TimePoint now = clock_->Now();
  std::vector<Timer*> due;
  for (Timer* t : timers_)
    if (t->due_ && *t->due_ <= now) due.push_back(t);
  // Earliest first; timers due at once fire in the order they were made.
  std::stable_sort(due.begin(), due.end(), [](const Timer* a, const Timer* b) { return *a->due_ < *b->due_; });
  for (Timer* t : due) {
    // An earlier callback may have destroyed, disarmed or re-armed it.
    if (std::find(timers_.begin(), timers_.end(), t) == timers_.end()) continue;
    if (!t->due_ || *t->due_ > now) continue;
    t->due_.reset();
    t->fire_();
  }
}

}  // namespace launch
