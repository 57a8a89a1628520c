#include "rendezvous/background_call.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include "common/status_macros.h"
#include "common/thread_name.h"

namespace launch {

absl::Status BackgroundCall::Start(std::function<void(CallCanceller*)> fn) {
  Wait();
  cancel_.Reset();
  event_ = UniqueFd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!event_.valid()) return ErrnoStatus("eventfd");
  int fd = event_.get();
  thread_ = std::thread([this, fn = std::move(fn), fd] {
    NameThisThread("launch-call");
    fn(&cancel_);
    uint64_t one = 1;
    ssize_t n = ::write(fd, &one, sizeof one);
    (void)n;
  });
  return absl::OkStatus();
}

void BackgroundCall::Wait() {
  if (thread_.joinable()) thread_.join();
}

}  // namespace launch
