// Python workers under the real `launch`: torch.distributed, -m, @record error files, and the
// shipped launch_progress module (hang detection with Python stacks; a no-op outside launch).

#include <chrono>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/launch_cmd.h"
#include "tests/test_util.h"

namespace launch::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST(Launch, PythonScriptWithGlooAllreduce) {
  LAUNCH_NEED_PYTHON_TORCH();
  auto r = RunCmd({kLaunch, "--nproc-per-node=2", std::string(TESTS_DIR) + "/python/allreduce.py"}, PythonTorchEnv(),
                  std::chrono::seconds(120));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("[0]:rank 0/2 allreduce=3"));
  EXPECT_THAT(r.out, HasSubstr("[1]:rank 1/2 allreduce=3"));
}

// A Python worker that reports through the shipped launch_progress module is watched for hangs
// like a C++ one: rank 1 stops at step 3 (rank 0 waits for it in all_reduce), the agent has it
// dump its own Python stacks (faulthandler), names it with its frame, and the restart runs through.
TEST(Launch, AHungPythonRankIsNamedWithItsPythonStack) {
  LAUNCH_NEED_PYTHON_TORCH();
  TempDir dir;
  auto r = RunCmd({kLaunch, "--nproc-per-node=2", "--max-restarts=1", "--hang-timeout", "2", "--log-dir", dir / "logs",
                   "--rdzv-id", "pyhang", std::string(TESTS_DIR) + "/python/hang.py"},
                  PythonTorchEnv(), std::chrono::seconds(120));
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("rank 1 failed (hung: no step for"));
  EXPECT_THAT(r.err, HasSubstr("stop_here (hang.py:"));
  EXPECT_THAT(r.out, HasSubstr("[0]:rank 0 done"));
  EXPECT_THAT(r.out, HasSubstr("[1]:rank 1 done"));
  const std::string stacks = ReadFile(dir / "logs/pyhang/attempt_0/1/py_stacks.txt");
  EXPECT_THAT(stacks, HasSubstr("in stop_here")) << stacks;
}

// An unmodified DDP script (no launch_progress): launch counts its optimizer steps, so an explicit
// --hang-timeout finds rank 1 stopped before a step, names it (not rank 0, which waits for it in
// its backward's all-reduce) with its Python stack, and says it was hung.
TEST(Launch, AnUnmodifiedDdpScriptsHungRankIsNamedWithItsStack) {
  LAUNCH_NEED_PYTHON_TORCH();
  TempDir dir;
  auto r = RunCmd({kLaunch, "--nproc-per-node=2", "--hang-timeout", "3", "--log-dir", dir / "logs", "--rdzv-id",
                   "plainhang", std::string(TESTS_DIR) + "/python/ddp_steps.py", "--steps", "100000", "--stop-rank",
                   "1", "--stop-step", "6"},
                  PythonTorchEnv(), std::chrono::seconds(120));
  EXPECT_NE(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.err, ::testing::ContainsRegex("reported no step for [0-9.]+ s \\(last step [1-9][0-9]*, hang timeout "
                                              "3.0 s\\): hung"));
  EXPECT_THAT(r.err, ::testing::ContainsRegex("\n  1 +1 +[0-9]+ +hung .*<- root cause\n"));
  EXPECT_THAT(r.err, HasSubstr("[1] stack: stop_here (ddp_steps.py:"));
  EXPECT_THAT(r.err, Not(HasSubstr("no rank has reported a step")));
  const std::string stacks = ReadFile(dir / "logs/plainhang/attempt_0/1/py_stacks.txt");
  EXPECT_THAT(stacks, HasSubstr("in stop_here")) << stacks;
}

// Without --hang-timeout a script's counted steps never arm the automatic one (a script that
// pauses its optimizer to evaluate is not hung), and the worker is given no stack-dump handler:
// SIGUSR1 keeps its default action, as under torchrun.
TEST(Launch, CountedStepsAloneChangeNoSignalOfTheScript) {
  LAUNCH_NEED_PYTHON_TORCH();
  TempDir dir;
  WriteFile(dir / "usr1.py",
            "import signal, sys, torch\n"
            "import os\n"
            "print('counted stacks', os.environ.get('LAUNCH_COUNTED_STACKS', 'unset'), flush=True)\n"
            "os.kill(os.getpid(), signal.SIGUSR1)\n"
            "print('survived SIGUSR1', flush=True)\n");
  auto r = RunCmd({kLaunch, "--nproc-per-node=1", dir / "usr1.py"}, PythonTorchEnv(), std::chrono::seconds(120));
  EXPECT_EQ(r.exit_code, 128 + 10) << r.err;
  EXPECT_THAT(r.out, HasSubstr("counted stacks unset"));
  EXPECT_THAT(r.out, Not(HasSubstr("survived")));
}

// Outside launch the module is a no-op, so a script that uses it runs anywhere.
TEST(Launch, TheProgressModuleIsANoOpOutsideLaunch) {
  auto r = RunCmd({"/usr/bin/python3", "-c",
                   "import sys; sys.path.append('" + std::string(TESTS_DIR) +
                       "/../worker_sdk/python'); import launch_progress as p; r = p.Reporter(); r.step(1, 0.5); "
                       "p.step(2); print('enabled', r.enabled)"},
                  {"LAUNCH_PROGRESS_FD="});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("enabled False"));
}

// A script that sets OMP_NUM_THREADS in os.environ before importing torch gets that many threads,
// as under torchrun: cold (launch's MKL_NUM_THREADS=1 used to win over it) and warm (torch was
// already loaded by the standby, with launch's value).
TEST(Launch, AScriptsOwnOmpNumThreadsIsHonoured) {
  LAUNCH_NEED_PYTHON_TORCH();
  TempDir dir;
  WriteFile(
      dir / "threads.py",
      "import os\nos.environ['OMP_NUM_THREADS'] = '3'\nimport torch\nprint('threads', torch.get_num_threads())\n");
  for (const std::string warm : {"--warm-start=false", "--warm-start"}) {
    auto r = RunCmd({kLaunch, "--nproc-per-node=2", warm, dir / "threads.py"}, PythonTorchEnv(),
                    std::chrono::seconds(120));
    ASSERT_EQ(r.exit_code, 0) << warm << ": " << r.err;
    EXPECT_THAT(r.out, HasSubstr("[0]:threads 3")) << warm;
    EXPECT_THAT(r.out, HasSubstr("[1]:threads 3")) << warm;
    if (warm == "--warm-start") EXPECT_THAT(r.err, HasSubstr("2 of 2 worker(s) started warm"));
  }
}

TEST(Launch, ModuleFlagRunsPythonDashM) {
  TempDir dir;
  WriteFile(dir / "probe_mod.py", "import os, sys\nprint('module', os.environ['RANK'], sys.stdout.write_through)\n");
  auto r = RunCmd({kLaunch, "--nproc-per-node=2", "-m", "probe_mod"},
                  {"PYTHON_EXEC=/usr/bin/python3", "PYTHONPATH=" + dir.path()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("[0]:module 0 True"));  // -u (unbuffered), as torchrun
  EXPECT_THAT(r.out, HasSubstr("[1]:module 1 True"));
}

// multiprocessing's own helpers (the forkserver, the resource tracker) outlive a worker for a
// moment and end by themselves: launch warned "rank 0 exited but left processes in its group"
// for them on every run. They are still stopped with the group, without the warning; a leftover
// of the script's own is still named (WorkerLeftoverChildrenAreStoppedAtTheEnd).
TEST(Launch, MultiprocessingsHelpersAreNoLeftoverWorthAWarning) {
  TempDir dir;
  WriteFile(dir / "helpers.py",
            "import multiprocessing as mp\n"
            "from multiprocessing import shared_memory\n"
            "def square(x):\n"
            "    return x * x\n"
            "if __name__ == '__main__':\n"
            "    ctx = mp.get_context('forkserver')\n"
            "    with ctx.Pool(1) as pool:\n"
            "        print('squares', pool.map(square, [2, 3]))\n"
            "    shm = shared_memory.SharedMemory(create=True, size=64)\n"
            "    shm.close()\n"
            "    shm.unlink()\n");
  auto r = RunCmd({kLaunch, "--nproc-per-node=2", dir / "helpers.py"}, {"PYTHON_EXEC=/usr/bin/python3"},
                  std::chrono::seconds(120));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("[1]:squares [4, 9]"));
  EXPECT_THAT(r.err, Not(HasSubstr("left processes"))) << r.err;
}

TEST(Launch, PythonRecordErrorFileReachesTheSummary) {
  LAUNCH_NEED_PYTHON_TORCH();
  auto r = RunCmd({kLaunch, "--nproc-per-node=2", std::string(TESTS_DIR) + "/python/record_error.py"},
                  {"PYTHON_EXEC=/usr/bin/python3"}, std::chrono::seconds(120));
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_THAT(r.err, HasSubstr("ValueError: rank 1 found a bad batch"));
  EXPECT_THAT(r.err, HasSubstr("<- root cause"));
}

}  // namespace
}  // namespace launch::testing
