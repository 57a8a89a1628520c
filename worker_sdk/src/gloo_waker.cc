#include "gloo_waker.h"

#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <exception>

#ifdef LAUNCH_SDK_GLOO_TCP_WAKER
#include <dlfcn.h>
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

// Whether `device` was made by the Gloo this file calls: the library that holds its vtable is
// the one that holds tcp::CreateDevice as linked here. A LibTorch that carries a Gloo of its own
// beside a system one (libgloo-dev installed, LibTorch from elsewhere) may make devices whose
// layout the other copy's registerDescriptor does not know.
bool OursToCall(const ::gloo::transport::tcp::Device* device) {
  Dl_info made{}, linked{};
  const void* vtable = *reinterpret_cast<const void* const*>(device);
  return ::dladdr(vtable, &made) != 0 &&
         ::dladdr(reinterpret_cast<void*>(&::gloo::transport::tcp::CreateDevice), &linked) != 0 &&
         made.dli_fbase != nullptr && made.dli_fbase == linked.dli_fbase;
}

}  // namespace

GlooLoopWaker::GlooLoopWaker(const std::vector<std::shared_ptr<::gloo::transport::Device>>& devices) {
  fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (fd_ < 0) return;             // the group is made all the same, at the transport's pace
  static auto* noop = new Noop();  // never destroyed: a loop may still hold it after the close
  int registered = 0;
  for (const auto& d : devices) {
    auto tcp = std::dynamic_pointer_cast<::gloo::transport::tcp::Device>(d);
    if (!tcp || !OursToCall(tcp.get())) continue;
    try {
      tcp->registerDescriptor(fd_, EPOLLIN | EPOLLET, noop);
      ++registered;
    } catch (const std::exception&) {  // a loop that refuses it keeps its pace
    }
  }
  if (registered == 0) return;
  try {
    thread_ = std::thread([this] {
      const uint64_t one = 1;  // the counter is never read: edge-triggered, each write is an event
      const auto start = std::chrono::steady_clock::now();
      while (!stop_.load(std::memory_order_relaxed)) {
        (void)!::write(fd_, &one, sizeof one);
        // Every 100 us while the pairs of a group that formed at once connect; every 1 ms once
        // the group has waited 50 ms (its store waits for a slow rank), so that a long wait
        // costs its loops 1,000 turns a second, not 10,000.
        const bool early = std::chrono::steady_clock::now() - start < std::chrono::milliseconds(50);
        std::this_thread::sleep_for(std::chrono::microseconds(early ? 100 : 1000));
      }
    });
  } catch (const std::exception&) {  // no thread (a limit on them): the group connects at its pace
    ::close(fd_);                    // its only descriptor: off every loop
    fd_ = -1;
  }
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
