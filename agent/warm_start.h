// Warm starts (--warm-start): per local rank a standby started ahead of its attempt, either a
// Python interpreter that has imported torch (and the modules the user names), or a worker_sdk
// program that declares it may be (LAUNCH_SDK_WARM_START) and has loaded its libraries; it waits,
// and at the attempt's start gets its rank's environment and descriptors: a Python worker then
// runs the script as `python -u` would, a C++ one returns from launch_sdk::AwaitWorkerStart. A
// Python worker is a fork of the standby, which stays for the next attempt, when launch adopts
// orphans (PR_SET_CHILD_SUBREAPER) and the standby has one thread. Otherwise, and always for a
// C++ worker, the standby becomes the worker and the next attempt gets a new one: a C++ worker
// then owns every page it touches (what its standby rehearsed, launch_sdk::InitOptions::
// standby_warm_up, included), where a fork would copy each page it writes, and its restart
// reached its next step in about half the time here. A worker that cannot start either way starts
// cold, with one log line saying why.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "probes/process.h"
#include "agent/worker_env.h"
#include "agent/worker_group.h"
#include "common/unique_fd.h"

namespace launch {

// The variables whose value depends on the round or the attempt (ranks, sizes, the master, the
// restart count, the attempt's files, the scaled training figures): a standby is started without
// them and given them at its start. Every other variable must be the same as when it was started.
bool IsRoundVariable(const std::string& key);
// `env` ("KEY=VALUE" strings) without the round's variables.
Env StandbyEnv(const std::vector<std::string>& env);

// Whether the executable at `path` declares, with worker_sdk's LAUNCH_SDK_WARM_START(), that it
// may be started ahead as a standby (its file holds the mark the macro defines).
bool DeclaresWarmStart(const std::string& path);

// The standby's command for a worker whose cold command is `cold_argv`: for a Python worker
// (`python -u TARGET...`, TARGET a script or -m MODULE) the standby interpreter's; for a program
// that DeclaresWarmStart, its own. InvalidArgument for any other command.
absl::StatusOr<std::vector<std::string>> StandbyArgv(const std::vector<std::string>& cold_argv, bool python);

// Why a worker starts cold whose standby ended at its go, having said `said` last on its stderr
// (empty: nothing). A standby of an older contract version calls a newer go malformed: the reason
// then says so, and what to do.
std::string StandbyEndedAtItsGo(const std::string& said);

class WarmStart : public WarmWorkers {
 public:
  struct Options {
    // The workers are Python's (`python -u TARGET`); otherwise programs that DeclaresWarmStart.
    bool python = true;
    // Where _launch_standby.py is (launch's Python directory, on the workers' PYTHONPATH).
    std::string python_dir;
    // What a standby imports before it waits (--warm-import; default torch).
    std::vector<std::string> imports = {"torch"};
    // How long Send waits for a standby still importing; then the worker starts cold.
    std::chrono::milliseconds ready_timeout{300000};
    // Readable when a signal is pending for launch: Send waits no longer (the worker starts cold
    // and the group acts on the signal at once). -1: none.
    int signal_fd = -1;
    int guard_fd = -1;  // OrphanGuard::fd(): standbys are registered as workers are
  };
  WarmStart(Options opts, ProcessLauncher* launcher, OrphanGuard* guard)
      : opts_(std::move(opts)), launcher_(launcher), guard_(guard) {}
  // Every standby not taken is killed and reaped.
  ~WarmStart() override;
  WarmStart(const WarmStart&) = delete;
  WarmStart& operator=(const WarmStart&) = delete;

  // Starts a standby for each worker of `launches` that has none (never waits: they import on
  // their own). A worker that cannot have one is logged once and starts cold.
  void Prepare(const std::vector<WorkerLaunch>& launches);
  bool Send(const WorkerLaunch& w, const WorkerFds& fds) override;
  std::optional<pid_t> Take(const WorkerLaunch& w) override;
  // Whether a standby stays to serve the next attempt too (it forks each worker: Python workers
  // when launch adopts orphans); otherwise each attempt's standbys are new, made by Prepare.
  bool stays() const;
  // Standbys started, workers started warm, and of those the ones forked (for tests and the log).
  int started() const { return started_; }
  int taken() const { return taken_; }
  int forked() const { return forked_; }

 private:
  struct Standby {
    pid_t pid = -1;
    UniqueFd pidfd;      // tells whether it is still there, even once reaped elsewhere
    UniqueFd control;    // the agent's end of its control socket
    UniqueFd err;        // its stderr (a memfd): what it said, when it exits before it is ready
    bool ready = false;  // it said "R"
    bool sent = false;   // it has a go whose worker is not taken yet
    std::vector<std::string> cold_argv;
    Env env;  // StandbyEnv of the worker it was made for
    std::vector<int> cpus;
    int memory_node = -1;
  };
  // Why `s` cannot be worker `w`, or why it is not ready (waits for it); empty: it can.
  std::string Ready(Standby& s, const WorkerLaunch& w);
  void Discard(Standby& s);
  absl::Status SendGo(Standby& s, const WorkerLaunch& w, const WorkerFds& fds);
  void StartsCold(std::map<int, Standby>::iterator it, const WorkerLaunch& w, const std::string& why,
                  bool warn = false);
  // After the go: the worker's pid, and whether it is a fork (the standby stays); else why not.
  absl::StatusOr<std::pair<pid_t, bool>> Started(Standby& s);

  Options opts_;
  ProcessLauncher* launcher_;
  OrphanGuard* guard_;
  std::map<int, Standby> standbys_;  // by local rank
  bool told_cold_ = false;           // "cannot start warm" said once for the run
  // A standby could not import, or refused a go (another contract version): no more this run.
  bool no_more_standbys_ = false;
  int started_ = 0, taken_ = 0, forked_ = 0;
};

}  // namespace launch
