#include "launcher/options.h"

#include <unistd.h>

#include <cmath>
#include <fstream>
#include <limits>

#include "common/limits.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace launch {
namespace {

using ::testing::ElementsAre;
using ::testing::Not;
using ::testing::HasSubstr;

absl::StatusOr<LaunchConfig> Parse(std::vector<std::string> args) {
  args.insert(args.begin(), "launch");
  auto p = ParseLaunchArgs(args);
  if (!p.ok()) return p.status();
  return p->config;
}

std::string Error(std::vector<std::string> args) {
  auto c = Parse(std::move(args));
  return c.ok() ? "<ok>" : std::string(c.status().message());
}

TEST(Options, DashAndUnderscoreSpellings) {
  for (auto flag : {"--nproc-per-node=4", "--nproc_per_node=4"}) {
    auto c = Parse({flag, "./train"});
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_EQ(c->nproc, 4);
  }
  auto c = Parse({"--max_restarts", "3", "--rdzv-id=job", "--rdzv_backend=static", "./train"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->max_restarts, 3);
  EXPECT_EQ(c->rdzv_id, "job");
  EXPECT_EQ(c->rdzv_backend, "static");
}

TEST(Options, ProgramArgsAfterProgramOrSeparator) {
  auto c = Parse({"--nproc-per-node", "2", "./train", "--lr", "0.1", "--nproc-per-node=9"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->nproc, 2);
  EXPECT_EQ(c->program, "./train");
  EXPECT_THAT(c->args, ElementsAre("--lr", "0.1", "--nproc-per-node=9"));
  c = Parse({"--nproc-per-node=2", "--", "./train", "-x"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->program, "./train");
  EXPECT_THAT(c->args, ElementsAre("-x"));
}

TEST(Options, NprocKinds) {
  EXPECT_EQ(Parse({"--nproc-per-node=cpu", "x"})->nproc_kind, LaunchConfig::Nproc::kCpu);
  EXPECT_EQ(Parse({"--nproc-per-node=gpu", "x"})->nproc_kind, LaunchConfig::Nproc::kGpu);
  EXPECT_EQ(Parse({"--nproc-per-node=auto", "x"})->nproc_kind, LaunchConfig::Nproc::kAuto);
}

TEST(Options, NnodesRange) {
  auto c = Parse({"--nnodes=2:4", "x"});
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->min_nodes, 2);
  EXPECT_EQ(c->max_nodes, 4);
  EXPECT_THAT(Error({"--nnodes=3:2", "x"}), HasSubstr("--nnodes=3:2"));
  EXPECT_THAT(Error({"--nnodes=0", "x"}), HasSubstr("--nnodes=0"));
}

TEST(Options, BadValuesNameTheValue) {
  EXPECT_THAT(Error({"--nproc-per-node=0", "x"}), HasSubstr("--nproc-per-node=0: expected"));
  EXPECT_THAT(Error({"--nproc-per-node=abc", "x"}), HasSubstr("--nproc-per-node=abc"));
  EXPECT_THAT(Error({"--rdzv-endpoint=[::1", "x"}), HasSubstr("unclosed"));
  EXPECT_THAT(Error({"--master-port=70000", "x"}), HasSubstr("--master-port=70000"));
  EXPECT_THAT(Error({"--rdzv-conf=bogus=1", "x"}), HasSubstr("'bogus' is unknown"));
  EXPECT_THAT(Error({"--module", "--no-python", "x"}), HasSubstr("cannot be used together"));
  EXPECT_THAT(Error({"--nproc-per-node=2"}), HasSubstr("no program given"));
  EXPECT_THAT(Error({"--bogus", "x"}), HasSubstr("unknown flag '--bogus'"));
  EXPECT_THAT(Error({"--rdzv-id=a/b", "x"}), HasSubstr("--rdzv-id=a/b"));
}

TEST(Options, RedirectsAndTee) {
  auto c = Parse({"-r", "3", "--tee", "0:1,1:2", "x"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->redirects.Stdout(5) && c->redirects.Stderr(5));
  EXPECT_TRUE(c->tee.Stdout(0) && !c->tee.Stderr(0));
  EXPECT_TRUE(!c->tee.Stdout(1) && c->tee.Stderr(1));
  EXPECT_FALSE(c->tee.Stdout(2));
}

TEST(Options, MonitorIntervalAndStandaloneAccepted) {
  auto c = Parse({"--standalone", "--monitor-interval=0.1", "--role=trainer", "x"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->standalone);
  EXPECT_EQ(c->role, "trainer");
}

TEST(Options, WarmStartAndItsImports) {
  auto c = Parse({"x.py"});
  ASSERT_TRUE(c.ok());
  EXPECT_TRUE(c->warm_start);  // on by default
  EXPECT_THAT(c->warm_imports, ::testing::ElementsAre("torch"));
  for (const char* off : {"--warm-start=false", "--warm_start=0", "--warm-start=off"}) {
    c = Parse({off, "x.py"});
    ASSERT_TRUE(c.ok()) << off << ": " << c.status();
    EXPECT_FALSE(c->warm_start) << off;
  }
  c = Parse({"--warm-start", "--warm-import", "torch, numpy,my_pkg.models", "x.py"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->warm_start);
  EXPECT_THAT(c->warm_imports, ::testing::ElementsAre("torch", "numpy", "my_pkg.models"));
  for (const char* bad : {"--warm-import=os;rm", "--warm-import=9lives", "--warm-import=a..b", "--warm-import=,"}) {
    EXPECT_THAT(Error({bad, "x.py"}), HasSubstr(std::string(bad) + ": expected")) << bad;
  }
  std::string many = "--warm-import=m0";
  for (int i = 1; i <= 64; ++i) many += ",m" + std::to_string(i);
  EXPECT_THAT(Error({many, "x.py"}), HasSubstr("expected at most 64 Python module names"));
}

class YamlTest : public ::testing::Test {
 protected:
  std::string Write(const std::string& text) {
    path_ = "/tmp/launch-options-test-" + std::to_string(getpid()) + ".yaml";
    std::ofstream(path_) << text;
    return path_;
  }
  void TearDown() override { ::unlink(path_.c_str()); }
  std::string path_;
};

TEST_F(YamlTest, NestedSectionsAndFlagsOverride) {
  std::string f = Write(
      "nproc-per-node: 4\n"
      "max_restarts: 2\n"
      "rdzv:\n"
      "  id: job7\n"
      "  conf:\n"
      "    join_timeout: 60\n"
      "redirects: {0: 3}\n"
      "gpus: [0, 2]\n"
      "program: ./train\n"
      "args: [--epochs, 3]\n"
      "train:\n"
      "  base_lr: 0.1\n"
      "  global_batch: 256\n"
      "  lr_scaling: sqrt\n");
  auto c = Parse({"--config", f, "--max-restarts=5"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->nproc, 4);
  EXPECT_EQ(c->max_restarts, 5);  // the flag wins
  EXPECT_EQ(c->rdzv_id, "job7");
  ASSERT_EQ(c->rdzv_conf.size(), 1u);
  EXPECT_EQ(c->rdzv_conf[0].first, "join_timeout");
  EXPECT_EQ(c->redirects.For(0), 3);
  EXPECT_THAT(c->gpus, ElementsAre("0", "2"));
  EXPECT_EQ(c->program, "./train");
  EXPECT_THAT(c->args, ElementsAre("--epochs", "3"));
  ASSERT_TRUE(c->train.has_value());
  EXPECT_EQ(c->train->global_batch, 256);
  EXPECT_EQ(c->train->mode, LrScaling::kSqrt);
}

TEST_F(YamlTest, UnknownKeyHasLineNumber) {
  std::string f = Write("nproc_per_node: 2\nrdzv:\n  endpoint: h:1\n  colour: blue\n");
  EXPECT_THAT(Error({"--config", f, "x"}), HasSubstr(f + ":4: rdzv_colour: unknown key"));
}

TEST_F(YamlTest, SyntaxErrorHasLineNumber) {
  std::string f = Write("nproc_per_node: 2\nmax_restarts: [1,\n");
  EXPECT_THAT(Error({"--config", f, "x"}), HasSubstr(f + ":3"));
}

TEST_F(YamlTest, BadValueNamesFileAndLine) {
  std::string f = Write("\nnproc_per_node: lots\n");
  EXPECT_THAT(Error({"--config", f, "x"}), HasSubstr(f + ":2: nproc_per_node=lots: expected"));
}

TEST_F(YamlTest, TrainSectionNeedsBaseLrAndOneBatch) {
  EXPECT_THAT(Error({"--config", Write("train:\n  per_worker_batch: 8\n"), "x"}), HasSubstr("needs base_lr"));
  EXPECT_THAT(Error({"--config", Write("train:\n  base_lr: 0.1\n"), "x"}),
              HasSubstr("needs train.per_worker_batch or train.global_batch"));
  EXPECT_THAT(Error({"--config", Write("train:\n  base_lr: 0.1\n  per_worker_batch: 8\n  lr_scaling: cubic\n"), "x"}),
              HasSubstr("lr_scaling=cubic: expected linear, sqrt or none"));
}

TEST(Options, MissingConfigFile) {
  EXPECT_THAT(Error({"--config", "/nonexistent.yaml", "x"}), HasSubstr("--config=/nonexistent.yaml"));
}

// yaml-cpp aborted reading a directory.
TEST(Options, ConfigThatIsADirectory) {
  EXPECT_THAT(Error({"--config", "/tmp", "x"}), HasSubstr("--config=/tmp: not a regular file; expected a YAML file"));
}

TEST_F(YamlTest, DuplicateKeyIsAnError) {
  std::string f = Write("max_restarts: 1\nnproc_per_node: 2\nmax_restarts: 3\n");
  EXPECT_THAT(Error({"--config", f, "x"}), HasSubstr(f + ":3: max_restarts: duplicate key (first at " + f + ":1"));
  f = Write("rdzv:\n  id: a\nrdzv_id: b\n");
  EXPECT_THAT(Error({"--config", f, "x"}), HasSubstr("rdzv_id: duplicate key"));
}

// Huge seconds overflowed to a negative duration (workers SIGKILLed at once, backoff skipped); tiny
// positive ones were rounded to 0. One bounded parser for every duration.
TEST(Options, SecondsAreBoundedEverywhere) {
  EXPECT_THAT(Error({"--stop-timeout=1e10", "x"}),
              HasSubstr("--stop-timeout=1e10: expected a number of seconds in 0..1e+07"));
  EXPECT_THAT(Error({"--restart-backoff=1e10", "x"}), HasSubstr("--restart-backoff=1e10: expected"));
  EXPECT_THAT(Error({"--monitor-interval=inf", "x"}), HasSubstr("--monitor-interval=inf: expected"));
  EXPECT_THAT(Error({"--rdzv-conf=join_timeout=1e-9", "x"}),
              HasSubstr("seconds for join_timeout in 0.001..1e+07 (got '1e-9')"));
  EXPECT_THAT(Error({"--rdzv-conf=close_timeout=2e7", "x"}), HasSubstr("close_timeout"));
  auto c = Parse({"--stop-timeout=1e7", "--rdzv-conf=last_call_timeout=0", "x"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->stop_timeout, 1e7);
  EXPECT_FALSE(c->hang_timeout.has_value());  // automatic
  auto h = Parse({"--hang-timeout=0", "x"});
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(h->hang_timeout, 0.0);  // off
  EXPECT_THAT(Error({"--hang-timeout=1e10", "x"}), HasSubstr("--hang-timeout=1e10: expected"));
}

TEST(Options, RunIdAndWorkerCountAreBounded) {
  EXPECT_THAT(Error({"--rdzv-id=" + std::string(129, 'a'), "x"}),
              HasSubstr("--rdzv-id=" + std::string(129, 'a') + ": expected at most 128 characters (got 129)"));
  EXPECT_TRUE(Parse({"--rdzv-id=" + std::string(128, 'a'), "x"}).ok());
  EXPECT_THAT(Error({"--nproc-per-node=100000", "x"}), HasSubstr("--nproc-per-node=100000: expected at most 4096"));
}

// `--role= PROG` made PROG the role (and the next word the program).
TEST(Options, AnEmptyValueAfterEqualsIsAnError) {
  EXPECT_THAT(Error({"--role=", "--dry-run", "./train"}), HasSubstr("--role=: expected a value after '='"));
  EXPECT_THAT(Error({"--nproc-per-node", "2", "--log-dir=", "x"}), HasSubstr("--log-dir=: expected a value"));
  auto c = Parse({"--nproc-per-node", "2", "./train", "--tag="});  // the program's own words are its own
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_THAT(c->args, ElementsAre("--tag="));
  c = Parse({"--dry-run", "-r", "3", "./train"});
  ASSERT_TRUE(c.ok()) << c.status();
}

// argparse (torchrun) takes the start of a flag's name when it is the start of one flag only;
// launch said "unknown flag". The start of several is an error naming them.
TEST(Options, AFlagsUnambiguousStartIsThatFlag) {
  auto c = Parse({"--nproc=2", "--max-r", "3", "--stand", "./train", "--nproc=9"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->nproc, 2);
  EXPECT_EQ(c->max_restarts, 3);
  EXPECT_TRUE(c->standalone);
  EXPECT_THAT(c->args, ElementsAre("--nproc=9"));  // the program's own
  EXPECT_EQ(Parse({"--nproc_per", "4", "./train"})->nproc, 4);
  const std::string ambiguous = Error({"--n=2", "./train"});
  EXPECT_THAT(ambiguous, HasSubstr("--n: ambiguous; it could be --nproc-per-node, --nnodes, "));
  EXPECT_THAT(ambiguous, HasSubstr("--node-rank"));
  EXPECT_THAT(Error({"--nproc-per-nodes=2", "./train"}), HasSubstr("unknown flag '--nproc-per-nodes=2'"));
  // --help and --version count among the names, as argparse's: --h could be either of two.
  EXPECT_THAT(Error({"--h", "./train"}), HasSubstr("--h: ambiguous; it could be --help, --hang-timeout"));
  EXPECT_TRUE(AsksForVersion({"launch", "--vers", "--nproc=2"}));
  EXPECT_TRUE(AsksForVersion({"launch", "--nproc", "2", "--version", "./train"}));
  EXPECT_FALSE(AsksForVersion({"launch", "--nproc=2", "./train", "--version"}));  // the program's
  EXPECT_FALSE(AsksForVersion({"launch", "--role", "--version", "./train"}));     // --role's value
}

// An empty prefix template is no prefix at all (it was the default).
TEST(Options, AnEmptyLinePrefixTemplateIsKept) {
  for (const auto& args : std::vector<std::vector<std::string>>{{"--log-line-prefix-template=", "./train"},
                                                                {"--log-line-prefix-template", "", "./train"}}) {
    auto c = Parse(args);
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_EQ(c->log_line_prefix_template, std::optional<std::string>(""));
  }
}

// Validate's checks, one bad value each, in the order Validate runs them.
struct CheckRow {
  std::string check;  // the concern, for failure messages
  std::vector<std::string> flags;
  std::string error;  // exact
};

std::vector<CheckRow> ChecksInOrder() {
  return {
      {"workers and nodes",
       {"--nproc-per-node=0"},
       "--nproc-per-node=0: expected a positive integer, cpu, gpu or auto"},
      {"rendezvous", {"--rdzv-backend=etcd"}, "--rdzv-backend=etcd: expected c10d or static"},
      {"restarts and monitoring",
       {"--straggler-factor=0.5"},
       "--straggler-factor=0.5: expected 0 (off) or a factor in 1..1000"},
      {"role and warm start",
       {"--warm-import=9x"},
       "--warm-import=9x: expected at most 64 Python module names (e.g. torch,numpy,mypkg.models)"},
      {"torchrun's flags", {"--start-method=thread"}, "--start-method=thread: expected spawn, fork or forkserver"},
      {"logs",
       {"--redirects=9"},
       "--redirects=9: '9' is not a level; expected 0-3 (0 none, 1 stdout, 2 stderr, 3 both) or a map like 0:1,1:2"},
      {"numa", {"--numa-binding=x"}, "--numa-binding=x: expected node, socket, exclusive or core-complex"},
      {"master", {"--master-addr=h:1"}, "--master-addr=h:1: expected a host name or IP address"},
      {"stop and restart", {"--stop-timeout=-1"}, "--stop-timeout=-1: expected a number of seconds in 0..1e+07"},
      {"devices", {"--gpu-binding=x"}, "--gpu-binding=x: expected shared or isolate"},
      {"combinations", {"--local-addr=h:5"}, "--local-addr=h:5: expected a host name or IP address (no port)"},
  };
}

std::vector<std::string> Join(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

TEST(OptionsChecks, EachNamesItsValue) {
  for (const CheckRow& row : ChecksInOrder()) {
    EXPECT_EQ(Error(Join(row.flags, {"./train"})), row.error) << row.check;
  }
}

// With several bad values the earliest check's error is reported, wherever its flag is on the
// command line, and any bad value before a missing program.
TEST(OptionsChecks, TheEarlierCheckIsReported) {
  const std::vector<CheckRow> rows = ChecksInOrder();
  for (size_t i = 0; i < rows.size(); ++i) {
    EXPECT_EQ(Error(rows[i].flags), rows[i].error) << rows[i].check << " without a program";
    for (size_t j = i + 1; j < rows.size(); ++j) {
      EXPECT_EQ(Error(Join(Join(rows[j].flags, rows[i].flags), {"./train"})), rows[i].error)
          << rows[i].check << " before " << rows[j].check;
    }
  }
}

// What one setting cannot say alone.
TEST(OptionsChecks, CombinationsNameTheValue) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> rows = {
      {{"--rdzv-backend=static", "--nnodes=1:2"},
       "--nnodes=1:2: expected a fixed number of nodes with --rdzv-backend=static"},
      {{"--rdzv-backend=static", "--nnodes=2", "--node-rank=2"},
       "--node-rank=2: expected a node rank below --nnodes=2"},
      // Several nodes, a master address and no endpoint: torchrun's static default.
      {{"--nnodes=2", "--master-addr=h", "--node-rank=3"}, "--node-rank=3: expected a node rank below --nnodes=2"},
      {{"--standalone", "--nnodes=2"}, "--nnodes=2: expected 1 with --standalone (a single-node run)"},
      {{"--virtual-local-rank", "--gpu-binding=shared"},
       "--gpu-binding=shared: expected isolate (or no --gpu-binding) with --virtual-local-rank, whose workers each "
       "see only their own GPU(s)"},
      {{"--metrics-port=70000"}, "--metrics-port=70000: expected a port in 1..65535"},
      {{"--local-ranks-filter=a"}, "--local-ranks-filter=a: expected local ranks like 0,1,2"},
      {{"--rdzv-id=.."}, "--rdzv-id=..: expected a name, not '.' or '..' (it names a log directory under --log-dir)"},
      {{"--run-path"},
       "--run-path is not supported: launch starts every worker as its own process; run the script by path or "
       "with -m MODULE"},
  };
  for (const auto& [flags, error] : rows) {
    EXPECT_EQ(Error(Join(flags, {"./train"})), error) << flags[0];
  }
}

TEST(Limits, SecondsToMsSaturates) {
  EXPECT_EQ(SecondsToMs(1.5).count(), 1500);
  EXPECT_EQ(SecondsToMs(1e10).count(), static_cast<long long>(kMaxSeconds * 1000));
  EXPECT_EQ(SecondsToMs(-3).count(), 0);
  EXPECT_EQ(SecondsToMs(std::nan("")).count(), 0);
  EXPECT_GT(SecondsToMs(std::numeric_limits<double>::infinity()).count(), 0);
}

}  // namespace
}  // namespace launch

namespace launch {
namespace {

absl::StatusOr<LaunchConfig> ParseWithEnv(std::vector<std::string> args, std::map<std::string, std::string> env) {
  args.insert(args.begin(), "launch");
  auto p = ParseLaunchArgs(args, env);
  if (!p.ok()) return p.status();
  return p->config;
}

// torchrun's PET_<FLAG> variables, as Kubeflow's PyTorchJob sets them.
TEST(OptionsFromEnvironment, PetVariablesFillWhatTheFlagsLeaveUnset) {
  auto c = ParseWithEnv({"./train"}, {{"PET_NPROC_PER_NODE", "2"},
                                      {"PET_NNODES", "2:4"},
                                      {"PET_RDZV_ENDPOINT", "master-0:23456"},
                                      {"PET_RDZV_ID", "pytorchjob-7"},
                                      {"PET_RDZV_CONF", "join_timeout=60"},
                                      {"PET_MAX_RESTARTS", "3"},
                                      {"PET_MASTER_PORT", "29501"}});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->nproc, 2);
  EXPECT_EQ(c->min_nodes, 2);
  EXPECT_EQ(c->max_nodes, 4);
  EXPECT_EQ(c->rdzv_endpoint, "master-0:23456");
  EXPECT_EQ(c->rdzv_id, "pytorchjob-7");
  EXPECT_EQ(c->rdzv.join_timeout, 60);
  EXPECT_EQ(c->max_restarts, 3);
  EXPECT_EQ(c->master_port, 29501);
}

TEST(OptionsFromEnvironment, AFlagWinsAndTheVariableWinsOverTheConfigFile) {
  char path[] = "/tmp/launch-pet-XXXXXX";
  const int fd = ::mkstemp(path);
  ASSERT_GE(fd, 0);
  ::close(fd);
  std::ofstream(path) << "nproc_per_node: 5\nmax_restarts: 7\n";
  auto c = ParseWithEnv({"--config", path, "--nproc-per-node", "3", "./train"},
                        {{"PET_NPROC_PER_NODE", "2"}, {"PET_MAX_RESTARTS", "1"}});
  ::unlink(path);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->nproc, 3);
  EXPECT_EQ(c->max_restarts, 1);
}

TEST(OptionsFromEnvironment, OnOffVariablesAsTorchrunReadsThemAndBadOnesAreNamed) {
  EXPECT_TRUE(ParseWithEnv({"./train"}, {{"PET_STANDALONE", ""}})->standalone);
  EXPECT_TRUE(ParseWithEnv({"./train"}, {{"PET_STANDALONE", "1"}})->standalone);
  EXPECT_FALSE(ParseWithEnv({"./train"}, {{"PET_STANDALONE", "0"}})->standalone);
  EXPECT_TRUE(ParseWithEnv({"./train"}, {{"PET_NO_PYTHON", "1"}})->no_python);
  auto bad = ParseWithEnv({"./train"}, {{"PET_STANDALONE", "yes"}});
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()),
              HasSubstr("PET_STANDALONE=yes: expected an empty value or an integer"));
  auto nnodes = ParseWithEnv({"./train"}, {{"PET_NNODES", "four"}});
  ASSERT_FALSE(nnodes.ok());
  EXPECT_THAT(std::string(nnodes.status().message()), HasSubstr("PET_NNODES=four"));
  // Other variables are nothing to launch.
  EXPECT_EQ(ParseWithEnv({"./train"}, {{"NPROC_PER_NODE", "4"}, {"PET_", "x"}})->nproc, 1);
}

TEST(OptionsFromEnvironment, JobCompletionIndexIsTheNodeRankWhereNothingElseGivesOne) {
  auto c = ParseWithEnv({"--rdzv-backend=static", "--nnodes=4", "--master-addr=h0", "./train"},
                        {{"JOB_COMPLETION_INDEX", "2"}});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->node_rank, 2);
  c = ParseWithEnv({"--rdzv-backend=static", "--nnodes=4", "--master-addr=h0", "./train"},
                   {{"JOB_COMPLETION_INDEX", "2"}, {"PET_NODE_RANK", "1"}});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->node_rank, 1);
  auto bad = ParseWithEnv({"--rdzv-backend=static", "--nnodes=4", "--master-addr=h0", "./train"},
                          {{"JOB_COMPLETION_INDEX", "9"}});
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()),
              HasSubstr("JOB_COMPLETION_INDEX=9: expected a node rank below --nnodes=4"));
}

}  // namespace
}  // namespace launch

namespace launch {
namespace {

// torchrun 2.x's newer flags that launch takes as they are, or refuses with a reason.
TEST(OptionsTorchrunNewer, ShutdownTimeoutIsTheStopTimeoutAndItsVariable) {
  EXPECT_EQ(Parse({"--shutdown-timeout", "7", "./train"})->stop_timeout, 7);
  EXPECT_EQ(Parse({"--shutdown_timeout=8", "./train"})->stop_timeout, 8);
  EXPECT_EQ(ParseWithEnv({"./train"}, {{"TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "9"}})->stop_timeout, 9);
  EXPECT_EQ(ParseWithEnv({"--stop-timeout", "4", "./train"}, {{"TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "9"}})->stop_timeout,
            4);
  EXPECT_THAT(std::string(ParseWithEnv({"./train"}, {{"TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "-1"}}).status().message()),
              HasSubstr("TORCH_ELASTIC_SHUTDOWN_TIMEOUT=-1: expected a number of seconds"));
}

TEST(OptionsTorchrunNewer, StartMethodIsAcceptedAndLogsSpecsRefusedWithAReason) {
  for (const char* m : {"spawn", "fork", "forkserver"}) EXPECT_TRUE(Parse({"--start-method", m, "./train"}).ok()) << m;
  EXPECT_THAT(Error({"--start-method", "thread", "./train"}),
              HasSubstr("--start-method=thread: expected spawn, fork or forkserver"));
  EXPECT_THAT(Error({"--logs-specs", "my_specs", "./train"}),
              HasSubstr("--logs-specs=my_specs: not supported (torchrun's Python plugin for log layouts)"));
}

// `launch doctor`'s flags, and --preflight.

TEST(DoctorArgs, Flags) {
  auto parsed = ParseDoctorArgs({"launch", "doctor", "--nproc-per-node", "8", "--log-dir", "/l", "--checkpoint-dir",
                                 "/c", "--exclude-gpus", "1,3", "--json"});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->config.nproc, 8);
  EXPECT_EQ(parsed->config.log_dir, "/l");
  EXPECT_EQ(parsed->config.checkpoint_dir, "/c");
  EXPECT_THAT(parsed->config.exclude_gpus, ElementsAre("1", "3"));
  EXPECT_TRUE(parsed->config.json);
  auto plain = ParseDoctorArgs({"launch", "doctor"});
  ASSERT_TRUE(plain.ok());
  EXPECT_FALSE(plain->config.nproc.has_value());
  EXPECT_FALSE(plain->config.json);
  for (const std::vector<std::string>& bad : {std::vector<std::string>{"launch", "doctor", "--nproc-per-node", "0"},
                                              {"launch", "doctor", "--nproc-per-node", "5000"},
                                              {"launch", "doctor", "--bogus"},
                                              {"launch", "doctor", "--log-dir", std::string(5000, 'x')}}) {
    auto r = ParseDoctorArgs(bad);
    ASSERT_FALSE(r.ok()) << bad.back();
    EXPECT_THAT(std::string(r.status().message()), Not(HasSubstr("\n")));
  }
  auto preflight = ParseLaunchArgs({"launch", "--preflight", "--nproc-per-node", "2", "./train"});
  ASSERT_TRUE(preflight.ok()) << preflight.status();
  EXPECT_TRUE(preflight->config.preflight);
  EXPECT_FALSE(ParseLaunchArgs({"launch", "./train"})->config.preflight);
}

}  // namespace
}  // namespace launch
