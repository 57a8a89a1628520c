// Faster Gloo process groups: wakes the TCP transport's event loops while a group connects.
// Internal to the SDK (context.cc), and used by its test and bench/gloo_init_bench.
#pragma once

#include <atomic>
#include <memory>
#include <thread>
#include <vector>

namespace gloo::transport {
class Device;
}  // namespace gloo::transport

namespace launch_sdk::internal {

// Gloo's TCP transport runs each device's events on a thread that waits in epoll_wait with a
// 10 ms timeout. A pair that connects first takes its listening socket off that loop
// (Loop::unregisterDescriptor) and waits for the loop's next turn, which, with nothing else
// happening, is that timeout: 10 ms of making every ProcessGroupGloo (10.4-12.6 ms for 2 ranks on
// one host here, torch 1.13's own Python binding alike). While one lives, a GlooLoopWaker wakes
// each TCP device's loop every 100 us through an eventfd registered on it (edge-triggered; its
// handler does nothing), so that such a wait ends within a turn; every 1 ms once it has lived
// 50 ms (a group whose store waits for a slow rank). Make one around a group's construction.
// Where the SDK was built without Gloo's TCP transport (LAUNCH_SDK_GLOO_TCP_WAKER undefined), a
// device is of another transport or was made by another copy of Gloo than the one linked here,
// or no thread can be started, it does nothing.
class GlooLoopWaker {
 public:
  explicit GlooLoopWaker(const std::vector<std::shared_ptr<::gloo::transport::Device>>& devices);
  // Stops; closing the eventfd, its only descriptor, takes it off every loop it was on.
  ~GlooLoopWaker();
  GlooLoopWaker(const GlooLoopWaker&) = delete;
  GlooLoopWaker& operator=(const GlooLoopWaker&) = delete;

  // The eventfd registered on the loops; -1 when it wakes none.
  int fd() const { return thread_.joinable() ? fd_ : -1; }

 private:
  int fd_ = -1;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace launch_sdk::internal
