// One worker of an attempt as the agent starts it: its ranks, program, environment, where its
// output and stacks go. Made by the agent's plan of the attempt, run by the WorkerGroup, watched by
// LiveRanks.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace launch {

struct WorkerLaunch {
  int local_rank = 0;
  int rank = 0;
  std::vector<std::string> argv;
  std::vector<std::string> env;
  std::string stdout_file, stderr_file;  // empty: no file
  bool stdout_console = true, stderr_console = true;
  std::string error_file;
  // --numa-binding: its CPUs (empty: launch's) and preferred memory node (-1: default policy).
  std::vector<int> cpus;
  int memory_node = -1;
  std::string numa_why;  // what the binding follows, for --dry-run
  // Its lines' console prefix ("[3]:", or "" for none); unset: Options::console_prefix_format's.
  std::optional<std::string> console_prefix;
  // This worker reads launch's stdin (global rank 0); the others read /dev/null.
  bool reads_stdin = false;
  // Where a hung worker's stacks go: its own Python stacks (LAUNCH_STACK_FILE, written by the
  // worker on a signal) and the debugger's native ones. Empty: not captured.
  std::string python_stack_file, native_stack_file;
};

}  // namespace launch
