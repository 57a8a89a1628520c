// The node agent: joins a rendezvous round, builds each worker's environment, runs the worker
// group, reports to the coordinator, and restarts the group while the job's budget allows.
#pragma once

#include <algorithm>
#include <chrono>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "agent/agent_machine.h"
#include "agent/agent_options.h"
#include "rendezvous/background_call.h"
#include "rendezvous/coordinator_client.h"
#include "rendezvous/coordinator_session.h"
#include "rendezvous/coordinator_watch.h"
#include "agent/file_timer.h"
#include "agent/live_ranks.h"
#include "agent/log_relay.h"
#include "agent/monitor.h"
#include "probes/process.h"
#include "probes/signals.h"
#include "agent/store_server.h"
#include "agent/worker_memory.h"
#include "agent/warm_start.h"
#include "agent/worker_env.h"
#include "agent/worker_group.h"
#include "common/clock.h"

namespace launch {

// A directory of its own for one run's logs: <log_dir>/<run_id>, or <run_id>.1, .2, ... when
// earlier runs with this id left theirs (made with mkdir, so two runs never share files).
absl::StatusOr<std::string> MakeRunLogDir(const std::string& log_dir, const std::string& run_id);

// torchrun's opt-out of the agent's store (torch 2.x): "1" has worker rank 0 host the store.
// Needed where Python torch >= 2.4 was built without libuv (Debian's): its env:// client, made for
// the agent's store, asks for libuv and fails.
inline constexpr char kDisableSharedStoreEnv[] = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE";
bool StoreSharingDisabled(const Env& env);

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
    v1::HeartbeatResponse why;       // the watch's answer that stopped the group
    v1::ReportExitResponse verdict;  // the coordinator's last answer to a report
    bool has_verdict = false;
    std::string error;  // what ended the run as launch's own error or bad input
  };

  // One phase's work each; what happened comes back as the event for NextAgentState.
  AgentEvent Join(Attempt* at);
  AgentEvent RunWorkers(Attempt* at);
  WorkerGroup::Options GroupOptions(const Attempt& at, int stop_fd);
  void StartMonitor(int round);
  void SetWarmStart(const v1::Assignment& a, Attempt* at, WorkerGroup::Options* gopts);
  void ReportLeaving(int round);
  AgentEvent ReportOutcome(const AgentState& state, Attempt* at);
  AgentEvent AwaitOthers(Attempt* at);
  AgentEvent BackOff();
  // Serves the workers' store for the round when this node is its group rank 0 (and the store
  // is the agent's); stops serving when another node is.
  absl::Status HostStore(const v1::Assignment& a);
  // Says how the run ended and returns launch's exit code.
  int Finish(const AgentState& state, const Attempt& at, bool temp_dir);
  // Logs a move between phases that users should see (a restart, a wait for the other nodes).
  void LogMove(const AgentState& from, const AgentState& to, const Attempt& at) const;

  // Waits until `fd` is readable (0), `timeout` passes (-1), or a terminating signal arrives
  // (its number). fd < 0: only the timeout and signals; no timeout: wait for ever.
  int WaitSignalOr(int fd, std::optional<std::chrono::milliseconds> timeout);
  // make_dirs false: the attempt's directories are not made (a dry run, or standbys made ahead).
  absl::StatusOr<std::vector<WorkerLaunch>> PrepareAttempt(const v1::Assignment& a, const std::string& attempt_dir,
                                                           bool make_dirs);
  // --warm-start: standbys for the first attempt, made while the rendezvous runs.
  void PrepareFirstStandbys();
  void PrintDryRun(const std::vector<WorkerLaunch>& workers) const;

  AgentOptions opts_;
  CoordinatorSession session_;
  ProcessLauncher* launcher_;
  OrphanGuard* guard_;
  SignalFd* signals_;
  const Clock* clock_;
  Env parent_env_;
  std::string run_dir_;  // this run's log (or temporary) directory
  long last_round_ = 0;
  bool left_reported_ = false;        // the coordinator was told this node leaves
  int last_picked_port_ = 0;          // the MASTER_PORT this node last proposed
  LiveRanks live_;                    // the workers' figures (the worker group writes, the monitor reads)
  std::unique_ptr<Monitor> monitor_;  // from the first attempt on, when --monitor-interval is on
  // torchrun's file timer (TORCHELASTIC_ENABLE_FILE_TIMER=1): one for the run, every attempt's
  // workers registered with it; null when not asked for.
  std::unique_ptr<FileTimerServer> file_timer_;
  // Where the workers' checkpoints and the node's all-reduce segment outlive them
  // (LAUNCH_CHECKPOINT_MEMORY, LAUNCH_SHM_ALLREDUCE_MEMORY); null: none.
  std::unique_ptr<WorkerMemory> worker_memory_;
  std::unique_ptr<ExitNotices> exit_notices_;
  // The workers' TCPStore: bound when this node proposes its port, served while it is group
  // rank 0, through every restart (agent/store_server.h).
  std::unique_ptr<StoreServer> store_;
  // --warm-start: the standby interpreters of the next attempt's workers.
  std::unique_ptr<WarmStart> warm_;
};

}  // namespace launch
