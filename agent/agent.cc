#include "agent/agent.h"

#include <sys/resource.h>

#include <poll.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <ctime>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "agent/error_file.h"
#include "rendezvous/heartbeat_order.h"
#include "agent/log_relay.h"
#include "probes/numa.h"
#include "common/check.h"
#include "common/exit_status.h"
#include "common/limits.h"
#include "common/net.h"
#include "common/status_macros.h"
#include "common/tunables.h"
#include "spdlog/spdlog.h"

namespace launch {
namespace fs = std::filesystem;

namespace {

absl::Status MakeDirs(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return absl::PermissionDeniedError(absl::StrCat("cannot create ", dir, ": ", ec.message()));
  return absl::OkStatus();
}

// launch's stdout and stderr are one file: a terminal, or `2>&1` into a file or pipe.
bool StdoutIsStderr() {
  struct stat out, err;
  return ::fstat(1, &out) == 0 && ::fstat(2, &err) == 0 && out.st_dev == err.st_dev && out.st_ino == err.st_ino;
}

}  // namespace

absl::StatusOr<std::string> MakeRunLogDir(const std::string& log_dir, const std::string& run_id) {
  constexpr int kMaxRuns = 10000;
  for (int n = 0; n < kMaxRuns; ++n) {
    const std::string dir = n == 0 ? absl::StrCat(log_dir, "/", run_id) : absl::StrCat(log_dir, "/", run_id, ".", n);
    if (::mkdir(dir.c_str(), 0755) == 0) return dir;  // made now: no other run writes here
    if (errno != EEXIST) return ErrnoStatus(absl::StrCat("cannot create the log directory ", dir));
  }
  return absl::ResourceExhaustedError(
      absl::StrCat("--log-dir=", log_dir, ": ", kMaxRuns, " runs named '", run_id,
                   "' are there already; expected a new --rdzv-id or a clean --log-dir"));
}

namespace {

v1::WorkerExit ToProto(const WorkerResult& w) {
  v1::WorkerExit e;
  e.set_rank(w.rank);
  e.set_local_rank(w.local_rank);
  e.set_pid(w.pid);
  e.set_exit_code(w.exit_code);
  e.set_signal(w.signal);
  e.set_run_seconds(w.run_seconds);
  e.set_hung(w.hung);
  e.set_in_collective(w.in_collective);
  // Bounded on the wire (an exception's message can be a whole tensor's repr): the coordinator
  // refuses messages over 1 MiB, and the first lines are what the failure line shows.
  e.set_error_message(w.error_message.substr(0, kMaxWireErrorMessage));
  return e;
}

// Quotes a value for the dry-run listing only (nothing is ever run through a shell).
std::string ShellQuote(const std::string& s) {
  if (!s.empty() && s.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                        "0123456789@%_-+=:,./") == std::string::npos) {
    return s;
  }
  return absl::StrCat("'", absl::StrReplaceAll(s, {{"'", "'\\''"}}), "'");
}

}  // namespace

Agent::Agent(AgentOptions opts, CoordinatorClient* coordinator, ProcessLauncher* launcher, OrphanGuard* guard,
             SignalFd* signals, const Clock* clock)
    : opts_(std::move(opts)),
      session_(
          CoordinatorSession::Options{opts_.spec.run_id, opts_.node, opts_.run_spec, {}, opts_.coordinator_patience},
          coordinator, clock,
          [this](int fd, std::optional<std::chrono::milliseconds> t) { return WaitSignalOr(fd, t); }),
      launcher_(launcher),
      guard_(guard),
      signals_(signals),
      clock_(clock) {}

int Agent::WaitSignalOr(int fd, std::optional<std::chrono::milliseconds> timeout) {
  std::optional<Clock::TimePoint> deadline;
  if (timeout) deadline = clock_->Now() + *timeout;
  for (;;) {
    int wait_ms = -1;
    if (deadline) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(*deadline - clock_->Now());
      if (left.count() <= 0) return -1;
      wait_ms = static_cast<int>(left.count());
    }
    pollfd p[2] = {{signals_->fd(), POLLIN, 0}, {fd, POLLIN, 0}};
    // On simulated time a wait with nothing ready moves the clock to its deadline; waiting for a
    // descriptor alone is waiting for an event, and stays a real wait.
    if (clock_->simulated() && deadline) {
      if (::poll(p, fd >= 0 ? 2 : 1, 0) == 0) {
        clock_->AdvanceTo(*deadline);
        continue;
      }
      wait_ms = 0;
    }
    int n = ::poll(p, fd >= 0 ? 2 : 1, wait_ms);
    while (int sig = signals_->Read()) {
      if (sig == SIGCHLD) {
        while (launcher_->ReapAny()) {  // late orphans reparented to us
        }
        continue;
      }
      return sig;
    }
    if (n > 0 && fd >= 0 && (p[1].revents & POLLIN)) return 0;
  }
}

absl::StatusOr<std::vector<WorkerLaunch>> Agent::PrepareAttempt(const v1::Assignment& a, const std::string& attempt_dir,
                                                                bool make_dirs) {
  const int n = opts_.spec.local_world_size;
  std::vector<WorkerPaths> paths;
  for (int i = 0; i < n; ++i) {
    std::string dir = absl::StrCat(attempt_dir, "/", i);
    if (make_dirs) RETURN_IF_ERROR(MakeDirs(dir));
    paths.push_back({dir + "/error.json", opts_.log_dir.empty() ? "" : dir, dir + "/py_stacks.txt"});
  }
  RoundInfo round;
  round.round = a.round();
  round.group_rank = a.group_rank();
  round.group_world_size = a.group_world_size();
  round.world_size = a.world_size();
  round.rank_offset = a.rank_offset();
  round.master_addr = a.master_addr();
  round.master_port = a.master_port();
  round.restart_count = a.restart_count();
  round.agent_store = a.agent_store();
  ASSIGN_OR_RETURN(WorkerEnvPlan plan, BuildWorkerEnvs(parent_env_, opts_.spec, round, paths));
  if (file_timer_) {
    for (Env& env : plan.envs) env[kTimerFileEnv] = file_timer_->path();
  }
  if (opts_.hang_timeout && opts_.hang_timeout->count() > 0) {
    for (Env& env : plan.envs) env[launch_sdk::kCountedStacksEnv] = "1";
  }
  if (worker_memory_) {
    for (int i = 0; i < n; ++i) {
      plan.envs[i][kCheckpointMemoryEnv] = worker_memory_->CheckpointEnvValue(i);
      plan.envs[i][kShmAllreduceMemoryEnv] = worker_memory_->ShmAllreduceEnvValue();
    }
  }
  if (exit_notices_) {
    for (Env& env : plan.envs) env[launch_sdk::kExitNoticeEnv] = exit_notices_->EnvValue();
  }
  if (a.restart_count() == 0 && make_dirs) {
    for (const auto& note : plan.notes) spdlog::info("{}", note);
  }

  std::vector<WorkerLaunch> workers;
  const bool keep_files = !opts_.log_dir.empty();
  for (int i = 0; i < n; ++i) {
    WorkerLaunch w;
    w.local_rank = i;
    w.rank = a.rank_offset() + i;
    for (const auto& arg : opts_.argv) {
      w.argv.push_back(absl::StrReplaceAll(arg, {{"${local_rank}", std::to_string(i)}}));
    }
    w.env = EnvToStrings(plan.envs[i]);
    w.error_file = paths[i].error_file;
    w.python_stack_file = paths[i].stack_file;
    std::string dir = absl::StrCat(attempt_dir, "/", i);
    w.native_stack_file = dir + "/stacks.txt";
    if (keep_files) {
      w.stdout_file = dir + "/stdout.log";
      w.stderr_file = dir + "/stderr.log";
    }
    if (i < static_cast<int>(opts_.numa.size())) {
      w.cpus = opts_.numa[i].cpus;
      w.memory_node = opts_.numa[i].memory_node;
      w.numa_why = opts_.numa[i].why;
    }
    LinePrefixFields fields{opts_.spec.role, w.rank, i, opts_.node.hostname()};
    ASSIGN_OR_RETURN(w.console_prefix, FormatLinePrefix(opts_.line_prefix_template, fields));
    w.reads_stdin = w.rank == 0;  // as torchrun users expect: pdb and input() work on rank 0
    bool shown = !opts_.console_local_ranks || opts_.console_local_ranks->count(i) > 0;
    // --redirects sends a stream to its file only; --tee to the file and the console.
    w.stdout_console = shown && (!opts_.redirects.Stdout(i) || opts_.tee.Stdout(i));
    w.stderr_console = shown && (!opts_.redirects.Stderr(i) || opts_.tee.Stderr(i));
    workers.push_back(std::move(w));
  }
  return workers;
}

void Agent::PrintDryRun(const std::vector<WorkerLaunch>& workers) const {
  for (const auto& w : workers) {
    std::vector<std::string> quoted;
    for (const auto& a : w.argv) quoted.push_back(ShellQuote(a));
    std::printf("rank %d (local rank %d):\n  argv: %s\n", w.rank, w.local_rank, absl::StrJoin(quoted, " ").c_str());
    if (!w.cpus.empty()) {
      std::printf("  numa: CPUs %s, memory preferred on node %d (%s)\n", FormatCpuList(w.cpus).c_str(), w.memory_node,
                  w.numa_why.c_str());
    }
    std::printf("  env:\n");
    Env env;
    for (const auto& kv : w.env) {
      auto eq = kv.find('=');
      env[kv.substr(0, eq)] = kv.substr(eq + 1);
    }
    for (const auto& [k, v] : EnvDiff(parent_env_, env)) {
      std::printf("    %s=%s\n", k.c_str(), ShellQuote(v).c_str());
    }
  }
  std::fflush(stdout);
}

namespace {

// The job's first failure as launch's exit status. Its `hung` is not read: a rank that hung on
// another node ends this one with the signal that stopped it.
LaunchOutcome FailureOutcome(const v1::Failure& f) {
  if (!f.has_exit()) return LaunchOutcome::WorkerFailed(0, 0);
  return LaunchOutcome::WorkerFailed(f.exit().exit_code(), f.exit().signal());
}

LaunchOutcome WorkerOutcome(const WorkerResult& w) {
  return LaunchOutcome::WorkerFailed(w.exit_code, w.signal, w.hung);
}

// "rank 3 on node host1 (10.0.0.2): exit 1: message" — the job's first failure, wherever it was.
std::string DescribeFailure(const v1::Failure& f) {
  WorkerResult w;
  w.exit_code = f.exit().exit_code();
  w.signal = f.exit().signal();
  std::string msg = f.exit().error_message().substr(0, f.exit().error_message().find('\n'));
  return absl::StrCat("rank ", f.exit().rank(), " on ", f.hostname().empty() ? f.node_id() : f.hostname(),
                      f.host_address().empty() ? "" : absl::StrCat(" (", f.host_address(), ")"), ": ", w.StatusText(),
                      msg.empty() ? "" : ": ", msg);
}

}  // namespace

namespace {

// The run's directory: <log_dir>/<run_id> (kept), or a temporary one for the error files only,
// removed however the run ends.
class RunDirectory {
 public:
  ~RunDirectory() {
    if (temporary_ && !keep_ && !path_.empty()) {
      std::error_code ec;
      fs::remove_all(path_, ec);
    }
  }
  absl::Status Make(const AgentOptions& o) {
    temporary_ = o.log_dir.empty();
    if (temporary_) {
      std::string tmpl = absl::StrCat(fs::temp_directory_path().string(), "/launch-", o.spec.run_id, "-XXXXXX");
      if (!::mkdtemp(tmpl.data())) return ErrnoStatus(absl::StrCat("cannot create a temporary directory ", tmpl));
      path_ = tmpl;
    } else if (o.dry_run) {
      path_ = absl::StrCat(o.log_dir, "/", o.spec.run_id);
    } else {
      ASSIGN_OR_RETURN(path_, MakeRunLogDir(o.log_dir, o.spec.run_id));
      spdlog::info("run {}: logs in {}", o.spec.run_id, path_);
    }
    return absl::OkStatus();
  }
  const std::string& path() const { return path_; }
  bool temporary() const { return temporary_; }
  // A temporary directory that holds what the user needs (a hung group's stacks) is kept.
  void Keep() { keep_ = true; }

 private:
  std::string path_;
  bool temporary_ = false;
  bool keep_ = false;
};

Verdict ToVerdict(const v1::ReportExitResponse& r) {
  return VerdictFrom(r.job_succeeded(), r.job_failed(), r.restart());
}

}  // namespace

int Agent::Run() {
  parent_env_ = CurrentEnv();
  RunDirectory dir;
  if (auto st = dir.Make(opts_); !st.ok()) {
    spdlog::error("{}", std::string(st.message()));
    return ExitStatus(LaunchOutcome::LaunchError());
  }
  run_dir_ = dir.path();
  if (opts_.node.addresses().empty()) {
    // Whom the store of a round this node hosts lets in comes from every node's addresses.
    for (const auto& ip : LocalInterfaceAddresses()) {
      if (opts_.node.addresses_size() >= kMaxNodeAddresses) break;
      if (ip.size() <= kMaxAddressLength) opts_.node.add_addresses(ip);
    }
  }
  if (!opts_.dry_run) {
    auto timer = StartFileTimer(parent_env_);
    if (!timer.ok()) {
      spdlog::error("{}", std::string(timer.status().message()));
      return ExitStatus(LaunchOutcome::UsageError());
    }
    file_timer_ = std::move(*timer);
    // Without it checkpoints are only written to disk, and each attempt's rank 0 makes a new
    // all-reduce segment: said once, and the run goes on. Only where the open-file limit leaves
    // room for its files beside what the plan counted (a worker's pipes and log files, and
    // launch's own margin).
    const int n = opts_.spec.local_world_size;
    const int files = WorkerMemory::FileCount(n);
    rlimit nofile{};
    auto room_for = [&](int more) {
      return ::getrlimit(RLIMIT_NOFILE, &nofile) != 0 || nofile.rlim_cur == RLIM_INFINITY ||
             nofile.rlim_cur >= static_cast<rlim_t>(64 + 4 * n + more);
    };
    auto no_room = [&](int more) {
      return absl::ResourceExhaustedError(
          absl::StrCat("the open-file limit (", nofile.rlim_cur, ") leaves no room for ", more, " more files"));
    };
    auto memory = room_for(files) ? WorkerMemory::Create(n) : no_room(files);
    if (memory.ok()) {
      worker_memory_ = std::move(*memory);
    } else {
      spdlog::info("checkpoints cannot be kept in memory, nor the all-reduce segment between attempts: {}",
                   std::string(memory.status().message()));
    }
    // Without them a failure is seen once the dead worker's memory is freed (about 10 ms later
    // for a LibTorch worker): said once, and the run goes on.
    const int more = (worker_memory_ ? files : 0) + ExitNotices::kFileCount;
    auto notices = room_for(more) ? ExitNotices::Create(n) : no_room(more);
    if (notices.ok()) {
      exit_notices_ = std::move(*notices);
    } else {
      spdlog::info("workers give no exit notices: {}", std::string(notices.status().message()));
    }
    if (opts_.warm_start) PrepareFirstStandbys();
  }
  AgentState state;
  Attempt at;
  while (state.phase != AgentPhase::kDone) {
    AgentEvent event = AgentEvent::Of(AgentEvent::Kind::kError);
    switch (state.phase) {
      case AgentPhase::kJoining:
        event = Join(&at);
        break;
      case AgentPhase::kRunning:
        event = RunWorkers(&at);
        break;
      case AgentPhase::kReporting:
        event = ReportOutcome(state, &at);
        break;
      case AgentPhase::kAwaiting:
        event = AwaitOthers(&at);
        break;
      case AgentPhase::kBackingOff:
        event = BackOff();
        break;
      case AgentPhase::kDone:
        break;
    }
    const AgentState next = NextAgentState(state, event);
    LogMove(state, next, at);
    state = next;
    if (next.phase == AgentPhase::kDone && monitor_) monitor_->Stop();  // its last events before the end
    if (event.kind == AgentEvent::Kind::kGroupEnded && at.outcome.stacks_captured) {
      if (dir.temporary()) dir.Keep();
      spdlog::warn(
          "the stacks of this node's workers{} are in {}/*/stacks.txt (py_stacks.txt for Python workers "
          "that write their own)",
          at.outcome.kind == GroupEnd::kCoordinatorStop ? ", stopped for a rank hung elsewhere," : "", at.dir);
    }
  }
  // Stopped by a signal between rounds (re-joining, backing off, stopping the workers for a new
  // round): a node of an earlier round says it leaves, as one stopped while its workers ran, so
  // that where it hosts the coordinator the job ends at once instead of its coordinator waiting
  // close_timeout for a round nobody will join (every node stopped at once, another's leaving
  // seen first).
  if (state.end == AgentEnd::kSignal && !left_reported_ && last_round_ > 0) {
    ReportLeaving(static_cast<int>(last_round_));
  }
  const int code = Finish(state, at, dir.temporary());
  file_timer_.reset();     // the FIFO goes with the run (the agent may stay to serve the coordinator)
  worker_memory_.reset();  // and so do the checkpoints and the all-reduce segment kept in memory
  exit_notices_.reset();
  store_.reset();  // and so does the workers' store
  warm_.reset();   // and the standbys no attempt took
  return code;
}

void Agent::PrepareFirstStandbys() {
  WarmStart::Options wo;
  wo.python = opts_.warm_python;
  wo.python_dir = opts_.spec.python_dir;
  wo.imports = opts_.warm_imports;
  wo.signal_fd = signals_->fd();
  wo.guard_fd = guard_ ? guard_->fd() : -1;
  warm_ = std::make_unique<WarmStart>(std::move(wo), launcher_, guard_);
  // Only the round's variables differ between this and the first round's environment; the
  // standbys get those at their start.
  v1::Assignment a;
  a.set_world_size(opts_.spec.local_world_size);
  a.set_group_world_size(1);
  a.set_master_addr(opts_.master_addr);
  auto workers = PrepareAttempt(a, absl::StrCat(run_dir_, "/attempt_0"), false);
  if (!workers.ok()) {
    spdlog::info("warm start: {}; the workers start cold", std::string(workers.status().message()));
    warm_.reset();
    return;
  }
  warm_->Prepare(*workers);
}

AgentEvent Agent::Join(Attempt* at) {
  // The last round's store stops serving now, not when this node learns the next round: another
  // node's next workers may connect before that, and must not be served the last round's keys
  // (or be cut off when the new serving starts). They wait in the listening socket's backlog.
  if (store_) store_->Stop();
  auto request = [this]() -> absl::StatusOr<v1::JoinRequest> {
    v1::JoinRequest req;
    req.set_run_id(opts_.spec.run_id);
    *req.mutable_node() = opts_.node;
    req.set_last_round(last_round_);
    req.set_proposed_master_addr(opts_.master_addr);
    if (opts_.run_spec.min_nodes() > 0) *req.mutable_spec() = opts_.run_spec;
    // Static ranks keep torchrun's static way (worker rank 0 hosts the store), a dry run hosts none;
    // TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 is torchrun's way to have worker rank 0 host it.
    req.set_agent_store(!opts_.static_topology && !StoreSharingDisabled(parent_env_));
    if (opts_.master_port) {
      req.set_proposed_master_port(*opts_.master_port);
      return req;
    }
    if (req.agent_store() && !opts_.dry_run) {
      // The port proposed is bound and held from now on, so it is still free if this node hosts.
      if (!store_) {
        auto store = StoreServer::Bind(opts_.master_addr, 0, last_picked_port_, StoreServer::Options());
        if (!store.ok()) {
          return absl::UnavailableError(absl::StrCat("cannot bind a port for the workers' store on ", opts_.master_addr,
                                                     ": ", store.status().message()));
        }
        store_ = std::move(*store);
      }
      req.set_proposed_master_port(store_->port());
      last_picked_port_ = store_->port();
      return req;
    }
    auto port = PickFreePort(opts_.master_addr, last_picked_port_);
    if (!port.ok()) {
      return absl::UnavailableError(
          absl::StrCat("cannot pick a MASTER_PORT on ", opts_.master_addr, ": ", port.status().message()));
    }
    req.set_proposed_master_port(*port);
    last_picked_port_ = *port;
    return req;
  };
  int sig = 0;
  auto assignment = session_.Join(request, &sig);
  if (sig) {
    spdlog::warn("stopped by {} while waiting for the rendezvous", SignalName(sig));
    return AgentEvent::Signal(sig);
  }
  if (!assignment.ok()) {
    at->error = std::string(assignment.status().message());
    return AgentEvent::Of(AgentEvent::Kind::kError);
  }
  last_round_ = assignment->round();
  session_.set_coordinator_host(assignment->coordinator_host());
  if (const auto& t = opts_.static_topology) {
    // Every node runs the same number of workers in static mode (as torchrun).
    const int local = opts_.spec.local_world_size;
    assignment->set_group_rank(t->group_rank);
    assignment->set_group_world_size(t->group_world_size);
    assignment->set_world_size(local * t->group_world_size);
    assignment->set_rank_offset(local * t->group_rank);
    assignment->set_master_addr(t->master_addr);
    assignment->set_master_port(t->master_port);
    assignment->set_agent_store(false);
  }
  if (auto st = HostStore(*assignment); !st.ok()) {
    at->error = std::string(st.message());
    return AgentEvent::Of(AgentEvent::Kind::kError);
  }
  *at = Attempt();
  at->assignment = *assignment;
  return AgentEvent::Of(AgentEvent::Kind::kAssigned);
}

bool StoreSharingDisabled(const Env& env) {
  auto it = env.find(kDisableSharedStoreEnv);
  return it != env.end() && it->second == "1";
}

absl::Status Agent::HostStore(const v1::Assignment& a) {
  if (opts_.dry_run || !a.agent_store()) return absl::OkStatus();
  if (a.group_rank() != 0) {
    // Another node hosts this round's store: ours (if it served) goes, with its port; the next
    // join binds a new one.
    if (store_ && store_->serving()) store_.reset();
    return absl::OkStatus();
  }
  if (!store_) {
    // --master-port: bound now that this node hosts (with it every node proposes the same port).
    ASSIGN_OR_RETURN(store_, StoreServer::Bind(opts_.master_addr, a.master_port(), 0, StoreServer::Options()));
  }
  StorePeers peers;
  peers.uid = ::geteuid();
  peers.remote.insert(a.member_addresses().begin(), a.member_addresses().end());
  // A fresh store for every round: the last attempt's keys and connections are gone.
  RETURN_IF_ERROR(store_->Serve(std::move(peers)));
  return absl::OkStatus();
}

// The worker group's options that follow from the agent's.
WorkerGroup::Options Agent::GroupOptions(const Attempt& at, int stop_fd) {
  WorkerGroup::Options gopts;
  gopts.stop = StopEscalation::TermThenKill(opts_.stop_timeout);
  gopts.hang.timeout = opts_.hang_timeout;
  gopts.hang.floor = kHangTimeoutFloor;
  gopts.hang.factor = kHangTimeoutFactor;
  gopts.hang.debugger = opts_.debugger;
  gopts.stop_fd = stop_fd;
  gopts.live = &live_;
  gopts.exit_notices = exit_notices_.get();
  gopts.one_console = StdoutIsStderr();
  gopts.stdout_filters = opts_.duplicate_stdout_filters;
  gopts.stderr_filters = opts_.duplicate_stderr_filters;
  gopts.filtered_stdout_file = at.dir + "/filtered_stdout.log";
  gopts.filtered_stderr_file = at.dir + "/filtered_stderr.log";
  return gopts;
}

// The monitor samples the ranks from the first attempt on (--monitor-interval).
void Agent::StartMonitor(int round) {
  if (opts_.monitor_interval && !monitor_) {
    Monitor::Options mo;
    mo.interval = *opts_.monitor_interval;
    mo.run_id = opts_.spec.run_id;
    mo.node_id = opts_.node.node_id();
    mo.hostname = opts_.node.hostname();
    if (!opts_.log_dir.empty()) mo.metrics_file = absl::StrCat(run_dir_, "/metrics.jsonl");
    mo.coordinator = session_.client();
    mo.gpus = opts_.sample_gpus;
    monitor_ = std::make_unique<Monitor>(std::move(mo), &live_, clock_);
    monitor_->Start();
  }
  if (monitor_) monitor_->SetRound(round);
}

// Warm workers for this attempt, and the next attempt's standbys once this one runs.
void Agent::SetWarmStart(const v1::Assignment& a, Attempt* at, WorkerGroup::Options* gopts) {
  gopts->warm = warm_.get();
  const int taken_before = warm_->taken(), forked_before = warm_->forked();
  // The next attempt's standbys load while this one runs, if there can be a next one.
  const bool elastic = opts_.run_spec.min_nodes() != opts_.run_spec.max_nodes();
  const bool next = a.restart_count() < a.max_restarts() || elastic;
  gopts->on_started = [this, &a, at, taken_before, forked_before, next] {
    spdlog::info("round {}: {} of {} worker(s) started warm ({} forked from standbys that stay)", a.round(),
                 warm_->taken() - taken_before, at->workers.size(), warm_->forked() - forked_before);
    if (next && warm_->stays()) warm_->Prepare(at->workers);  // only ranks whose standby is gone
  };
  // New standbys (each became its worker) load once every rank trains, not while the attempt
  // resumes on the same cores. An attempt that fails before then restarts cold, as without
  // standbys.
  if (next && !warm_->stays()) gopts->on_stepping = [this, at] { warm_->Prepare(at->workers); };
}

// Launch was stopped by a signal: the coordinator hears that this node leaves.
void Agent::ReportLeaving(int round) {
  left_reported_ = true;
  v1::ReportExitRequest leaving;
  leaving.set_run_id(opts_.spec.run_id);
  leaving.set_node_id(opts_.node.node_id());
  leaving.set_round(round);
  leaving.set_leaving(true);
  (void)session_.client()->ReportExit(leaving, kLeavingReportDeadline);
}

AgentEvent Agent::RunWorkers(Attempt* at) {
  const v1::Assignment& a = at->assignment;
  at->dir = absl::StrCat(run_dir_, "/attempt_", a.restart_count());
  auto workers = PrepareAttempt(a, at->dir, !opts_.dry_run);
  if (!workers.ok()) {
    at->error = std::string(workers.status().message());
    return AgentEvent::Of(AgentEvent::Kind::kBadInput);
  }
  at->workers = std::move(*workers);
  if (opts_.dry_run) {
    PrintDryRun(at->workers);
    return AgentEvent::Of(AgentEvent::Kind::kDryRun);
  }
  spdlog::info("round {}: starting {} worker(s), ranks {}-{} of world size {}{}, master {}, restart {}/{}", a.round(),
               at->workers.size(), a.rank_offset(), a.rank_offset() + static_cast<int>(at->workers.size()) - 1,
               a.world_size(),
               a.group_world_size() > 1 ? absl::StrCat(" (node ", a.group_rank(), " of ", a.group_world_size(), ")")
                                        : "",
               JoinHostPort(a.master_addr(), a.master_port()), a.restart_count(), a.max_restarts());

  CoordinatorWatch watch(&session_, opts_.heartbeat_interval);
  if (auto st = watch.Start(a); !st.ok()) {
    at->error = std::string(st.message());
    return AgentEvent::Of(AgentEvent::Kind::kError);
  }
  WorkerGroup::Options gopts = GroupOptions(*at, watch.fd());
  StartMonitor(a.round());
  gopts.stop_wants_stacks = [&watch] { return WantsStacks(watch.answer()); };
  // Tell the coordinator at once, not after the group has stopped, so the other nodes stop now;
  // on a thread of its own, so the call never holds up the group's supervision.
  BackgroundCall early_report;
  gopts.on_failure = [&](const WorkerResult& w) {
    v1::ReportExitRequest early;
    early.set_run_id(opts_.spec.run_id);
    early.set_node_id(opts_.node.node_id());
    early.set_round(a.round());
    *early.add_exits() = ToProto(w);
    auto st = early_report.Start(
        [this, early](CallCanceller*) { (void)session_.client()->ReportExit(early, kEarlyReportDeadline); });
    if (!st.ok()) spdlog::warn("cannot tell the coordinator of the failure early: {}", std::string(st.message()));
  };
  if (file_timer_) {
    gopts.on_spawned = [this](const WorkerResult& w) { file_timer_->AddWorker(w.pid, w.rank); };
  }
  if (warm_) SetWarmStart(a, at, &gopts);
  WorkerGroup group(gopts, launcher_, guard_, signals_, clock_);
  auto outcome = group.Run(at->workers);
  if (file_timer_) file_timer_->ClearWorkers();  // the next attempt's workers start with no timers
  early_report.Wait();                           // the early report stays the first the coordinator hears
  watch.Stop();
  if (!outcome.ok()) {
    // launch's own failure (exit 1; 2 is for bad input): the workers it started are gone.
    at->error = absl::StrCat("cannot run the workers: ", outcome.status().message());
    return AgentEvent::Of(AgentEvent::Kind::kError);
  }
  at->outcome = std::move(*outcome);
  at->why = watch.answer();
  if (at->outcome.kind == GroupEnd::kInterrupted) {
    ReportLeaving(a.round());
    spdlog::warn("stopped by {}", SignalName(at->outcome.signal));
  }
  // The agent-hosted coordinator died with its node: nobody is left to report to.
  const bool coordinator_gone = OrderOf(at->why) == HeartbeatOrder::kJobFailed && watch.unreachable();
  return AgentEvent::GroupEnded(at->outcome.kind, at->outcome.signal, coordinator_gone);
}

AgentEvent Agent::ReportOutcome(const AgentState& state, Attempt* at) {
  v1::ReportExitRequest report;
  report.set_run_id(opts_.spec.run_id);
  report.set_node_id(opts_.node.node_id());
  report.set_round(at->assignment.round());
  const GroupOutcome& o = at->outcome;
  if (o.kind == GroupEnd::kFailed) {
    // A failed group names the worker whose failure stopped it.
    LAUNCH_CHECK(o.root_cause >= 0 && o.root_cause < static_cast<int>(o.workers.size()))
        << "root cause " << o.root_cause << " of " << o.workers.size() << " workers";
    // The root cause first: the coordinator keeps the first exit of the job's first report.
    *report.add_exits() = ToProto(o.workers[o.root_cause]);
    for (int i = 0; i < static_cast<int>(o.workers.size()); ++i)
      if (i != o.root_cause && o.workers[i].failed()) *report.add_exits() = ToProto(o.workers[i]);
  }
  // A report after waiting asks only for the verdict (with the job's first failure).
  report.set_group_succeeded(o.kind == GroupEnd::kSucceeded && !state.asking);
  int sig = 0;
  auto verdict = session_.Report(report, at->assignment, &sig);
  if (sig) return AgentEvent::Signal(sig);
  if (!verdict.ok()) {
    at->error = std::string(verdict.status().message());
    at->has_verdict = false;
    return AgentEvent::Of(AgentEvent::Kind::kNoVerdict);
  }
  at->verdict = *verdict;
  at->has_verdict = true;
  Verdict v = ToVerdict(*verdict);
  // The watch already said the job failed (e.g. the node hosting the coordinator is gone).
  if (o.kind == GroupEnd::kCoordinatorStop && OrderOf(at->why) == HeartbeatOrder::kJobFailed &&
      v != Verdict::kSucceeded) {
    v = Verdict::kFailed;
  }
  return AgentEvent::Answered(v);
}

AgentEvent Agent::AwaitOthers(Attempt* at) {
  CoordinatorWatch watch(&session_, opts_.heartbeat_interval);
  if (!watch.Start(at->assignment).ok()) return AgentEvent::Of(AgentEvent::Kind::kNoVerdict);
  if (int sig = WaitSignalOr(watch.fd(), std::nullopt); sig > 0) {
    spdlog::warn("stopped by {} while waiting for the other nodes", SignalName(sig));
    return AgentEvent::Signal(sig);
  }
  switch (OrderOf(watch.answer())) {
    case HeartbeatOrder::kJobSucceeded:
      return AgentEvent::Answered(Verdict::kSucceeded);
    case HeartbeatOrder::kJobFailed:
      return AgentEvent::Answered(Verdict::kFailed);
    case HeartbeatOrder::kStopWorkers:
      return AgentEvent::Answered(Verdict::kNewRound);
    default:
      return AgentEvent::Answered(Verdict::kGoOn);
  }
}

AgentEvent Agent::BackOff() {
  if (int sig = WaitSignalOr(-1, opts_.restart_backoff); sig > 0) {
    spdlog::warn("stopped by {} while waiting to restart", SignalName(sig));
    return AgentEvent::Signal(sig);
  }
  return AgentEvent::Of(AgentEvent::Kind::kBackoffOver);
}

void Agent::LogMove(const AgentState& from, const AgentState& to, const Attempt& at) const {
  if (from.phase == to.phase) return;
  if (to.phase == AgentPhase::kAwaiting) {
    spdlog::info("all {} worker(s) of this node exited 0; waiting for the other nodes", at.outcome.workers.size());
  } else if (to.phase == AgentPhase::kBackingOff) {
    // Only a failed group backs off (agent_machine.cc), and a failed group has a root cause.
    LAUNCH_CHECK(at.outcome.root_cause >= 0 && at.outcome.root_cause < static_cast<int>(at.outcome.workers.size()))
        << "backing off with root cause " << at.outcome.root_cause << " of " << at.outcome.workers.size();
    const WorkerResult& root = at.outcome.workers[at.outcome.root_cause];
    std::string why = root.error_message.substr(0, root.error_message.find('\n'));
    if (root.hung) {
      why = absl::StrFormat("no step for %.1f s%s", root.hung_after_seconds,
                            root.in_collective ? ", waiting in a collective (for a rank elsewhere?)" : "");
      if (!root.stack_top.empty()) absl::StrAppend(&why, "; in ", absl::StrJoin(root.stack_top, " < "));
    }
    spdlog::warn("rank {} failed ({}{}{}); restarting the group ({} of {} restarts)", root.rank, root.StatusText(),
                 why.empty() ? "" : ": ", why, at.verdict.restart_count(), at.assignment.max_restarts());
  } else if (to.phase == AgentPhase::kJoining && from.phase != AgentPhase::kBackingOff) {
    if (to.last_end == GroupEnd::kCoordinatorStop) {
      const std::string& why = at.why.reason();
      spdlog::info("the coordinator started a new round{}{}: re-joining", why.empty() ? "" : " (",
                   why.empty() ? "" : why + ")");
    } else {
      // Another node failed after ours succeeded: the whole group runs again.
      spdlog::info("another node started a new round: re-joining");
    }
  }
}

int Agent::Finish(const AgentState& state, const Attempt& at, bool temp_dir) {
  if (std::string table = live_.EndTable(opts_.node.hostname(), at.assignment.restart_count()); !table.empty()) {
    ConsoleErr().Write(absl::StrCat("launch: per-rank progress on this node:\n", table));
  }
  // The job failed as the coordinator saw it: say where it failed first and exit with that code.
  auto job_failed = [&](LaunchOutcome own) {
    if (at.has_verdict && at.verdict.has_first_failure()) {
      ConsoleErr().Write(
          absl::StrCat("launch: job failed: first failure: ", DescribeFailure(at.verdict.first_failure()), "\n"));
      return ExitStatus(FailureOutcome(at.verdict.first_failure()));
    }
    std::string reason = at.has_verdict ? at.verdict.reason() : at.error;
    if (at.outcome.kind == GroupEnd::kCoordinatorStop && OrderOf(at.why) == HeartbeatOrder::kJobFailed &&
        !at.why.reason().empty() && (!at.has_verdict || reason.empty())) {
      reason = at.why.reason();
    }
    ConsoleErr().Write(absl::StrCat("launch: job failed: ", reason, "\n"));
    return ExitStatus(own);
  };
  // Every node stopped at once (scancel, a pod's deletion): the host's stop can reach this node as
  // the job's failure a moment before its own signal is read. That signal is what ended it here.
  if (state.end == AgentEnd::kJobFailed || state.end == AgentEnd::kGaveUp) {
    if (const int sig = signals_->Pending()) {
      spdlog::info("stopped by {} as the run ended", SignalListName({sig}));
      return ExitStatus(LaunchOutcome::Signalled(sig));
    }
  }
  switch (state.end) {
    case AgentEnd::kSucceeded:
      spdlog::info("all {} worker(s) exited 0", at.outcome.workers.size());
      return ExitStatus(LaunchOutcome::Succeeded());
    case AgentEnd::kDryRun:
      return ExitStatus(LaunchOutcome::Succeeded());
    case AgentEnd::kSignal:
      return ExitStatus(LaunchOutcome::Signalled(state.signal));
    case AgentEnd::kLaunchError:
      spdlog::error("{}", at.error.empty() ? std::string("internal: an event that cannot come now") : at.error);
      return ExitStatus(LaunchOutcome::LaunchError());
    case AgentEnd::kBadInput:
      spdlog::error("{}", at.error);
      return ExitStatus(LaunchOutcome::UsageError());
    case AgentEnd::kJobFailed:
      return job_failed(LaunchOutcome::JobFailed());
    case AgentEnd::kGaveUp:
    case AgentEnd::kNone:
      break;
  }
  if (at.outcome.root_cause < 0) {
    spdlog::error("internal: the run ended with no outcome");
    return ExitStatus(LaunchOutcome::LaunchError());
  }
  // The group ran the attempt's workers: one result for each.
  LAUNCH_CHECK(at.outcome.root_cause < static_cast<int>(at.outcome.workers.size()) &&
               at.outcome.workers.size() == at.workers.size())
      << "root cause " << at.outcome.root_cause << " of " << at.outcome.workers.size() << " results for "
      << at.workers.size() << " workers";
  const WorkerResult& root = at.outcome.workers[at.outcome.root_cause];
  std::string headline = absl::StrCat("launch: worker group failed after ", at.assignment.restart_count(),
                                      " restart(s)",
                                      at.assignment.max_restarts() > 0 ? " (restart budget exhausted)" : "",
                                      temp_dir ? "" : absl::StrCat("; logs in ", at.dir));
  ConsoleErr().Write(FailureSummary(at.outcome, headline));
  if (auto own = parent_env_.find("TORCHELASTIC_ERROR_FILE"); own != parent_env_.end() && !own->second.empty()) {
    const std::string what = absl::StrCat("rank ", root.rank, " (local rank ", root.local_rank, ") on ",
                                          opts_.node.hostname(), ": ", root.StatusText());
    // torchrun's errorCode: the exit code, or minus the signal (Popen's returncode).
    const int code = root.signal != 0 ? -root.signal : root.exit_code;
    if (auto st = WriteLauncherErrorFile(own->second, at.workers[at.outcome.root_cause].error_file, what, code,
                                         static_cast<long>(::time(nullptr)));
        !st.ok()) {
      spdlog::warn("{}", std::string(st.message()));
    }
  }
  if (!at.has_verdict) {
    spdlog::error("{}", at.error);
    return ExitStatus(WorkerOutcome(root));
  }
  if (at.verdict.has_first_failure() && at.verdict.first_failure().node_id() != opts_.node.node_id()) {
    return job_failed(WorkerOutcome(root));
  }
  return ExitStatus(WorkerOutcome(root));
}

}  // namespace launch
