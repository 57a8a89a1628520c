// --warm-start against the real launch and Python: a script started from a standby sees what it
// sees started cold (tests/python/warm_probe.py prints it), exits and fails the same, restarts
// from the standby made during the last attempt, falls back to a cold start with one line, and
// leaves no standby behind.
#include <dirent.h>
#include <signal.h>
#include <unistd.h>

#include <map>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace launch::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

const std::string kLaunch = LAUNCH_BIN;
const std::string kProbe = std::string(TESTS_DIR) + "/python/warm_probe.py";
// Light for a standby to import, and imported by nothing else: the probe tells warm from cold by it.
const std::string kLightImport = "--warm-import=xml.dom.minidom";

struct Probe {
  std::string start;  // "warm" or "cold"
  std::string json;
};

// "rank restart" -> the rest of each line a worker printed after `tag` and those two numbers.
std::map<std::string, std::string> Tagged(const std::string& out, const std::string& tag) {
  std::map<std::string, std::string> lines;
  for (absl::string_view line : absl::StrSplit(out, '\n')) {
    const size_t at = line.find(tag);
    if (at == absl::string_view::npos) continue;
    std::vector<std::string> f = absl::StrSplit(line.substr(at + tag.size()), absl::MaxSplits(' ', 2));
    if (f.size() == 3) lines[f[0] + " " + f[1]] = f[2];
  }
  return lines;
}

// "rank restart" -> what that worker printed.
std::map<std::string, Probe> Probes(const std::string& out) {
  std::map<std::string, Probe> probes;
  for (const auto& [key, rest] : Tagged(out, "PROBE ")) {
    const size_t space = rest.find(' ');
    if (space != std::string::npos) probes[key] = Probe{rest.substr(0, space), rest.substr(space + 1)};
  }
  return probes;
}

int Count(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// The pids of live processes whose environment holds `entry` ("KEY=VALUE").
std::vector<pid_t> ProcessesWithEnv(const std::string& entry) {
  std::vector<pid_t> pids;
  DIR* d = ::opendir("/proc");
  if (!d) return pids;
  while (dirent* e = ::readdir(d)) {
    const pid_t pid = static_cast<pid_t>(std::atoi(e->d_name));
    if (pid <= 0 || !ProcessAlive(pid)) continue;
    const std::string env = ReadFile(absl::StrCat("/proc/", pid, "/environ"));
    for (absl::string_view kv : absl::StrSplit(env, '\0'))
      if (kv == entry) pids.push_back(pid);
  }
  ::closedir(d);
  return pids;
}

RunResult Launch(std::vector<std::string> flags, const std::vector<std::string>& script_args,
                 std::vector<std::string> env = {}) {
  std::vector<std::string> argv = {kLaunch, "--nproc-per-node=2"};
  argv.insert(argv.end(), flags.begin(), flags.end());
  argv.insert(argv.end(), script_args.begin(), script_args.end());
  env.push_back("PYTHON_EXEC=/usr/bin/python3");
  return RunCmd(argv, env, std::chrono::seconds(120));
}

TEST(WarmStart, AScriptSeesWhatItSeesStartedCold) {
  auto cold = Launch({"--warm-start=false"}, {kProbe});
  auto warm = Launch({"--warm-start", kLightImport}, {kProbe});
  ASSERT_EQ(cold.exit_code, 0) << cold.err;
  ASSERT_EQ(warm.exit_code, 0) << warm.err;
  EXPECT_THAT(warm.err, HasSubstr("round 1: 2 of 2 worker(s) started warm"));
  auto c = Probes(cold.out), w = Probes(warm.out);
  ASSERT_EQ(c.size(), 2u) << cold.out;
  ASSERT_EQ(w.size(), 2u) << warm.out;
  for (const char* key : {"0 0", "1 0"}) {
    EXPECT_EQ(c[key].start, "cold");
    EXPECT_EQ(w[key].start, "warm") << "the standby's import is not there: it did not run the script";
    EXPECT_EQ(w[key].json, c[key].json) << key;
  }
  EXPECT_THAT(w["1 0"].json, HasSubstr("\"LAUNCH_STANDBY_FD\": null"));
  EXPECT_THAT(w["1 0"].json, HasSubstr("\"3\": \"SOCK\""));  // the progress socket, as cold
  // A warm worker's standby holds its exit notice for launch where its imports loaded ctypes (its
  // own import would leave the script libffi's descriptor, which a cold start does not have; torch
  // loads it: ATorchJobRestartsWarm); a cold script holds none.
  auto cn = Tagged(cold.out, "NOTICE "), wn = Tagged(warm.out, "NOTICE ");
  for (const char* key : {"0 0", "1 0"}) {
    EXPECT_THAT(cn[key], ::testing::StartsWith("0 ")) << key;
    EXPECT_TRUE(wn[key] == "1 1" || wn[key] == "0 0") << key << ": " << wn[key];
  }
  EXPECT_THAT(warm.err, Not(HasSubstr("launch will see this worker's exit only once it is reaped")));
}

TEST(WarmStart, AModuleSeesWhatItSeesStartedCold) {
  const std::string path = "PYTHONPATH=" + std::string(TESTS_DIR) + "/python";
  auto cold = Launch({"-m", "--warm-start=false"}, {"warm_probe", "x y"}, {path});
  auto warm = Launch({"-m", "--warm-start", kLightImport}, {"warm_probe", "x y"}, {path});
  ASSERT_EQ(cold.exit_code, 0) << cold.err;
  ASSERT_EQ(warm.exit_code, 0) << warm.err;
  auto c = Probes(cold.out), w = Probes(warm.out);
  ASSERT_EQ(w.size(), 2u) << warm.out;
  for (const char* key : {"0 0", "1 0"}) {
    EXPECT_EQ(w[key].start, "warm");
    EXPECT_EQ(w[key].json, c[key].json) << key;
  }
  EXPECT_THAT(w["0 0"].json, HasSubstr("warm_probe.py\", \"x y\"]"));  // sys.argv[0] is the module's file
}

// A forked worker holds its exit notice (the fork's code loaded ctypes), and its failure is seen
// from it, before it is reaped (it has 512 MiB to free; up to three tries, as the notice could
// lose to the reaping on a loaded machine).
TEST(WarmStart, AWarmWorkersFailureIsSeenFromItsExitNotice) {
  int seen = 0;
  for (int attempt = 0; attempt < 3 && seen == 0; ++attempt) {
    auto r = Launch({"--warm-start", kLightImport}, {kProbe, "exit-big"}, {"LAUNCH_LOG_LEVEL=debug"});
    EXPECT_EQ(r.exit_code, 7) << r.err;
    EXPECT_EQ(Tagged(r.out, "NOTICE ")["1 0"], "1 1") << r.out;
    if (r.err.find("is exiting (exit 7), seen from its exit notice") != std::string::npos) ++seen;
    EXPECT_THAT(r.err, ::testing::ContainsRegex("\n  1 +1 +[0-9]+ +exit 7 "));
  }
  EXPECT_EQ(seen, 1);
}

// An exception's traceback is the script's own (no frame of the standby), and the exit codes and
// the failure table are the cold start's.
TEST(WarmStart, FailuresAndTracebacksAreTheColdStarts) {
  TempDir dir;
  auto cold = Launch({"--warm-start=false", "--log-dir", dir / "logs", "--rdzv-id", "cold"}, {kProbe, "raise"});
  auto warm = Launch({"--warm-start", kLightImport, "--log-dir", dir / "logs", "--rdzv-id", "warm"}, {kProbe, "raise"});
  EXPECT_EQ(cold.exit_code, 1) << cold.err;
  EXPECT_EQ(warm.exit_code, 1) << warm.err;
  const std::string cold_tb = ReadFile(dir / "logs/cold/attempt_0/1/stderr.log");
  const std::string warm_tb = ReadFile(dir / "logs/warm/attempt_0/1/stderr.log");
  EXPECT_THAT(cold_tb, HasSubstr("ValueError: rank 1 found a bad batch"));
  EXPECT_THAT(cold_tb, HasSubstr("in deeper"));
  EXPECT_EQ(warm_tb, cold_tb);
  EXPECT_THAT(warm_tb, Not(HasSubstr("_launch_standby")));
  EXPECT_THAT(warm.err, ::testing::ContainsRegex("\n  1 +1 +[0-9]+ +exit 1 "));

  auto exit7 = Launch({"--warm-start", kLightImport}, {kProbe, "exit"});
  EXPECT_EQ(exit7.exit_code, 7) << exit7.err;
  EXPECT_THAT(exit7.err, ::testing::ContainsRegex("\n  1 +1 +[0-9]+ +exit 7 "));
}

// A forked worker ends without the interpreter's teardown of what it shares with its standby
// (slow: every shared page it writes is copied), but what a program sees of that exit happens:
// other threads are joined, atexit handlers run, a file left open is flushed, and SystemExit's
// message and status are the cold start's.
TEST(WarmStart, AForkedWorkersExitIsTheInterpretersAsAProgramSeesIt) {
  TempDir dir;
  auto r = Launch({"--warm-start", kLightImport}, {kProbe, "unclosed", dir.path()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("2 of 2 worker(s) started warm (2 forked"));
  for (int rank : {0, 1}) {
    EXPECT_EQ(ReadFile(dir / absl::StrCat("unclosed.", rank)), absl::StrCat("written by rank ", rank, "\n"));
    EXPECT_THAT(r.out, HasSubstr(absl::StrCat("[", rank, "]:THREAD ", rank, "\n")));
    EXPECT_THAT(r.out, HasSubstr(absl::StrCat("[", rank, "]:ATEXIT ", rank, " 0\n")));
  }
  auto cold = Launch({"--warm-start=false"}, {kProbe, "exit-message"});
  auto warm = Launch({"--warm-start", kLightImport}, {kProbe, "exit-message"});
  EXPECT_EQ(cold.exit_code, 1) << cold.err;
  EXPECT_EQ(warm.exit_code, 1) << warm.err;
  EXPECT_THAT(warm.err, HasSubstr("[1]:rank 1 gives up"));
  EXPECT_THAT(cold.err, HasSubstr("[1]:rank 1 gives up"));
}

// The exit of a forked worker touched every object of the script (isinstance asks for __class__):
// torch 1.13's deprecated reduce_op warned at every rank's exit, and under PYTHONWARNINGS=error a
// worker that succeeded exited 1 and --max-restarts ran it again.
TEST(WarmStart, AForkedWorkersExitTouchesNoneOfTheScriptsObjects) {
  for (const std::string warnings : {"", "error"}) {
    std::vector<std::string> env;
    if (!warnings.empty()) env.push_back("PYTHONWARNINGS=" + warnings);
    auto r = Launch({"--warm-start", kLightImport, "--max-restarts=1"}, {kProbe, "touchy"}, env);
    EXPECT_EQ(r.exit_code, 0) << "PYTHONWARNINGS=" << warnings << ": " << r.err;
    EXPECT_THAT(r.err, HasSubstr("2 of 2 worker(s) started warm (2 forked"));
    EXPECT_THAT(r.err, Not(HasSubstr("touchy object was asked"))) << "PYTHONWARNINGS=" << warnings;
    EXPECT_THAT(r.err, HasSubstr("all 2 worker(s) exited 0")) << "PYTHONWARNINGS=" << warnings;
    EXPECT_THAT(r.err, Not(HasSubstr("round 2"))) << "PYTHONWARNINGS=" << warnings;
  }
}

// @record's error file (torch.distributed.elastic) is written at the attempt's path, which the
// standby learns only at its start.
TEST(WarmStart, TheErrorFileOfATorchScriptReachesTheSummary) {
  LAUNCH_NEED_PYTHON_TORCH();
  auto r = Launch({"--warm-start"}, {std::string(TESTS_DIR) + "/python/record_error.py"});
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_THAT(r.err, HasSubstr("round 1: 2 of 2 worker(s) started warm"));
  EXPECT_THAT(r.err, HasSubstr("ValueError: rank 1 found a bad batch"));
  EXPECT_THAT(r.err, HasSubstr("<- root cause"));
}

// "rank restart" -> the probe's hash of a string: the same in the forks of one interpreter.
std::map<std::string, std::string> Interpreters(const std::string& out) { return Tagged(out, "INTERPRETER "); }

// Each attempt's workers are forks of the standbys made when the run started: a rank's
// interpreter imported once, both attempts' workers are its forks.
TEST(WarmStart, ARestartForksTheStandbysOfTheFirstAttemptAgain) {
  TempDir dir;
  auto r = Launch({"--warm-start", kLightImport, "--max-restarts=1"}, {kProbe, "fail-first", dir.path()},
                  {"PYTHONHASHSEED=random"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(Count(r.err, "2 of 2 worker(s) started warm (2 forked from standbys that stay)"), 2) << r.err;
  auto p = Probes(r.out);
  ASSERT_EQ(p.size(), 4u) << r.out;
  EXPECT_EQ(p["0 1"].start, "warm");
  EXPECT_EQ(p["1 1"].start, "warm");
  EXPECT_THAT(p["1 1"].json, HasSubstr("\"TORCHELASTIC_RESTART_COUNT\": \"1\""));
  EXPECT_THAT(p["1 1"].json, HasSubstr("\"RANK\": \"1\""));
  EXPECT_THAT(p["1 1"].json, HasSubstr("\"threads\": 1"));
  auto i = Interpreters(r.out);
  ASSERT_EQ(i.size(), 4u) << r.out;
  EXPECT_EQ(i["0 0"], i["0 1"]);
  EXPECT_EQ(i["1 0"], i["1 1"]);
  EXPECT_NE(i["0 0"], i["1 0"]);  // one standby per rank
}

// A standby with a thread of its own is not forked: it becomes the worker itself, and the next
// attempt's standbys are made while the attempt runs.
TEST(WarmStart, AStandbyWithAThreadBecomesTheWorkerAndANewOneIsMade) {
  TempDir dir;
  auto r = Launch({"--warm-start", "--warm-import=warm_thread", "--max-restarts=1"}, {kProbe, "fail-first", dir.path()},
                  {"PYTHONHASHSEED=random"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(Count(r.err, "2 of 2 worker(s) started warm (0 forked from standbys that stay)"), 2) << r.err;
  auto p = Probes(r.out);
  ASSERT_EQ(p.size(), 4u) << r.out;
  for (const char* key : {"0 0", "1 0", "0 1", "1 1"}) EXPECT_EQ(p[key].start, "warm") << key;
  auto i = Interpreters(r.out);
  ASSERT_EQ(i.size(), 4u) << r.out;
  EXPECT_NE(i["1 0"], i["1 1"]);
}

// A real DDP-style torch script (gloo all-reduce on the agent's store) on the default import,
// torch, through a restart.
TEST(WarmStart, ATorchJobRestartsWarm) {
  LAUNCH_NEED_PYTHON_TORCH();
  std::vector<std::string> env = PythonTorchEnv();
  env.push_back("ALLREDUCE_FAIL_FIRST=1");
  // OpenBLAS starts a thread pool when torch loads it; it stops at a fork, so the standby is
  // still forked.
  env.push_back("OPENBLAS_NUM_THREADS=2");
  auto r = Launch({"--warm-start", "--max-restarts=1"}, {std::string(TESTS_DIR) + "/python/allreduce.py"}, env);
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  EXPECT_EQ(Count(r.err, "2 of 2 worker(s) started warm (2 forked from standbys that stay)"), 2) << r.err;
  // The restarted worker, a fork of its standby, holds its exit notice for launch.
  EXPECT_THAT(r.out, HasSubstr("[0]:rank 0/2 allreduce=3 torch preloaded, exit notice held"));
  EXPECT_THAT(r.err, Not(HasSubstr("launch will see this worker's exit only once it is reaped")));
}

TEST(WarmStart, AStandbyThatCannotImportStartsColdWithOneLine) {
  TempDir dir;
  // Through a restart: the standbys that cannot import are not made again for the next attempt.
  auto r = Launch({"--warm-start", "--warm-import=xml.dom.minidom,no_such_module_for_launch", "--max-restarts=1"},
                  {kProbe, "fail-first", dir.path()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const char* rank : {"rank 0 (local rank 0)", "rank 1 (local rank 1)"}) {
    EXPECT_EQ(Count(r.err, absl::StrCat(rank,
                                        " starts cold: its standby cannot import no_such_module_for_launch: "
                                        "ModuleNotFoundError: No module named 'no_such_module_for_launch'")),
              1)
        << r.err;
  }
  EXPECT_THAT(r.err, HasSubstr("round 1: 0 of 2 worker(s) started warm"));
  auto p = Probes(r.out);
  ASSERT_EQ(p.size(), 4u) << r.out;
  EXPECT_EQ(p["0 0"].start, "cold");  // the half-made standby's import is not in the cold worker
  EXPECT_EQ(p["1 1"].start, "cold");
}

// --- C++ workers (worker_sdk programs that declare LAUNCH_SDK_WARM_START) ---

const std::string kWarmWorker = WARM_WORKER_BIN;

struct CppProbe {
  std::string start, token;
  int threads = 0;
  std::string standby_fd, fd3, stdin_kind, name;
};

// "rank restart" -> what tests/workers/warm_worker.cc printed after AwaitWorkerStart.
std::map<std::string, CppProbe> CppProbes(const std::string& out) {
  std::map<std::string, CppProbe> probes;
  for (const auto& [key, rest] : Tagged(out, "WARM ")) {
    std::vector<std::string> f = absl::StrSplit(rest, ' ');
    if (f.size() == 7) probes[key] = CppProbe{f[0], f[1], std::atoi(f[2].c_str()), f[3], f[4], f[5], f[6]};
  }
  return probes;
}

// On by default: each rank's standby, made ahead, loads the program and becomes the worker with
// the attempt's environment and descriptors; what it printed before its go starts the worker's
// output. The next attempt's standbys are made only once every rank has reported a step (not
// while the attempt starts on the same cores), and the restart starts from them.
TEST(WarmStartCpp, ADeclaringProgramRestartsFromItsStandbyByDefault) {
  TempDir dir;
  auto r = RunCmd({kLaunch, "--nproc-per-node=2", "--max-restarts=1", kWarmWorker, "fail-first", dir.path()});
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  EXPECT_EQ(Count(r.err, "2 of 2 worker(s) started warm (0 forked from standbys that stay)"), 2) << r.err;
  auto p = CppProbes(r.out);
  ASSERT_EQ(p.size(), 4u) << r.out;
  for (const auto& [key, probe] : p) {
    EXPECT_EQ(probe.start, "warm") << key;
    EXPECT_EQ(probe.threads, 1) << key;
    EXPECT_EQ(probe.standby_fd, "-") << key;  // the worker's environment is its attempt's
    EXPECT_EQ(probe.fd3, "SOCK") << key;      // the progress socket, as a cold worker's
    EXPECT_EQ(probe.stdin_kind, "CHR") << key;
    EXPECT_EQ(probe.name, "warm_worker") << key;  // the standby's name was launch-standby
    // Printed by its standby, at the start of its output.
    const std::string rank = key.substr(0, 1);
    EXPECT_EQ(Count(r.out, absl::StrCat("[", rank, "]:BEFORE ", probe.token, "\n")), 1) << r.out;
  }
  EXPECT_NE(p["0 0"].token, p["0 1"].token);  // each attempt's standbys are new
  EXPECT_NE(p["1 0"].token, p["1 1"].token);
  EXPECT_NE(p["0 0"].token, p["1 0"].token);
  // None before the ranks' first report; then they come (the printed count is at least 1).
  for (const char* rank : {"0", "1"}) {
    std::map<std::string, std::string> counts = Tagged(r.out, "STANDBYS ");
    ASSERT_EQ(counts.count(absl::StrCat(rank, " 0")), 1u) << r.out;
    EXPECT_THAT(counts[absl::StrCat(rank, " 0")], ::testing::AnyOf("1", "2")) << r.out;
  }

  auto cold = RunCmd({kLaunch, "--nproc-per-node=2", "--warm-start=false", kWarmWorker});
  ASSERT_EQ(cold.exit_code, 0) << cold.err;
  EXPECT_THAT(cold.err, Not(HasSubstr("started warm")));
  auto c = CppProbes(cold.out);
  ASSERT_EQ(c.size(), 2u) << cold.out;
  EXPECT_EQ(c["0 0"].start, "cold");
  EXPECT_EQ(c["1 0"].fd3, "SOCK");
}

// A standby with a thread of its own becomes the worker itself; the next attempt gets a new one.
TEST(WarmStartCpp, AStandbyWithAThreadBecomesTheWorker) {
  TempDir dir;
  auto r = RunCmd({kLaunch, "--nproc-per-node=2", "--max-restarts=1", kWarmWorker, "thread"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("2 of 2 worker(s) started warm (0 forked from standbys that stay)"));
  auto p = CppProbes(r.out);
  ASSERT_EQ(p.size(), 2u) << r.out;
  EXPECT_EQ(p["0 0"].start, "warm");
  EXPECT_EQ(p["1 0"].threads, 2);
  // The thread made in the standby (named launch-standby with it) has the program's name back.
  EXPECT_THAT(r.out, HasSubstr("[1]:THREADNAMES 1 warm_worker,warm_worker\n"));
}

// An exception after the go reaches the error file, and the summary, as from a cold worker.
TEST(WarmStartCpp, TheErrorFileIsTheAttempts) {
  auto r = RunCmd({kLaunch, "--nproc-per-node=2", kWarmWorker, "throw"});
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_THAT(r.err, HasSubstr("2 of 2 worker(s) started warm"));
  EXPECT_THAT(r.err, HasSubstr("std::runtime_error: rank 1 gives up warm   <- root cause"));
}

// A warm worker's exit keeps what a program sees of exit(): the handlers it registered, its
// buffered output, its status.
TEST(WarmStartCpp, AWarmWorkersExitIsAProgramsExit) {
  for (const char* warm : {"--warm-start=true", "--warm-start=false"}) {
    // One rank: the first failure stops the others, before they would print.
    auto r = RunCmd({kLaunch, "--nproc-per-node=1", warm, kWarmWorker, "exit"});
    EXPECT_EQ(r.exit_code, 7) << warm << r.err;
    EXPECT_THAT(r.out, HasSubstr("[0]:BUFFERED 0ATEXIT\n")) << warm << r.out;
    EXPECT_EQ(absl::StrContains(r.err, "1 of 1 worker(s) started warm"), std::string(warm) == "--warm-start=true")
        << r.err;
  }
}

// A malformed LAUNCH_STANDBY_KEEP_WARM_MS is named once by the standby (which ends: the rank starts
// cold, saying why) and once by the cold worker, which fails.
TEST(WarmStartCpp, AMalformedKeepWarmIntervalIsNamed) {
  auto r = RunCmd({kLaunch, "--nproc-per-node=1", kWarmWorker}, {"LAUNCH_STANDBY_KEEP_WARM_MS=-1"});
  EXPECT_NE(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("rank 0 (local rank 0) starts cold: its standby exited before it was ready: launch_sdk: "
                               "LAUNCH_STANDBY_KEEP_WARM_MS=-1: expected an integer in 0..60000 (0: never)"));
  EXPECT_THAT(r.err, HasSubstr("LAUNCH_STANDBY_KEEP_WARM_MS=-1: expected an integer in 0..60000"));
}

// A program without the mark starts cold: silently by default, with one line when asked for.
TEST(WarmStartCpp, AProgramWithoutTheMarkStartsCold) {
  auto quiet = RunCmd({kLaunch, "--nproc-per-node=2", TEST_WORKER_BIN});
  EXPECT_EQ(quiet.exit_code, 0) << quiet.err;
  EXPECT_THAT(quiet.err, Not(HasSubstr("warm")));
  auto asked = RunCmd({kLaunch, "--nproc-per-node=2", "--warm-start", TEST_WORKER_BIN});
  EXPECT_EQ(asked.exit_code, 0) << asked.err;
  EXPECT_EQ(Count(asked.err, absl::StrCat("warm start: '", TEST_WORKER_BIN,
                                          "' is neither a Python worker nor a worker_sdk program")),
            1)
      << asked.err;
}

// Standbys are named launch-standby (their workers have the program's name) and die with launch.
TEST(WarmStartCpp, StandbysAreNamedAndDieWithLaunch) {
  TempDir dir;
  const std::string marker = "WARM_TEST_MARKER=" + dir.path();
  Child c({kLaunch, "--nproc-per-node=2", "--max-restarts=1", kWarmWorker, "wait", dir / "never"}, {marker});
  auto named = [&](const std::string& name) {
    int n = 0;
    for (pid_t pid : ProcessesWithEnv(marker))
      if (absl::StripTrailingAsciiWhitespace(ReadFile(absl::StrCat("/proc/", pid, "/comm"))) == name) ++n;
    return n;
  };
  // launch, its orphan guard, 2 workers and, once they reported a step, the next attempt's 2
  // standbys.
  ASSERT_TRUE(WaitUntil(
      [&] {
        c.Pump(10);
        return absl::StrContains(c.err(), "started warm") && named("launch-standby") == 2 && named("warm_worker") == 2;
      },
      std::chrono::seconds(60)))
      << c.err();
  ::kill(c.pid(), SIGKILL);
  c.Wait(std::chrono::seconds(10));
  EXPECT_TRUE(WaitUntil([&] { return ProcessesWithEnv(marker).empty(); }, std::chrono::seconds(20)));
}

// The next attempt's standbys, never used, go with launch: at its end, and when it is killed.
TEST(WarmStart, NoStandbyOutlivesLaunch) {
  TempDir dir;
  const std::string marker = "WARM_TEST_MARKER=" + dir.path();
  auto r = Launch({"--warm-start", kLightImport, "--max-restarts=2"}, {kProbe}, {marker});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(ProcessesWithEnv(marker), ::testing::IsEmpty());

  Child c({kLaunch, "--nproc-per-node=2", "--warm-start", kLightImport, "--max-restarts=2", kProbe, "wait",
           dir / "never"},
          {marker, "PYTHON_EXEC=/usr/bin/python3"});
  // launch, its orphan guard, 2 workers and 2 standbys for the next attempt; then launch dies
  // without a word.
  ASSERT_TRUE(WaitUntil(
      [&] {
        c.Pump(10);
        return absl::StrContains(c.err(), "started warm") && ProcessesWithEnv(marker).size() >= 6;
      },
      std::chrono::seconds(60)))
      << c.err();
  ::kill(c.pid(), SIGKILL);
  c.Wait(std::chrono::seconds(10));
  EXPECT_TRUE(WaitUntil([&] { return ProcessesWithEnv(marker).empty(); }, std::chrono::seconds(20)));
}

}  // namespace
}  // namespace launch::testing
