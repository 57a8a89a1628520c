// launch: a torchrun-compatible launcher. main only orders start-up: signals blocked before any
// thread exists, the orphan guard forked before gRPC starts its threads.
#include <fcntl.h>
#include <malloc.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "probes/console.h"
#include "probes/process.h"
#include "probes/signals.h"
#include "agent/worker_env.h"
#include "common/exit_status.h"
#include "common/launch_env.h"
#include "rendezvous/grpc_log.h"
#include "launcher/options.h"
#include "launcher/run.h"
#include "spdlog/details/os.h"
#include "spdlog/sinks/ansicolor_sink.h"
#include "spdlog/sinks/stdout_color_sinks.h"
#include "spdlog/spdlog.h"

namespace {

using launch::ExitStatus;
using launch::LaunchOutcome;

// False (after one line naming the value) when LAUNCH_LOG_LEVEL is not a level: spdlog would
// read an unknown name as "off" and silence every later error.
bool SetUpLogging() {
  // Through launch's console thread (a slow terminal never blocks supervision), coloured where
  // stderr is a colour terminal; the in-process coordinator logs from gRPC threads too.
  FILE* err = launch::ConsoleErrFile();
  std::shared_ptr<spdlog::logger> logger;
  if (err) {
    const bool colour = ::isatty(STDERR_FILENO) && spdlog::details::os::is_color_terminal();
    auto sink = std::make_shared<spdlog::sinks::ansicolor_sink<spdlog::details::console_mutex>>(
        err, colour ? spdlog::color_mode::always : spdlog::color_mode::never);
    logger = std::make_shared<spdlog::logger>("launch", std::move(sink));
  } else {
    logger = spdlog::stderr_color_mt("launch");
  }
  logger->set_pattern("[launch %H:%M:%S.%e %^%L%$] %v");
  spdlog::set_default_logger(logger);
  const char* level = std::getenv(launch::kLogLevelEnv);
  if (!level || !*level) return true;
  const std::string name = level;
  for (const char* known : {"trace", "debug", "info", "warn", "error", "off"}) {
    if (name == known) {
      logger->set_level(spdlog::level::from_str(name));
      return true;
    }
  }
  std::fprintf(stderr, "launch: %s=%s: expected trace, debug, info, warn, error or off\n", launch::kLogLevelEnv, level);
  return false;
}

// Descriptors 0-2 closed by whoever started launch would be reused by its own pipes and handed
// on as a worker's stdin: they point at /dev/null instead.
void OpenStandardDescriptors() {
  for (int fd = 0; fd <= 2; ++fd) {
    if (::fcntl(fd, F_GETFD) >= 0) continue;
    int null = ::open("/dev/null", O_RDWR);
    if (null >= 0 && null != fd) {
      ::dup2(null, fd);
      ::close(null);
    }
  }
}

// As many open files as the hard limit allows (the soft limit is often 1024): a node's workers
// each hold launch's ends of their pipes and log files; the coordinator holds a connection per
// node.
void RaiseOpenFileLimit() {
  rlimit lim{};
  if (::getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur < lim.rlim_max) {
    lim.rlim_cur = lim.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &lim);
  }
}

// One malloc arena that grows in large steps. glibc gives each thread that allocates under
// contention an arena of its own, grown a page at a time by an mprotect call: a coordinator's
// gRPC threads building 16,384 calls at once spent more time there (and in the page faults of
// the extra heaps) than in the rendezvous itself. Not inherited by workers (no environment).
void TuneMalloc() {
  mallopt(M_ARENA_MAX, 1);
  mallopt(M_TOP_PAD, 64 << 20);  // address space reserved per heap growth; pages count once touched
}

// Everything shown is written before launch exits, however slowly the console reads; a
// terminating signal gives up on the rest.
struct DrainConsoleAtExit {
  ~DrainConsoleAtExit() {
    spdlog::default_logger()->flush();
    auto signals = launch::SignalFd::Create();
    if (!signals.ok()) return;
    launch::DrainConsole(signals->fd(), [&] {
      while (int sig = signals->Read()) {
        if (sig != SIGCHLD) return true;
        while (::waitpid(-1, nullptr, WNOHANG) > 0) {  // late orphans reparented to launch
        }
      }
      return false;
    });
  }
};

// A subcommand that needs only its parsed flags and the signals: exit 2 on bad flags.
template <typename Parsed, typename Run>
int RunSubcommand(const char* name, const absl::StatusOr<Parsed>& parsed, Run run) {
  if (!parsed.ok()) {
    std::fprintf(stderr, "%s: %s\n", name, std::string(parsed.status().message()).c_str());
    return ExitStatus(LaunchOutcome::UsageError());
  }
  if (parsed->help) return ExitStatus(LaunchOutcome::Succeeded());
  auto signals = launch::SignalFd::Create();
  if (!signals.ok()) {
    std::fprintf(stderr, "%s: %s\n", name, std::string(signals.status().message()).c_str());
    return ExitStatus(LaunchOutcome::LaunchError());
  }
  return run(parsed->config, &*signals);
}

}  // namespace

int main(int argc, char** argv) {
  // Debian builds abseil with mutex deadlock detection on; it shows in every gRPC lock.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  TuneMalloc();
  OpenStandardDescriptors();
  RaiseOpenFileLimit();
  launch::BlockLauncherSignals();
  DrainConsoleAtExit drain_console;
  if (!SetUpLogging()) return ExitStatus(LaunchOutcome::UsageError());
  launch::InstallGrpcLogBridge();  // gRPC's own lines in launch's format
  std::vector<std::string> args(argv, argv + argc);
  if (launch::AsksForVersion(args)) {
    std::printf("launch %s\n", LAUNCH_VERSION);
    return ExitStatus(LaunchOutcome::Succeeded());
  }
  if (args.size() > 1 && args[1] == "coordinator") {
    return RunSubcommand("launch coordinator", launch::ParseCoordinatorArgs(args), launch::RunCoordinator);
  }
  if (args.size() > 1 && args[1] == "status") {
    return RunSubcommand("launch status", launch::ParseStatusArgs(args), launch::RunStatus);
  }
  if (args.size() > 1 && args[1] == "doctor") {
    return RunSubcommand("launch doctor", launch::ParseDoctorArgs(args), launch::RunDoctor);
  }
  auto parsed = launch::ParseLaunchArgs(args, launch::CurrentEnv());
  if (!parsed.ok()) {
    std::fprintf(stderr, "launch: %s\n", std::string(parsed.status().message()).c_str());
    return ExitStatus(LaunchOutcome::UsageError());
  }
  if (parsed->help) return ExitStatus(LaunchOutcome::Succeeded());

  // Orphaned grandchildren of workers are reparented to us, so we can reap and account for them.
  prctl(PR_SET_CHILD_SUBREAPER, 1);
  launch::OrphanGuard guard;
  if (!parsed->config.dry_run) {
    if (auto st = guard.Start(); !st.ok()) {
      std::fprintf(stderr, "launch: %s\n", std::string(st.message()).c_str());
      return ExitStatus(LaunchOutcome::LaunchError());
    }
  }
  launch::InstallJobControl();
  auto signals = launch::SignalFd::Create(parsed->config.signals_to_handle);
  if (!signals.ok()) {
    std::fprintf(stderr, "launch: %s\n", std::string(signals.status().message()).c_str());
    return ExitStatus(LaunchOutcome::LaunchError());
  }
  int code = launch::RunLaunch(parsed->config, &guard, &*signals);
  guard.Stop();
  return code;
}
