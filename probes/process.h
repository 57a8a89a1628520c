// Starting and signalling worker processes: fork/exec with argv vectors only (never a shell),
// each worker leading its own process group with a parent-death signal.
#pragma once

#include <sys/types.h>

#include <csignal>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/unique_fd.h"

namespace launch {

struct SpawnOptions {
  std::vector<std::string> argv;  // argv[0] must be a path (see ResolveExecutable)
  std::vector<std::string> env;   // KEY=VALUE
  std::string cwd;                // empty: inherit
  int stdin_fd = -1;              // child's stdin; -1: inherit
  int stdout_fd = -1;             // child's stdout; -1: inherit
  int stderr_fd = -1;
  int extra_fd = -1;  // given to the child as fd `extra_fd_target` (e.g. progress socket)
  int extra_fd_target = 3;
  bool new_process_group = true;
  // stdin_fd is a terminal that becomes the child's controlling terminal: the child leads a new
  // session (and so its own process group) instead of only a new process group.
  bool controlling_terminal = false;
  int parent_death_signal = SIGKILL;  // 0: none
  // The orphan guard's pipe (OrphanGuard::fd()): the child registers its new process group there
  // before it execs, so the group is known to the guard before any of the worker's code runs.
  int guard_fd = -1;
  // --numa-binding: the CPUs the child may run on (empty: launch's own affinity) and the NUMA node
  // its memory is preferably taken from (-1: the default policy), set before it execs.
  std::vector<int> cpus;
  int preferred_memory_node = -1;
};

// How a child ended.
struct ChildExit {
  pid_t pid = -1;
  int exit_code = 0;  // valid when signal == 0
  int signal = 0;
};

// Every way the agent acts on processes: start, signal, reap, look for leftovers. A fake stands in
// for tests of the worker group and the agent that run without processes.
class ProcessLauncher {
 public:
  virtual ~ProcessLauncher() = default;
  // Returns the pid once the child has exec'd; an exec failure is an error, not a child.
  virtual absl::StatusOr<pid_t> Spawn(const SpawnOptions& opts) = 0;
  // Sends `sig` to every process in process group `pgid` (a worker's pid: it leads its group).
  virtual void SignalGroup(pid_t pgid, int sig) = 0;
  // Sends `sig` to process `pid` alone.
  virtual void Signal(pid_t pid, int sig) = 0;
  // Whether any process is left in process group `pgid`.
  virtual bool GroupAlive(pid_t pgid) = 0;
  // The command lines (argv joined by spaces, each cut to 4 KiB) of at most 64 processes in
  // group `pgid` that are not exiting (zombies waiting to be reaped, and processes whose argv is
  // already gone, are left out); nullopt when unknown.
  virtual std::optional<std::vector<std::string>> GroupCommandLines(pid_t /*pgid*/) { return std::nullopt; }
  // One child that has ended, now reaped, or nullopt when none has; never waits. Orphans that
  // were reparented to launch (a subreaper) come back here too.
  virtual std::optional<ChildExit> ReapAny() = 0;
  // SIGKILLs process group `pid` and waits for `pid` itself: the cleanup of a group that cannot
  // go on.
  virtual void KillAndReap(pid_t pid) = 0;
  // Readable when a child may have ended, for a launcher whose children do not raise SIGCHLD on
  // launch's signal fd; -1: SIGCHLD says so.
  virtual int exit_fd() const { return -1; }
};

class PosixProcessLauncher : public ProcessLauncher {
 public:
  absl::StatusOr<pid_t> Spawn(const SpawnOptions& opts) override;
  void SignalGroup(pid_t pgid, int sig) override;
  void Signal(pid_t pid, int sig) override;
  bool GroupAlive(pid_t pgid) override;
  std::optional<std::vector<std::string>> GroupCommandLines(pid_t pgid) override;
  std::optional<ChildExit> ReapAny() override;
  void KillAndReap(pid_t pid) override;
};

// The path execve needs for `program`: as given when it contains '/', else searched on `path_env`.
// NotFound / PermissionDenied errors name the program.
absl::StatusOr<std::string> ResolveExecutable(const std::string& program, const std::string& path_env);

// "SIGTERM" for 15, "signal 99" for unknown numbers.
std::string SignalName(int sig);

// Kills every registered worker process group if launch dies, however it dies (kill -9 included):
// a small helper process forked before any thread exists holds the read end of a pipe and, on
// EOF, sends SIGKILL to the groups still registered. Workers also get PR_SET_PDEATHSIG; this
// covers their children, which stay in the worker's group.
class OrphanGuard {
 public:
  OrphanGuard() = default;
  ~OrphanGuard();
  OrphanGuard(const OrphanGuard&) = delete;
  OrphanGuard& operator=(const OrphanGuard&) = delete;

  absl::Status Start();  // call before any thread is created
  void Remove(pid_t pgid);
  // The pipe a spawned child registers itself on (SpawnOptions::guard_fd); -1 before Start.
  int fd() const { return write_.get(); }
  // Closes the pipe and reaps the helper (with nothing registered it just exits).
  void Stop();
  pid_t pid() const { return pid_; }

 private:
  void Send(char op, pid_t pgid);
  UniqueFd write_;
  pid_t pid_ = -1;
};

}  // namespace launch
