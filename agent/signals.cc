#include "agent/signals.h"

#include <signal.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <cerrno>

#include "common/status_macros.h"

namespace launch {
namespace {

sigset_t LauncherSignals() {
  sigset_t set;
  sigemptyset(&set);
  for (int s : {SIGCHLD, SIGINT, SIGTERM, SIGHUP, SIGQUIT}) sigaddset(&set, s);
  return set;
}

}  // namespace

void BlockLauncherSignals() {
  sigset_t set = LauncherSignals();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  signal(SIGPIPE, SIG_IGN);  // a closed console or socket is an error code, not a crash
  // Reading a terminal launch is no longer in the foreground of (Ctrl-Z, then bg) fails with EIO
  // instead of stopping launch, which relays the terminal to rank 0.
  signal(SIGTTIN, SIG_IGN);
}

absl::StatusOr<SignalFd> SignalFd::Create() {
  sigset_t set = LauncherSignals();
  int fd = signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK);
  if (fd < 0) return ErrnoStatus("signalfd");
  return SignalFd(UniqueFd(fd));
}

int SignalFd::Read() {
  signalfd_siginfo info;
  for (;;) {
    ssize_t n = ::read(fd_.get(), &info, sizeof info);
    if (n == sizeof info) return static_cast<int>(info.ssi_signo);
    if (n < 0 && errno == EINTR) continue;
    return 0;
  }
}

}  // namespace launch
