#include "launcher/run.h"

#include <fcntl.h>
#include <poll.h>
#include <grpcpp/grpcpp.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <random>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "agent/agent.h"
#include "agent/cpus.h"
#include "agent/devices.h"
#include "common/limits.h"
#include "common/net.h"
#include "common/status_macros.h"
#include "launcher/coordinator.h"
#include "launcher/security.h"
#include "spdlog/spdlog.h"

namespace launch {
namespace {

constexpr int kUsageError = 2;

int UsageError(const std::string& message) {
  std::fprintf(stderr, "launch: %s\n", message.c_str());
  return kUsageError;
}

// What launch holds open per worker while it runs: the read ends of its stdout and stderr
// pipes, and its two log files when there are any; plus a margin for launch itself (gRPC, epoll,
// the signal and console descriptors) and for one spawn's pipes in flight.
constexpr long kOwnDescriptors = 64;
long DescriptorsNeeded(int nproc, bool log_files) { return kOwnDescriptors + nproc * (log_files ? 4L : 2L); }

// A plan that cannot have its descriptors started about 10,000 workers of 12,000 before it failed
// (and said "nothing started"): it is refused before anything starts.
absl::Status CheckDescriptorBudget(int nproc, bool log_files) {
  rlimit lim{};
  if (::getrlimit(RLIMIT_NOFILE, &lim) != 0 || lim.rlim_cur == RLIM_INFINITY) return absl::OkStatus();
  const long need = DescriptorsNeeded(nproc, log_files);
  if (need <= static_cast<long>(lim.rlim_cur)) return absl::OkStatus();
  const long fit = std::max(0L, (static_cast<long>(lim.rlim_cur) - kOwnDescriptors) / (log_files ? 4 : 2));
  return absl::InvalidArgumentError(absl::StrCat(
      "--nproc-per-node=", nproc, ": ", nproc, " workers", log_files ? " with log files" : "", " need about ", need,
      " open files, and the limit is ", lim.rlim_cur, " (ulimit -n; the hard limit is ",
      lim.rlim_max == RLIM_INFINITY ? std::string("unlimited") : std::to_string(lim.rlim_max), "); expected at most ",
      fit, " workers, or a higher limit"));
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
    auto exe = ResolveExecutable(c.program, path);
    struct stat st;
    if (!exe.ok() && !c.no_python && ::stat(c.program.c_str(), &st) == 0 && S_ISREG(st.st_mode) &&
        ::access(c.program.c_str(), X_OK) != 0) {
      // torchrun runs every program through Python unless --no-python; launch runs .py files (and
      // -m) through it and everything else directly, so a script without .py needs one more word.
      return absl::InvalidArgumentError(absl::StrCat(
          "program '", c.program, "' is a file that is not executable", c.program.find('/') == std::string::npos ? " and not on PATH" : "",
          ": launch runs only .py scripts and -m modules through Python (torchrun would run it with python); "
          "name it ", c.program, ".py, chmod +x it, or give the interpreter: launch ... python3 -u ", c.program));
    }
    if (!exe.ok()) return exe.status();
    argv.push_back(*exe);
  }
  argv.insert(argv.end(), c.args.begin(), c.args.end());
  return argv;
}

// This node's address as the other nodes reach it.
absl::StatusOr<std::string> NodeAddress(const LaunchConfig& c) {
  std::string addr = c.local_addr;
  std::string endpoint_host;
  if (!c.rdzv_endpoint.empty()) {
    auto hp = ParseHostPort(c.rdzv_endpoint, "--rdzv-endpoint");
    if (hp.ok()) endpoint_host = hp->host;
  }
  if (addr.empty() && !endpoint_host.empty()) {
    // A coordinator on loopback means the whole job is on this machine.
    auto loop = IsLoopbackHost(endpoint_host);
    if (loop.ok() && *loop) addr = endpoint_host.find(':') != std::string::npos ? "::1" : "127.0.0.1";
  }
  if (addr.empty()) {
    auto guess = DefaultHostAddress();
    if (!guess.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("cannot tell this node's address (", guess.status().message(),
                                                     "); give --local-addr"));
    }
    addr = *guess;
  } else if (auto ips = ResolveHost(addr); !ips.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--local-addr=", addr, ": ", ips.status().message()));
  }
  // A loopback address is fine when the whole job is on this machine (the endpoint is loopback).
  std::string peer = c.rdzv_backend == "static" ? c.master_addr.value_or("") : "";
  if (peer.empty() && !c.rdzv_endpoint.empty()) {
    auto hp = ParseHostPort(c.rdzv_endpoint, "--rdzv-endpoint");
    if (hp.ok()) peer = hp->host;
  }
  auto self_loop = IsLoopbackHost(addr);
  auto peer_loop = peer.empty() ? absl::StatusOr<bool>(false) : IsLoopbackHost(peer);
  if (self_loop.ok() && *self_loop && !(peer_loop.ok() && *peer_loop)) {
    return absl::InvalidArgumentError(absl::StrCat(
        c.local_addr.empty() ? "this host's name" : "--local-addr=" + c.local_addr, " resolves to loopback ", addr,
        ", which other nodes cannot reach; expected --local-addr=<this node's IP or name on the cluster network>"));
  }
  return addr;
}

RendezvousConfig RendezvousSettings(const LaunchConfig& c, bool multi) {
  auto ms = [](double s) { return SecondsToMs(s); };
  RendezvousConfig r;
  r.min_nodes = multi ? c.min_nodes : 1;
  r.max_nodes = multi ? c.max_nodes : 1;
  r.max_restarts = c.max_restarts;
  r.join_timeout = ms(c.rdzv.join_timeout);
  r.last_call_timeout = ms(c.rdzv.last_call_timeout);
  r.close_timeout = ms(c.rdzv.close_timeout);
  // A single node's coordinator lives in its agent: the agent cannot be lost while it runs, so
  // its lease never expires (SIGSTOP/SIGCONT of launch, or a paused VM, restarted healthy workers).
  r.heartbeat_timeout = multi ? ms(c.rdzv.heartbeat_timeout) : ms(kMaxSeconds);
  return r;
}

// The coordinator this agent talks to, and the server when this agent hosts it.
struct RendezvousLink {
  std::unique_ptr<CoordinatorServer> server;
  std::unique_ptr<GrpcCoordinatorClient> client;
};

absl::StatusOr<std::unique_ptr<GrpcCoordinatorClient>> MakeClient(const std::string& target,
                                                                   const SecurityOptions& security,
                                                                   const RendezvousConfig& rcfg) {
  ASSIGN_OR_RETURN(auto creds, MakeChannelCredentials(security));
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kMaxRendezvousMessageBytes);
  args.SetMaxSendMessageSize(kMaxRendezvousMessageBytes);
  // Reconnect quickly to a coordinator that comes back (gRPC's default backoff grows to 120 s).
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  // A Watch stream only sends: pings find a coordinator that vanished without closing the
  // connection (a cut link), so the agent says so and reconnects when it comes back.
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 5000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 3000);
  args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);  // tiny messages: no bandwidth probing pings
  auto channel = grpc::CreateCustomChannel(target, creds, args);
  return std::make_unique<GrpcCoordinatorClient>(channel, target, security.token, rcfg.join_timeout);
}

// A single node's coordinator serves its own agent only: on loopback any local user could reach
// it (one forged heartbeat took a training job's launch to 3 GB and restarted its workers), so
// every call needs a random token that only this process knows.
absl::StatusOr<RendezvousLink> ConnectInProcess(const RendezvousConfig& rcfg, const Clock* clock) {
  RendezvousLink link;
  CoordinatorOptions copts;
  copts.defaults = rcfg;
  SecurityOptions own;
  own.token = RandomHex(32);
  ASSIGN_OR_RETURN(link.server, CoordinatorServer::Start("127.0.0.1:0", copts, own, clock));
  ASSIGN_OR_RETURN(link.client, MakeClient(link.server->address(), own, rcfg));
  return link;
}

absl::StatusOr<RendezvousLink> ConnectToRendezvous(const LaunchConfig& c, const RendezvousConfig& rcfg,
                                                  const SecurityOptions& security, const Clock* clock) {
  ASSIGN_OR_RETURN(HostPort hp, ParseHostPort(c.rdzv_endpoint, "--rdzv-endpoint"));
  const std::string endpoint = JoinHostPort(hp.host, hp.port.value_or(kDefaultRendezvousPort));
  bool host = false;
  if (c.rdzv.is_host) {
    host = *c.rdzv.is_host;
  } else {
    auto local = IsLocalHost(hp.host);
    if (!local.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--rdzv-endpoint=", c.rdzv_endpoint, ": ", local.status().message()));
    }
    host = *local;
  }
  RendezvousLink link;
  if (host) {
    RETURN_IF_ERROR(CheckListenerIsProtected(hp.host, security));
    CoordinatorOptions copts;
    copts.defaults = rcfg;
    auto server = CoordinatorServer::Start(endpoint, copts, security, clock);
    if (server.ok()) {
      spdlog::info("hosting the rendezvous coordinator at {}", (*server)->address());
      link.server = std::move(*server);
    } else if (absl::IsAlreadyExists(server.status()) && !c.rdzv.is_host) {
      // Another agent on this machine hosts it (as torchrun: the first to bind wins).
      spdlog::info("{}: joining the coordinator there", std::string(server.status().message()));
    } else {
      return absl::UnavailableError(absl::StrCat("cannot host the coordinator at ", endpoint, ": ",
                                                 server.status().message()));
    }
  }
  ASSIGN_OR_RETURN(link.client, MakeClient(endpoint, security, rcfg));
  return link;
}

// The security flags of `launch` or `launch coordinator`, with the token read from its file or
// LAUNCH_RDZV_TOKEN.
template <typename Config>
absl::StatusOr<SecurityOptions> SecurityFrom(const Config& c) {
  SecurityOptions s;
  ASSIGN_OR_RETURN(s.token, LoadToken(c.rdzv_token_file, std::getenv("LAUNCH_RDZV_TOKEN")));
  s.tls_cert_file = c.tls_cert;
  s.tls_key_file = c.tls_key;
  s.tls_ca_file = c.tls_ca;
  s.insecure = c.insecure;
  RETURN_IF_ERROR(CheckSecurityFiles(s));
  return s;
}

}  // namespace

int RunCoordinator(const CoordinatorConfig& c, SignalFd* signals) {
  auto loaded = SecurityFrom(c);
  if (!loaded.ok()) return UsageError(std::string(loaded.status().message()));
  const SecurityOptions& security = *loaded;
  auto hp = ParseHostPort(c.listen, "--listen");
  if (!hp.ok()) return UsageError(std::string(hp.status().message()));
  if (auto st = CheckListenerIsProtected(hp->host, security); !st.ok()) return UsageError(std::string(st.message()));
  SystemClock clock;
  auto server = CoordinatorServer::Start(c.listen, CoordinatorOptions{}, security, &clock);
  if (!server.ok()) {
    if (absl::IsInvalidArgument(server.status())) return UsageError(std::string(server.status().message()));
    std::fprintf(stderr, "launch coordinator: %s\n", std::string(server.status().message()).c_str());
    return 1;
  }
  std::printf("launch coordinator: listening on %s%s%s\n", (*server)->address().c_str(),
              security.tls() ? " (TLS)" : "", security.token.empty() ? "" : " (token required)");
  std::fflush(stdout);
  for (;;) {
    pollfd p{signals->fd(), POLLIN, 0};
    ::poll(&p, 1, -1);
    while (int sig = signals->Read()) {
      if (sig == SIGCHLD) continue;
      spdlog::info("stopped by {}", SignalName(sig));
      server->reset();
      return 128 + sig;
    }
  }
}

int RunLaunch(const LaunchConfig& c, OrphanGuard* guard, SignalFd* signals) {
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
  const bool redirecting_files = c.redirects.all || !c.redirects.per_rank.empty() || c.tee.all ||
                                 !c.tee.per_rank.empty();
  if (!c.dry_run) {
    if (auto st = CheckDescriptorBudget(nproc, !c.log_dir.empty() || redirecting_files); !st.ok()) {
      return UsageError(std::string(st.message()));
    }
  }

  // Topology: one node with its coordinator in-process, a multi-node rendezvous, or static ranks.
  const bool is_static = c.rdzv_backend == "static" && c.max_nodes > 1;
  const bool multi = !is_static && !c.standalone && (c.max_nodes > 1 || !c.rdzv_endpoint.empty());
  if (multi && c.rdzv_endpoint.empty()) {
    return UsageError(absl::StrCat("--nnodes=", c.min_nodes == c.max_nodes ? std::to_string(c.max_nodes)
                                                                            : absl::StrCat(c.min_nodes, ":", c.max_nodes),
                                   ": a multi-node run needs --rdzv-endpoint=HOST[:PORT] (the coordinator)"));
  }
  std::string node_addr = "127.0.0.1";
  if (multi || is_static) {
    auto addr = NodeAddress(c);
    if (!addr.ok()) return UsageError(std::string(addr.status().message()));
    node_addr = *addr;
  }
  const std::string master_addr = c.master_addr.value_or(multi ? node_addr : "127.0.0.1");
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
  // Every node of a job must name the same run: torchrun's default id when none is given.
  opts.spec.run_id = !c.rdzv_id.empty() ? c.rdzv_id : (multi || is_static) ? "none" : RandomHex(8);
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
  opts.stop_timeout = SecondsToMs(c.stop_timeout);
  opts.restart_backoff = SecondsToMs(c.restart_backoff);
  opts.dry_run = c.dry_run;
  opts.master_addr = master_addr;
  opts.master_port = c.master_port;
  opts.node.set_hostname(Hostname());
  // "<host>:<pid>:<hex>", its host part cut so that the id fits kMaxNodeIdLength.
  opts.node.set_node_id(
      absl::StrCat(opts.node.hostname().substr(0, kMaxNodeIdLength - 32), ":", ::getpid(), ":", RandomHex(4)));
  opts.node.set_host_address(node_addr);
  opts.node.set_local_world_size(nproc);
  RendezvousConfig rcfg = RendezvousSettings(c, multi);
  opts.run_spec = rcfg.ToSpec();
  opts.heartbeat_interval = SecondsToMs(c.rdzv.heartbeat_interval);
  opts.coordinator_patience = SecondsToMs(c.rdzv.close_timeout);
  if (is_static) {
    if (!c.master_addr) {
      return UsageError("--rdzv-backend=static: --master-addr is needed (the address of node rank 0)");
    }
    StaticTopology t;
    t.group_rank = c.node_rank;
    t.group_world_size = c.max_nodes;
    t.master_addr = *c.master_addr;
    t.master_port = c.master_port.value_or(29500);
    opts.static_topology = t;
  }

  auto loaded = SecurityFrom(c);
  if (!loaded.ok()) return UsageError(std::string(loaded.status().message()));
  const SecurityOptions& security = *loaded;

  SystemClock clock;
  auto link = multi ? ConnectToRendezvous(c, rcfg, security, &clock)
                    : ConnectInProcess(rcfg, &clock);
  if (!link.ok()) {
    if (absl::IsInvalidArgument(link.status()) || absl::IsFailedPrecondition(link.status())) {
      return UsageError(std::string(link.status().message()));
    }
    spdlog::error("{}", std::string(link.status().message()));
    return 1;
  }
  // The other nodes learn that this agent hosts the coordinator: when it is gone, so is the job.
  if (multi && link->server) opts.node.set_hosts_coordinator(true);
  PosixProcessLauncher launcher;
  Agent agent(std::move(opts), link->client.get(), &launcher, guard, signals, &clock);
  int code = agent.Run();
  if (link->server && multi) {
    // The job's coordinator lives in this agent: stay until every node has its verdict.
    if (!link->server->service()->WaitUntilEveryNodeKnowsTheEnd(rcfg.close_timeout)) {
      spdlog::warn("leaving before every node learned the job's end (close_timeout {} s)",
                   rcfg.close_timeout.count() / 1000.0);
    }
  }
  return code;
}

}  // namespace launch
