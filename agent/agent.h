// The node agent: joins a rendezvous round, builds each worker's environment, runs the worker
// group, reports to the coordinator, and restarts the group while the job's budget allows.
#pragma once

#include <algorithm>
#include <chrono>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "agent/agent_machine.h"
#include "agent/coordinator_client.h"
#include "agent/coordinator_session.h"
#include "agent/coordinator_watch.h"
#include "agent/log_relay.h"
#include "agent/process.h"
#include "agent/signals.h"
#include "agent/worker_env.h"
#include "agent/worker_group.h"
#include "common/clock.h"

namespace launch {

// --rdzv-backend=static: the node's place is given, not negotiated (torchrun's static mode).
struct StaticTopology {
  int group_rank = 0;
  int group_world_size = 1;
  std::string master_addr;
  int master_port = 29500;
};

struct AgentOptions {
  WorkerGroupSpec spec;
  // argv of every worker; "${local_rank}" is replaced per worker.
  std::vector<std::string> argv;
  // torchrun's layout under <log_dir>/<run_id>/attempt_<k>/<local_rank>/. Empty: a temporary
  // directory holds only the error files and is removed at exit.
  std::string log_dir;
  StdSpec redirects, tee;
  std::optional<std::set<int>> console_local_ranks;  // --local-ranks-filter
  std::chrono::milliseconds stop_timeout{30000};
  std::chrono::milliseconds restart_backoff{0};
  // How often the lease is renewed while the workers run (--rdzv-conf heartbeat_interval).
  std::chrono::milliseconds heartbeat_interval{1000};
  // How long to keep trying an unreachable coordinator once the workers have ended.
  std::chrono::milliseconds coordinator_patience{30000};
  bool dry_run = false;
  // The run's settings, sent with every join (the coordinator checks all nodes agree).
  v1::RunSpec run_spec;
  std::optional<StaticTopology> static_topology;
  // What this node offers as MASTER_ADDR/MASTER_PORT if it becomes group rank 0.
  std::string master_addr = "127.0.0.1";
  std::optional<int> master_port;  // --master-port; else a free port per attempt
  v1::NodeIdentity node;
};

// A directory of its own for one run's logs: <log_dir>/<run_id>, or <run_id>.1, .2, ... when
// earlier runs with this id left theirs (made with mkdir, so two runs never share files).
absl::StatusOr<std::string> MakeRunLogDir(const std::string& log_dir, const std::string& run_id);

class Agent {
 public:
  Agent(AgentOptions opts, CoordinatorClient* coordinator, ProcessLauncher* launcher, OrphanGuard* guard,
        SignalFd* signals, const Clock* clock);

  // Runs the job to its end; returns launch's exit code.
  int Run();

 private:
  // What the current attempt has learned so far.
  struct Attempt {
    v1::Assignment assignment;
    std::string dir;  // <run dir>/attempt_<restart>
    std::vector<WorkerLaunch> workers;
    GroupOutcome outcome;
    v1::HeartbeatResponse why;        // the watch's answer that stopped the group
    v1::ReportExitResponse verdict;   // the coordinator's last answer to a report
    bool has_verdict = false;
    std::string error;                // what ended the run as launch's own error or bad input
  };

  // One phase's work each; what happened comes back as the event for NextAgentState.
  AgentEvent Join(Attempt* at);
  AgentEvent RunWorkers(Attempt* at);
  AgentEvent ReportOutcome(const AgentState& state, Attempt* at);
  AgentEvent AwaitOthers(Attempt* at);
  AgentEvent BackOff();
  // Says how the run ended and returns launch's exit code.
  int Finish(const AgentState& state, const Attempt& at, bool temp_dir);
  // Logs a move between phases that users should see (a restart, a wait for the other nodes).
  void LogMove(const AgentState& from, const AgentState& to, const Attempt& at) const;

  // Waits until `fd` is readable (0), `timeout` passes (-1), or a terminating signal arrives
  // (its number). fd < 0: only the timeout and signals; no timeout: wait for ever.
  int WaitSignalOr(int fd, std::optional<std::chrono::milliseconds> timeout);
  absl::StatusOr<std::vector<WorkerLaunch>> PrepareAttempt(const v1::Assignment& a,
                                                           const std::string& attempt_dir);
  void PrintDryRun(const std::vector<WorkerLaunch>& workers) const;

  AgentOptions opts_;
  CoordinatorSession session_;
  ProcessLauncher* launcher_;
  OrphanGuard* guard_;
  SignalFd* signals_;
  const Clock* clock_;
  Env parent_env_;
  std::string run_dir_;       // this run's log (or temporary) directory
  long last_round_ = 0;
  int last_picked_port_ = 0;  // the MASTER_PORT this node last proposed
};

}  // namespace launch
