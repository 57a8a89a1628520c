// A ProcessLauncher without processes, for tests of the worker group and the agent: each "worker"
// follows a script (what it writes, whether it ends at once, which signals it survives, whether
// it leaves a process behind in its group). Ends are announced on an eventfd (exit_fd), as SIGCHLD
// would announce them. Single-threaded: used from the thread that runs the group.
#pragma once

#include <sys/types.h>

#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "probes/process.h"
#include "common/unique_fd.h"

namespace launch::testing {

class FakeProcessLauncher : public ProcessLauncher {
 public:
  struct Script {
    std::string stdout_text, stderr_text;  // written as it starts
    std::optional<int> exit_at_start;      // ends at once with this exit code
    std::set<int> survives;                // signals it ignores (never SIGKILL)
    bool leaves_child = false;             // when it ends, a process stays in its group until signalled
    std::optional<absl::Status> spawn_error;  // Spawn fails with this
  };
  struct Sent {
    pid_t pgid;
    int signal;
  };

  FakeProcessLauncher();

  // The script of the n-th Spawn (from 0); unset: a worker that runs until a signal ends it.
  std::function<Script(int n, const SpawnOptions& opts)> script;

  absl::StatusOr<pid_t> Spawn(const SpawnOptions& opts) override;
  void SignalGroup(pid_t pgid, int sig) override;
  void Signal(pid_t pid, int sig) override { signaled_.push_back(Sent{pid, sig}); }
  bool GroupAlive(pid_t pgid) override;
  std::optional<ChildExit> ReapAny() override;
  void KillAndReap(pid_t pid) override;
  int exit_fd() const override { return exit_event_.get(); }

  // Ends worker `pid` now (exit code, or killed by `signal`).
  void End(pid_t pid, int exit_code, int signal);

  const std::vector<SpawnOptions>& spawned() const { return spawned_; }
  const std::vector<Sent>& sent() const { return sent_; }
  // Signals sent to single processes (Signal), in order.
  const std::vector<Sent>& signaled() const { return signaled_; }
  // Signals sent to one group, in order.
  std::vector<int> SignalsTo(pid_t pgid) const;
  const std::vector<pid_t>& killed_and_reaped() const { return killed_and_reaped_; }
  bool Running(pid_t pid) const;

 private:
  struct Worker {
    Script script;
    bool running = true;
    bool child_left = false;
    UniqueFd out, err;  // the worker's ends of its stdout and stderr
  };
  std::map<pid_t, Worker> workers_;
  std::vector<ChildExit> ended_;  // ended, not yet reaped
  std::vector<SpawnOptions> spawned_;
  std::vector<Sent> sent_, signaled_;
  std::vector<pid_t> killed_and_reaped_;
  UniqueFd exit_event_;
  pid_t next_pid_ = 1000;
};

}  // namespace launch::testing
