#include "agent/agent.h"

#include <poll.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <ctime>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "agent/error_file.h"
#include "common/limits.h"
#include "common/net.h"
#include "common/status_macros.h"
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

}  // namespace

absl::StatusOr<std::string> MakeRunLogDir(const std::string& log_dir, const std::string& run_id) {
  constexpr int kMaxRuns = 10000;
  for (int n = 0; n < kMaxRuns; ++n) {
    const std::string dir = n == 0 ? absl::StrCat(log_dir, "/", run_id) : absl::StrCat(log_dir, "/", run_id, ".", n);
    if (::mkdir(dir.c_str(), 0755) == 0) return dir;  // made now: no other run writes here
    if (errno != EEXIST) return ErrnoStatus(absl::StrCat("cannot create the log directory ", dir));
  }
  return absl::ResourceExhaustedError(absl::StrCat("--log-dir=", log_dir, ": ", kMaxRuns, " runs named '", run_id,
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

absl::StatusOr<v1::Assignment> Agent::JoinRound(long last_round, int* signal) {
  *signal = 0;
  const auto deadline = clock_->Now() + SecondsToMs(opts_.run_spec.join_timeout_s());
  std::chrono::milliseconds delay(50);
  bool warned = false;
  std::optional<Clock::TimePoint> unreachable_since;
  for (;;) {
    v1::JoinRequest req;
    req.set_run_id(opts_.spec.run_id);
    *req.mutable_node() = opts_.node;
    req.set_last_round(last_round);
    req.set_proposed_master_addr(opts_.master_addr);
    if (opts_.run_spec.min_nodes() > 0) *req.mutable_spec() = opts_.run_spec;
    if (opts_.master_port) {
      req.set_proposed_master_port(*opts_.master_port);
    } else {
      auto port = PickFreePort(opts_.master_addr, last_picked_port_);
      if (!port.ok()) {
        return absl::UnavailableError(absl::StrCat("cannot pick a MASTER_PORT on ", opts_.master_addr, ": ",
                                                   port.status().message()));
      }
      req.set_proposed_master_port(*port);
      last_picked_port_ = *port;
    }
    absl::StatusOr<v1::Assignment> result = absl::UnknownError("join did not run");
    BackgroundCall call;
    RETURN_IF_ERROR(call.Start([&](CallCanceller* c) { result = coordinator_->Join(req, c); }));
    if (int sig = WaitSignalOr(call.fd(), std::nullopt); sig > 0) {
      call.Cancel();
      call.Wait();
      *signal = sig;
      return absl::CancelledError(absl::StrCat("stopped by ", SignalName(sig), " while waiting for the rendezvous"));
    }
    call.Wait();
    if (result.ok() || !CoordinatorUnreachable(result.status()) || clock_->Now() >= deadline) return result;
    if (!unreachable_since) unreachable_since = clock_->Now();
    if (!coordinator_host_.empty() && clock_->Now() - *unreachable_since >= opts_.coordinator_patience) {
      return absl::UnavailableError(
          HostedCoordinatorGone(coordinator_->target(), coordinator_host_, opts_.coordinator_patience));
    }
    // The coordinator went away while the round was forming: wait for it to come back.
    if (!warned) {
      spdlog::warn("{}; retrying", std::string(result.status().message()));
      warned = true;
    }
    if (int sig = SleepUnlessSignaled(delay)) {
      *signal = sig;
      return absl::CancelledError(absl::StrCat("stopped by ", SignalName(sig), " while waiting for the rendezvous"));
    }
    delay = std::min(delay * 2, std::chrono::milliseconds(2000));
  }
}

absl::StatusOr<v1::ReportExitResponse> Agent::Report(const v1::ReportExitRequest& req, const v1::Assignment& a,
                                                     int* signal) {
  *signal = 0;
  const auto deadline = clock_->Now() + opts_.coordinator_patience;
  std::chrono::milliseconds delay(50);
  bool warned = false;
  for (;;) {
    auto resp = coordinator_->ReportExit(req, std::chrono::seconds(10));
    if (resp.ok()) return resp;
    if (absl::IsNotFound(resp.status())) {
      // A restarted coordinator that has not heard of the run yet: re-register, then report.
      v1::HeartbeatRequest hb;
      hb.set_run_id(req.run_id());
      hb.set_node_id(req.node_id());
      hb.set_round(a.round());
      *hb.mutable_node() = opts_.node;
      *hb.mutable_assignment() = a;
      *hb.mutable_spec() = opts_.run_spec;
      auto re = coordinator_->Heartbeat(hb);
      if (re.ok()) {
        resp = coordinator_->ReportExit(req, std::chrono::seconds(10));
        if (resp.ok()) return resp;
      }
    }
    if (!CoordinatorUnreachable(resp.status()) && !absl::IsNotFound(resp.status())) return resp.status();
    if (clock_->Now() >= deadline) {
      return absl::UnavailableError(absl::StrCat("gave up on the coordinator at ", coordinator_->target(),
                                                 " after ", opts_.coordinator_patience.count() / 1000, " s: ",
                                                 resp.status().message()));
    }
    if (!warned) {
      spdlog::warn("{}; retrying for up to {} s", std::string(resp.status().message()),
                   opts_.coordinator_patience.count() / 1000);
      warned = true;
    }
    if (int sig = SleepUnlessSignaled(delay)) {
      *signal = sig;
      return absl::CancelledError(absl::StrCat("stopped by ", SignalName(sig)));
    }
    delay = std::min(delay * 2, std::chrono::milliseconds(2000));
  }
}

CoordinatorWatch::Options Agent::WatchOptions() const {
  CoordinatorWatch::Options wo;
  wo.run_id = opts_.spec.run_id;
  wo.node = opts_.node;
  wo.spec = opts_.run_spec;
  wo.interval = opts_.heartbeat_interval;
  wo.patience = opts_.coordinator_patience;
  return wo;
}

absl::StatusOr<v1::HeartbeatResponse> Agent::AwaitVerdict(const v1::Assignment& a, int* signal) {
  *signal = 0;
  CoordinatorWatch watch(WatchOptions(), coordinator_);
  RETURN_IF_ERROR(watch.Start(a));
  if (int sig = WaitSignalOr(watch.fd(), std::nullopt); sig > 0) {
    *signal = sig;
    return absl::CancelledError(absl::StrCat("stopped by ", SignalName(sig)));
  }
  return watch.answer();
}

absl::StatusOr<std::vector<WorkerLaunch>> Agent::PrepareAttempt(const v1::Assignment& a,
                                                                const std::string& attempt_dir) {
  const int n = opts_.spec.local_world_size;
  std::vector<WorkerPaths> paths;
  for (int i = 0; i < n; ++i) {
    std::string dir = absl::StrCat(attempt_dir, "/", i);
    if (!opts_.dry_run) RETURN_IF_ERROR(MakeDirs(dir));
    paths.push_back({dir + "/error.json", opts_.log_dir.empty() ? "" : dir});
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
  ASSIGN_OR_RETURN(WorkerEnvPlan plan, BuildWorkerEnvs(parent_env_, opts_.spec, round, paths));
  if (a.restart_count() == 0) {
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
    std::string dir = absl::StrCat(attempt_dir, "/", i);
    if (keep_files) {
      w.stdout_file = dir + "/stdout.log";
      w.stderr_file = dir + "/stderr.log";
    }
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
    std::printf("rank %d (local rank %d):\n  argv: %s\n  env:\n", w.rank, w.local_rank,
                absl::StrJoin(quoted, " ").c_str());
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

int FailureExitCode(const v1::Failure& f) {
  if (!f.has_exit()) return 1;
  if (f.exit().signal()) return 128 + f.exit().signal();
  return f.exit().exit_code() ? f.exit().exit_code() : 1;
}

// "rank 3 on node host1 (10.0.0.2): exit 1: message" — the job's first failure, wherever it was.
std::string DescribeFailure(const v1::Failure& f) {
  WorkerResult w;
  w.exit_code = f.exit().exit_code();
  w.signal = f.exit().signal();
  std::string msg = f.exit().error_message().substr(0, f.exit().error_message().find('\n'));
  return absl::StrCat("rank ", f.exit().rank(), " on ", f.hostname().empty() ? f.node_id() : f.hostname(),
                      f.host_address().empty() ? "" : absl::StrCat(" (", f.host_address(), ")"), ": ",
                      w.StatusText(), msg.empty() ? "" : ": ", msg);
}

}  // namespace

int Agent::Run() {
  parent_env_ = CurrentEnv();
  const bool temp_dir = opts_.log_dir.empty();
  std::string base;
  if (temp_dir) {
    std::string tmpl = absl::StrCat(fs::temp_directory_path().string(), "/launch-", opts_.spec.run_id,
                                    "-XXXXXX");
    if (!::mkdtemp(tmpl.data())) {
      spdlog::error("cannot create a temporary directory {}: {}", tmpl, std::strerror(errno));
      return 1;
    }
    base = tmpl;
  } else if (opts_.dry_run) {
    base = absl::StrCat(opts_.log_dir, "/", opts_.spec.run_id);
  } else {
    auto dir = MakeRunLogDir(opts_.log_dir, opts_.spec.run_id);
    if (!dir.ok()) {
      spdlog::error("{}", std::string(dir.status().message()));
      return 1;
    }
    base = *dir;
    spdlog::info("run {}: logs in {}", opts_.spec.run_id, base);
  }
  auto cleanup = [&] {
    if (temp_dir) {
      std::error_code ec;
      fs::remove_all(base, ec);
    }
  };
  // The job failed as the coordinator saw it: say where it failed first and exit with that code.
  auto job_failed = [&](const v1::ReportExitResponse& verdict, int own_code) {
    if (verdict.has_first_failure()) {
      ConsoleErr().Write(absl::StrCat("launch: job failed: first failure: ", DescribeFailure(verdict.first_failure()), "\n"));
    } else {
      ConsoleErr().Write(absl::StrCat("launch: job failed: ", verdict.reason(), "\n"));
    }
    cleanup();
    return verdict.has_first_failure() ? FailureExitCode(verdict.first_failure()) : (own_code ? own_code : 1);
  };

  GroupState state = GroupState::kInit;
  auto move = [&](GroupEvent e) {
    auto next = NextGroupState(state, e);
    if (next.ok()) state = *next;
    else spdlog::error("internal: {}", std::string(next.status().message()));
  };
  const CoordinatorWatch::Options wo = WatchOptions();
  long last_round = 0;
  for (;;) {
    if (state == GroupState::kInit) move(GroupEvent::kJoin);
    int sig = 0;
    auto assignment = JoinRound(last_round, &sig);
    if (sig) {
      spdlog::warn("stopped by {} while waiting for the rendezvous", SignalName(sig));
      cleanup();
      return 128 + sig;
    }
    if (!assignment.ok()) {
      spdlog::error("{}", std::string(assignment.status().message()));
      cleanup();
      return 1;
    }
    last_round = assignment->round();
    coordinator_host_ = assignment->coordinator_host();
    if (const auto& t = opts_.static_topology) {
      // Every node runs the same number of workers in static mode (as torchrun).
      const int local = opts_.spec.local_world_size;
      assignment->set_group_rank(t->group_rank);
      assignment->set_group_world_size(t->group_world_size);
      assignment->set_world_size(local * t->group_world_size);
      assignment->set_rank_offset(local * t->group_rank);
      assignment->set_master_addr(t->master_addr);
      assignment->set_master_port(t->master_port);
    }
    move(GroupEvent::kAssigned);
    std::string attempt_dir = absl::StrCat(base, "/attempt_", assignment->restart_count());
    auto workers = PrepareAttempt(*assignment, attempt_dir);
    if (!workers.ok()) {
      spdlog::error("{}", std::string(workers.status().message()));
      cleanup();
      return 2;
    }
    if (opts_.dry_run) {
      PrintDryRun(*workers);
      cleanup();
      return 0;
    }
    spdlog::info("round {}: starting {} worker(s), ranks {}-{} of world size {}{}, master {}, restart {}/{}",
                 assignment->round(), workers->size(), assignment->rank_offset(),
                 assignment->rank_offset() + static_cast<int>(workers->size()) - 1, assignment->world_size(),
                 assignment->group_world_size() > 1
                     ? absl::StrCat(" (node ", assignment->group_rank(), " of ", assignment->group_world_size(), ")")
                     : "",
                 JoinHostPort(assignment->master_addr(), assignment->master_port()),
                 assignment->restart_count(), assignment->max_restarts());

    const long round = assignment->round();
    v1::ReportExitRequest report;
    report.set_run_id(opts_.spec.run_id);
    report.set_node_id(opts_.node.node_id());
    report.set_round(round);

    CoordinatorWatch watch(wo, coordinator_);
    if (auto st = watch.Start(*assignment); !st.ok()) {
      spdlog::error("{}", std::string(st.message()));
      cleanup();
      return 1;
    }
    WorkerGroup::Options gopts;
    gopts.stop = StopEscalation::TermThenKill(opts_.stop_timeout);
    gopts.stop_fd = watch.fd();
    // Tell the coordinator at once, not after the group has stopped, so the other nodes stop
    // now; on a thread of its own, so the call never holds up the group's supervision.
    BackgroundCall early_report;
    gopts.on_failure = [&](const WorkerResult& w) {
      v1::ReportExitRequest early = report;
      *early.add_exits() = ToProto(w);
      auto st = early_report.Start([this, early](CallCanceller*) {
        (void)coordinator_->ReportExit(early, std::chrono::seconds(1));
      });
      if (!st.ok()) spdlog::warn("cannot tell the coordinator of the failure early: {}", std::string(st.message()));
    };
    WorkerGroup group(gopts, launcher_, guard_, signals_, clock_);
    auto outcome = group.Run(*workers);
    early_report.Wait();  // the early report stays the first the coordinator hears
    watch.Stop();
    if (!outcome.ok()) {
      // launch's own failure (exit 1; 2 is for bad input): the workers it started are gone.
      spdlog::error("cannot run the workers: {}", std::string(outcome.status().message()));
      cleanup();
      return 1;
    }
    if (outcome->kind == GroupEnd::kFailed) {
      // The root cause first: the coordinator keeps the first exit of the job's first report.
      *report.add_exits() = ToProto(outcome->workers[outcome->root_cause]);
      for (int i = 0; i < static_cast<int>(outcome->workers.size()); ++i)
        if (i != outcome->root_cause && outcome->workers[i].failed()) *report.add_exits() = ToProto(outcome->workers[i]);
    }

    switch (outcome->kind) {
      case GroupEnd::kSucceeded: {
        move(GroupEvent::kAllSucceeded);
        report.set_group_succeeded(true);
        auto verdict = Report(report, *assignment, &sig);
        if (sig) {
          cleanup();
          return 128 + sig;
        }
        if (!verdict.ok()) {
          spdlog::error("{}", std::string(verdict.status().message()));
          cleanup();
          return 1;
        }
        if (!verdict->job_succeeded() && !verdict->job_failed() && !verdict->restart()) {
          spdlog::info("all {} worker(s) of this node exited 0; waiting for the other nodes",
                       outcome->workers.size());
          auto answer = AwaitVerdict(*assignment, &sig);
          if (sig) {
            spdlog::warn("stopped by {} while waiting for the other nodes", SignalName(sig));
            cleanup();
            return 128 + sig;
          }
          if (answer.ok() && answer->job_succeeded()) verdict->set_job_succeeded(true);
          else if (answer.ok() && answer->stop_workers() && !answer->job_failed()) verdict->set_restart(true);
          else {
            // Failed, or an answer we cannot wait past: ask for the verdict with its first failure.
            v1::ReportExitRequest ask = report;
            ask.set_group_succeeded(false);
            auto v2 = Report(ask, *assignment, &sig);
            if (v2.ok()) {
              *verdict = *v2;
            } else {
              verdict->set_job_failed(true);
              verdict->set_reason(std::string(v2.status().message()));
            }
          }
        }
        if (verdict->job_succeeded()) {
          spdlog::info("all {} worker(s) exited 0", outcome->workers.size());
          cleanup();
          return 0;
        }
        if (verdict->job_failed()) return job_failed(*verdict, 1);
        // Another node failed after ours succeeded: the whole group runs again.
        move(GroupEvent::kRestart);
        spdlog::info("another node started a new round: re-joining");
        continue;
      }
      case GroupEnd::kInterrupted: {
        move(GroupEvent::kSignal);
        move(GroupEvent::kAllStopped);
        move(GroupEvent::kSignal);
        report.set_leaving(true);
        (void)coordinator_->ReportExit(report, std::chrono::seconds(2));
        spdlog::warn("stopped by {}", SignalName(outcome->signal));
        cleanup();
        return 128 + outcome->signal;
      }
      case GroupEnd::kCoordinatorStop: {
        move(GroupEvent::kCoordinatorStop);
        move(GroupEvent::kAllStopped);
        const v1::HeartbeatResponse why = watch.answer();
        if (why.job_failed() && watch.unreachable()) {  // the agent-hosted coordinator died with its node
          move(GroupEvent::kGiveUp);
          ConsoleErr().Write(absl::StrCat("launch: job failed: ", why.reason(), "\n"));
          cleanup();
          return 1;
        }
        auto verdict = Report(report, *assignment, &sig);  // no exits: only asks for the verdict
        if (sig) {
          cleanup();
          return 128 + sig;
        }
        if (!verdict.ok()) {
          spdlog::error("{}", std::string(verdict.status().message()));
          cleanup();
          return 1;
        }
        if (verdict->job_failed() || why.job_failed()) {
          move(GroupEvent::kGiveUp);
          return job_failed(*verdict, 1);
        }
        move(GroupEvent::kRestart);
        spdlog::info("the coordinator started a new round{}{}: re-joining", why.reason().empty() ? "" : " (",
                     why.reason().empty() ? "" : why.reason() + ")");
        continue;
      }
      case GroupEnd::kFailed:
        break;
    }
    move(GroupEvent::kWorkerFailed);
    move(GroupEvent::kAllStopped);
    const WorkerResult& root = outcome->workers[outcome->root_cause];
    auto verdict = Report(report, *assignment, &sig);
    if (sig) {
      cleanup();
      return 128 + sig;
    }
    if (verdict.ok() && verdict->restart()) {
      move(GroupEvent::kRestart);
      spdlog::warn("rank {} failed ({}{}{}); restarting the group ({} of {} restarts)", root.rank,
                   root.StatusText(), root.error_message.empty() ? "" : ": ",
                   root.error_message.substr(0, root.error_message.find('\n')),
                   verdict->restart_count(), assignment->max_restarts());
      if (int s2 = SleepUnlessSignaled(opts_.restart_backoff)) {
        spdlog::warn("stopped by {} while waiting to restart", SignalName(s2));
        cleanup();
        return 128 + s2;
      }
      continue;
    }
    move(GroupEvent::kGiveUp);
    std::string headline = absl::StrCat(
        "launch: worker group failed after ", assignment->restart_count(), " restart(s)",
        assignment->max_restarts() > 0 ? " (restart budget exhausted)" : "",
        temp_dir ? "" : absl::StrCat("; logs in ", attempt_dir));
    ConsoleErr().Write(FailureSummary(*outcome, headline));
    if (auto own = parent_env_.find("TORCHELASTIC_ERROR_FILE"); own != parent_env_.end() && !own->second.empty()) {
      const std::string what = absl::StrCat("rank ", root.rank, " (local rank ", root.local_rank, ") on ",
                                            opts_.node.hostname(), ": ", root.StatusText());
      if (auto st = WriteLauncherErrorFile(own->second, (*workers)[outcome->root_cause].error_file, what,
                                           static_cast<long>(::time(nullptr)));
          !st.ok()) {
        spdlog::warn("{}", std::string(st.message()));
      }
    }
    if (!verdict.ok()) {
      spdlog::error("{}", std::string(verdict.status().message()));
      cleanup();
      return root.AsExitCode();
    }
    if (verdict->has_first_failure() && verdict->first_failure().node_id() != opts_.node.node_id()) {
      return job_failed(*verdict, root.AsExitCode());
    }
    cleanup();
    return root.AsExitCode();
  }
}

}  // namespace launch
