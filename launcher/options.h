// `launch`'s command line and YAML config, merged into one validated LaunchConfig. Flags take
// torchrun's spellings (dashes or underscores); the YAML file uses the same keys, nested
// sections allowed; flags override the file. Every bad value is a one-line error naming it.
#pragma once

#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "agent/job_spec.h"
#include "probes/numa.h"
#include "probes/signals.h"
#include "common/tunables.h"

namespace launch {

// --rdzv-conf, typed.
struct RdzvSettings {
  double join_timeout = SecondsOf(kDefaultJoinTimeout);
  double last_call_timeout = SecondsOf(kDefaultLastCallTimeout);
  double close_timeout = SecondsOf(kDefaultCloseTimeout);
  double heartbeat_interval = SecondsOf(kDefaultHeartbeatInterval);
  double heartbeat_timeout = SecondsOf(kDefaultHeartbeatTimeout);
  std::optional<bool> is_host;  // unset: host the coordinator when the endpoint is this machine
};

struct LaunchConfig {
  enum class Nproc { kCount, kCpu, kGpu, kAuto };
  Nproc nproc_kind = Nproc::kCount;
  int nproc = 1;
  int min_nodes = 1, max_nodes = 1;
  int node_rank = 0;
  std::string rdzv_backend = "c10d";
  std::string rdzv_endpoint;
  std::string rdzv_id;  // empty: a fresh id
  std::vector<std::pair<std::string, std::string>> rdzv_conf;
  RdzvSettings rdzv;
  std::string rdzv_token_file;
  std::string tls_cert, tls_key, tls_ca;
  bool insecure = false;
  bool standalone = false;
  int max_restarts = 0;
  // Seconds between the agent's samples of its workers (0: none); below kMinMonitorInterval
  // samples come every kMinMonitorInterval (torchrun's default of 0.1 is its exit poll).
  double monitor_interval = SecondsOf(kDefaultMonitorInterval);
  double straggler_factor = kDefaultStragglerFactor;  // 0: off
  std::optional<int> metrics_port;
  std::string role = "default";
  bool module = false;
  bool no_python = false;
  bool no_flight_recorder = false;
  // --warm-start (on unless --warm-start=false), whether it was given, and what its standbys
  // import (--warm-import).
  bool warm_start = true;
  bool warm_start_given = false;
  std::vector<std::string> warm_imports = {kDefaultWarmImport};
  std::string log_dir;
  StdSpec redirects, tee;
  std::optional<std::set<int>> local_ranks_filter;
  // torchrun's --duplicate-std{out,err}-filters: substrings (",," a literal comma).
  std::vector<std::string> duplicate_stdout_filters, duplicate_stderr_filters;
  // torchrun's --numa-binding.
  NumaBinding numa_binding = NumaBinding::kNone;
  // torchrun's --virtual-local-rank: LOCAL_RANK=0 for every worker, each seeing its own GPU(s).
  bool virtual_local_rank = false;
  // --log-line-prefix-template; unset: "[${rank}]:" on one node, "[${hostname}:${rank}]:" on several.
  std::optional<std::string> log_line_prefix_template;
  std::optional<std::string> master_addr;
  std::optional<int> master_port;
  std::string local_addr;
  std::string config_file;
  double stop_timeout = SecondsOf(kDefaultStopTimeout);
  // Forwarded to the workers, then the group is stopped (torchrun's --signals-to-handle).
  std::vector<int> signals_to_handle = DefaultHandledSignals();
  double restart_backoff = 0;
  std::optional<double> hang_timeout;  // --hang-timeout; unset: automatic; 0: off
  std::vector<std::string> gpus, exclude_gpus;
  GpuBinding gpu_binding = GpuBinding::kShared;
  std::optional<std::string> cuda_alloc_conf;
  std::optional<int> threads_per_worker;
  bool dry_run = false;
  bool preflight = false;  // run launch doctor's checks for this plan first; stop on a failure
  std::optional<TrainScaling> train;
  // Where each setting came from: "--nnodes", "PET_NNODES", "job.yaml:3: nnodes", "SLURM_NNODES";
  // a setting left at its default is absent. --dry-run prints them.
  std::map<std::string, std::string> origins;
  // Inside a Slurm job step: SLURM_CPUS_ON_NODE, the CPUs the job has on this node.
  std::optional<int> slurm_cpus_on_node;
  std::string program;
  std::vector<std::string> args;
};

struct ParsedArgs {
  bool help = false;  // help was asked for and printed
  LaunchConfig config;
};

// argv[0] is the program name. Errors are InvalidArgument with a one-line message. `env`: the
// environment, for torchrun's PET_<FLAG> variables (a flag given on the command line wins over
// them, they win over --config's file), then a Slurm job step's topology (launcher/slurm.h: what
// the file left unset), then JOB_COMPLETION_INDEX (the node rank where nothing else gives one).
// Whether --version is among launch's own words (before the program), as argparse's version
// action answers wherever it comes.
bool AsksForVersion(const std::vector<std::string>& argv);

absl::StatusOr<ParsedArgs> ParseLaunchArgs(const std::vector<std::string>& argv,
                                           const std::map<std::string, std::string>& env = {});

// `launch coordinator --listen HOST:PORT ...`: a standalone coordinator for any number of jobs.
struct CoordinatorConfig {
  std::string listen = absl::StrCat("0.0.0.0:", kDefaultRendezvousPort);
  std::string rdzv_token_file;
  std::string tls_cert, tls_key, tls_ca;
  bool insecure = false;
  std::optional<int> metrics_port;
  // Replicated coordinators: etcd://HOST:PORT[,...][/PREFIX] holds their state; empty: none.
  std::string state;
  std::string advertise;                     // how agents reach this replica (default: --listen's)
  std::string etcd_ca, etcd_cert, etcd_key;  // TLS to etcd
  int leader_lease = 3;                      // seconds
};
struct ParsedCoordinatorArgs {
  bool help = false;
  CoordinatorConfig config;
};
// argv[0] is "launch", argv[1] "coordinator".
absl::StatusOr<ParsedCoordinatorArgs> ParseCoordinatorArgs(const std::vector<std::string>& argv);

// `launch status --rdzv-endpoint HOST:PORT --rdzv-id ID [--watch]`: a running job as its
// coordinator sees it.
struct StatusConfig {
  std::string rdzv_endpoint;
  std::string rdzv_id;
  bool watch = false;
  double interval = SecondsOf(kDefaultStatusInterval);  // --watch: seconds between screens
  bool json = false;
  std::string rdzv_token_file;
  std::string tls_cert, tls_key, tls_ca;
  bool insecure = false;
};
struct ParsedStatusArgs {
  bool help = false;
  StatusConfig config;
};
// argv[0] is "launch", argv[1] "status".
absl::StatusOr<ParsedStatusArgs> ParseStatusArgs(const std::vector<std::string>& argv);

// `launch doctor [--nproc-per-node N] [--log-dir DIR] [--checkpoint-dir DIR] [--json]`: this
// machine's readiness for a run, one row per check.
struct DoctorConfig {
  std::optional<int> nproc;  // unset: the GPUs in the pool, else 1
  std::vector<std::string> exclude_gpus;
  std::string log_dir, checkpoint_dir;
  bool json = false;
};
struct ParsedDoctorArgs {
  bool help = false;
  DoctorConfig config;
};
// argv[0] is "launch", argv[1] "doctor".
absl::StatusOr<ParsedDoctorArgs> ParseDoctorArgs(const std::vector<std::string>& argv);

}  // namespace launch
