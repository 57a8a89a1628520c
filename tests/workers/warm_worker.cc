// A worker_sdk program that declares LAUNCH_SDK_WARM_START() without LibTorch (the SDK's warm
// start, environment and error-file parts only), for tests of C++ warm starts. Before
// AwaitWorkerStart it prints "BEFORE <token>" (a token drawn then: the same in every worker forked
// from one standby); after it, one line "WARM <rank> <restart> <start> <token> <threads>
// <standby fd> <fd 3 kind> <stdin kind> <process name>".
// argv[1]: "" (exit 0), "fail-first DIR" (each rank reports step 1, prints "STANDBYS <rank> <n>
// <m>": its parent's children named launch-standby before the report and once one is there (or
// 60 s passed), then rank 1 exits 3 in attempt 0 once rank 0 has printed), "thread" (a thread runs
// before AwaitWorkerStart; after it, "THREADNAMES <rank> <each thread's name, comma separated>"),
// "throw" (rank 1 throws, as RunWithErrorFile reports), "exit" (exit 7
// through an atexit handler and a buffered line), "wait FILE" (report step 1, wait until FILE
// exists), "keep-warm DIR" (a keep-warm function, AddStandbyKeepWarm, counts its runs in
// DIR/keep-warm; the worker prints "KEEPWARM <runs>").
#include <dirent.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>

#include "launch_sdk/env.h"
#include "launch_sdk/errors.h"
#include "launch_sdk/progress.h"
#include "launch_sdk/warm_start.h"

LAUNCH_SDK_WARM_START();

namespace {

std::string Kind(int fd) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return "closed";
  if (S_ISSOCK(st.st_mode)) return "SOCK";
  if (S_ISFIFO(st.st_mode)) return "FIFO";
  if (S_ISCHR(st.st_mode)) return "CHR";
  if (S_ISREG(st.st_mode)) return "REG";
  return "other";
}

int Threads() {
  int n = 0;
  if (DIR* d = ::opendir("/proc/self/task")) {
    while (dirent* e = ::readdir(d))
      if (e->d_name[0] != '.') ++n;
    ::closedir(d);
  }
  return n;
}

// The children of this process's parent (launch) whose name is launch-standby.
int Standbys() {
  const std::string parent = std::to_string(::getppid());
  int n = 0;
  DIR* d = ::opendir("/proc");
  if (!d) return 0;
  while (dirent* e = ::readdir(d)) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    std::ifstream f(std::string("/proc/") + e->d_name + "/stat");
    std::string stat((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    // "pid (comm) state ppid ...": comm may hold spaces and parentheses, so from the last ')'.
    const size_t close = stat.rfind(')');
    if (close == std::string::npos || stat.find("(launch-standby)") == std::string::npos) continue;
    std::istringstream rest(stat.substr(close + 1));
    std::string state, ppid;
    rest >> state >> ppid;
    if (ppid == parent) ++n;
  }
  ::closedir(d);
  return n;
}

bool Exists(const std::string& path) { return ::access(path.c_str(), F_OK) == 0; }

// Polls for `path` (another rank's word), at most a minute.
void WaitFor(const std::string& path) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(1);
  while (!Exists(path) && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  const std::string arg = argc > 2 ? argv[2] : "";
  const unsigned long token = std::random_device{}();
  std::printf("BEFORE %lu\n", token);
  if (mode == "thread") std::thread([] { std::this_thread::sleep_for(std::chrono::hours(1)); }).detach();
  int keep_warm_runs = 0;
  if (mode == "keep-warm") {
    launch_sdk::AddStandbyKeepWarm([&] {
      const std::string path = arg + "/keep-warm";
      std::ofstream(path + ".tmp") << ++keep_warm_runs;
      std::rename((path + ".tmp").c_str(), path.c_str());
    });
  }
  return launch_sdk::RunWithErrorFile([&] {
    const launch_sdk::WorkerEnv env = launch_sdk::ReadWorkerEnv();
    const char* standby_fd = std::getenv("LAUNCH_STANDBY_FD");
    char name[16] = {};
    ::prctl(PR_GET_NAME, name, 0, 0, 0);
    std::printf("WARM %d %d %s %lu %d %s %s %s %s\n", env.rank, env.restart_count,
                launch_sdk::StartedWarm() ? "warm" : "cold", token, Threads(), standby_fd ? standby_fd : "-",
                Kind(3).c_str(), Kind(0).c_str(), name);
    std::fflush(stdout);
    if (mode == "fail-first" && env.restart_count == 0) {
      // The next attempt's standbys are made once every rank has reported a step, not before.
      // Counted once both ranks are past their go (a standby is named launch-standby until then).
      const std::string started = arg + "/started." + std::to_string(env.rank);
      std::ofstream(started + ".tmp") << "1";
      std::rename((started + ".tmp").c_str(), started.c_str());
      WaitFor(arg + "/started." + std::to_string(1 - env.rank));
      const int before = Standbys();
      launch_sdk::ProgressReporter::FromEnv().Report(1, 0.0, 0.001);
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(1);
      while (Standbys() == 0 && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      std::printf("STANDBYS %d %d %d\n", env.rank, before, Standbys());
      std::fflush(stdout);
      const std::string ready = arg + "/ready." + std::to_string(env.rank);
      std::ofstream(ready + ".tmp") << "1";
      std::rename((ready + ".tmp").c_str(), ready.c_str());
      if (env.rank == 1) {
        WaitFor(arg + "/ready.0");
        return 3;
      }
      WaitFor(arg + "/never");  // stopped by the agent when rank 1 fails
    }
    if (mode == "throw" && env.rank == 1) throw std::runtime_error("rank 1 gives up warm");
    if (mode == "exit") {  // an atexit handler, a buffered line, an exit status: as a cold worker's
      std::atexit([] { std::printf("ATEXIT\n"); });
      std::printf("BUFFERED %d", env.rank);
      return 7;
    }
    if (mode == "keep-warm") std::printf("KEEPWARM %d\n", keep_warm_runs);
    if (mode == "thread") {  // every thread's name, the one made in the standby too
      std::string names;
      if (DIR* d = ::opendir("/proc/self/task")) {
        while (dirent* e = ::readdir(d)) {
          if (e->d_name[0] == '.') continue;
          std::ifstream f(std::string("/proc/self/task/") + e->d_name + "/comm");
          std::string name;
          std::getline(f, name);
          names += (names.empty() ? "" : ",") + name;
        }
        ::closedir(d);
      }
      std::printf("THREADNAMES %d %s\n", env.rank, names.c_str());
    }
    if (mode == "wait") {
      launch_sdk::ProgressReporter::FromEnv().Report(1, 0.0, 0.001);
      WaitFor(arg);
    }
    return 0;
  });
}
