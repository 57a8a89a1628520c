#include "launcher/plan.h"

#include <arpa/inet.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "agent/log_relay.h"
#include "common/limits.h"
#include "common/net.h"
#include "common/status_macros.h"

namespace launch {
namespace {

// Every refusal of the plan is a usage error (exit 2): lower-level NotFound or PermissionDenied
// answers (a program not found) keep their message and become InvalidArgument.
absl::Status AsUsage(const absl::Status& st) {
  if (st.ok() || absl::IsInvalidArgument(st) || absl::IsFailedPrecondition(st)) return st;
  return absl::InvalidArgumentError(st.message());
}

// DescribePlan's columns.
constexpr size_t kKeyWidth = 19;
constexpr size_t kValueWidth = 24;

// A plan that cannot have its descriptors started about 10,000 workers of 12,000 before it failed
// (and said "nothing started"): it is refused before anything starts.
absl::Status CheckDescriptorBudget(int nproc, bool log_files, const HostFacts& host) {
  if (!host.open_files_soft) return absl::OkStatus();
  const long limit = *host.open_files_soft;
  const long need = DescriptorsNeeded(nproc, log_files);
  if (need <= limit) return absl::OkStatus();
  const long fit = std::max(0L, (limit - kOwnDescriptors) / (log_files ? 4 : 2));
  return absl::InvalidArgumentError(
      absl::StrCat("--nproc-per-node=", nproc, ": ", nproc, " workers", log_files ? " with log files" : "",
                   " need about ", need, " open files, and the limit is ", limit, " (ulimit -n; the hard limit is ",
                   host.open_files_hard ? std::to_string(*host.open_files_hard) : std::string("unlimited"),
                   "); expected at most ", fit, " workers, or a higher limit"));
}

// What the workers run, as torchrun decides it: a -m module, a .py script or any other script
// (a file here that the kernel would not run: no ELF header, no #! line, or not executable)
// through the interpreter; an ELF binary or #! script here, a program on PATH, or anything under
// --no-python, directly. A program named without '/' is looked for here first, as Python would.
struct Program {
  bool python = false;
  std::string path;  // the script or module, or the program to resolve on PATH
};
Program ChooseProgram(const LaunchConfig& c, HostQueries& q) {
  if (c.module) return {true, c.program};
  if (c.no_python) return {false, c.program};
  if (absl::EndsWith(c.program, ".py")) return {true, c.program};
  const FileFacts here = q.File(c.program);
  if (!here.regular) return {false, c.program};
  if (here.native && here.executable) {
    return {false, c.program.find('/') == std::string::npos ? "./" + c.program : c.program};
  }
  return {true, c.program};
}

// The worker command line: through $PYTHON_EXEC -u (python3 on PATH by default), like torchrun, or
// the program itself (see ChooseProgram). `python` says which.
absl::StatusOr<std::vector<std::string>> WorkerArgv(const LaunchConfig& c, const HostFacts& host, bool* python) {
  const Env& env = host.env;
  HostQueries& q = *host.queries;
  std::string path = env.count("PATH") ? env.at("PATH") : "/usr/local/bin:/usr/bin:/bin";
  const Program program = ChooseProgram(c, q);
  *python = program.python;
  std::vector<std::string> argv;
  if (program.python) {
    const bool chosen = env.count("PYTHON_EXEC") > 0;
    std::string py = chosen ? env.at("PYTHON_EXEC") : "python3";
    auto exe = q.ResolveExecutable(py, path);
    if (!exe.ok()) return absl::NotFoundError(absl::StrCat("PYTHON_EXEC: ", exe.status().message()));
    if (!c.module && !q.File(c.program).readable) {
      return absl::NotFoundError(absl::StrCat("script '", c.program, "' does not exist or is not readable"));
    }
    // torchrun's workers run on the interpreter that has torch (its own). python3 from PATH may be
    // another (a pyenv shim, a bare venv): one line here rather than an ImportError from every rank.
    if (!chosen) {
      auto torch = q.PythonFindsTorch(*exe, env);
      if (torch.ok() && !*torch) {
        return absl::FailedPreconditionError(
            absl::StrCat("python3 on PATH (", *exe,
                         ") cannot import torch; set PYTHON_EXEC to the interpreter of your "
                         "training environment (PYTHON_EXEC=python3 runs the script there anyway)"));
      }
    }
    argv = {*exe, "-u"};
    if (c.module) argv.push_back("-m");
    argv.push_back(program.path);
  } else {
    ASSIGN_OR_RETURN(std::string exe, q.ResolveExecutable(program.path, path));
    argv.push_back(std::move(exe));
  }
  argv.insert(argv.end(), c.args.begin(), c.args.end());
  return argv;
}

// This node's address as the other nodes reach it.
absl::StatusOr<std::string> NodeAddress(const LaunchConfig& c, HostQueries& q) {
  std::string addr = c.local_addr;
  std::string endpoint_host;
  if (!c.rdzv_endpoint.empty()) {
    auto hp = ParseEndpoints(c.rdzv_endpoint, "--rdzv-endpoint");
    if (hp.ok()) endpoint_host = hp->front().host;
  }
  if (addr.empty() && !endpoint_host.empty()) {
    // A coordinator on loopback means the whole job is on this machine.
    auto loop = q.IsLoopbackHost(endpoint_host);
    if (loop.ok() && *loop) addr = endpoint_host.find(':') != std::string::npos ? "::1" : "127.0.0.1";
  }
  if (addr.empty()) {
    auto guess = q.DefaultHostAddress();
    if (!guess.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("cannot tell this node's address (", guess.status().message(), "); give --local-addr"));
    }
    addr = *guess;
  } else if (auto ips = q.ResolveHost(addr); !ips.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--local-addr=", addr, ": ", ips.status().message()));
  }
  // A loopback address is fine when the whole job is on this machine (the endpoint is loopback).
  std::string peer = c.rdzv_backend == "static" ? c.master_addr.value_or("") : "";
  if (peer.empty()) peer = endpoint_host;
  auto self_loop = q.IsLoopbackHost(addr);
  auto peer_loop = peer.empty() ? absl::StatusOr<bool>(false) : q.IsLoopbackHost(peer);
  if (self_loop.ok() && *self_loop && !(peer_loop.ok() && *peer_loop)) {
    return absl::InvalidArgumentError(
        absl::StrCat(c.local_addr.empty() ? "this host's name" : "--local-addr=" + c.local_addr,
                     " resolves to loopback ", addr,
                     ", which other nodes cannot reach; expected --local-addr=<this node's IP or "
                     "name on the cluster network>"));
  }
  return addr;
}

RendezvousConfig RendezvousSettings(const LaunchConfig& c, bool multi) {
  auto ms = [](double s) { return SecondsToMs(s); };
  RendezvousConfig r;
  r.min_nodes = multi ? c.min_nodes : 1;
  r.max_nodes = multi ? c.max_nodes : 1;
  r.max_restarts = c.max_restarts;
  r.straggler_factor = c.straggler_factor;
  r.join_timeout = ms(c.rdzv.join_timeout);
  r.last_call_timeout = ms(c.rdzv.last_call_timeout);
  r.close_timeout = ms(c.rdzv.close_timeout);
  // A single node's coordinator lives in its agent: the agent cannot be lost while it runs, so
  // its lease never expires (SIGSTOP/SIGCONT of launch, or a paused VM, restarted healthy workers).
  r.heartbeat_timeout = multi ? ms(c.rdzv.heartbeat_timeout) : ms(kMaxSeconds);
  return r;
}

// How this node meets the others: Plan's first decision, which its later steps follow.
struct Shape {
  bool is_static = false;  // --rdzv-backend=static on several nodes: the ranks are given
  bool multi = false;      // a rendezvous through the coordinator at --rdzv-endpoint
  bool dry_multi = false;  // a multi-node --dry-run, which meets no other node
};

// The GPUs the workers may use (--gpus, --exclude-gpus, an inherited CUDA_VISIBLE_DEVICES).
absl::StatusOr<GpuPool> ChooseGpus(const LaunchConfig& c, const HostFacts& host, LaunchPlan& plan) {
  const std::vector<GpuInfo>& gpus = host.gpus;
  GpuSelection sel;
  if (host.env.count("CUDA_VISIBLE_DEVICES")) sel.inherited_cuda_visible_devices = host.env.at("CUDA_VISIBLE_DEVICES");
  sel.gpus = c.gpus;
  sel.exclude = c.exclude_gpus;
  if (gpus.empty() && (!c.gpus.empty() || !c.exclude_gpus.empty())) {
    return absl::InvalidArgumentError(
        absl::StrCat(c.gpus.empty() ? "--exclude-gpus" : "--gpus", ": no GPU (", host.why_no_gpu, ")"));
  }
  ASSIGN_OR_RETURN(GpuPool pool, SelectGpuPool(gpus, sel));
  plan.warnings = pool.warnings;
  for (const GpuInfo& g : pool.gpus) plan.gpu_pool_indices.push_back(g.index);
  return pool;
}

// Inside a Slurm job step, the CPUs the job has here bound those usable.
int UsableCpus(const LaunchConfig& c, const HostFacts& host) {
  return c.slurm_cpus_on_node ? std::max(1, std::min(host.usable_cpus, *c.slurm_cpus_on_node)) : host.usable_cpus;
}

// Workers on this node: --nproc-per-node's number, or the CPUs or GPUs it names.
absl::StatusOr<int> CountWorkers(const LaunchConfig& c, const HostFacts& host, const GpuPool& pool, int cpus) {
  const std::vector<GpuInfo>& gpus = host.gpus;
  int nproc = c.nproc;
  switch (c.nproc_kind) {
    case LaunchConfig::Nproc::kCount:
      break;
    case LaunchConfig::Nproc::kCpu:
      nproc = cpus;
      break;
    case LaunchConfig::Nproc::kGpu:
      if (pool.gpus.empty()) {
        return absl::InvalidArgumentError(absl::StrCat("--nproc-per-node=gpu: no GPU (",
                                                       gpus.empty() ? host.why_no_gpu : "every GPU is excluded", ")"));
      }
      nproc = static_cast<int>(pool.gpus.size());
      break;
    case LaunchConfig::Nproc::kAuto:
      nproc = pool.gpus.empty() ? cpus : static_cast<int>(pool.gpus.size());
      break;
  }
  if (c.gpu_binding == GpuBinding::kIsolate && !pool.gpus.empty() && static_cast<int>(pool.gpus.size()) < nproc) {
    return absl::InvalidArgumentError(absl::StrCat("--gpu-binding=isolate: ", nproc, " workers but ", pool.gpus.size(),
                                                   " GPU(s) in the pool; expected at least one GPU per worker"));
  }
  return nproc;
}

// Slurm's CPUs for this task, when they are fewer than its workers.
void WarnOfFewSlurmCpus(const LaunchConfig& c, int nproc, LaunchPlan& plan) {
  if (c.slurm_cpus_on_node && *c.slurm_cpus_on_node < nproc) {
    // A plain srun gives every task one CPU: the workers would share it.
    plan.warnings.push_back(absl::StrCat("Slurm gave this task ", *c.slurm_cpus_on_node,
                                         " CPU(s) on this node (SLURM_CPUS_ON_NODE) for ", nproc,
                                         " workers: ask srun for more (srun -c ", nproc, " or more)"));
  }
}

// Redirected output and filtered copies need files somewhere that outlives the run.
bool Redirecting(const LaunchConfig& c) {
  return c.redirects.Any() || c.tee.Any() || !c.duplicate_stdout_filters.empty() || !c.duplicate_stderr_filters.empty();
}

// The descriptors the workers need, refused now when the limit is too low (not under --dry-run).
absl::Status CountDescriptors(const LaunchConfig& c, const HostFacts& host, int nproc, LaunchPlan& plan) {
  const bool redirecting = Redirecting(c);
  if (!c.dry_run) {
    const bool log_files = !c.log_dir.empty() || redirecting;
    RETURN_IF_ERROR(CheckDescriptorBudget(nproc, log_files, host));
    plan.descriptors_needed = DescriptorsNeeded(nproc, log_files);
  }
  return absl::OkStatus();
}

// plan.topology and the Shape the later steps follow; a multi-node run needs an endpoint.
absl::StatusOr<Shape> ChooseTopology(const LaunchConfig& c, LaunchPlan& plan) {
  // Topology: one node with its coordinator in-process, a multi-node rendezvous, or static ranks.
  const bool is_static = c.rdzv_backend == "static" && c.max_nodes > 1;
  const bool multi = !is_static && !c.standalone && (c.max_nodes > 1 || !c.rdzv_endpoint.empty());
  plan.topology = multi ? Topology::kMultiNode : is_static ? Topology::kStatic : Topology::kSingleNode;
  // A dry run meets no other node: the ranks it shows are this node's as if its group rank were
  // its node rank and every node ran as many workers.
  const bool dry_multi = multi && c.dry_run;
  if (multi && c.rdzv_endpoint.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--nnodes=",
                     c.min_nodes == c.max_nodes ? std::to_string(c.max_nodes)
                                                : absl::StrCat(c.min_nodes, ":", c.max_nodes),
                     ": a multi-node run needs --rdzv-endpoint=HOST[:PORT] (the coordinator)"));
  }
  return Shape{is_static, multi, dry_multi};
}

// The address the other nodes reach this one at; a dry run goes on without one, with a warning.
absl::StatusOr<std::string> ThisNodeAddress(const LaunchConfig& c, const HostFacts& host, const Shape& shape,
                                            LaunchPlan& plan) {
  HostQueries& q = *host.queries;
  std::string node_addr = "127.0.0.1";
  if (shape.multi || shape.is_static) {
    auto addr = NodeAddress(c, q);
    if (!addr.ok() && !shape.dry_multi) return addr.status();
    if (addr.ok()) {
      node_addr = *addr;
    } else {
      node_addr = host.hostname;
      plan.warnings.push_back(absl::StrCat("a real run would stop here: ", addr.status().message()));
    }
  }
  return node_addr;
}

// MASTER_ADDR, with --master-port checked where the master is this machine.
absl::StatusOr<std::string> MasterAddress(const LaunchConfig& c, HostQueries& q, const Shape& shape,
                                          const std::string& node_addr) {
  const std::string master_addr = c.master_addr.value_or(shape.multi ? node_addr : "127.0.0.1");
  // Whether the port is free can be asked only where the master is: this machine (on the other
  // nodes of a static job, or pods of a non-elastic PyTorchJob, it is another machine's address).
  auto master_here = c.master_port && !c.dry_run ? q.IsLocalHost(master_addr) : absl::StatusOr<bool>(false);
  if (master_here.ok() && *master_here) {
    auto in_use = q.PortInUse(master_addr, *c.master_port);
    if (!in_use.ok()) {
      auto from = c.origins.find("master_addr");
      return absl::InvalidArgumentError(absl::StrCat(from == c.origins.end() ? "--master-addr" : from->second, "=",
                                                     master_addr, ": ", in_use.status().message()));
    }
    if (*in_use) {
      return absl::FailedPreconditionError(absl::StrCat("--master-port=", *c.master_port,
                                                        ": the port is already in use on ", master_addr,
                                                        "; expected a free port (or omit the flag to get one)"));
    }
  }
  return master_addr;
}

// The worker group's spec: how many workers, its run id, GPUs, CPUs and training scale.
absl::Status PlanGroupSpec(const LaunchConfig& c, const HostFacts& host, const GpuPool& pool, int nproc, int cpus,
                           const Shape& shape, AgentOptions& opts) {
  HostQueries& q = *host.queries;
  opts.spec.local_world_size = nproc;
  opts.spec.role = c.role;
  // Every node of a job must name the same run: torchrun's default id when none is given.
  opts.spec.run_id = !c.rdzv_id.empty() ? c.rdzv_id : (shape.multi || shape.is_static) ? "none" : q.RandomHex(8);
  opts.spec.max_restarts = c.max_restarts;
  opts.spec.gpu_pool = pool.tokens;
  opts.spec.gpu_pool_is_nvml_indices = pool.from_nvml_indices;
  opts.spec.gpu_binding = c.gpu_binding;
  opts.spec.cuda_alloc_conf = c.cuda_alloc_conf;
  opts.spec.threads_per_worker = c.threads_per_worker;
  opts.spec.usable_cpus = cpus;
  opts.spec.train = c.train;
  if (c.train) {
    // Fail now, not at the first round, when the batch cannot be split.
    RETURN_IF_ERROR(ScaleTraining(*c.train, nproc).status());
  }
  opts.spec.python_dir = host.python_dir;
  opts.spec.flight_recorder = !c.no_flight_recorder;
  opts.spec.virtual_local_rank = c.virtual_local_rank;
  return absl::OkStatus();
}

// Where the workers' output goes: log files, the console, and the console's line prefix.
void PlanLogs(const LaunchConfig& c, const Shape& shape, LaunchPlan& plan) {
  AgentOptions& opts = plan.agent;
  const bool redirecting = Redirecting(c);
  opts.log_dir = c.log_dir;
  // As torchrun: redirected output needs files somewhere; they are kept.
  plan.make_temp_log_dir = opts.log_dir.empty() && redirecting && !c.dry_run;
  plan.ensure_log_dir = (!opts.log_dir.empty() || plan.make_temp_log_dir) && !c.dry_run;
  opts.redirects = c.redirects;
  opts.tee = c.tee;
  opts.console_local_ranks = c.local_ranks_filter;
  // The host tells lines apart only where there can be several nodes (not --nnodes=1 with an
  // endpoint).
  opts.line_prefix_template = c.log_line_prefix_template.value_or(
      (shape.multi || shape.is_static) && c.max_nodes > 1 ? kMultiNodeLinePrefix : kSingleNodeLinePrefix);
}

// How the workers are stopped, restarted, watched and, when hung, looked into.
void PlanSupervision(const LaunchConfig& c, const HostFacts& host, AgentOptions& opts) {
  HostQueries& q = *host.queries;
  opts.stop_timeout = SecondsToMs(c.stop_timeout);
  opts.restart_backoff = SecondsToMs(c.restart_backoff);
  if (c.hang_timeout) opts.hang_timeout = SecondsToMs(*c.hang_timeout);
  if (c.monitor_interval > 0) {
    opts.monitor_interval = SecondsToMs(std::max(c.monitor_interval, kMinMonitorInterval));
  }
  // gdb captures the native stacks of hung workers; without it only Python workers' own dumps.
  const std::string path_env = host.env.count("PATH") ? host.env.at("PATH") : "/usr/local/bin:/usr/bin:/bin";
  if (auto gdb = q.ResolveExecutable("gdb", path_env); gdb.ok()) opts.debugger = *gdb;
}

// Warm starts: on by default for Python workers and for programs that declare them.
void PlanWarmStart(const LaunchConfig& c, const HostFacts& host, bool python, AgentOptions& opts) {
  HostQueries& q = *host.queries;
  // On by default for Python workers and for programs that declare LAUNCH_SDK_WARM_START(); for
  // another program only when asked for (then the log says once why its workers start cold).
  opts.warm_python = python;
  opts.warm_start = c.warm_start &&
                    (opts.warm_python || c.warm_start_given || (!c.dry_run && q.DeclaresWarmStart(opts.argv.front())));
  opts.warm_imports = c.warm_imports;
}

// --numa-binding: each worker's CPUs, near its GPU where it has one.
absl::Status PlanNuma(const LaunchConfig& c, const HostFacts& host, const GpuPool& pool, int nproc,
                      AgentOptions& opts) {
  if (c.numa_binding != NumaBinding::kNone) {
    // The GPU each local rank uses: LOCAL_RANK among the pool (shared), or its slice's first.
    std::vector<int> nodes(nproc, -1);
    const int pool_size = static_cast<int>(pool.gpus.size());
    if (pool_size > 0) {
      const int per = c.gpu_binding == GpuBinding::kIsolate ? std::max(1, pool_size / nproc) : 1;
      for (int i = 0; i < nproc; ++i) nodes[i] = pool.gpus[(i * per) % pool_size].numa_node;
    }
    ASSIGN_OR_RETURN(opts.numa, PlanNumaBinding(c.numa_binding, host.cpu_topology, nodes));
  }
  return absl::OkStatus();
}

// This node as the coordinator sees it, and the rendezvous's settings.
void PlanNode(const LaunchConfig& c, const HostFacts& host, const Shape& shape, const std::string& node_addr, int nproc,
              LaunchPlan& plan) {
  HostQueries& q = *host.queries;
  AgentOptions& opts = plan.agent;
  opts.node.set_hostname(host.hostname);
  // "<host>:<pid>:<hex>", its host part cut so that the id fits kMaxNodeIdLength.
  opts.node.set_node_id(
      absl::StrCat(host.hostname.substr(0, kMaxNodeIdLength - 32), ":", host.pid, ":", q.RandomHex(4)));
  opts.node.set_host_address(node_addr);
  opts.node.set_local_world_size(nproc);
  // A node rank that was given (not the default 0) orders the first round's group ranks.
  if (shape.multi && c.origins.count("node_rank")) opts.node.set_node_rank(c.node_rank);
  plan.rendezvous = RendezvousSettings(c, shape.multi && !shape.dry_multi);
  opts.run_spec = plan.rendezvous.ToSpec();
  opts.heartbeat_interval = SecondsToMs(c.rdzv.heartbeat_interval);
  opts.coordinator_patience = SecondsToMs(c.rdzv.close_timeout);
}

// --rdzv-backend=static on several nodes: the ranks as given.
absl::Status PlanStaticRanks(const LaunchConfig& c, const Shape& shape, AgentOptions& opts) {
  if (shape.is_static) {
    if (!c.master_addr) {
      return absl::InvalidArgumentError("--rdzv-backend=static: --master-addr is needed (the address of node rank 0)");
    }
    StaticTopology t;
    t.group_rank = c.node_rank;
    t.group_world_size = c.max_nodes;
    t.master_addr = *c.master_addr;
    t.master_port = c.master_port.value_or(kDefaultMasterPort);
    opts.static_topology = t;
  }
  return absl::OkStatus();
}

// Who hosts the coordinator of a multi-node run: this agent, or another machine's.
absl::Status ChooseCoordinator(const LaunchConfig& c, const HostFacts& host, const Shape& shape, LaunchPlan& plan) {
  HostQueries& q = *host.queries;
  if (shape.multi) {
    ASSIGN_OR_RETURN(std::vector<HostPort> endpoints, ParseEndpoints(c.rdzv_endpoint, "--rdzv-endpoint"));
    const HostPort& hp = endpoints.front();
    plan.rdzv_host = hp.host;
    plan.rdzv_endpoint = JoinHostPort(hp.host, hp.port.value_or(kDefaultRendezvousPort));
    if (endpoints.size() > 1) {
      // Replicated coordinators (`launch coordinator --state etcd://...`): no agent hosts one.
      if (c.rdzv.is_host && *c.rdzv.is_host) {
        return absl::InvalidArgumentError(absl::StrCat("--rdzv-endpoint=", c.rdzv_endpoint,
                                                       ": several endpoints are replicated coordinators, which no "
                                                       "agent hosts; drop is_host=true from --rdzv-conf"));
      }
      for (const HostPort& e : endpoints)
        plan.rdzv_replicas.push_back(JoinHostPort(e.host, e.port.value_or(kDefaultRendezvousPort)));
      plan.coordinator = CoordinatorRole::kJoin;
    } else if (c.rdzv.is_host) {
      plan.coordinator = *c.rdzv.is_host ? CoordinatorRole::kHost : CoordinatorRole::kJoin;
    } else {
      // This machine's own name is this machine, whatever DNS says yet, and so is a name under it
      // that does not resolve yet (a pod's "<host>.<subdomain>" before its DNS record exists). Any
      // other name that does not resolve yet is another machine's: the agent joins it, retrying
      // until join_timeout, as it does an endpoint that does not answer.
      const bool own_name = absl::EqualsIgnoreCase(hp.host, host.hostname);
      absl::StatusOr<bool> local = own_name ? absl::StatusOr<bool>(true) : q.IsLocalHost(hp.host);
      // A name over several addresses is replicated coordinators (a DNS name, a headless
      // service): no agent hosts one, not even on a replica's machine.
      if (!own_name && NameReplicas(q, hp.host).size() >= 2) local = false;
      if (!local.ok() && !host.hostname.empty() &&
          absl::StartsWithIgnoreCase(hp.host, absl::StrCat(host.hostname, "."))) {
        local = true;
      }
      if (!local.ok()) {
        plan.warnings.push_back(absl::StrCat("--rdzv-endpoint=", c.rdzv_endpoint, ": ", local.status().message(),
                                             " (yet): joining it, retried until join_timeout"));
      }
      plan.coordinator = local.ok() && *local ? CoordinatorRole::kHostUnlessTaken : CoordinatorRole::kJoin;
    }
    // Port 0 (`localhost:0`, as torch 2.x scripts pass): a free port picked when the coordinator
    // is hosted here, which no other agent could learn.
    for (const HostPort& e : endpoints) {
      if (e.port != 0) continue;
      if (plan.coordinator == CoordinatorRole::kJoin || c.max_nodes > 1) {
        return absl::InvalidArgumentError(
            absl::StrCat("--rdzv-endpoint=", c.rdzv_endpoint,
                         ": port 0 (any free port) works only for a coordinator hosted here with --nnodes=1, since no "
                         "other node could learn the port; give the coordinator's port"));
      }
      plan.coordinator = CoordinatorRole::kHost;
    }
    if (plan.coordinator == CoordinatorRole::kJoin && plan.rdzv_replicas.empty()) {
      for (const std::string& a : NameReplicas(q, hp.host)) {
        plan.rdzv_replicas.push_back(JoinHostPort(a, hp.port.value_or(kDefaultRendezvousPort)));
        plan.rdzv_replicas_name = hp.host;
      }
    }
  }
  return absl::OkStatus();
}

// A multi-node dry run's ranks: this node's, as if the rendezvous had given them (see Shape).
void PlanDryRunRanks(const LaunchConfig& c, const Shape& shape, LaunchPlan& plan) {
  AgentOptions& opts = plan.agent;
  if (shape.dry_multi) {
    StaticTopology t;
    t.group_rank = c.node_rank < c.max_nodes ? c.node_rank : 0;
    if (c.node_rank >= c.max_nodes) {
      plan.warnings.push_back(absl::StrCat("node rank ", c.node_rank, " is not below the node count ", c.max_nodes,
                                           ": the dry run shows group rank 0"));
    }
    t.group_world_size = c.max_nodes;
    t.master_addr = c.master_addr.value_or(plan.rdzv_host);
    t.master_port = c.master_port.value_or(kDefaultMasterPort);
    opts.static_topology = t;
    plan.dry_run_without_rendezvous = true;
  }
}

absl::StatusOr<LaunchPlan> Plan(const LaunchConfig& c, const HostFacts& host) {
  LaunchPlan plan;
  AgentOptions& opts = plan.agent;
  ASSIGN_OR_RETURN(const GpuPool pool, ChooseGpus(c, host, plan));
  const int cpus = UsableCpus(c, host);
  ASSIGN_OR_RETURN(const int nproc, CountWorkers(c, host, pool, cpus));
  WarnOfFewSlurmCpus(c, nproc, plan);
  bool python = false;
  ASSIGN_OR_RETURN(opts.argv, WorkerArgv(c, host, &python));
  if (python) plan.python = opts.argv.front();
  RETURN_IF_ERROR(CountDescriptors(c, host, nproc, plan));
  ASSIGN_OR_RETURN(const Shape shape, ChooseTopology(c, plan));
  ASSIGN_OR_RETURN(const std::string node_addr, ThisNodeAddress(c, host, shape, plan));
  ASSIGN_OR_RETURN(const std::string master_addr, MasterAddress(c, *host.queries, shape, node_addr));
  RETURN_IF_ERROR(PlanGroupSpec(c, host, pool, nproc, cpus, shape, opts));
  PlanLogs(c, shape, plan);
  PlanSupervision(c, host, opts);
  PlanWarmStart(c, host, python, opts);
  RETURN_IF_ERROR(PlanNuma(c, host, pool, nproc, opts));
  opts.duplicate_stdout_filters = c.duplicate_stdout_filters;
  opts.duplicate_stderr_filters = c.duplicate_stderr_filters;
  opts.dry_run = c.dry_run;
  opts.master_addr = master_addr;
  opts.master_port = c.master_port;
  PlanNode(c, host, shape, node_addr, nproc, plan);
  RETURN_IF_ERROR(PlanStaticRanks(c, shape, opts));
  RETURN_IF_ERROR(ChooseCoordinator(c, host, shape, plan));
  PlanDryRunRanks(c, shape, plan);
  return plan;
}

}  // namespace

std::string DescribePlan(const LaunchConfig& c, const LaunchPlan& plan) {
  const AgentOptions& a = plan.agent;
  auto origin = [&](const char* key) {
    auto it = c.origins.find(key);
    return it == c.origins.end() ? std::string("default") : it->second;
  };
  std::string out;
  auto row = [&](const char* key, const std::string& value, const std::string& from) {
    absl::StrAppend(&out, "  ", key, std::string(kKeyWidth - std::min(kKeyWidth, std::strlen(key)), ' '), value,
                    std::string(kValueWidth - std::min(kValueWidth, value.size()), ' '), "  ", from, "\n");
  };
  const int nodes = plan.topology == Topology::kSingleNode ? 1 : c.max_nodes;
  const std::string node_count = c.min_nodes == c.max_nodes ? std::to_string(nodes)
                                                            : absl::StrCat(c.min_nodes, ":", c.max_nodes);
  const int group_rank = a.static_topology ? a.static_topology->group_rank : 0;
  absl::StrAppend(&out, "launch --dry-run: node rank ", group_rank, " of ", node_count, ", ", a.spec.local_world_size,
                  " worker(s) on this node");
  if (plan.topology == Topology::kMultiNode) {
    absl::StrAppend(&out, ", rendezvous at ", plan.rdzv_endpoint,
                    plan.coordinator == CoordinatorRole::kJoin ? " (another host's)" : " (hosted here)");
  }
  absl::StrAppend(&out, ", run id ", a.spec.run_id, "\n");
  row("nnodes", node_count, origin("nnodes"));
  row("node_rank", std::to_string(plan.topology == Topology::kSingleNode ? 0 : c.node_rank), origin("node_rank"));
  row("nproc_per_node", std::to_string(a.spec.local_world_size), origin("nproc_per_node"));
  row("rdzv_backend", c.rdzv_backend, origin("rdzv_backend"));
  if (plan.topology == Topology::kMultiNode) row("rdzv_endpoint", plan.rdzv_endpoint, origin("rdzv_endpoint"));
  row("rdzv_id", a.spec.run_id, c.origins.count("rdzv_id") ? origin("rdzv_id") : "default (fresh)");
  if (plan.topology == Topology::kStatic || c.master_addr) row("master_addr", a.master_addr, origin("master_addr"));
  if (c.master_port) row("master_port", std::to_string(*c.master_port), origin("master_port"));
  row("max_restarts", std::to_string(c.max_restarts), origin("max_restarts"));
  row("signals_to_handle", SignalListName(c.signals_to_handle), origin("signals_to_handle"));
  row("log_line_prefix", a.line_prefix_template, origin("log_line_prefix_template"));
  if (c.numa_binding != NumaBinding::kNone)
    row("numa_binding", NumaBindingName(c.numa_binding), origin("numa_binding"));
  if (c.slurm_cpus_on_node) row("usable_cpus", std::to_string(a.spec.usable_cpus), "SLURM_CPUS_ON_NODE and affinity");
  if (plan.dry_run_without_rendezvous) {
    absl::StrAppend(&out, "  note: a dry run meets no other node: the ranks below are group rank ", group_rank,
                    "'s with ", a.spec.local_world_size,
                    " worker(s) on every node; at run time the rendezvous gives the group ranks (in node-rank "
                    "order among nodes that join together and have one), and the group-rank-0 node's agent picks "
                    "MASTER_ADDR and MASTER_PORT\n");
  }
  return out;
}

absl::StatusOr<LaunchPlan> PlanLaunch(const LaunchConfig& config, const HostFacts& host) {
  if (host.queries == nullptr) return absl::InternalError("PlanLaunch: no HostQueries");
  absl::StatusOr<LaunchPlan> plan = Plan(config, host);
  if (!plan.ok()) return AsUsage(plan.status());
  return plan;
}

std::vector<std::string> NameReplicas(HostQueries& q, const std::string& host) {
  in6_addr a6;
  in_addr a4;
  if (inet_pton(AF_INET, host.c_str(), &a4) == 1 || inet_pton(AF_INET6, host.c_str(), &a6) == 1) return {};
  auto resolved = q.ResolveHost(host);
  if (!resolved.ok()) return {};
  // One family (IPv4 where there is any): a host's own IPv4 and IPv6 addresses are one host.
  const bool any_v4 = std::any_of(resolved->begin(), resolved->end(),
                                  [](const std::string& a) { return a.find(':') == std::string::npos; });
  std::vector<std::string> out;
  for (const std::string& a : *resolved) {
    if ((a.find(':') == std::string::npos) == any_v4 && std::find(out.begin(), out.end(), a) == out.end() &&
        static_cast<int>(out.size()) < kMaxEndpoints) {
      out.push_back(a);
    }
  }
  if (out.size() < 2) out.clear();
  return out;
}

}  // namespace launch
