#include "probes/console.h"
#include "common/thread_name.h"

#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>

namespace launch {

namespace {

void Signal(const UniqueFd& event) {
  uint64_t one = 1;
  ssize_t n = ::write(event.get(), &one, sizeof one);
  (void)n;
}

void Clear(const UniqueFd& event) {
  uint64_t v;
  ssize_t n = ::read(event.get(), &v, sizeof v);
  (void)n;
}

// Writes all of [p, p + n) to a blocking or non-blocking descriptor; false when it refuses.
bool WriteFully(int fd, const char* p, size_t n) {
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w > 0) {
      p += w;
      n -= static_cast<size_t>(w);
      continue;
    }
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && errno == EAGAIN) {  // someone made the shared description non-blocking
      pollfd pfd{fd, POLLOUT, 0};
      ::poll(&pfd, 1, -1);
      continue;
    }
    return false;
  }
  return true;
}

}  // namespace

ConsoleStream::ConsoleStream(int fd)
    : fd_(fd),
      ready_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)),
      idle_event_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {}

ConsoleStream::~ConsoleStream() {
  Drain();
  {
    std::lock_guard<std::mutex> lock(mu_);
    closing_ = true;
  }
  wake_.notify_all();
  if (writer_.joinable()) writer_.join();
}

void ConsoleStream::Write(const void* owner, std::string_view prefix, std::string_view text, bool open) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (failed_) return;
    const bool continues = open_ && open_owner_ == owner && owner != nullptr;
    if (open_ && !continues) queue_.push_back('\n');
    if (!continues) queue_.append(prefix);
    queue_.append(text);
    open_ = open;
    open_owner_ = owner;
    if (queue_.size() + in_flight_ > kHighWater) backlogged_ = true;
    // Started here, not in the constructor: launch forks its orphan guard before any thread.
    if (!writer_.joinable()) {
      writer_ = std::thread([this] {
        NameThisThread("launch-console");
        WriterLoop();
      });
    }
  }
  wake_.notify_one();
}

void ConsoleStream::LineEndedElsewhere() {
  std::lock_guard<std::mutex> lock(mu_);
  open_ = false;
  open_owner_ = nullptr;
}

bool ConsoleStream::backlogged() const {
  std::lock_guard<std::mutex> lock(mu_);
  return backlogged_;
}

size_t ConsoleStream::queued() const {
  std::lock_guard<std::mutex> lock(mu_);
  return queue_.size() + in_flight_;
}

void ConsoleStream::WriterLoop() {
  // A closed console is EPIPE for this thread, never a SIGPIPE that ends the process.
  sigset_t pipe_signal;
  sigemptyset(&pipe_signal);
  sigaddset(&pipe_signal, SIGPIPE);
  ::pthread_sigmask(SIG_BLOCK, &pipe_signal, nullptr);
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    wake_.wait(lock, [&] { return !queue_.empty() || closing_; });
    if (queue_.empty()) return;
    std::string chunk;
    chunk.swap(queue_);
    in_flight_ = chunk.size();
    lock.unlock();
    const bool ok = WriteFully(fd_, chunk.data(), chunk.size());
    lock.lock();
    in_flight_ = 0;
    if (!ok) {
      failed_ = true;  // a closed console must not stop the workers: the rest is dropped
      queue_.clear();
    }
    if (backlogged_ && queue_.size() < kLowWater) {
      backlogged_ = false;
      Signal(ready_);
    }
    if (queue_.empty()) {
      Signal(idle_event_);
      idle_.notify_all();
    }
  }
}

bool ConsoleStream::Drain(int interrupt_fd, const std::function<bool()>& interrupted) {
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (interrupt_fd < 0) {
        idle_.wait(lock, [&] { return queue_.empty() && in_flight_ == 0; });
        return !failed_;
      }
      if (queue_.empty() && in_flight_ == 0) return !failed_;
    }
    pollfd p[2] = {{idle_event_.get(), POLLIN, 0}, {interrupt_fd, POLLIN, 0}};
    if (::poll(p, 2, -1) < 0 && errno != EINTR) return false;
    if (p[0].revents & POLLIN) Clear(idle_event_);
    if ((p[1].revents & POLLIN) && (!interrupted || interrupted())) return false;
  }
}

ConsoleStream& ConsoleOut() {
  static ConsoleStream* out = new ConsoleStream(STDOUT_FILENO);
  return *out;
}

ConsoleStream& ConsoleErr() {
  static ConsoleStream* err = new ConsoleStream(STDERR_FILENO);
  return *err;
}

FILE* ConsoleErrFile() {
  static FILE* file = [] {
    cookie_io_functions_t io{};
    io.write = [](void*, const char* buf, size_t n) -> ssize_t {
      ConsoleErr().Write(std::string_view(buf, n));
      return static_cast<ssize_t>(n);
    };
    FILE* f = ::fopencookie(nullptr, "w", io);
    if (f) std::setvbuf(f, nullptr, _IOFBF, 1 << 16);
    return f;
  }();
  return file;
}

bool DrainConsole(int interrupt_fd, const std::function<bool()>& interrupted) {
  const bool out = ConsoleOut().Drain(interrupt_fd, interrupted);
  const bool err = ConsoleErr().Drain(interrupt_fd, interrupted);
  return out && err;
}

}  // namespace launch
