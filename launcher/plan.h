// What `launch` will do on this node, decided before anything starts: a pure function from the
// validated config and the facts of this machine to a plan that run.cc carries out.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "agent/agent_options.h"
#include "probes/devices.h"
#include "agent/worker_env.h"
#include "common/tunables.h"
#include "launcher/options.h"
#include "rendezvous/rendezvous.h"

namespace launch {

// What a path is, as far as choosing how to run it goes.
struct FileFacts {
  bool regular = false;     // exists and is a regular file
  bool readable = false;    // access(R_OK)
  bool executable = false;  // access(X_OK)
  bool native = false;      // starts with an ELF header or a #! line: the kernel runs it
};

// The questions whose answers depend on their argument (PATH lookups, name resolution, ports) and
// the run's randomness: behind an interface so that a table test answers them.
class HostQueries {
 public:
  virtual ~HostQueries() = default;
  // As probes/process.h's ResolveExecutable.
  virtual absl::StatusOr<std::string> ResolveExecutable(const std::string& program, const std::string& path_env) = 0;
  virtual FileFacts File(const std::string& path) = 0;
  // As common/net.h's functions of the same names.
  virtual absl::StatusOr<std::string> DefaultHostAddress() = 0;
  virtual absl::StatusOr<std::vector<std::string>> ResolveHost(const std::string& host) = 0;
  virtual absl::StatusOr<bool> IsLoopbackHost(const std::string& host) = 0;
  virtual absl::StatusOr<bool> IsLocalHost(const std::string& host) = 0;
  virtual absl::StatusOr<bool> PortInUse(const std::string& host, int port) = 0;
  // `bytes` random bytes as lowercase hex (run ids, node ids).
  virtual std::string RandomHex(int bytes) = 0;
  // As agent/warm_start.h's DeclaresWarmStart.
  virtual bool DeclaresWarmStart(const std::string& /*executable*/) { return false; }
  // Whether the interpreter `python` (a path) finds the torch package with `env`; an error when it
  // cannot be asked (then the workers' own errors say).
  virtual absl::StatusOr<bool> PythonFindsTorch(const std::string& /*python*/, const Env& /*env*/) { return true; }
};

// Everything the plan needs to know about this machine.
struct HostFacts {
  Env env;
  std::vector<GpuInfo> gpus;
  std::string why_no_gpu;  // when `gpus` is empty
  // The CPUs this process may use, with their NUMA nodes, sockets, cores and L3 caches (read only
  // for --numa-binding; the GPUs' numa_node then too).
  CpuTopology cpu_topology;
  int usable_cpus = 1;
  std::string hostname;
  // Where launch's Python module is (<bin>/../share/launch/python); empty: not found.
  std::string python_dir;
  int pid = 0;
  // RLIMIT_NOFILE; nullopt: unlimited (for the soft limit also: unknown, so not checked).
  std::optional<long> open_files_soft;
  std::optional<long> open_files_hard;
  HostQueries* queries = nullptr;  // not owned; required
};

// Where this node's agent finds its coordinator.
enum class Topology {
  kSingleNode,  // one node; its coordinator in-process
  kMultiNode,   // a rendezvous through the coordinator at --rdzv-endpoint
  kStatic,      // --rdzv-backend=static: ranks given; an in-process coordinator keeps the books
};

enum class CoordinatorRole {
  kInProcess,        // single node or static: a private coordinator on loopback
  kHost,             // --rdzv-conf is_host=true: this agent must host it
  kHostUnlessTaken,  // the endpoint is this machine: host it unless another agent here already does
  kJoin,             // another machine hosts it
};

struct LaunchPlan {
  Topology topology = Topology::kSingleNode;
  CoordinatorRole coordinator = CoordinatorRole::kInProcess;
  // kMultiNode: the endpoint to connect to (the default port filled in), and its host.
  std::string rdzv_endpoint;
  std::string rdzv_host;
  // Replicated coordinators (--rdzv-endpoint h1:p,h2:p,...): every replica's endpoint, ports
  // filled in (rdzv_endpoint and rdzv_host are the first's); one endpoint: empty.
  std::vector<std::string> rdzv_replicas;
  // Replicas behind one name (--rdzv-endpoint NAME:PORT, NAME resolving to several addresses):
  // NAME, which TLS checks each replica's certificate against; empty: each endpoint's own host.
  std::string rdzv_replicas_name;
  RendezvousConfig rendezvous;
  // Everything but what only execution learns: log_dir when make_temp_log_dir, and
  // node.hosts_coordinator (known once the server is up).
  AgentOptions agent;
  // --redirects/--tee without --log-dir: a fresh temporary directory holds the logs (kept).
  bool make_temp_log_dir = false;
  // agent.log_dir (or the temporary one) must exist and be writable before anything starts.
  bool ensure_log_dir = false;
  // What launch expects to hold open while its workers run (0: not counted, as under --dry-run).
  long descriptors_needed = 0;
  std::vector<std::string> warnings;  // one log line each
  // What --preflight checks: the NVML indices of the GPUs the workers use, and the interpreter of
  // .py and -m workers (empty: the workers run directly, so LibTorch is what they use).
  std::vector<int> gpu_pool_indices;
  std::string python;
  // A multi-node --dry-run: no rendezvous; agent.static_topology holds the ranks it shows.
  bool dry_run_without_rendezvous = false;
};

// What --dry-run prints before the workers: the topology and each setting's value with where it
// came from (a flag, a PET_ variable, the config file, Slurm, or the default), one per line.
std::string DescribePlan(const LaunchConfig& config, const LaunchPlan& plan);

// Every refusal is a one-line InvalidArgument (bad flags for this machine) or FailedPrecondition
// (the machine's state, such as a port in use), which `launch` reports with exit status 2.
absl::StatusOr<LaunchPlan> PlanLaunch(const LaunchConfig& config, const HostFacts& host);

// The addresses of `host`, a name over replicated coordinators: its distinct addresses of one family
// (IPv4 where it has any), at most kMaxEndpoints; empty for a numeric address, a name that does
// not resolve, or one with a single address.
std::vector<std::string> NameReplicas(HostQueries& q, const std::string& host);

}  // namespace launch
