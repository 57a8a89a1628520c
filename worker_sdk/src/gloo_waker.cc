#include "gloo_waker.h"

#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <exception>

#ifdef LAUNCH_SDK_GLOO_TCP_WAKER
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/tcp/loop.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#endif

namespace launch_sdk::internal {

#ifdef LAUNCH_SDK_GLOO_TCP_WAKER
namespace {

struct Noop final : ::gloo::transport::tcp::Handler {
  void handleEvents(int) override {}
};

}  // namespace

GlooLoopWaker::GlooLoopWaker(const std::vector<std::shared_ptr<::gloo::transport::Device>>& devices) {
  fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (fd_ < 0) return;  // the group is made all the same, at the transport's pace
  static auto* noop = new Noop();  // never destroyed: a loop may still hold it after the close
  int registered = 0;
  for (const auto& d : devices) {
    auto tcp = std::dynamic_pointer_cast<::gloo::transport::tcp::Device>(d);
    if (!tcp) continue;
    try {
      tcp->registerDescriptor(fd_, EPOLLIN | EPOLLET, noop);
      ++registered;
    } catch (const std::exception&) {  // a loop that refuses it keeps its pace
    }
  }
  if (registered == 0) return;
  thread_ = std::thread([this] {
    const uint64_t one = 1;  // the counter is never read: edge-triggered, each write is an event
    while (!stop_.load(std::memory_order_relaxed)) {
      (void)!::write(fd_, &one, sizeof one);
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  });
}
#else
GlooLoopWaker::GlooLoopWaker(const std::vector<std::shared_ptr<::gloo::transport::Device>>&) {}
#endif

GlooLoopWaker::~GlooLoopWaker() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
  if (fd_ >= 0) ::close(fd_);
}

}  // namespace launch_sdk::internal
