// What the integration tests share: the real `launch` and test_worker binaries, a command line
// of the two, and readings of what a run left (its lines, its processes, its listening ports).
#pragma once

#include <sys/types.h>

#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "tests/test_util.h"

namespace launch::testing {

inline const std::string kLaunch = LAUNCH_BIN;
inline const std::string kWorker = TEST_WORKER_BIN;

// launch with `launch_args`, running test_worker with `worker_args`.
inline std::vector<std::string> Cmd(std::vector<std::string> launch_args, std::vector<std::string> worker_args) {
  std::vector<std::string> argv = {kLaunch};
  argv.insert(argv.end(), launch_args.begin(), launch_args.end());
  argv.push_back(kWorker);
  argv.insert(argv.end(), worker_args.begin(), worker_args.end());
  return argv;
}

inline std::vector<std::string> Lines(const std::string& s) {
  return absl::StrSplit(s, '\n', absl::SkipEmpty());
}

inline int CountLines(const std::string& s, const std::string& needle) {
  int n = 0;
  for (const auto& l : Lines(s)) n += absl::StrContains(l, needle);
  return n;
}

// The TCP ports process `pid` listens on (its socket inodes matched in /proc/net/tcp{,6}).
inline std::vector<int> ListeningTcpPorts(pid_t pid) {
  std::set<std::string> inodes;
  const std::string fd_dir = "/proc/" + std::to_string(pid) + "/fd";
  for (const auto& e : std::filesystem::directory_iterator(fd_dir)) {
    std::error_code ec;
    const std::string target = std::filesystem::read_symlink(e.path(), ec).string();
    if (!ec && absl::StartsWith(target, "socket:[")) inodes.insert(target.substr(8, target.size() - 9));
  }
  std::vector<int> ports;
  for (const auto& line : Lines(ReadFile("/proc/net/tcp") + ReadFile("/proc/net/tcp6"))) {
    std::vector<std::string> f = absl::StrSplit(line, ' ', absl::SkipEmpty());
    if (f.size() < 10 || f[3] != "0A" || !inodes.count(f[9])) continue;  // 0A: LISTEN
    ports.push_back(std::stoi(f[1].substr(f[1].find(':') + 1), nullptr, 16));
  }
  return ports;
}

// Live processes (zombies excluded) with `arg` among their arguments.
inline std::vector<pid_t> ProcessesWithArg(const std::string& arg) {
  std::vector<pid_t> out;
  for (const auto& e : std::filesystem::directory_iterator("/proc")) {
    pid_t pid = 0;
    if (!absl::SimpleAtoi(e.path().filename().string(), &pid)) continue;
    const std::string cmdline = ReadFile(e.path().string() + "/cmdline");
    for (absl::string_view a : absl::StrSplit(cmdline, '\0')) {
      if (a == arg && ProcessAlive(pid)) out.push_back(pid);
    }
  }
  return out;
}

inline bool AllDead(const std::vector<pid_t>& pids) {
  for (pid_t p : pids)
    if (ProcessAlive(p)) return false;
  return true;
}

}  // namespace launch::testing
