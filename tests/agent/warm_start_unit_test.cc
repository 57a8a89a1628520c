// agent/warm_start: which variables a standby gets at its start, its command, the go message, one
// standby through the real protocol (a Python interpreter, the shipped _launch_standby.py), and
// standbys of another contract version.
#include "agent/warm_start.h"

#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <set>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "launch_sdk/contract.h"
#include "spdlog/sinks/ostream_sink.h"
#include "spdlog/spdlog.h"
#include "tests/test_util.h"

namespace launch {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::vector<WorkerPaths> Paths(const std::string& attempt, int n) {
  std::vector<WorkerPaths> p;
  for (int i = 0; i < n; ++i) {
    const std::string d = absl::StrCat(attempt, "/", i);
    p.push_back({d + "/error.json", d, d + "/py_stacks.txt"});
  }
  return p;
}

// The options of a standby that imports `imports`, from the shipped _launch_standby.py.
WarmStart::Options Importing(std::vector<std::string> imports) {
  WarmStart::Options o;
  o.python_dir = SDK_PYTHON_DIR;
  o.imports = std::move(imports);
  return o;
}

// A worker script: it sends "progress from RANK" on its progress socket and prints its rank, its
// stdin and then `rest` (the rest of the print call, and what follows it).
std::string Script(const std::string& rest) {
  return "import os, sys, socket\n"
         "s = socket.socket(fileno=int(os.environ['LAUNCH_PROGRESS_FD']))\n"
         "s.send(b'progress from ' + os.environ['RANK'].encode())\n"
         "print('rank', os.environ['RANK'], 'stdin', sys.stdin.read().strip(), " + rest;
}

// A worker started through WarmStart::Take, with its stdout and progress socket here.
struct Worker {
  pid_t pid = -1;
  int out = -1, progress = -1;
  Worker() = default;
  Worker(Worker&& o) noexcept : pid(o.pid), out(std::exchange(o.out, -1)), progress(std::exchange(o.progress, -1)) {}
  Worker& operator=(Worker&&) = delete;
  ~Worker() {
    if (out >= 0) ::close(out);
    if (progress >= 0) ::close(progress);
  }
  std::string Out() {
    std::string text;
    char buf[4096];
    ssize_t n;
    while ((n = ::read(out, buf, sizeof buf)) > 0) text.append(buf, static_cast<size_t>(n));
    return text;
  }
  std::string Progress() {
    char buf[256];
    ssize_t n = ::recv(progress, buf, sizeof buf, MSG_DONTWAIT);
    return std::string(buf, n > 0 ? static_cast<size_t>(n) : 0);
  }
  int Wait() {
    int status = 0;
    if (::waitpid(pid, &status, 0) != pid) return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
};

Worker Start(WarmStart* warm, const WorkerLaunch& w, const std::string& input) {
  Worker a;
  int progress[2], in[2], out[2];
  if (::socketpair(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0, progress) != 0 || ::pipe2(in, O_CLOEXEC) != 0 ||
      ::pipe2(out, O_CLOEXEC) != 0) {
    return a;
  }
  if (::write(in[1], input.data(), input.size()) != static_cast<ssize_t>(input.size())) return a;
  ::close(in[1]);
  std::optional<pid_t> pid;
  if (warm->Send(w, {progress[1], in[0], out[1], STDERR_FILENO})) pid = warm->Take(w);
  ::close(in[0]);
  ::close(progress[1]);
  ::close(out[1]);
  a.out = out[0];
  a.progress = progress[0];
  if (pid) a.pid = *pid;
  return a;
}

// Everything that differs between two rounds' environments is a round variable (given at the
// start); everything else is fixed, so the standby made in one round is right for the next.
TEST(WarmStartEnv, OnlyTheRoundsVariablesDifferBetweenRounds) {
  WorkerGroupSpec spec;
  spec.local_world_size = 2;
  spec.usable_cpus = 8;
  spec.python_dir = "/opt/launch/python";
  spec.gpu_pool = {"0", "1"};
  spec.cuda_alloc_conf = "expandable_segments:True";
  TrainScaling t;
  t.base_lr = 0.1;
  t.per_worker_batch = 32;
  spec.train = t;
  const Env parent = {{"PATH", "/usr/bin"}, {"PYTHONPATH", "/src"}};
  RoundInfo a;
  RoundInfo b;
  b.round = 7;
  b.group_rank = 2;
  b.group_world_size = 3;
  b.world_size = 6;
  b.rank_offset = 4;
  b.master_addr = "10.0.0.9";
  b.master_port = 29511;
  b.restart_count = 3;
  b.agent_store = true;
  auto ea = BuildWorkerEnvs(parent, spec, a, Paths("/r/attempt_0", 2));
  auto eb = BuildWorkerEnvs(parent, spec, b, Paths("/r/attempt_3", 2));
  ASSERT_TRUE(ea.ok() && eb.ok());
  std::set<std::string> differing;
  for (int i = 0; i < 2; ++i) {
    for (const auto& [k, v] : ea->envs[i]) {
      auto it = eb->envs[i].find(k);
      if (it == eb->envs[i].end() || it->second != v) differing.insert(k);
    }
    for (const auto& [k, v] : eb->envs[i])
      if (!ea->envs[i].count(k)) differing.insert(k);
  }
  for (const auto& k : differing) EXPECT_TRUE(IsRoundVariable(k)) << k << " differs between rounds";
  EXPECT_TRUE(differing.count("RANK") && differing.count("MASTER_PORT") && differing.count("LAUNCH_LR"));
  for (const char* fixed : {"LOCAL_RANK", "LOCAL_WORLD_SIZE", "OMP_NUM_THREADS", "CUDA_VISIBLE_DEVICES",
                            "PYTORCH_CUDA_ALLOC_CONF", "PYTHONPATH", "LAUNCH_PROGRESS_FD", "TORCHELASTIC_RUN_ID"}) {
    EXPECT_FALSE(IsRoundVariable(fixed)) << fixed;
  }
  // StandbyEnv of the two rounds' environments is the same.
  EXPECT_EQ(StandbyEnv(EnvToStrings(ea->envs[1])), StandbyEnv(EnvToStrings(eb->envs[1])));
}

TEST(WarmStartArgv, PythonScriptsAndModulesHaveTheStandbyInterpreter) {
  auto s = StandbyArgv({"/usr/bin/python3", "-u", "train.py", "--lr", "0.1"}, true);
  ASSERT_TRUE(s.ok());
  EXPECT_THAT(*s, ElementsAre("/usr/bin/python3", "-u", "-c", "import _launch_standby; _launch_standby.main()",
                              "train.py", "--lr", "0.1"));
  auto m = StandbyArgv({"/usr/bin/python3", "-u", "-m", "pkg.train"}, true);
  ASSERT_TRUE(m.ok());
  EXPECT_THAT(*m, ElementsAre("/usr/bin/python3", "-u", "-c", "import _launch_standby; _launch_standby.main()", "-m",
                              "pkg.train"));
  for (std::vector<std::string> bad : std::vector<std::vector<std::string>>{
           {"./train_mlp", "--steps", "3"}, {"/usr/bin/python3", "-u", "-m"}, {"/usr/bin/python3"}, {}}) {
    auto r = StandbyArgv(bad, true);
    EXPECT_FALSE(r.ok());
  }
  EXPECT_THAT(std::string(StandbyArgv({"./train_mlp", "--steps", "3"}, true).status().message()),
              HasSubstr("'./train_mlp --steps 3' is not a Python worker"));
}

// A program is its own standby only when its file holds LAUNCH_SDK_WARM_START()'s mark; a C++
// program whose first argument is -u is not taken for Python.
TEST(WarmStartArgv, OnlyProgramsThatDeclareItAreTheirOwnStandbys) {
  EXPECT_TRUE(DeclaresWarmStart(WARM_WORKER_BIN));
  auto own = StandbyArgv({WARM_WORKER_BIN, "-u", "x"}, false);
  ASSERT_TRUE(own.ok()) << own.status();
  EXPECT_THAT(*own, ElementsAre(WARM_WORKER_BIN, "-u", "x"));
  testing::TempDir dir;
  // The mark without its terminating NUL, or in a file that is not regular, does not count.
  testing::WriteFile(dir / "almost", "launch-sdk-warm-start/1");
  for (const std::string& unmarked : {std::string(TEST_WORKER_BIN), std::string("/bin/true"), dir / "almost",
                                      dir.path(), dir / "missing", std::string("/dev/zero")}) {
    EXPECT_FALSE(DeclaresWarmStart(unmarked)) << unmarked;
    auto r = StandbyArgv({unmarked, "-u", "x"}, false);
    ASSERT_FALSE(r.ok()) << unmarked;
    EXPECT_THAT(std::string(r.status().message()),
                HasSubstr("is neither a Python worker nor a worker_sdk program that declares LAUNCH_SDK_WARM_START()"));
  }
  static const char kMarked[] = "\x7f" "ELF...launch-sdk-warm-start/1\0...";
  testing::WriteFile(dir / "marked", std::string(kMarked, sizeof kMarked - 1));
  EXPECT_TRUE(DeclaresWarmStart(dir / "marked"));
}

// The go's encoding and decoding are launch_sdk/contract.h's (tests/contract_test.cc); here the
// agent's reason for a standby that ended at its go: one of contract version 1 calls any later go
// malformed, and the reason says what to do.
TEST(WarmStartGo, AStandbyThatEndedAtItsGoIsExplained) {
  EXPECT_EQ(StandbyEndedAtItsGo(""), "its standby ended without starting the worker");
  EXPECT_EQ(StandbyEndedAtItsGo("Segmentation fault"), "its standby ended without starting the worker: Segmentation fault");
  for (const char* v1 : {"launch_sdk standby: a malformed go from the agent", "launch standby: a malformed go from the agent"}) {
    EXPECT_THAT(StandbyEndedAtItsGo(v1),
                HasSubstr(absl::StrCat(v1, " (a standby older than launch's worker contract version ",
                                       launch_sdk::kContractVersion,
                                       ": install launch and launch-sdk (or launch's Python modules) of one release)")));
  }
}

// One standby through the real protocol: it imports, waits, gets its environment, the progress
// socket at fd 3 and its stdin, and runs the script; its output is in the pipes it started with.
TEST(WarmStartStandby, RunsTheScriptWithTheEnvironmentAndDescriptorsItIsGiven) {
  testing::TempDir dir;
  testing::WriteFile(dir / "w.py", Script("'argv', sys.argv[1:], 'standby fd', os.environ.get('LAUNCH_STANDBY_FD'),\n"
                                          "      'json' in sys.modules)\n"
                                          "sys.exit(5)\n"));
  PosixProcessLauncher launcher;
  WarmStart warm(Importing({"json"}), &launcher, nullptr);
  WorkerLaunch w;
  w.local_rank = 0;
  w.rank = 4;
  w.argv = {"/usr/bin/python3", "-u", dir / "w.py", "a b"};
  w.env = {"PATH=/usr/bin:/bin", std::string("PYTHONPATH=") + SDK_PYTHON_DIR, "LAUNCH_PROGRESS_FD=3", "RANK=-1"};
  warm.Prepare({w});
  EXPECT_EQ(warm.started(), 1);
  w.env.back() = "RANK=4";  // a round variable: given at the start
  Worker a = Start(&warm, w, "hello\n");
  ASSERT_GT(a.pid, 0);
  EXPECT_EQ(warm.taken(), 1);
  EXPECT_EQ(warm.forked(), 0);  // this test is no subreaper: the standby itself is the worker
  EXPECT_EQ(a.Out(), "rank 4 stdin hello argv ['a b'] standby fd None True\n");
  EXPECT_EQ(a.Progress(), "progress from 4");
  EXPECT_EQ(a.Wait(), 5);
}

// With launch adopting orphans, each go forks a worker from the standby, which stays: one import
// serves every attempt. Each worker is this process's child, in a process group of its own, and
// gets what the standby printed while it imported.
TEST(WarmStartStandby, ForksOneWorkerPerGoWhenLaunchAdoptsOrphans) {
  ASSERT_EQ(::prctl(PR_SET_CHILD_SUBREAPER, 1), 0);  // as launch's main does; this test's process only
  testing::TempDir dir;
  testing::WriteFile(dir / "noisy.py", "print('imported noisy')\n");
  testing::WriteFile(dir / "w.py", Script("'own group', os.getpgid(0) == os.getpid())\n"
                                          "sys.exit(int(os.environ['RANK']))\n"));
  PosixProcessLauncher launcher;
  WarmStart warm(Importing({"noisy"}), &launcher, nullptr);
  WorkerLaunch w;
  w.argv = {"/usr/bin/python3", "-u", dir / "w.py"};
  w.env = {"PATH=/usr/bin:/bin", absl::StrCat("PYTHONPATH=", SDK_PYTHON_DIR, ":", dir.path()), "LAUNCH_PROGRESS_FD=3",
           "RANK=-1"};
  warm.Prepare({w});
  for (int rank : {3, 7}) {
    w.env.back() = absl::StrCat("RANK=", rank);
    Worker a = Start(&warm, w, absl::StrCat("attempt ", rank, "\n"));
    ASSERT_GT(a.pid, 0);
    EXPECT_EQ(a.Out(), absl::StrCat("imported noisy\nrank ", rank, " stdin attempt ", rank, " own group True\n"));
    EXPECT_EQ(a.Progress(), absl::StrCat("progress from ", rank));
    EXPECT_EQ(a.Wait(), rank);  // waitpid here: the worker is this process's child
    warm.Prepare({w});          // the standby is still there: nothing to start
  }
  EXPECT_EQ(warm.started(), 1);
  EXPECT_EQ(warm.taken(), 2);
  EXPECT_EQ(warm.forked(), 2);
}

// A C++ standby runs its keep-warm function (launch_sdk::AddStandbyKeepWarm) every
// LAUNCH_STANDBY_KEEP_WARM_MS while it waits, and never at 0; a malformed value ends it before it
// is ready, and the worker starts cold.
TEST(WarmStartStandby, ACppStandbyKeepsWarmWhileItWaits) {
  for (const std::string ms : {"5", "0", "5x"}) {
    testing::TempDir dir;
    PosixProcessLauncher launcher;
    WarmStart::Options o;
    o.python = false;
    WarmStart warm(o, &launcher, nullptr);
    WorkerLaunch w;
    w.argv = {WARM_WORKER_BIN, "keep-warm", dir.path()};
    w.env = {"LAUNCH_PROGRESS_FD=3", "LAUNCH_STANDBY_KEEP_WARM_MS=" + ms, "RANK=0", "WORLD_SIZE=1"};
    warm.Prepare({w});
    ASSERT_EQ(warm.started(), 1);
    auto runs = [&] {
      const std::string text = testing::ReadFile(dir / "keep-warm");
      return text.empty() ? 0 : std::stoi(text);
    };
    if (ms == "5") ASSERT_TRUE(testing::WaitUntil([&] { return runs() >= 3; }, std::chrono::seconds(30))) << ms;
    Worker a = Start(&warm, w, "");
    if (ms == "5x") {
      EXPECT_EQ(a.pid, -1);  // its standby exited: not started warm
      EXPECT_EQ(warm.taken(), 0);
      continue;
    }
    ASSERT_GT(a.pid, 0) << ms;
    const std::string out = a.Out();
    EXPECT_EQ(a.Wait(), 0);
    if (ms == "0") {
      EXPECT_THAT(out, HasSubstr("KEEPWARM 0\n"));
    } else {
      const size_t at = out.find("KEEPWARM ");
      ASSERT_NE(at, std::string::npos) << out;
      EXPECT_GE(std::stoi(out.substr(at + 9)), 3) << out;
    }
  }
}

// A standby made for one environment is not used for another (a variable that is not the
// round's changed): the worker starts cold and the standby is gone.
TEST(WarmStartStandby, IsNotUsedWhenAFixedVariableChanged) {
  PosixProcessLauncher launcher;
  WarmStart warm(Importing({}), &launcher, nullptr);
  WorkerLaunch w;
  w.argv = {"/usr/bin/python3", "-u", "/nonexistent.py"};
  w.env = {std::string("PYTHONPATH=") + SDK_PYTHON_DIR, "OMP_NUM_THREADS=4"};
  warm.Prepare({w});
  w.env.back() = "OMP_NUM_THREADS=2";
  EXPECT_FALSE(warm.Send(w, {}));
  EXPECT_FALSE(warm.Take(w).has_value());
  EXPECT_FALSE(warm.Send(w, {}));  // and it is gone
  EXPECT_EQ(warm.taken(), 0);
}

// A C++ standby given a go of another contract version refuses it with one line that names both
// versions and what to do, and ends; so does one given contract version 1's go ("LGO1").
TEST(WarmStartSkew, ACppStandbyRefusesAGoOfAnotherVersion) {
  const std::string go = launch_sdk::EncodeGo({"RANK=0", "WORLD_SIZE=1"});
  const std::string v1 = std::string(launch_sdk::kGoMagicV1, 4) + go.substr(launch_sdk::kGoVersionBytes);
  for (const auto& [version, msg] : {std::pair<uint32_t, std::string>{launch_sdk::kContractVersion + 1,
                                                                      launch_sdk::EncodeGo({"RANK=0"}, launch_sdk::kContractVersion + 1)},
                                     {1, v1}}) {
    int sv[2];
    ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    UniqueFd agent(sv[0]), theirs(sv[1]);
    UniqueFd null(::open("/dev/null", O_RDWR | O_CLOEXEC));
    PosixProcessLauncher launcher;
    SpawnOptions so;
    so.argv = {WARM_WORKER_BIN, ""};
    so.env = {absl::StrCat(launch_sdk::kStandbyFdEnv, "=", launch_sdk::kStandbyControlFd)};
    so.stdout_fd = null.get();
    so.stderr_fd = null.get();
    so.extra_fd = theirs.get();
    so.extra_fd_target = launch_sdk::kStandbyControlFd;
    auto pid = launcher.Spawn(so);
    ASSERT_TRUE(pid.ok()) << pid.status();
    theirs.Reset();
    char ready = 0;
    ASSERT_EQ(::read(agent.get(), &ready, 1), 1);
    EXPECT_EQ(ready, launch_sdk::kStandbyReady);
    int fds[4] = {null.get(), null.get(), null.get(), null.get()};
    char control[CMSG_SPACE(sizeof fds)] = {};
    iovec iov{const_cast<char*>(msg.data()), msg.size()};
    msghdr mh{};
    mh.msg_iov = &iov;
    mh.msg_iovlen = 1;
    mh.msg_control = control;
    mh.msg_controllen = sizeof control;
    cmsghdr* cm = CMSG_FIRSTHDR(&mh);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof fds);
    std::memcpy(CMSG_DATA(cm), fds, sizeof fds);
    ASSERT_EQ(::sendmsg(agent.get(), &mh, MSG_NOSIGNAL), static_cast<ssize_t>(msg.size()));
    std::string said;
    char buf[512];
    ssize_t n;
    while ((n = ::read(agent.get(), buf, sizeof buf)) > 0) said.append(buf, static_cast<size_t>(n));
    EXPECT_EQ(said, absl::StrCat("Flaunch_sdk standby: ", launch_sdk::VersionSkew(version, launch_sdk::kContractVersion, "launch_sdk"), "\n"));
    EXPECT_THAT(said, HasSubstr(absl::StrCat("launch speaks worker contract version ", version, ", this standby's launch_sdk version ",
                                             launch_sdk::kContractVersion, ": install launch and launch-sdk")));
    int status = 0;
    ASSERT_EQ(::waitpid(*pid, &status, 0), *pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 70) << status;
  }
}

// A standby of another contract version (here launch's Python module of version 99): its worker
// starts cold, launch warns once per rank with the standby's line, and makes no more standbys.
TEST(WarmStartSkew, AWorkerWhoseStandbyIsOfAnotherVersionStartsCold) {
  testing::TempDir dir;
  std::string module = testing::ReadFile(std::string(SDK_PYTHON_DIR) + "/_launch_standby.py");
  const std::string current = absl::StrCat("CONTRACT_VERSION = ", launch_sdk::kContractVersion, "\n");
  ASSERT_NE(module.find(current), std::string::npos);
  module.replace(module.find(current), current.size(), "CONTRACT_VERSION = 99\n");
  testing::WriteFile(dir / "_launch_standby.py", module);
  testing::WriteFile(dir / "w.py", "print('ran')\n");
  std::ostringstream log;
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(log);
  spdlog::default_logger()->sinks().push_back(sink);
  PosixProcessLauncher launcher;
  WarmStart::Options o = Importing({});
  o.python_dir = dir.path();
  WarmStart warm(o, &launcher, nullptr);
  WorkerLaunch w;
  w.argv = {"/usr/bin/python3", "-u", dir / "w.py"};
  w.env = {"PATH=/usr/bin:/bin", "PYTHONPATH=" + dir.path(), "LAUNCH_PROGRESS_FD=3", "RANK=0"};
  warm.Prepare({w});
  EXPECT_EQ(warm.started(), 1);
  Worker a = Start(&warm, w, "");
  EXPECT_EQ(a.pid, -1);  // cold: the group spawns it
  EXPECT_EQ(warm.taken(), 0);
  warm.Prepare({w});
  EXPECT_EQ(warm.started(), 1);  // every standby of this run would refuse alike
  spdlog::default_logger()->flush();
  spdlog::default_logger()->sinks().pop_back();
  EXPECT_THAT(log.str(), HasSubstr(absl::StrCat(
                             "starts cold: its standby refused the go: launch standby: launch speaks worker contract version ",
                             launch_sdk::kContractVersion,
                             ", this standby's Python module (_launch_standby) version 99: install launch and launch-sdk "
                             "(or launch's Python modules) of one release")));
  EXPECT_THAT(log.str(), HasSubstr("[warning]"));
}

}  // namespace
}  // namespace launch
