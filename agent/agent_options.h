// What the node agent is asked to do: plain option types, apart from the agent's implementation
// (the launch plan builds them without the coordinator client or the worker group).
#pragma once

#include <chrono>
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "agent/job_spec.h"
#include "agent/log_relay.h"
#include "probes/numa.h"
#include "common/tunables.h"
#include "launch.pb.h"

namespace launch {

// --rdzv-backend=static: the node's place is given, not negotiated (torchrun's static mode).
struct StaticTopology {
  int group_rank = 0;
  int group_world_size = 1;
  std::string master_addr;
  int master_port = kDefaultMasterPort;
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
  // The console prefix of each worker's lines (agent/log_relay.h's FormatLinePrefix), checked.
  std::string line_prefix_template = kSingleNodeLinePrefix;
  // --duplicate-std{out,err}-filters: into attempt_<k>/filtered_std{out,err}.log.
  std::vector<std::string> duplicate_stdout_filters, duplicate_stderr_filters;
  // --numa-binding: one per local rank (empty: none).
  std::vector<WorkerCpuBinding> numa;
  std::chrono::milliseconds stop_timeout = kDefaultStopTimeout;
  std::chrono::milliseconds restart_backoff{0};
  // --hang-timeout (nullopt: automatic; zero: off), and the debugger for hung workers' stacks.
  std::optional<std::chrono::milliseconds> hang_timeout;
  std::string debugger;
  // How often the workers are sampled to metrics.jsonl and the coordinator (nullopt: never).
  std::optional<std::chrono::milliseconds> monitor_interval;
  // The GPUs' figures for each sample (unset: none sampled).
  std::function<std::vector<v1::GpuSample>()> sample_gpus;
  // How often the lease is renewed while the workers run (--rdzv-conf heartbeat_interval).
  std::chrono::milliseconds heartbeat_interval = kDefaultHeartbeatInterval;
  // How long to keep trying an unreachable coordinator once the workers have ended.
  std::chrono::milliseconds coordinator_patience = kDefaultCloseTimeout;
  bool dry_run = false;
  // --warm-start: each worker starts from a standby made ahead of its attempt (agent/warm_start.h):
  // for Python workers (warm_python) an interpreter that imported these modules; otherwise the
  // program itself, when it declares LAUNCH_SDK_WARM_START().
  bool warm_start = false;
  bool warm_python = true;
  std::vector<std::string> warm_imports = {kDefaultWarmImport};
  // The run's settings, sent with every join (the coordinator checks all nodes agree).
  v1::RunSpec run_spec;
  std::optional<StaticTopology> static_topology;
  // What this node offers as MASTER_ADDR/MASTER_PORT if it becomes group rank 0.
  std::string master_addr = "127.0.0.1";
  // --master-port; else the port the workers' store binds at this node's first join, kept for
  // every attempt while the store is this node's (a fresh free port per join where worker rank 0
  // hosts the store: Agent::Join).
  std::optional<int> master_port;
  v1::NodeIdentity node;
};

}  // namespace launch
