#include "launcher/run.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <grpcpp/grpcpp.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "agent/agent.h"
#include "probes/cpus.h"
#include "probes/devices.h"
#include "common/exit_status.h"
#include "rendezvous/grpc_wire.h"
#include "common/launch_env.h"
#include "common/limits.h"
#include "common/net.h"
#include "common/status_macros.h"
#include "common/tunables.h"
#include "rendezvous/coordinator.h"
#include "rendezvous/failover_coordinator_client.h"
#include "rendezvous/grpc_coordinator_client.h"
#ifdef LAUNCH_WITH_ETCD
#include "rendezvous/coordinator_replica.h"
#endif
#include "doctor/doctor.h"
#include "doctor/doctor_facts.h"
#include "common/unique_fd.h"
#include "rendezvous/local_coordinator.h"
#include "rendezvous/local_token.h"
#include "launcher/plan.h"
#include "rendezvous/security.h"
#include "launcher/metrics_server.h"
#include "launcher/metrics_text.h"
#include "launcher/status_view.h"
#include "google/protobuf/util/json_util.h"
#include "spdlog/spdlog.h"

namespace launch {
namespace {

int UsageError(const std::string& message) {
  std::fprintf(stderr, "launch: %s\n", message.c_str());
  return ExitStatus(LaunchOutcome::UsageError());
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

// launch_progress.py next to this binary as installed, or as the build tree lays it out:
// <bin>/../share/launch/python.
std::string PythonModuleDir() {
  std::error_code ec;
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return "";
  const std::filesystem::path dir = exe.parent_path().parent_path() / "share" / "launch" / "python";
  return std::filesystem::exists(dir / "launch_progress.py", ec) ? dir.lexically_normal().string() : "";
}

std::string Hostname() {
  char buf[256] = {0};
  ::gethostname(buf, sizeof buf - 1);
  return buf;
}

// The plan's questions, answered by this machine.
class SystemHostQueries : public HostQueries {
 public:
  absl::StatusOr<std::string> ResolveExecutable(const std::string& program, const std::string& path_env) override {
    return launch::ResolveExecutable(program, path_env);
  }
  FileFacts File(const std::string& path) override {
    FileFacts f;
    struct stat st;
    f.regular = ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
    f.readable = ::access(path.c_str(), R_OK) == 0;
    f.executable = ::access(path.c_str(), X_OK) == 0;
    if (f.regular && f.readable) {
      UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));
      char head[4] = {};
      const ssize_t n = fd.valid() ? ::read(fd.get(), head, sizeof head) : -1;
      f.native = (n >= 2 && head[0] == '#' && head[1] == '!') || (n == 4 && std::memcmp(head,
                                                                                        "\x7f"
                                                                                        "ELF",
                                                                                        4) == 0);
    }
    return f;
  }
  absl::StatusOr<std::string> DefaultHostAddress() override { return launch::DefaultHostAddress(); }
  absl::StatusOr<std::vector<std::string>> ResolveHost(const std::string& host) override {
    return launch::ResolveHost(host);
  }
  absl::StatusOr<bool> IsLoopbackHost(const std::string& host) override { return launch::IsLoopbackHost(host); }
  absl::StatusOr<bool> IsLocalHost(const std::string& host) override { return launch::IsLocalHost(host); }
  absl::StatusOr<bool> PortInUse(const std::string& host, int port) override { return launch::PortInUse(host, port); }
  std::string RandomHex(int bytes) override { return launch::RandomHex(bytes); }
  bool DeclaresWarmStart(const std::string& executable) override { return launch::DeclaresWarmStart(executable); }
  // find_spec looks torch up without importing it: one interpreter start.
  absl::StatusOr<bool> PythonFindsTorch(const std::string& python, const Env& env) override {
    auto run = RunCaptured({python, "-c",
                            "import importlib.util, sys; sys.exit(0 if importlib.util.find_spec('torch') else 3)"},
                           env, std::chrono::seconds(10), nullptr);
    if (!run.ok()) return run.status();
    if (run->timed_out || !WIFEXITED(run->status)) return absl::UnavailableError(python + " did not answer");
    return WEXITSTATUS(run->status) != 3;
  }
};

// `topology`: read the CPUs' and GPUs' NUMA placement (--numa-binding), from LAUNCH_SYSFS_ROOT
// (default /sys; the tests give fake machines).
HostFacts GatherHostFacts(HostQueries* queries, bool topology) {
  HostFacts h;
  h.env = CurrentEnv();
  NvmlInventory nvml(NvmlLibraryFromEnv());
  h.gpus = nvml.ListGpus(&h.why_no_gpu);
  h.usable_cpus = UsableCpuCount();
  if (topology) {
    const auto root = h.env.find(kSysfsRootEnv);
    const std::string sysfs = root != h.env.end() && !root->second.empty() ? root->second : "/sys";
    std::vector<int> allowed;
    cpu_set_t set;
    CPU_ZERO(&set);
    if (::sched_getaffinity(0, sizeof set, &set) == 0) {
      for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu)
        if (CPU_ISSET(cpu, &set)) allowed.push_back(cpu);
    }
    h.cpu_topology = ReadCpuTopology(sysfs, allowed);
    for (GpuInfo& g : h.gpus) g.numa_node = PciNumaNode(sysfs, SysfsPciAddress(g.pci_bus_id)).value_or(-1);
  }
  h.hostname = Hostname();
  h.python_dir = PythonModuleDir();
  h.pid = static_cast<int>(::getpid());
  rlimit lim{};
  if (::getrlimit(RLIMIT_NOFILE, &lim) == 0) {
    if (lim.rlim_cur != RLIM_INFINITY) h.open_files_soft = static_cast<long>(lim.rlim_cur);
    if (lim.rlim_max != RLIM_INFINITY) h.open_files_hard = static_cast<long>(lim.rlim_max);
  }
  h.queries = queries;
  return h;
}

// The coordinator this agent talks to, and the server when this agent hosts it.
struct RendezvousLink {
  std::unique_ptr<CoordinatorServer> server;
  std::unique_ptr<CoordinatorClient> client;
};

absl::StatusOr<std::unique_ptr<GrpcCoordinatorClient>> MakeClient(const std::string& target,
                                                                  const SecurityOptions& security,
                                                                  const RendezvousConfig& rcfg,
                                                                  const std::string& tls_name = "") {
  ASSIGN_OR_RETURN(auto creds, MakeChannelCredentials(security));
  grpc::ChannelArguments args;
  // A replica reached by one of its name's addresses is still checked against that name.
  if (!tls_name.empty() && security.tls()) args.SetSslTargetNameOverride(tls_name);
  args.SetMaxReceiveMessageSize(kMaxRendezvousMessageBytes);
  args.SetMaxSendMessageSize(kMaxRendezvousMessageBytes);
  // Reconnect quickly to a coordinator that comes back (gRPC's default backoff grows to 120 s).
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, static_cast<int>(kReconnectFirstBackoff.count()));
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, static_cast<int>(kReconnectFirstBackoff.count()));
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, static_cast<int>(kReconnectMaxBackoff.count()));
  // A Watch stream only sends: pings find a coordinator that vanished without closing the
  // connection (a cut link), so the agent says so and reconnects when it comes back.
  ApplyKeepalive(&args);
  auto channel = grpc::CreateCustomChannel(target, creds, args);
  auto client = std::make_unique<GrpcCoordinatorClient>(channel, target, security.token, rcfg.join_timeout);
  if (auto hp = ParseHostPort(target, "--rdzv-endpoint");
      hp.ok() && TakesLocalToken(hp->host, security.token, security.tls(), security.insecure)) {
    client->UseLocalToken(hp->port.value_or(kDefaultRendezvousPort));
  }
  return client;
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

// The replicas an agent follows: every endpoint of --rdzv-endpoint h1:p,h2:p,..., or every address
// of a name that resolves to several (plan.cc, NameReplicas); none: one coordinator.
std::vector<std::pair<std::string, std::string>> ReplicaTargets(const LaunchPlan& plan) {
  std::vector<std::pair<std::string, std::string>> out;  // (target, the name TLS checks)
  for (const std::string& e : plan.rdzv_replicas) {
    auto hp = ParseHostPort(e, "--rdzv-endpoint");
    out.emplace_back(e, !plan.rdzv_replicas_name.empty() ? plan.rdzv_replicas_name : hp.ok() ? hp->host : "");
  }
  return out;
}

absl::StatusOr<std::unique_ptr<CoordinatorClient>> MakeReplicasClient(const LaunchPlan& plan,
                                                                      const SecurityOptions& security) {
  auto replicas = ReplicaTargets(plan);
  if (replicas.empty()) {
    ASSIGN_OR_RETURN(auto one, MakeClient(plan.rdzv_endpoint, security, plan.rendezvous));
    return std::unique_ptr<CoordinatorClient>(std::move(one));
  }
  std::vector<std::unique_ptr<CoordinatorClient>> clients;
  for (const auto& [target, name] : replicas) {
    ASSIGN_OR_RETURN(auto c, MakeClient(target, security, plan.rendezvous, name));
    c->set_wait_for_ready(false);  // a replica that is down: the next one is tried
    clients.push_back(std::move(c));
  }
  auto failover = std::make_unique<FailoverCoordinatorClient>(std::move(clients));
  spdlog::info("rendezvous through the coordinator replicas at {}", failover->targets());
  return std::unique_ptr<CoordinatorClient>(std::move(failover));
}

absl::StatusOr<RendezvousLink> ConnectToRendezvous(const LaunchPlan& plan, const SecurityOptions& security,
                                                   const Clock* clock) {
  RendezvousLink link;
  if (plan.coordinator == CoordinatorRole::kHost || plan.coordinator == CoordinatorRole::kHostUnlessTaken) {
    RETURN_IF_ERROR(CheckListenerIsProtected(plan.rdzv_host, security));
    CoordinatorOptions copts;
    copts.defaults = plan.rendezvous;
    auto server = CoordinatorServer::Start(plan.rdzv_endpoint, copts, security, clock);
    if (server.ok()) {
      spdlog::info("hosting the rendezvous coordinator at {}", (*server)->address());
      link.server = std::move(*server);
    } else if (absl::IsAlreadyExists(server.status()) && plan.coordinator == CoordinatorRole::kHostUnlessTaken) {
      // Another agent on this machine hosts it (as torchrun: the first to bind wins).
      spdlog::info("{}: joining the coordinator there", std::string(server.status().message()));
    } else {
      return absl::UnavailableError(
          absl::StrCat("cannot host the coordinator at ", plan.rdzv_endpoint, ": ", server.status().message()));
    }
  }
  if (link.server && plan.rdzv_endpoint == JoinHostPort(plan.rdzv_host, 0)) {
    // Hosted on port 0: the agent joins the port it got.
    LaunchPlan hosted = plan;
    hosted.rdzv_endpoint = JoinHostPort(plan.rdzv_host, link.server->port());
    ASSIGN_OR_RETURN(link.client, MakeReplicasClient(hosted, security));
    return link;
  }
  ASSIGN_OR_RETURN(link.client, MakeReplicasClient(plan, security));
  return link;
}

// The security flags of `launch` or `launch coordinator`, with the token read from its file or
// LAUNCH_RDZV_TOKEN.
template <typename Config>
absl::StatusOr<SecurityOptions> SecurityFrom(const Config& c) {
  SecurityOptions s;
  ASSIGN_OR_RETURN(s.token, LoadToken(c.rdzv_token_file, std::getenv(kRdzvTokenEnv)));
  s.tls_cert_file = c.tls_cert;
  s.tls_key_file = c.tls_key;
  s.tls_ca_file = c.tls_ca;
  s.insecure = c.insecure;
  RETURN_IF_ERROR(CheckSecurityFiles(s));
  return s;
}

absl::StatusOr<std::unique_ptr<MetricsServer>> ServeMetrics(CoordinatorService* service, const std::string& host,
                                                            int port, const SecurityOptions& security) {
  MetricsServer::Options mo;
  mo.host = host;
  mo.port = port;
  mo.token = security.token;
  mo.tls_cert_file = security.tls_cert_file;
  mo.tls_key_file = security.tls_key_file;
  mo.render = [service] {
    auto replica = service->Replica();
    return PrometheusText(service->AllStatus(), replica ? &*replica : nullptr);
  };
  return MetricsServer::Start(std::move(mo));
}

// `launch coordinator --state etcd://...`: this coordinator as one of several replicas (nullptr
// without --state).
absl::StatusOr<std::unique_ptr<RunStore>> StartReplica(const CoordinatorConfig& c, const SecurityOptions& security,
                                                       const std::string& listen_host, CoordinatorServer* server) {
  if (c.state.empty()) return nullptr;
#ifdef LAUNCH_WITH_ETCD
  ASSIGN_OR_RETURN(EtcdOptions etcd, ParseEtcdUrl(c.state));
  etcd.ca_file = c.etcd_ca;
  etcd.cert_file = c.etcd_cert;
  etcd.key_file = c.etcd_key;
  if (absl::StartsWith(c.state, "etcds://") && etcd.ca_file.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("--state ", c.state, ": etcds:// needs --etcd-cacert"));
  }
  ReplicaOptions ro;
  ro.etcd = std::move(etcd);
  ro.lease_ttl = std::chrono::seconds(c.leader_lease);
  ro.security = security;
  ro.advertise = c.advertise;
  if (ro.advertise.empty()) {
    std::string host = listen_host;
    if (host.empty() || host == "0.0.0.0" || host == "::") {
      char name[256] = {};
      host = ::gethostname(name, sizeof name - 1) == 0 ? name : "localhost";
    }
    ro.advertise = JoinHostPort(host, server->port());
  }
  ASSIGN_OR_RETURN(auto replica, CoordinatorReplica::Start(std::move(ro), server->service()));
  return std::unique_ptr<RunStore>(std::move(replica));
#else
  (void)security;
  (void)listen_host;
  (void)server;
  return absl::InvalidArgumentError(
      absl::StrCat("--state ", c.state,
                   ": this launch was built without etcd support (install golang-etcd-server-dev and rebuild)"));
#endif
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
    return ExitStatus(LaunchOutcome::LaunchError());
  }
  auto replica = StartReplica(c, security, hp->host, server->get());
  if (!replica.ok()) {
    if (absl::IsInvalidArgument(replica.status())) return UsageError(std::string(replica.status().message()));
    std::fprintf(stderr, "launch coordinator: %s\n", std::string(replica.status().message()).c_str());
    return ExitStatus(LaunchOutcome::LaunchError());
  }
  std::unique_ptr<MetricsServer> metrics;
  if (c.metrics_port) {
    auto served = ServeMetrics((*server)->service(), hp->host, *c.metrics_port, security);
    if (!served.ok()) return UsageError(std::string(served.status().message()));
    metrics = std::move(*served);
  }
  const std::string owner_only = (*server)->local_token_path();
  std::printf("launch coordinator: listening on %s%s%s%s\n", (*server)->address().c_str(),
              security.tls() ? " (TLS)" : "",
              !security.token.empty() ? " (token required)"
              : owner_only.empty()    ? ""
                                      : absl::StrCat(" (this user's only: token in ", owner_only, ")").c_str(),
              c.state.empty() ? "" : " (a replica; state in etcd)");
  std::fflush(stdout);
  for (;;) {
    pollfd p{signals->fd(), POLLIN, 0};
    ::poll(&p, 1, -1);
    while (int sig = signals->Read()) {
      if (sig == SIGCHLD) continue;
      spdlog::info("stopped by {}", SignalName(sig));
      replica->reset();  // a leader gives its leadership up first: a standby leads at once
      server->reset();
      return ExitStatus(LaunchOutcome::Signalled(sig));
    }
  }
}

int RunStatus(const StatusConfig& c, SignalFd* signals) {
  auto loaded = SecurityFrom(c);
  if (!loaded.ok()) return UsageError(std::string(loaded.status().message()));
  auto hp = ParseHostPort(c.rdzv_endpoint, "--rdzv-endpoint");
  if (!hp.ok()) return UsageError(std::string(hp.status().message()));
  const std::string target = JoinHostPort(hp->host, hp->port.value_or(kDefaultRendezvousPort));
  auto creds = MakeChannelCredentials(*loaded);
  if (!creds.ok()) return UsageError(std::string(creds.status().message()));
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kGrpcReceiveLimitBytes);
  auto stub = v1::Rendezvous::NewStub(grpc::CreateCustomChannel(target, *creds, args));
  const bool tty = ::isatty(STDOUT_FILENO);
  for (;;) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + kStatusDeadline);
    const std::string token = TakesLocalToken(hp->host, loaded->token, loaded->tls(), loaded->insecure)
                                  ? ReadLocalToken(
                                        hp->port.value_or(kDefaultRendezvousPort))  // an owner-only coordinator's
                                  : loaded->token;
    if (!token.empty()) ctx.AddMetadata(kTokenMetadataKey, token);
    v1::StatusRequest req;
    req.set_run_id(c.rdzv_id);
    v1::StatusResponse resp;
    if (grpc::Status st = stub->Status(&ctx, req, &resp); !st.ok()) {
      std::fprintf(stderr, "launch status: %s\n",
                   std::string(FromGrpc(st, absl::StrCat("coordinator at ", target)).message()).c_str());
      return ExitStatus(LaunchOutcome::LaunchError());
    }
    std::string screen;
    if (c.json) {
      google::protobuf::util::JsonPrintOptions o;
      o.preserve_proto_field_names = true;
      (void)google::protobuf::util::MessageToJsonString(resp, &screen, o);
      screen += '\n';
    } else {
      screen = RenderStatus(resp);
      if (c.watch && tty) screen = absl::StrCat("\033[H\033[2J", screen);  // the screen redrawn in place
      else if (c.watch) screen += '\n';
    }
    std::fwrite(screen.data(), 1, screen.size(), stdout);
    std::fflush(stdout);
    if (!c.watch || resp.state() == "succeeded" || resp.state() == "failed") {
      return ExitStatus(LaunchOutcome::Succeeded());
    }
    pollfd p{signals->fd(), POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(c.interval * 1000)) > 0) {
      while (int sig = signals->Read()) {
        if (sig != SIGCHLD) return ExitStatus(LaunchOutcome::Signalled(sig));
      }
    }
  }
}

int RunDoctor(const DoctorConfig& c, SignalFd* signals) {
  DoctorRequest request;
  request.nproc = c.nproc;
  request.exclude_gpus = c.exclude_gpus;
  request.log_dir = c.log_dir;
  request.checkpoint_dir = c.checkpoint_dir;
  SystemDoctorProbe probe(signals);
  const int code = DoctorCommand(request, c.json, &probe, stdout);
  return probe.stopped_by() != 0 ? ExitStatus(LaunchOutcome::Signalled(probe.stopped_by())) : code;
}

int RunLaunch(const LaunchConfig& c, OrphanGuard* guard, SignalFd* signals) {
  SystemHostQueries queries;
  auto planned = PlanLaunch(c, GatherHostFacts(&queries, c.numa_binding != NumaBinding::kNone));
  if (!planned.ok()) return UsageError(std::string(planned.status().message()));
  LaunchPlan& plan = *planned;
  for (const auto& w : plan.warnings) spdlog::warn("{}", w);
  if (c.preflight) {
    // The plan's own values: its workers, threads, GPUs, descriptors, and the torch they use.
    DoctorRequest request;
    request.nproc = plan.agent.spec.local_world_size;
    request.threads_per_worker = c.threads_per_worker;
    request.gpu_pool = plan.gpu_pool_indices;
    request.descriptors_needed = plan.descriptors_needed;
    request.log_dir = plan.agent.log_dir;
    request.check_python = !plan.python.empty();
    request.check_libtorch = plan.python.empty();
    request.python = plan.python;
    SystemDoctorProbe probe(signals);
    const int code = Preflight(request, &probe, stderr);
    if (probe.stopped_by() != 0) return ExitStatus(LaunchOutcome::Signalled(probe.stopped_by()));
    if (code == kUsageErrorExitCode) return ExitStatus(LaunchOutcome::UsageError());
  }

  if (c.dry_run) {
    std::fputs(DescribePlan(c, plan).c_str(), stdout);
    std::fflush(stdout);
  }
  AgentOptions opts = std::move(plan.agent);
  if (plan.make_temp_log_dir) {
    // As torchrun: redirected output needs files somewhere; they are kept.
    std::string tmpl = (std::filesystem::temp_directory_path() / "launch-logs-XXXXXX").string();
    if (!::mkdtemp(tmpl.data())) return UsageError(absl::StrCat("cannot create ", tmpl));
    opts.log_dir = tmpl;
    spdlog::info("--redirects, --tee or --duplicate-*-filters without --log-dir: logs go to {}", opts.log_dir);
  }
  if (plan.ensure_log_dir) {
    std::error_code ec;
    std::filesystem::create_directories(opts.log_dir, ec);
    if (ec || ::access(opts.log_dir.c_str(), W_OK) != 0) {
      return UsageError(absl::StrCat("--log-dir=", opts.log_dir, ": cannot create or write it (",
                                     ec ? ec.message() : std::strerror(errno), ")"));
    }
  }

  auto loaded = SecurityFrom(c);
  if (!loaded.ok()) return UsageError(std::string(loaded.status().message()));
  const SecurityOptions& security = *loaded;

  const bool multi = plan.topology == Topology::kMultiNode && !plan.dry_run_without_rendezvous;
  SystemClock clock;
  absl::StatusOr<RendezvousLink> link;
  if (multi) {
    link = ConnectToRendezvous(plan, security, &clock);
  } else if (c.metrics_port) {
    link = ConnectInProcess(plan.rendezvous, &clock);  // the metrics endpoint serves its status
  } else {
    // A single node's rendezvous needs no server: no socket, no gRPC threads (see local_coordinator.h).
    link = RendezvousLink{nullptr, std::make_unique<LocalCoordinator>(plan.rendezvous, &clock)};
  }
  if (!link.ok()) {
    if (absl::IsInvalidArgument(link.status()) || absl::IsFailedPrecondition(link.status())) {
      return UsageError(std::string(link.status().message()));
    }
    spdlog::error("{}", std::string(link.status().message()));
    return ExitStatus(LaunchOutcome::LaunchError());
  }
  std::unique_ptr<MetricsServer> metrics;
  if (c.metrics_port && !link->server) {
    spdlog::warn("--metrics-port: the coordinator is not on this node; its metrics are served where it runs");
  } else if (c.metrics_port) {
    auto served = ServeMetrics(link->server->service(), multi ? plan.rdzv_host : "127.0.0.1", *c.metrics_port,
                               security);
    if (!served.ok()) return UsageError(std::string(served.status().message()));
    metrics = std::move(*served);
  }
  // The other nodes learn that this agent hosts the coordinator: when it is gone, so is the job.
  if (multi && link->server) opts.node.set_hosts_coordinator(true);
  if (opts.monitor_interval) {
    // The GPUs' figures go with every sample where a driver is there to give them.
    if (auto nvml = Nvml::Load(NvmlLibraryFromEnv()); nvml.ok()) {
      opts.sample_gpus = NvmlGpuSampler(std::shared_ptr<Nvml>(std::move(*nvml)));
    } else {
      spdlog::debug("samples carry no GPU figures: {}", std::string(nvml.status().message()));
    }
  }
  PosixProcessLauncher launcher;
  Agent agent(std::move(opts), link->client.get(), &launcher, guard, signals, &clock);
  int code = agent.Run();
  if (link->server && multi) {
    // The job's coordinator lives in this agent: stay until every node has its verdict.
    if (!link->server->service()->WaitUntilEveryNodeKnowsTheEnd(plan.rendezvous.close_timeout)) {
      spdlog::warn("leaving before every node learned the job's end (close_timeout {} s)",
                   plan.rendezvous.close_timeout.count() / 1000.0);
    }
  }
  return code;
}

}  // namespace launch
