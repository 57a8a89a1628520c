#include "agent/agent.h"

#include <poll.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
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

v1::WorkerExit ToProto(const WorkerResult& w) {
  v1::WorkerExit e;
  e.set_rank(w.rank);
  e.set_local_rank(w.local_rank);
  e.set_pid(w.pid);
  e.set_exit_code(w.exit_code);
  e.set_signal(w.signal);
  e.set_run_seconds(w.run_seconds);
  e.set_error_message(w.error_message);
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

int Agent::SleepUnlessSignaled(std::chrono::milliseconds d) {
  auto deadline = clock_->Now() + d;
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock_->Now());
    if (left.count() <= 0) return 0;
    pollfd p{signals_->fd(), POLLIN, 0};
    ::poll(&p, 1, static_cast<int>(left.count()));
    while (int sig = signals_->Read()) {
      if (sig == SIGCHLD) {
        while (::waitpid(-1, nullptr, WNOHANG) > 0) {  // late orphans reparented to us
        }
        continue;
      }
      return sig;
    }
  }
}

absl::StatusOr<std::vector<WorkerLaunch>> Agent::PrepareAttempt(const v1::Assignment& a,
                                                                const std::string& attempt_dir) {
  const int n = opts_.spec.local_world_size;
  std::vector<WorkerPaths> paths;
  for (int i = 0; i < n; ++i) {
    std::string dir = absl::StrCat(attempt_dir, "/", i);
    if (!opts_.dry_run) {
      RETURN_IF_ERROR(MakeDirs(dir));
      std::string stale = dir + "/error.json";
      if (::access(stale.c_str(), F_OK) == 0) {
        // A previous run with this run id left it; keep it, but out of the new worker's way.
        std::string kept = stale + ".previous";
        std::rename(stale.c_str(), kept.c_str());
        spdlog::warn("moved an earlier error file to {}", kept);
      }
    }
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
  } else {
    base = absl::StrCat(opts_.log_dir, "/", opts_.spec.run_id);
  }
  auto cleanup = [&] {
    if (temp_dir) {
      std::error_code ec;
      fs::remove_all(base, ec);
    }
  };

  GroupState state = GroupState::kInit;
  auto move = [&](GroupEvent e) {
    auto next = NextGroupState(state, e);
    if (next.ok()) state = *next;
    else spdlog::error("internal: {}", std::string(next.status().message()));
  };
  long last_round = 0;
  for (;;) {
    if (state == GroupState::kInit) move(GroupEvent::kJoin);
    v1::JoinRequest req;
    req.set_run_id(opts_.spec.run_id);
    *req.mutable_node() = opts_.node;
    req.set_last_round(last_round);
    req.set_proposed_master_addr(opts_.master_addr);
    if (opts_.master_port) {
      req.set_proposed_master_port(*opts_.master_port);
    } else {
      auto port = PickFreePort(opts_.master_addr);
      if (!port.ok()) {
        spdlog::error("cannot pick a MASTER_PORT on {}: {}", opts_.master_addr, std::string(port.status().message()));
        cleanup();
        return 1;
      }
      req.set_proposed_master_port(*port);
    }
    auto assignment = coordinator_->Join(req);
    if (!assignment.ok()) {
      spdlog::error("{}", std::string(assignment.status().message()));
      cleanup();
      return 1;
    }
    last_round = assignment->round();
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
    spdlog::info("round {}: starting {} worker(s), ranks {}-{} of world size {}, master {}, restart {}/{}",
                 assignment->round(), workers->size(), assignment->rank_offset(),
                 assignment->rank_offset() + static_cast<int>(workers->size()) - 1,
                 assignment->world_size(), JoinHostPort(assignment->master_addr(), assignment->master_port()),
                 assignment->restart_count(), assignment->max_restarts());

    WorkerGroup::Options gopts;
    gopts.stop_timeout = opts_.stop_timeout;
    gopts.heartbeat_interval = opts_.heartbeat_interval;
    const long round = assignment->round();
    if (opts_.heartbeat_interval.count() > 0) {
      gopts.heartbeat = [this, round] {
        v1::HeartbeatRequest hb;
        hb.set_run_id(opts_.spec.run_id);
        hb.set_node_id(opts_.node.node_id());
        hb.set_round(round);
        auto resp = coordinator_->Heartbeat(hb);
        return resp.ok() && (resp->stop_workers() || resp->current_round() > round);
      };
    }
    WorkerGroup group(gopts, launcher_, guard_, signals_, clock_);
    auto outcome = group.Run(*workers);
    if (!outcome.ok()) {
      spdlog::error("{}", std::string(outcome.status().message()));
      cleanup();
      return 2;
    }

    v1::ReportExitRequest report;
    report.set_run_id(opts_.spec.run_id);
    report.set_node_id(opts_.node.node_id());
    report.set_round(round);
    report.set_group_succeeded(outcome->kind == GroupOutcome::kSucceeded);
    for (const auto& w : outcome->workers)
      if (w.failed()) *report.add_exits() = ToProto(w);

    switch (outcome->kind) {
      case GroupOutcome::kSucceeded:
        move(GroupEvent::kAllSucceeded);
        (void)coordinator_->ReportExit(report);
        spdlog::info("all {} worker(s) exited 0", outcome->workers.size());
        cleanup();
        return 0;
      case GroupOutcome::kInterrupted:
        move(GroupEvent::kSignal);
        move(GroupEvent::kAllStopped);
        move(GroupEvent::kSignal);
        (void)coordinator_->ReportExit(report);
        spdlog::warn("stopped by {}", SignalName(outcome->signal));
        cleanup();
        return 128 + outcome->signal;
      case GroupOutcome::kCoordinatorStop:
        move(GroupEvent::kCoordinatorStop);
        move(GroupEvent::kAllStopped);
        move(GroupEvent::kRestart);
        spdlog::info("the coordinator started a new round: re-joining");
        continue;
      case GroupOutcome::kFailed:
        break;
    }
    move(GroupEvent::kWorkerFailed);
    move(GroupEvent::kAllStopped);
    const WorkerResult& root = outcome->workers[outcome->root_cause];
    auto verdict = coordinator_->ReportExit(report);
    if (verdict.ok() && verdict->restart()) {
      move(GroupEvent::kRestart);
      spdlog::warn("rank {} failed ({}{}{}); restarting the group ({} of {} restarts)", root.rank,
                   root.StatusText(), root.error_message.empty() ? "" : ": ",
                   root.error_message.substr(0, root.error_message.find('\n')),
                   verdict->restart_count(), assignment->max_restarts());
      if (int sig = SleepUnlessSignaled(opts_.restart_backoff)) {
        spdlog::warn("stopped by {} while waiting to restart", SignalName(sig));
        cleanup();
        return 128 + sig;
      }
      continue;
    }
    move(GroupEvent::kGiveUp);
    std::string headline = absl::StrCat(
        "launch: worker group failed after ", assignment->restart_count(), " restart(s)",
        assignment->max_restarts() > 0 ? " (restart budget exhausted)" : "",
        temp_dir ? "" : absl::StrCat("; logs in ", attempt_dir));
    std::fputs(FailureSummary(*outcome, headline).c_str(), stderr);
    cleanup();
    return root.AsExitCode();
  }
}

}  // namespace launch
