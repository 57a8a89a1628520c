#include "tests/fakes/fake_process_launcher.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>

namespace launch::testing {

namespace {

void WriteAll(int fd, const std::string& text) {
  size_t done = 0;
  while (fd >= 0 && done < text.size()) {
    ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n <= 0) return;
    done += static_cast<size_t>(n);
  }
}

}  // namespace

FakeProcessLauncher::FakeProcessLauncher() : exit_event_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {}

absl::StatusOr<pid_t> FakeProcessLauncher::Spawn(const SpawnOptions& opts) {
  const int n = static_cast<int>(spawned_.size());
  spawned_.push_back(opts);
  Script s = script ? script(n, opts) : Script();
  if (s.spawn_error) return *s.spawn_error;
  const pid_t pid = next_pid_++;
  Worker& w = workers_[pid];
  w.script = s;
  if (opts.stdout_fd >= 0) w.out.Reset(::dup(opts.stdout_fd));
  if (opts.stderr_fd >= 0) w.err.Reset(::dup(opts.stderr_fd));
  WriteAll(w.out.get(), s.stdout_text);
  WriteAll(w.err.get(), s.stderr_text);
  if (s.exit_at_start) End(pid, *s.exit_at_start, 0);
  return pid;
}

void FakeProcessLauncher::End(pid_t pid, int exit_code, int signal) {
  auto it = workers_.find(pid);
  if (it == workers_.end() || !it->second.running) return;
  Worker& w = it->second;
  w.running = false;
  w.child_left = w.script.leaves_child;
  if (!w.child_left) {  // the pipes close with the last process that holds them
    w.out.Reset();
    w.err.Reset();
  }
  ended_.push_back(ChildExit{pid, exit_code, signal});
  const uint64_t one = 1;
  ssize_t n = ::write(exit_event_.get(), &one, sizeof one);
  (void)n;
}

void FakeProcessLauncher::SignalGroup(pid_t pgid, int sig) {
  sent_.push_back(Sent{pgid, sig});
  auto it = workers_.find(pgid);
  if (it == workers_.end()) return;
  Worker& w = it->second;
  const bool dies = sig == SIGKILL || w.script.survives.count(sig) == 0;
  if (!dies) return;
  if (w.running) End(pgid, 0, sig);
  if (w.child_left) {
    w.child_left = false;
    w.out.Reset();
    w.err.Reset();
  }
}

bool FakeProcessLauncher::GroupAlive(pid_t pgid) {
  auto it = workers_.find(pgid);
  return it != workers_.end() && (it->second.running || it->second.child_left);
}

std::optional<ChildExit> FakeProcessLauncher::ReapAny() {
  if (ended_.empty()) return std::nullopt;
  ChildExit e = ended_.front();
  ended_.erase(ended_.begin());
  return e;
}

void FakeProcessLauncher::KillAndReap(pid_t pid) {
  killed_and_reaped_.push_back(pid);
  SignalGroup(pid, SIGKILL);
  ended_.erase(std::remove_if(ended_.begin(), ended_.end(), [pid](const ChildExit& e) { return e.pid == pid; }),
               ended_.end());
}

std::vector<int> FakeProcessLauncher::SignalsTo(pid_t pgid) const {
  std::vector<int> out;
  for (const Sent& s : sent_)
    if (s.pgid == pgid) out.push_back(s.signal);
  return out;
}

bool FakeProcessLauncher::Running(pid_t pid) const {
  auto it = workers_.find(pid);
  return it != workers_.end() && it->second.running;
}

}  // namespace launch::testing
