// The node agent: joins a rendezvous round, builds each worker's environment, runs the worker
// group, reports to the coordinator, and restarts the group while the job's budget allows.
#pragma once

#include <chrono>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "agent/coordinator_client.h"
#include "agent/log_relay.h"
#include "agent/process.h"
#include "agent/signals.h"
#include "agent/worker_env.h"
#include "agent/worker_group.h"
#include "common/clock.h"

namespace launch {

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
  std::chrono::milliseconds heartbeat_interval{0};
  bool dry_run = false;
  // What this node offers as MASTER_ADDR/MASTER_PORT if it becomes group rank 0.
  std::string master_addr = "127.0.0.1";
  std::optional<int> master_port;  // --master-port; else a free port per attempt
  v1::NodeIdentity node;
};

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
  // Waits `d`, or less if a terminating signal arrives (returned; 0 if none).
  int SleepUnlessSignaled(std::chrono::milliseconds d);
  absl::StatusOr<std::vector<WorkerLaunch>> PrepareAttempt(const v1::Assignment& a,
                                                           const std::string& attempt_dir);
  void PrintDryRun(const std::vector<WorkerLaunch>& workers) const;

  AgentOptions opts_;
  CoordinatorClient* coordinator_;
  ProcessLauncher* launcher_;
  OrphanGuard* guard_;
  SignalFd* signals_;
  const Clock* clock_;
  Env parent_env_;
};

}  // namespace launch
