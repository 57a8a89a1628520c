// The node agent: joins a rendezvous round, builds each worker's environment, runs the worker
// group, reports to the coordinator, and restarts the group while the job's budget allows.
#pragma once

#include <algorithm>
#include <chrono>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "agent/coordinator_client.h"
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
  Agent(AgentOptions opts, CoordinatorClient* coordinator, ProcessLauncher* launcher,
        OrphanGuard* guard, SignalFd* signals, const Clock* clock)
      : opts_(std::move(opts)),
        coordinator_(coordinator),
        launcher_(launcher),
        guard_(guard),
        signals_(signals),
        clock_(clock) {}

  // Runs the job to its end; returns launch's exit code.
  int Run();

 private:
  // Waits until `fd` is readable (0), `timeout` passes (-1), or a terminating signal arrives
  // (its number). fd < 0: only the timeout and signals; no timeout: wait for ever.
  int WaitSignalOr(int fd, std::optional<std::chrono::milliseconds> timeout);
  int SleepUnlessSignaled(std::chrono::milliseconds d) { return std::max(0, WaitSignalOr(-1, d)); }
  // Joins the next round, riding out a coordinator that restarts; *signal set if interrupted.
  absl::StatusOr<v1::Assignment> JoinRound(long last_round, int* signal);
  // Reports to the coordinator, retrying while it is unreachable (up to coordinator_patience).
  absl::StatusOr<v1::ReportExitResponse> Report(const v1::ReportExitRequest& req, const v1::Assignment& a,
                                                int* signal);
  // Waits, after this node's workers succeeded, for the job's verdict or a new round.
  absl::StatusOr<v1::HeartbeatResponse> AwaitVerdict(const v1::Assignment& a, int* signal);
  absl::StatusOr<std::vector<WorkerLaunch>> PrepareAttempt(const v1::Assignment& a,
                                                           const std::string& attempt_dir);
  void PrintDryRun(const std::vector<WorkerLaunch>& workers) const;
  CoordinatorWatch::Options WatchOptions() const;

  AgentOptions opts_;
  CoordinatorClient* coordinator_;
  ProcessLauncher* launcher_;
  OrphanGuard* guard_;
  SignalFd* signals_;
  const Clock* clock_;
  Env parent_env_;
  int last_picked_port_ = 0;  // the MASTER_PORT this node last proposed
  // The node whose agent hosts the coordinator, from the last assignment (empty: standalone).
  std::string coordinator_host_;
};

}  // namespace launch
