// Helpers for integration tests: run the real `launch` binary with a deadline, capture its
// output, wait for conditions without fixed sleeps, and check that no process was left behind.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace launch::testing {

struct RunResult {
  int exit_code = -1;  // 128+signal when killed
  std::string out, err;
  bool timed_out = false;
};

// A running `launch` (or any program) whose output is collected in the background of Wait().
class Child {
 public:
  // stdin_fd >= 0: the child's stdin (else it inherits the test's).
  Child(const std::vector<std::string>& argv, const std::vector<std::string>& extra_env = {}, int stdin_fd = -1);
  ~Child();
  pid_t pid() const { return pid_; }
  // Reads output until exit or the deadline; on the deadline kills the child's process group.
  RunResult Wait(std::chrono::milliseconds timeout = std::chrono::seconds(60));
  // Reads whatever output is available for up to `for_ms` (so a pipe never fills).
  void Pump(int for_ms);
  // While paused, the child's stdout is not read (a console that stops reading).
  void PauseStdout(bool paused) { stdout_paused_ = paused; }
  const std::string& out() const { return out_; }
  const std::string& err() const { return err_; }

 private:
  pid_t pid_ = -1;
  int out_fd_ = -1, err_fd_ = -1;
  std::string out_, err_;
  bool reaped_ = false;
  bool stdout_paused_ = false;
  int status_ = 0;
};

RunResult RunCmd(const std::vector<std::string>& argv, const std::vector<std::string>& extra_env = {},
                 std::chrono::milliseconds timeout = std::chrono::seconds(60));

// The environment for a Python torch.distributed (env://) worker under launch: /usr/bin/python3,
// and where that torch has no libuv (USE_LIBUV=0 set for the test run, as scripts/test_torch2.sh
// does for Debian 13's torch 2.6) TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1: there torch's env://
// client for the agent's store asks for libuv and fails, so worker rank 0 hosts the store
// (tests/python/store_ops.py tests the agent's store there with use_libuv=False).
std::vector<std::string> PythonTorchEnv(std::vector<std::string> more = {});

// Polls `cond` (every few ms) until true or the deadline; returns its last value.
bool WaitUntil(const std::function<bool()>& cond, std::chrono::milliseconds timeout = std::chrono::seconds(20));

// Whether /usr/bin/python3 imports torch.distributed, and whether the run demands it
// (LAUNCH_TEST_REQUIRE_TORCH=1, set by scripts/test.sh: there a missing torch is a broken set-up).
bool PythonHasTorch();
bool PythonTorchRequired();
// In a test body: skips the test when /usr/bin/python3 has no torch, or fails it where required.
#define LAUNCH_NEED_PYTHON_TORCH()                                                     \
  do {                                                                                 \
    if (!::launch::testing::PythonHasTorch()) {                                        \
      if (::launch::testing::PythonTorchRequired())                                    \
        FAIL() << "/usr/bin/python3 has no torch and LAUNCH_TEST_REQUIRE_TORCH=1";     \
      GTEST_SKIP() << "/usr/bin/python3 has no torch (apt-get install python3-torch)"; \
    }                                                                                  \
  } while (0)

bool ProcessAlive(pid_t pid);  // false for zombies too
// The parent pid and command name of a process ({0, ""} when it is gone).
std::pair<pid_t, std::string> ParentAndName(pid_t pid);
// The float32 values in a file (train_mlp --save-params), and the largest difference between two
// such lists (infinity when their sizes differ or they are empty).
std::vector<float> ReadFloats(const std::string& path);
double MaxAbsDiff(const std::vector<float>& a, const std::vector<float>& b);
std::vector<pid_t> ReadPids(const std::string& path);
std::string ReadFile(const std::string& path);
void WriteFile(const std::string& path, const std::string& text);

// The live train_mlp workers whose parent is one of `agents` (standbys, which have the program's
// name too, left out), and the step of the newest checkpoint train_mlp wrote in `dir` (0: none).
std::vector<pid_t> TrainWorkers(const std::vector<pid_t>& agents);
long NewestCheckpoint(const std::string& dir);

// A fresh directory under /tmp, removed by the destructor.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// A CA, a server certificate for 127.0.0.1 and a client certificate, made with openssl in `dir`.
struct TestCerts {
  explicit TestCerts(const TempDir& dir);
  bool ok = true;
  std::string error, ca, server_cert, server_key, client_cert, client_key;
};

}  // namespace launch::testing
