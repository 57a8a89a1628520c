#include "launcher/run.h"

#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <random>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "agent/agent.h"
#include "agent/cpus.h"
#include "agent/devices.h"
#include "common/net.h"
#include "common/status_macros.h"
#include "launcher/coordinator.h"
#include "spdlog/spdlog.h"

namespace launch {
namespace {

constexpr int kUsageError = 2;

int UsageError(const std::string& message) {
  std::fprintf(stderr, "launch: %s\n", message.c_str());
  return kUsageError;
}

std::string RandomHex(int bytes) {
  std::random_device rd;
  std::string out;
  static const char* kHex = "0123456789abcdef";
  for (int i = 0; i < bytes; ++i) {
    unsigned v = rd() & 0xff;
    out.push_back(kHex[v >> 4]);
    out.push_back(kHex[v & 15]);
  }
  return out;
}

std::string Hostname() {
  char buf[256] = {0};
  ::gethostname(buf, sizeof buf - 1);
  return buf;
}

// The worker command line: a .py script or -m module through $PYTHON_EXEC -u, like torchrun;
// anything else (or --no-python) directly.
absl::StatusOr<std::vector<std::string>> WorkerArgv(const LaunchConfig& c, const Env& env) {
  std::string path = env.count("PATH") ? env.at("PATH") : "/usr/local/bin:/usr/bin:/bin";
  const bool python = c.module || (!c.no_python && absl::EndsWith(c.program, ".py"));
  std::vector<std::string> argv;
  if (python) {
    std::string py = env.count("PYTHON_EXEC") ? env.at("PYTHON_EXEC") : "python3";
    auto exe = ResolveExecutable(py, path);
    if (!exe.ok()) return absl::NotFoundError(absl::StrCat("PYTHON_EXEC: ", exe.status().message()));
    argv = {*exe, "-u"};
    if (c.module) {
      argv.push_back("-m");
    } else if (::access(c.program.c_str(), R_OK) != 0) {
      return absl::NotFoundError(absl::StrCat("script '", c.program, "' does not exist or is not readable"));
    }
    argv.push_back(c.program);
  } else {
    ASSIGN_OR_RETURN(std::string exe, ResolveExecutable(c.program, path));
    argv.push_back(exe);
  }
  argv.insert(argv.end(), c.args.begin(), c.args.end());
  return argv;
}

}  // namespace

int RunLaunch(const LaunchConfig& c, OrphanGuard* guard, SignalFd* signals) {
  if (c.max_nodes > 1) {
    return UsageError(absl::StrCat("--nnodes=", c.min_nodes == c.max_nodes ? std::to_string(c.max_nodes)
                                                                            : absl::StrCat(c.min_nodes, ":", c.max_nodes),
                                   ": multi-node runs are not supported yet; expected 1"));
  }
  const Env env = CurrentEnv();

  // GPUs.
  NvmlInventory nvml;
  std::string why_no_gpu;
  std::vector<GpuInfo> gpus = nvml.ListGpus(&why_no_gpu);
  GpuSelection sel;
  if (env.count("CUDA_VISIBLE_DEVICES")) sel.inherited_cuda_visible_devices = env.at("CUDA_VISIBLE_DEVICES");
  sel.gpus = c.gpus;
  sel.exclude = c.exclude_gpus;
  if (gpus.empty() && (!c.gpus.empty() || !c.exclude_gpus.empty())) {
    return UsageError(absl::StrCat(c.gpus.empty() ? "--exclude-gpus" : "--gpus", ": no GPU (", why_no_gpu, ")"));
  }
  auto pool = SelectGpuPool(gpus, sel);
  if (!pool.ok()) return UsageError(std::string(pool.status().message()));
  for (const auto& w : pool->warnings) spdlog::warn("{}", w);

  // Workers on this node.
  const int cpus = UsableCpuCount();
  int nproc = c.nproc;
  switch (c.nproc_kind) {
    case LaunchConfig::Nproc::kCount: break;
    case LaunchConfig::Nproc::kCpu: nproc = cpus; break;
    case LaunchConfig::Nproc::kGpu:
      if (pool->gpus.empty()) {
        return UsageError(absl::StrCat("--nproc-per-node=gpu: no GPU (",
                                       gpus.empty() ? why_no_gpu : "every GPU is excluded", ")"));
      }
      nproc = static_cast<int>(pool->gpus.size());
      break;
    case LaunchConfig::Nproc::kAuto:
      nproc = pool->gpus.empty() ? cpus : static_cast<int>(pool->gpus.size());
      break;
  }
  if (c.gpu_binding == GpuBinding::kIsolate && !pool->gpus.empty() &&
      static_cast<int>(pool->gpus.size()) < nproc) {
    return UsageError(absl::StrCat("--gpu-binding=isolate: ", nproc, " workers but ", pool->gpus.size(),
                                   " GPU(s) in the pool; expected at least one GPU per worker"));
  }

  auto argv = WorkerArgv(c, env);
  if (!argv.ok()) return UsageError(std::string(argv.status().message()));

  const std::string master_addr = c.master_addr.value_or("127.0.0.1");
  if (c.master_port && !c.dry_run) {
    auto in_use = PortInUse(master_addr, *c.master_port);
    if (!in_use.ok()) return UsageError(absl::StrCat("--master-addr=", master_addr, ": ", in_use.status().message()));
    if (*in_use) {
      return UsageError(absl::StrCat("--master-port=", *c.master_port, ": the port is already in use on ",
                                     master_addr, "; expected a free port (or omit the flag to get one)"));
    }
  }

  AgentOptions opts;
  opts.spec.local_world_size = nproc;
  opts.spec.role = c.role;
  opts.spec.run_id = c.rdzv_id.empty() ? RandomHex(8) : c.rdzv_id;
  opts.spec.max_restarts = c.max_restarts;
  opts.spec.gpu_pool = pool->tokens;
  opts.spec.gpu_pool_is_nvml_indices = pool->from_nvml_indices;
  opts.spec.gpu_binding = c.gpu_binding;
  opts.spec.cuda_alloc_conf = c.cuda_alloc_conf;
  opts.spec.threads_per_worker = c.threads_per_worker;
  opts.spec.usable_cpus = cpus;
  opts.spec.train = c.train;
  if (c.train) {
    // Fail now, not at the first round, when the batch cannot be split.
    auto scaled = ScaleTraining(*c.train, nproc);
    if (!scaled.ok()) return UsageError(std::string(scaled.status().message()));
  }
  opts.argv = *argv;
  opts.log_dir = c.log_dir;
  const bool redirecting = c.redirects.all || !c.redirects.per_rank.empty() || c.tee.all || !c.tee.per_rank.empty();
  if (opts.log_dir.empty() && redirecting && !c.dry_run) {
    // As torchrun: redirected output needs files somewhere; they are kept.
    std::string tmpl = (std::filesystem::temp_directory_path() / "launch-logs-XXXXXX").string();
    if (!::mkdtemp(tmpl.data())) return UsageError(absl::StrCat("cannot create ", tmpl));
    opts.log_dir = tmpl;
    spdlog::info("--redirects/--tee without --log-dir: logs go to {}", opts.log_dir);
  }
  if (!opts.log_dir.empty() && !c.dry_run) {
    std::error_code ec;
    std::filesystem::create_directories(opts.log_dir, ec);
    if (ec || ::access(opts.log_dir.c_str(), W_OK) != 0) {
      return UsageError(absl::StrCat("--log-dir=", opts.log_dir, ": cannot create or write it (",
                                     ec ? ec.message() : std::strerror(errno), ")"));
    }
  }
  opts.redirects = c.redirects;
  opts.tee = c.tee;
  opts.console_local_ranks = c.local_ranks_filter;
  opts.stop_timeout = std::chrono::milliseconds(static_cast<long>(c.stop_timeout * 1000));
  opts.restart_backoff = std::chrono::milliseconds(static_cast<long>(c.restart_backoff * 1000));
  opts.dry_run = c.dry_run;
  opts.master_addr = master_addr;
  opts.master_port = c.master_port;
  opts.node.set_hostname(Hostname());
  opts.node.set_node_id(absl::StrCat(opts.node.hostname(), ":", ::getpid(), ":", RandomHex(4)));
  opts.node.set_host_address(master_addr);
  opts.node.set_local_world_size(nproc);
  if (!opts.log_dir.empty() && !c.dry_run) {
    spdlog::info("run {}: logs in {}/{}", opts.spec.run_id, opts.log_dir, opts.spec.run_id);
  }

  // The same path as multi-node: a coordinator (here in-process on loopback) and this agent.
  SystemClock clock;
  RendezvousConfig rcfg;
  rcfg.min_nodes = rcfg.max_nodes = 1;
  rcfg.max_restarts = c.max_restarts;
  auto server = CoordinatorServer::Start("127.0.0.1:0", rcfg, &clock);
  if (!server.ok()) {
    spdlog::error("{}", std::string(server.status().message()));
    return 1;
  }
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kMaxRendezvousMessageBytes);
  args.SetMaxSendMessageSize(kMaxRendezvousMessageBytes);
  auto channel = grpc::CreateCustomChannel((*server)->address(), grpc::InsecureChannelCredentials(), args);
  GrpcCoordinatorClient client(channel, std::chrono::duration_cast<std::chrono::seconds>(rcfg.join_timeout));
  PosixProcessLauncher launcher;
  Agent agent(std::move(opts), &client, &launcher, guard, signals, &clock);
  return agent.Run();
}

}  // namespace launch
