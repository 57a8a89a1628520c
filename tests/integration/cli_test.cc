// The command line of the real `launch`: flags, the config file, the environment's topology
// (PET_*, Slurm), --dry-run, --version, --help, and bad input: one line, exit 2, nothing started.

#include <netinet/in.h>
#include <poll.h>
#include <pty.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/launch_cmd.h"
#include "tests/test_util.h"

namespace launch::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST(Launch, DryRunPrintsArgvAndEnvAndStartsNothing) {
  TempDir dir;
  auto r = RunCmd(Cmd({"--nproc-per-node=2", "--dry-run"}, {"--pid-file", dir / "pids", "${local_rank}"}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("rank 1 (local rank 1):"));
  EXPECT_THAT(r.out, HasSubstr("WORLD_SIZE=2"));
  EXPECT_THAT(r.out, HasSubstr(dir / "pids 1"));
  EXPECT_FALSE(std::filesystem::exists(dir / "pids"));
}

// Kubeflow's PyTorchJob gives torchrun its topology as PET_<FLAG> variables; launch reads them
// the same way.
TEST(Launch, PetVariablesPlanTheWorkersAsTorchrunsFlagsWould) {
  auto r = RunCmd(Cmd({"--dry-run"}, {}), {"PET_NPROC_PER_NODE=2", "PET_RDZV_ID=from-pet"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("rank 1 (local rank 1):"));
  EXPECT_THAT(r.out, Not(HasSubstr("rank 2 (local rank 2):")));
  EXPECT_THAT(r.out, HasSubstr("TORCHELASTIC_RUN_ID=from-pet"));
  auto bad = RunCmd(Cmd({"--dry-run"}, {}), {"PET_NPROC_PER_NODE=many"});
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_THAT(bad.err, HasSubstr("PET_NPROC_PER_NODE=many"));
}

// Under srun with one task per node, Slurm's variables alone plan the node; the header says which
// value came from where.
TEST(Launch, SlurmVariablesAlonePlanTheNode) {
  const std::vector<std::string> slurm = {"SLURM_JOB_ID=4321", "SLURM_STEP_ID=0", "SLURM_NNODES=4",
                                          "SLURM_NODEID=2",    "SLURM_NTASKS=4",  "SLURM_JOB_NODELIST=node[01-04]"};
  auto r = RunCmd(Cmd({"--nproc-per-node=2", "--dry-run"}, {}), slurm);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("launch --dry-run: node rank 2 of 4, 2 worker(s) on this node, rendezvous at node01:"));
  EXPECT_THAT(r.out, HasSubstr("SLURM_JOB_NODELIST (first host)"));
  EXPECT_THAT(r.out, HasSubstr("rank 4 (local rank 0):"));
  EXPECT_THAT(r.out, HasSubstr("rank 5 (local rank 1):"));
  EXPECT_THAT(r.out, HasSubstr("WORLD_SIZE=8"));
  EXPECT_THAT(r.out, HasSubstr("GROUP_RANK=2"));
  EXPECT_THAT(r.out, HasSubstr("TORCHELASTIC_RUN_ID=4321.0"));
  // Flags still win.
  auto flags = RunCmd(Cmd({"--nnodes=1", "--dry-run"}, {}), slurm);
  ASSERT_EQ(flags.exit_code, 0) << flags.err;
  EXPECT_THAT(flags.out, HasSubstr("node rank 0 of 1, 1 worker(s)"));
  EXPECT_THAT(flags.out, HasSubstr("--nnodes"));
  // Two tasks per node would start every worker twice.
  std::vector<std::string> two = slurm;
  two.push_back("SLURM_STEP_NUM_TASKS=8");
  auto bad = RunCmd(Cmd({"--dry-run"}, {}), two);
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_THAT(bad.err, HasSubstr("srun started 8 tasks on 4 node(s)"));
  EXPECT_THAT(bad.err, HasSubstr("srun --ntasks-per-node=1"));
}

TEST(Launch, VersionIsOneLineAndExitZero) {
  auto r = RunCmd({LAUNCH_BIN, "--version"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, ::testing::MatchesRegex("launch [0-9]+\\.[0-9]+\\.[0-9]+\n"));
  // Among other flags, as argparse's version action (it was "unknown flag '--version'"); a
  // program's own --version is the program's.
  auto among = RunCmd({LAUNCH_BIN, "--version", "--nproc-per-node", "2"});
  EXPECT_EQ(among.exit_code, 0) << among.err;
  EXPECT_EQ(among.out, r.out);
  EXPECT_EQ(RunCmd({LAUNCH_BIN, "--nproc-per-node", "2", "--version", kWorker}).out, r.out);
  auto program = RunCmd({LAUNCH_BIN, "--nproc-per-node=1", kWorker, "--version"});
  EXPECT_THAT(program.out, Not(HasSubstr("launch 0")));
}

// --interval nan passed CLI11's range check: --watch never refreshed.
TEST(Launch, StatusIntervalMustBeANumberOfSeconds) {
  auto r = RunCmd({LAUNCH_BIN, "status", "--watch", "--interval", "nan", "--rdzv-endpoint=127.0.0.1:9", "--rdzv-id=x"});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_EQ(r.err, "launch status: --interval=nan: expected seconds in 0.1..3600\n");
}

// A token file every user can read is used, with one warning line; an owner-only one without.
TEST(Launch, AWorldReadableTokenFileIsSaidOnce) {
  TempDir dir;
  WriteFile(dir / "token", "a-token-of-the-job\n");
  for (mode_t mode : {0644, 0600}) {
    ASSERT_EQ(::chmod((dir / "token").c_str(), mode), 0);
    auto r = RunCmd({LAUNCH_BIN, "--nnodes=1", "--rdzv-endpoint=127.0.0.1:0", "--rdzv-token-file", dir / "token",
                     kWorker, "--exit", "0"});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    const std::string warning = "--rdzv-token-file=" + dir / "token" +
                                ": every user of this machine can read the token (mode 0644); expected chmod 600";
    if (mode == 0644) {
      EXPECT_THAT(r.err, HasSubstr(warning));
    } else {
      EXPECT_THAT(r.err, Not(HasSubstr("every user")));
    }
  }
}

// python3 on PATH without torch (here: Debian's with its site packages off) made every rank fail
// with ModuleNotFoundError. It is one line naming it and PYTHON_EXEC now; with PYTHON_EXEC the
// script runs on the interpreter given. A text script without .py runs through it, as torchrun.
TEST(Launch, Python3OnPathWithoutTorchIsOneLine) {
  TempDir dir;
  WriteFile(dir / "python3", "#!/bin/sh\nexec /usr/bin/python3 -S \"$@\"\n");
  ASSERT_EQ(::chmod((dir / "python3").c_str(), 0755), 0);
  WriteFile(dir / "hello", "import sys\nprint('hello from', sys.argv[1])\n");
  const std::string path = "PATH=" + dir.path() + ":/usr/bin:/bin";
  auto refused = RunCmd({LAUNCH_BIN, "--nproc-per-node=2", dir / "hello", "x"}, {path, "PYTHON_EXEC"});
  EXPECT_EQ(refused.exit_code, 2) << refused.err;
  EXPECT_THAT(refused.err, HasSubstr("launch: python3 on PATH (" + dir / "python3" +
                                     ") cannot import torch; set PYTHON_EXEC to the interpreter of your "
                                     "training environment"));
  EXPECT_EQ(refused.out, "");
  auto chosen = RunCmd({LAUNCH_BIN, "--nproc-per-node=2", dir / "hello", "x"}, {path, "PYTHON_EXEC=python3"});
  EXPECT_EQ(chosen.exit_code, 0) << chosen.err;
  EXPECT_THAT(chosen.out, HasSubstr("[1]:hello from x\n"));
}

TEST(Launch, ConfigFileSetsFlagsAndFlagsOverrideIt) {
  TempDir dir;
  WriteFile(dir / "job.yaml",
            "nproc_per_node: 2\n"
            "rdzv:\n"
            "  id: fromfile\n"
            "train:\n"
            "  base_lr: 0.1\n"
            "  per_worker_batch: 32\n"
            "  lr_scaling: linear\n");
  auto r = RunCmd(Cmd({"--config", dir / "job.yaml"},
                      {"--print-env", "TORCHELASTIC_RUN_ID,LAUNCH_LR,LAUNCH_GLOBAL_BATCH,WORLD_SIZE"}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(CountLines(r.out, "TORCHELASTIC_RUN_ID=fromfile"), 2);
  EXPECT_EQ(CountLines(r.out, "LAUNCH_LR=0.2"), 2);
  EXPECT_EQ(CountLines(r.out, "LAUNCH_GLOBAL_BATCH=64"), 2);
  auto o = RunCmd(Cmd({"--config", dir / "job.yaml", "--nproc-per-node=1"}, {"--print-env", "WORLD_SIZE"}));
  ASSERT_EQ(o.exit_code, 0) << o.err;
  EXPECT_EQ(o.out, "[0]:WORLD_SIZE=1\n");
}

// --nproc-per-node=12000 started about 10,000 workers before it ran out of descriptors and
// said "nothing started". What a plan needs is checked against the open-file limit first.
TEST(Launch, APlanBeyondTheOpenFileLimitIsRefusedBeforeAnythingStarts) {
  TempDir dir;
  auto r = RunCmd(
      {"/usr/bin/prlimit", "--nofile=100:100", kLaunch, "--nproc-per-node=40", kWorker, "--pid-file", dir / "started"});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_EQ(Lines(r.err).size(), 1u) << r.err;
  EXPECT_THAT(r.err, HasSubstr("--nproc-per-node=40: 40 workers need about 144 open files, and the limit is 100"));
  EXPECT_FALSE(std::filesystem::exists(dir / "started"));
  // Within the limit, the same plan runs.
  auto ok = RunCmd({"/usr/bin/prlimit", "--nofile=100:100", kLaunch, "--nproc-per-node=16", kWorker, "--exit", "0"});
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
}

// ---- bad input: one line naming the value, exit 2, nothing started ----

struct BadInput {
  std::string name;
  std::vector<std::string> launch_args;
  std::string expect;  // in the error line
};

void PrintTo(const BadInput& b, std::ostream* os) { *os << b.name; }

class BadInputTest : public ::testing::TestWithParam<BadInput> {};

TEST_P(BadInputTest, OneLineErrorExit2NothingStarted) {
  TempDir dir;
  const BadInput& p = GetParam();
  std::vector<std::string> argv = {kLaunch};
  for (auto a : p.launch_args) {
    if (a.rfind("@", 0) == 0) a = dir / a.substr(1);  // @name: a file in the temp dir
    argv.push_back(a);
  }
  bool has_program = false;
  for (const auto& a : argv) has_program |= a == "PROGRAM";
  for (auto& a : argv)
    if (a == "PROGRAM") a = kWorker;
  if (!has_program && p.name != "missing_program" && p.name != "not_executable") argv.push_back(kWorker);
  argv.push_back("--pid-file");
  argv.push_back(dir / "started");
  if (p.name == "yaml_syntax") WriteFile(dir / "bad.yaml", "nproc_per_node: 2\nrdzv: [unclosed\n");
  if (p.name == "yaml_unknown_key") WriteFile(dir / "bad.yaml", "nproc_per_node: 2\n\nnproc: 3\n");
  if (p.name == "token_not_ascii")
    WriteFile(dir / "token",
              "abcd\xc3\xa9"
              "fghijk\n");  // gRPC aborted on it
  if (p.name == "tls_cert_not_pem" || p.name == "tls_cert_without_key")
    WriteFile(dir / "cert.pem", "-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n");
  if (p.name == "token_too_long") WriteFile(dir / "token", std::string(20000, 'a') + "\n");
  if (p.name == "yaml_flag_maybe") WriteFile(dir / "bad.yaml", "no_python: maybe\n");
  if (p.name == "yaml_flag_two") WriteFile(dir / "bad.yaml", "nproc_per_node: 1\nno_python: 2x\n");
  if (p.name == "yaml_flag_list") WriteFile(dir / "bad.yaml", "dry_run: [1]\n");
  if (p.name == "yaml_args_mapping") WriteFile(dir / "bad.yaml", "args: {a: 1}\n");
  if (p.name == "yaml_two_documents") WriteFile(dir / "bad.yaml", "nproc_per_node: 1\n---\nnproc_per_node: 2\n");
  if (p.name == "token_file_fifo" || p.name == "tls_ca_fifo") ASSERT_EQ(::mkfifo((dir / "fifo").c_str(), 0600), 0);
  if (p.name == "not_executable") {
    WriteFile(dir / "noexec", "#!/bin/sh\n");
    chmod((dir / "noexec").c_str(), 0644);
  }
  int busy = -1;
  if (p.name == "master_port_in_use") {
    busy = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(bind(busy, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    ASSERT_EQ(listen(busy, 1), 0);
    socklen_t len = sizeof a;
    getsockname(busy, reinterpret_cast<sockaddr*>(&a), &len);
    for (auto& arg : argv)
      if (arg == "--master-port=BUSY") arg = "--master-port=" + std::to_string(ntohs(a.sin_port));
  }
  auto r = RunCmd(argv);
  if (busy >= 0) close(busy);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_EQ(Lines(r.err).size(), 1u) << r.err;
  EXPECT_THAT(r.err, HasSubstr(p.expect));
  EXPECT_THAT(r.err, ::testing::StartsWith("launch: "));
  EXPECT_FALSE(std::filesystem::exists(dir / "started")) << "a worker started";
}

INSTANTIATE_TEST_SUITE_P(
    Launch, BadInputTest,
    ::testing::Values(
        BadInput{"unknown_flag", {"--frobnicate=1", "PROGRAM"}, "unknown flag '--frobnicate=1'"},
        BadInput{"nproc_zero", {"--nproc-per-node=0"}, "--nproc-per-node=0: expected a positive integer"},
        BadInput{"nproc_negative", {"--nproc-per-node=-1"}, "--nproc-per-node=-1: expected"},
        BadInput{"nproc_abc", {"--nproc-per-node=abc"}, "--nproc-per-node=abc: expected"},
        BadInput{"nnodes_reversed", {"--nnodes", "3:2"}, "--nnodes=3:2: expected N or MIN:MAX"},
        BadInput{"missing_program", {"/nonexistent/train"}, "'/nonexistent/train' does not exist"},
        BadInput{"not_executable", {"--no-python", "@noexec"}, "is not executable"},
        BadInput{"bad_endpoint", {"--rdzv-endpoint=host:99999"}, "--rdzv-endpoint=host:99999: port"},
        BadInput{"bad_endpoint_empty_host", {"--rdzv-endpoint=:29400"}, "--rdzv-endpoint=:29400: empty host"},
        BadInput{"yaml_syntax", {"--config", "@bad.yaml"}, "bad.yaml:3"},
        BadInput{"yaml_unknown_key", {"--config", "@bad.yaml"}, "bad.yaml:3: nproc: unknown key"},
        BadInput{"master_port_in_use", {"--master-port=BUSY"}, "already in use"},
        BadInput{"redirects_9", {"--redirects", "9"}, "--redirects=9"},
        BadInput{"tee_bad_map", {"--tee", "0:7"}, "--tee=0:7"},
        BadInput{"run_path", {"--run-path"}, "--run-path is not supported"},
        BadInput{"gpu_binding", {"--gpu-binding=spread"}, "--gpu-binding=spread: expected shared or isolate"},
        BadInput{"max_restarts", {"--max-restarts=-2"}, "--max-restarts=-2"},
        BadInput{"stop_timeout", {"--stop-timeout=soon"}, "--stop-timeout=soon"},
        BadInput{"hang_timeout", {"--hang-timeout=-1"}, "--hang-timeout=-1"},
        BadInput{"rdzv_conf", {"--rdzv-conf=join_timeout"}, "--rdzv-conf=join_timeout"},
        // These exited 1, aborted, or (huge seconds) SIGKILLed the workers at once.
        BadInput{"stop_timeout_huge", {"--stop-timeout=1e10"}, "--stop-timeout=1e10: expected a number of seconds"},
        BadInput{"restart_backoff_huge", {"--restart-backoff=1e10"}, "--restart-backoff=1e10"},
        BadInput{"join_timeout_tiny", {"--rdzv-conf=join_timeout=1e-9"}, "join_timeout in 0.001.."},
        BadInput{"rdzv_id_too_long", {"--rdzv-id=" + std::string(129, 'x')}, "expected at most 128 characters"},
        // With --log-dir X/inner, logs went to X/ itself.
        BadInput{"rdzv_id_dot_dot", {"--rdzv-id=..", "--log-dir=@inner"}, "--rdzv-id=..: expected a name"},
        BadInput{"nproc_huge", {"--nproc-per-node=100000"}, "--nproc-per-node=100000: expected at most 4096"},
        BadInput{"config_is_a_directory", {"--config=/tmp"}, "--config=/tmp: not a regular file"},
        BadInput{"token_not_ascii", {"--rdzv-token-file", "@token"}, "the token's byte 5 is not printable ASCII"},
        BadInput{"tls_cert_not_pem",
                 {"--tls-cert", "@cert.pem", "--tls-key", "@cert.pem"},
                 "expected a PEM certificate"},
        BadInput{"tls_cert_without_key", {"--tls-cert", "@cert.pem"}, "needs --tls-key"},
        // These grew launch without end (/dev/zero), blocked forever (a FIFO), or were accepted and
        // then failed every call (a token over gRPC's metadata size) or were misread (YAML).
        BadInput{"token_file_dev_zero",
                 {"--nnodes=2", "--rdzv-endpoint=127.0.0.1:9", "--rdzv-token-file=/dev/zero"},
                 "--rdzv-token-file=/dev/zero: not a regular file"},
        BadInput{"token_file_fifo",
                 {"--nnodes=2", "--rdzv-endpoint=127.0.0.1:9", "--rdzv-token-file", "@fifo"},
                 "fifo: not a regular file; expected a file whose first line is the token"},
        BadInput{"tls_ca_dev_zero",
                 {"--nnodes=2", "--rdzv-endpoint=127.0.0.1:9", "--tls-ca=/dev/zero"},
                 "--tls-ca=/dev/zero: not a regular file; expected a PEM file"},
        BadInput{"tls_ca_fifo",
                 {"--nnodes=2", "--rdzv-endpoint=127.0.0.1:9", "--tls-ca", "@fifo"},
                 "fifo: not a regular file; expected a PEM file"},
        BadInput{"token_too_long",
                 {"--nnodes=2", "--rdzv-endpoint=127.0.0.1:9", "--rdzv-token-file", "@token"},
                 "a token of 20000 characters; expected 8 to 1024"},
        BadInput{"config_dev_zero", {"--config=/dev/zero"}, "--config=/dev/zero: not a regular file"},
        BadInput{"yaml_flag_maybe", {"--config", "@bad.yaml"}, "bad.yaml:1: no_python=maybe: expected true or false"},
        BadInput{"yaml_flag_two", {"--config", "@bad.yaml"}, "bad.yaml:2: no_python=2x: expected true or false"},
        BadInput{"yaml_flag_list", {"--config", "@bad.yaml"}, "bad.yaml:1: dry_run: expected true or false"},
        BadInput{"yaml_args_mapping", {"--config", "@bad.yaml"}, "args: expected a list of arguments, not a mapping"},
        BadInput{"yaml_two_documents",
                 {"--config", "@bad.yaml"},
                 "bad.yaml:3: a second YAML document; expected one mapping of settings"},
        BadInput{"threads_per_worker_huge",
                 {"--threads-per-worker=99999999"},
                 "--threads-per-worker=99999999: expected an integer in 1..1024"},
        BadInput{"flag_ambiguous", {"--n=2"}, "--n: ambiguous; it could be --nproc-per-node, --nnodes"},
        // Each node restarted alone and the job hung in its second round (3 of 3 runs).
        BadInput{"static_restarts",
                 {"--rdzv-backend=static", "--nnodes=2", "--node-rank=0", "--master-addr=127.0.0.1",
                  "--max-restarts=1"},
                 "--max-restarts=1: expected 0 with static ranks on 2 nodes, which cannot restart together; for "
                 "restarts use the c10d backend"}),
    [](const auto& info) { return info.param.name; });

// An encrypted --tls-key made OpenSSL ask for its passphrase on the terminal, and launch waited
// there for ever. It is refused at once, also with a terminal to ask on.
TEST(Launch, AnEncryptedTlsKeyIsRefusedWithoutAPrompt) {
  TempDir dir;
  TestCerts certs(dir);
  ASSERT_TRUE(certs.ok) << certs.error;
  auto enc = RunCmd({"/usr/bin/openssl", "pkey", "-in", certs.server_key, "-aes256", "-passout", "pass:secret", "-out",
                     dir / "encrypted.key"});
  ASSERT_EQ(enc.exit_code, 0) << enc.err;
  std::vector<std::string> argv = {kLaunch,           "--nnodes=2", "--rdzv-endpoint=127.0.0.1:9", "--tls-cert",
                                   certs.server_cert, "--tls-key",  dir / "encrypted.key",         kWorker};
  std::vector<char*> cargv;
  for (auto& a : argv) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  int master = -1;
  const pid_t pid = ::forkpty(&master, nullptr, nullptr, nullptr);
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    execv(cargv[0], cargv.data());
    _exit(127);
  }
  std::string out;
  int status = 0;
  const bool exited = WaitUntil(
      [&] {
        pollfd p{master, POLLIN, 0};
        char buf[4096];
        while (::poll(&p, 1, 10) == 1) {
          const ssize_t n = ::read(master, buf, sizeof buf);
          if (n <= 0) break;
          out.append(buf, static_cast<size_t>(n));
        }
        return ::waitpid(pid, &status, WNOHANG) == pid;
      },
      std::chrono::seconds(30));
  if (!exited) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, &status, 0);
  }
  ::close(master);
  ASSERT_TRUE(exited) << "launch waited: " << out;
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 2) << out;
  EXPECT_THAT(out, HasSubstr("encrypted.key: expected an unencrypted PEM private key")) << out;
  EXPECT_THAT(out, Not(HasSubstr("pass phrase")));
}

// spdlog reads an unknown level as "off": every later error went silent.
TEST(Launch, BadLogLevelIsAnError) {
  auto r = RunCmd({kLaunch, "--nproc-per-node=1", kWorker}, {"LAUNCH_LOG_LEVEL=bogus"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err, "launch: LAUNCH_LOG_LEVEL=bogus: expected trace, debug, info, warn, error or off\n");
  auto ok = RunCmd({kLaunch, "--nproc-per-node=1", kWorker}, {"LAUNCH_LOG_LEVEL=error"});
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
}

TEST(Launch, NprocGpuWithoutGpuIsAClearError) {
  auto probe = RunCmd(Cmd({"--nproc-per-node=gpu", "--dry-run"}, {}));
  if (probe.exit_code == 0) GTEST_SKIP() << "this machine has a GPU";
  EXPECT_EQ(probe.exit_code, 2);
  EXPECT_THAT(probe.err, HasSubstr("--nproc-per-node=gpu: no GPU"));
  EXPECT_EQ(Lines(probe.err).size(), 1u) << probe.err;
}

// scripts/gpu_check.sh on a machine without a GPU: exit 2 and one line that says so, its report
// holding the same line, and nothing left in /tmp.
TEST(GpuCheck, RefusesClearlyWithoutAGpu) {
  auto probe = RunCmd(Cmd({"--nproc-per-node=gpu", "--dry-run"}, {}));
  if (probe.exit_code == 0) GTEST_SKIP() << "this machine has a GPU";
  TempDir dir;
  auto r = RunCmd({"/bin/bash", std::string(TESTS_DIR) + "/../scripts/gpu_check.sh", dir / "report"},
                  {"GPU_CHECK_LAUNCH=" + kLaunch}, std::chrono::seconds(60));
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("gpu_check.sh: cannot run here: no GPU: launch: --nproc-per-node=gpu: no GPU ("));
  EXPECT_EQ(Lines(r.out).size(), 1u) << r.out;
  EXPECT_EQ(ReadFile(dir / "report/report.md"), r.out);
  EXPECT_TRUE(std::filesystem::exists(dir / "report/logs.tar.gz"));
}

TEST(Launch, HelpListsTorchrunFlags) {
  auto r = RunCmd({kLaunch, "--help"});
  EXPECT_EQ(r.exit_code, 0);
  for (const char* f : {"--nproc-per-node", "--max-restarts", "--rdzv-endpoint", "--redirects", "--tee", "--log-dir",
                        "--stop-timeout", "--gpu-binding", "--dry-run"}) {
    EXPECT_THAT(r.out, HasSubstr(f));
  }
  // The subcommands, each of which answers --help.
  for (const char* sub : {"coordinator", "status", "doctor"}) {
    EXPECT_THAT(r.out, HasSubstr(std::string("launch ") + sub + " ("));
    auto help = RunCmd({kLaunch, sub, "--help"});
    EXPECT_EQ(help.exit_code, 0) << sub << ": " << help.err;
  }
}

}  // namespace
}  // namespace launch::testing
