// Slurm's variables as launch reads them: the node list's expansion as a table, a job step's
// topology, and how it fills what the flags, PET_ variables and --config leave unset.
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "probes/signals.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "launcher/options.h"
#include "launcher/slurm.h"

namespace launch {
namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

struct HostlistRow {
  std::string list;
  std::vector<std::string> hosts;  // empty: an error containing `error`
  std::string error;
};

TEST(Hostlist, ExpandsAsSlurmWritesThem) {
  const std::vector<HostlistRow> rows = {
      {"node01", {"node01"}},
      {"node[01-04,07]", {"node01", "node02", "node03", "node04", "node07"}},
      {"node[01-04,07],gpu-[1-2]", {"node01", "node02", "node03", "node04", "node07", "gpu-1", "gpu-2"}},
      {"a,b,c", {"a", "b", "c"}},
      {"n[8-11]", {"n8", "n9", "n10", "n11"}},
      {"n[008-010]", {"n008", "n009", "n010"}},
      {"rack[1-2]-n[01-02]", {"rack1-n01", "rack1-n02", "rack2-n01", "rack2-n02"}},
      {"login,n[3]", {"login", "n3"}},
      {"n[1-2],", {"n1", "n2"}},
      {"[1-2]x", {"1x", "2x"}},
      {"", {}, "an empty host name"},
      {",a", {}, "an empty host name"},
      {"a,,b", {}, "an empty host name"},
      {"n[1-2", {}, "without its ']'"},
      {"n1-2]", {}, "without its '['"},
      {"n[[1]]", {}, "inside brackets"},
      {"n[]", {}, "expected numbers or ranges"},
      {"n[a-b]", {}, "expected numbers or ranges"},
      {"n[1,]", {}, "expected numbers or ranges"},
      {"n[4-2]", {}, "LOW <= HIGH"},
      {"n[1-99999999]", {}, "more than 16384 host names"},
      {"n[1-9999999999]", {}, "expected numbers or ranges"},
      {"a[1-200]b[1-200]", {}, "more than 16384 host names"},
      {"n 1", {}, "a space"},
  };
  for (const auto& row : rows) {
    SCOPED_TRACE(row.list);
    auto hosts = ExpandHostlist(row.list, 16384);
    if (row.error.empty()) {
      ASSERT_TRUE(hosts.ok()) << hosts.status();
      EXPECT_THAT(*hosts, ElementsAreArray(row.hosts));
    } else {
      ASSERT_FALSE(hosts.ok());
      EXPECT_THAT(std::string(hosts.status().message()), HasSubstr(row.error));
      EXPECT_THAT(std::string(hosts.status().message()), HasSubstr("node list '"));
    }
  }
  // The bound is the caller's.
  EXPECT_FALSE(ExpandHostlist("n[1-5]", 4).ok());
  EXPECT_TRUE(ExpandHostlist("n[1-4]", 4).ok());
  EXPECT_FALSE(ExpandHostlist(std::string(70000, 'a'), 16384).ok());
}

std::map<std::string, std::string> Step(std::map<std::string, std::string> extra = {}) {
  std::map<std::string, std::string> env = {
      {"SLURM_JOB_ID", "1234"},           {"SLURM_STEP_ID", "0"},         {"SLURM_NNODES", "4"},
      {"SLURM_STEP_NUM_NODES", "4"},      {"SLURM_NODEID", "2"},          {"SLURM_STEP_NUM_TASKS", "4"},
      {"SLURM_JOB_NODELIST", "node[01-04]"}, {"SLURM_STEP_NODELIST", "node[01-04]"},
  };
  for (auto& [k, v] : extra) {
    if (v == "<unset>") env.erase(k);
    else env[k] = v;
  }
  return env;
}

TEST(SlurmFromEnv, AJobStepsTopology) {
  auto t = SlurmFromEnv(Step({{"SLURM_RESTART_COUNT", "0"}, {"SLURM_CPUS_ON_NODE", "8"}}));
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_TRUE(t->has_value());
  const SlurmTopology& s = **t;
  EXPECT_EQ(s.nnodes.value, "4");
  EXPECT_EQ(s.nnodes.origin, "SLURM_STEP_NUM_NODES");
  EXPECT_EQ(s.node_rank.value, "2");
  EXPECT_EQ(s.rdzv_endpoint.value, absl::StrCat("node01:", SlurmRendezvousPort(1234, 0)));
  EXPECT_EQ(s.rdzv_endpoint.origin, "SLURM_STEP_NODELIST (first host)");
  EXPECT_EQ(s.master_addr.value, "node01");
  EXPECT_EQ(s.rdzv_id.value, "1234.0");
  EXPECT_FALSE(s.nproc_per_node.has_value());
  EXPECT_EQ(s.cpus_on_node, 8);
  EXPECT_EQ(s.tasks, 4);
}

TEST(SlurmFromEnv, PortsOfNeighbouringJobsAndStepsDiffer) {
  EXPECT_EQ(SlurmRendezvousPort(1000, 0), 29400);
  EXPECT_EQ(SlurmRendezvousPort(1234, 0), 29634);
  EXPECT_NE(SlurmRendezvousPort(1234, 0), SlurmRendezvousPort(1235, 0));
  EXPECT_NE(SlurmRendezvousPort(1234, 0), SlurmRendezvousPort(1234, 1));
  for (long long job : {1LL, 999LL, 123456789LL, 1LL << 52}) {
    EXPECT_GE(SlurmRendezvousPort(job, 4294967294LL), 29400);
    EXPECT_LT(SlurmRendezvousPort(job, 4294967294LL), 30400);
  }
}

TEST(SlurmFromEnv, FallsBackToTheJobsVariablesAndReadsGpusAndRequeues) {
  auto t = SlurmFromEnv(Step({{"SLURM_STEP_NUM_NODES", "<unset>"},
                              {"SLURM_STEP_NODELIST", "<unset>"},
                              {"SLURM_GPUS_ON_NODE", "8"},
                              {"SLURM_RESTART_COUNT", "2"}}));
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_TRUE(t->has_value());
  EXPECT_EQ((*t)->nnodes.origin, "SLURM_NNODES");
  EXPECT_EQ((*t)->rdzv_endpoint.origin, "SLURM_JOB_NODELIST (first host)");
  ASSERT_TRUE((*t)->nproc_per_node.has_value());
  EXPECT_EQ((*t)->nproc_per_node->value, "8");
  EXPECT_EQ((*t)->nproc_per_node->origin, "SLURM_GPUS_ON_NODE");
  EXPECT_EQ((*t)->rdzv_id.value, "1234.0.requeue2");
}

TEST(SlurmFromEnv, OutsideAJobStepThereIsNone) {
  for (const auto& env : std::vector<std::map<std::string, std::string>>{
           {}, {{"SLURM_JOB_ID", "7"}}, Step({{"SLURM_STEP_ID", "<unset>"}}), Step({{"SLURM_STEP_ID", "batch"}}),
           Step({{"SLURM_STEP_ID", "extern"}})}) {
    auto t = SlurmFromEnv(env);
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_FALSE(t->has_value());
  }
}

TEST(SlurmFromEnv, BadVariablesAreNamed) {
  struct Bad {
    std::map<std::string, std::string> extra;
    std::string error;
  };
  const std::vector<Bad> rows = {
      {{{"SLURM_JOB_ID", "x"}}, "SLURM_JOB_ID=x: expected an integer"},
      {{{"SLURM_STEP_NUM_NODES", "0"}}, "SLURM_STEP_NUM_NODES=0: expected an integer in 1..16384"},
      {{{"SLURM_STEP_NUM_NODES", "99999"}}, "SLURM_STEP_NUM_NODES=99999"},
      {{{"SLURM_NODEID", "4"}}, "SLURM_NODEID=4: expected an integer in 0..3"},
      {{{"SLURM_NODEID", "<unset>"}}, "SLURM_NODEID is unset"},
      {{{"SLURM_STEP_NUM_NODES", "<unset>"}, {"SLURM_NNODES", "<unset>"}}, "SLURM_NNODES are unset"},
      {{{"SLURM_STEP_NODELIST", "node[01-03]"}}, "3 host(s) for SLURM_STEP_NUM_NODES=4"},
      {{{"SLURM_STEP_NODELIST", "node[01-"}}, "SLURM_STEP_NODELIST: node list 'node[01-'"},
      {{{"SLURM_STEP_NODELIST", "<unset>"}, {"SLURM_JOB_NODELIST", "<unset>"}}, "SLURM_JOB_NODELIST are unset"},
      {{{"SLURM_GPUS_ON_NODE", "-1"}}, "SLURM_GPUS_ON_NODE=-1"},
      {{{"SLURM_CPUS_ON_NODE", "0"}}, "SLURM_CPUS_ON_NODE=0"},
      {{{"SLURM_RESTART_COUNT", "many"}}, "SLURM_RESTART_COUNT=many"},
      {{{"SLURM_STEP_ID", "99999999999"}}, "SLURM_STEP_ID=99999999999"},
  };
  for (const auto& row : rows) {
    auto t = SlurmFromEnv(Step(row.extra));
    ASSERT_FALSE(t.ok()) << row.error;
    EXPECT_THAT(std::string(t.status().message()), HasSubstr(row.error));
  }
}

absl::StatusOr<LaunchConfig> ParseWithEnv(std::vector<std::string> args, std::map<std::string, std::string> env) {
  args.insert(args.begin(), "launch");
  auto p = ParseLaunchArgs(args, env);
  if (!p.ok()) return p.status();
  return p->config;
}

TEST(OptionsFromSlurm, AStepGivesTheTopologyAndItsOrigins) {
  auto c = ParseWithEnv({"--nproc-per-node=2", "./train"}, Step());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->min_nodes, 4);
  EXPECT_EQ(c->max_nodes, 4);
  EXPECT_EQ(c->node_rank, 2);
  EXPECT_EQ(c->rdzv_endpoint, absl::StrCat("node01:", SlurmRendezvousPort(1234, 0)));
  EXPECT_EQ(c->rdzv_id, "1234.0");
  EXPECT_EQ(c->nproc, 2);
  EXPECT_EQ(c->origins.at("nnodes"), "SLURM_STEP_NUM_NODES");
  EXPECT_EQ(c->origins.at("node_rank"), "SLURM_NODEID");
  EXPECT_EQ(c->origins.at("nproc_per_node"), "--nproc-per-node");
  EXPECT_EQ(c->origins.at("rdzv_id"), "SLURM_JOB_ID.SLURM_STEP_ID");
  EXPECT_EQ(c->signals_to_handle, SlurmHandledSignals());
  EXPECT_EQ(c->origins.at("signals_to_handle"), "default in a Slurm job step");
}

TEST(OptionsFromSlurm, FlagsAndPetVariablesWin) {
  auto c = ParseWithEnv({"--nnodes=2", "--rdzv-endpoint=head:29400", "--signals-to-handle=SIGTERM", "./train"},
                        Step({{"PET_RDZV_ID", "mine"}}));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->max_nodes, 2);
  EXPECT_EQ(c->rdzv_endpoint, "head:29400");
  EXPECT_EQ(c->rdzv_id, "mine");
  EXPECT_EQ(c->origins.at("rdzv_id"), "PET_RDZV_ID");
  EXPECT_THAT(c->signals_to_handle, ElementsAre(SIGTERM));
}

TEST(OptionsFromSlurm, OneNodeNeedsNoEndpointAndStandaloneTurnsItOff) {
  auto one = ParseWithEnv({"./train"}, Step({{"SLURM_STEP_NUM_NODES", "1"}, {"SLURM_NODEID", "0"},
                                             {"SLURM_STEP_NUM_TASKS", "1"}, {"SLURM_GPUS_ON_NODE", "4"}}));
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(one->max_nodes, 1);
  EXPECT_EQ(one->rdzv_endpoint, "");
  EXPECT_EQ(one->rdzv_id, "1234.0");
  EXPECT_EQ(one->nproc, 4);
  EXPECT_EQ(one->origins.at("nproc_per_node"), "SLURM_GPUS_ON_NODE");
  auto alone = ParseWithEnv({"--standalone", "./train"}, Step());
  ASSERT_TRUE(alone.ok()) << alone.status();
  EXPECT_EQ(alone->max_nodes, 1);
  EXPECT_EQ(alone->rdzv_endpoint, "");
  EXPECT_EQ(alone->signals_to_handle, DefaultHandledSignals());
}

TEST(OptionsFromSlurm, TheStaticBackendGetsTheFirstHostAsMaster) {
  auto c = ParseWithEnv({"--rdzv-backend=static", "./train"}, Step());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->master_addr, "node01");
  EXPECT_EQ(c->node_rank, 2);
  EXPECT_EQ(c->rdzv_endpoint, "");
}

TEST(OptionsFromSlurm, MoreThanOneTaskPerNodeSaysWhatToChange) {
  auto c = ParseWithEnv({"./train"}, Step({{"SLURM_STEP_NUM_TASKS", "8"}}));
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(std::string(c.status().message()),
              HasSubstr("srun started 8 tasks on 4 node(s) (SLURM_STEP_NUM_TASKS=8, SLURM_STEP_NUM_NODES=4): launch "
                        "is one agent per node"));
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("srun --ntasks-per-node=1"));
  // Nothing taken from Slurm: the user's own topology.
  EXPECT_TRUE(ParseWithEnv({"--nnodes=1", "--rdzv-id=x", "--standalone", "./train"},
                           Step({{"SLURM_STEP_NUM_TASKS", "8"}}))
                  .ok());
}

TEST(OptionsFromSlurm, ABadVariableIsAUsageError) {
  auto c = ParseWithEnv({"./train"}, Step({{"SLURM_NODEID", "9"}}));
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("SLURM_NODEID=9"));
}

TEST(SignalsToHandle, ParsesNamesAndRefusesOthers) {
  auto s = ParseSignalList("SIGTERM, usr1,INT,10,SIGTERM");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_THAT(*s, ElementsAre(SIGTERM, SIGUSR1, SIGINT));
  EXPECT_EQ(SignalListName(*s), "SIGTERM,SIGUSR1,SIGINT");
  for (const char* bad : {"SIGKILL", "SIGSTOP", "SIGCHLD", "SIGSEGV", "FOO", "0", "99", ""}) {
    SCOPED_TRACE(bad);
    EXPECT_FALSE(ParseSignalList(bad).ok());
  }
  auto c = ParseWithEnv({"--signals-to-handle=SIGTERM,SIGKILL", "./train"}, {});
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(std::string(c.status().message()),
              HasSubstr("--signals-to-handle=SIGTERM,SIGKILL: 'SIGKILL': expected signals among SIGTERM,SIGINT"));
  EXPECT_EQ(ParseWithEnv({"./train"}, {})->signals_to_handle, DefaultHandledSignals());
}

}  // namespace
}  // namespace launch

namespace launch {
namespace {

TEST(LogLinePrefixTemplate, FlagThenTorchrunsVariable) {
  auto parse = [](std::vector<std::string> args, std::map<std::string, std::string> env) {
    args.insert(args.begin(), "launch");
    args.push_back("./train");
    return ParseLaunchArgs(args, env);
  };
  auto flag = parse({"--log-line-prefix-template=${rank}|"}, {{"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE", "x"}});
  ASSERT_TRUE(flag.ok()) << flag.status();
  EXPECT_EQ(flag->config.log_line_prefix_template, "${rank}|");
  auto env = parse({}, {{"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE", "[${role_name}${local_rank}]:"}});
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_EQ(env->config.log_line_prefix_template, "[${role_name}${local_rank}]:");
  EXPECT_FALSE(parse({}, {})->config.log_line_prefix_template.has_value());
  auto bad = parse({}, {{"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE", "${gpu}"}});
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()),
              HasSubstr("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE=${gpu}: '${gpu}' is unknown"));
}

TEST(TorchrunsNewerFlags, FiltersAndVirtualLocalRank) {
  auto parse = [](std::vector<std::string> args) {
    args.insert(args.begin(), "launch");
    args.push_back("./train");
    return ParseLaunchArgs(args, {});
  };
  auto f = parse({"--duplicate-stdout-filters=loss,a,,b,", "--duplicate_stderr_filters=NCCL WARN"});
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_THAT(f->config.duplicate_stdout_filters, ElementsAre("loss", "a,b"));
  EXPECT_THAT(f->config.duplicate_stderr_filters, ElementsAre("NCCL WARN"));
  EXPECT_TRUE(parse({"--duplicate-stdout-filters=,"})->config.duplicate_stdout_filters.empty());
  auto big = parse({"--duplicate-stdout-filters=" + std::string(2000, 'x')});
  ASSERT_FALSE(big.ok());
  EXPECT_THAT(std::string(big.status().message()), HasSubstr("filters of at most 1024 bytes"));

  auto v = parse({"--virtual-local-rank"});
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_TRUE(v->config.virtual_local_rank);
  EXPECT_EQ(v->config.gpu_binding, GpuBinding::kIsolate);
  auto shared = parse({"--virtual-local-rank", "--gpu-binding=shared"});
  ASSERT_FALSE(shared.ok());
  EXPECT_THAT(std::string(shared.status().message()), HasSubstr("--gpu-binding=shared: expected isolate"));
}

// torchrun's default backend is static: a non-elastic PyTorchJob gives several nodes, a master
// and no endpoint.
TEST(OptionsFromEnvironment, AMasterAndNoEndpointOnSeveralNodesIsStaticAsUnderTorchrun) {
  auto c = ParseWithEnv({"./train"}, {{"PET_NNODES", "2"},
                                      {"PET_NODE_RANK", "1"},
                                      {"PET_MASTER_ADDR", "job-master-0"},
                                      {"PET_MASTER_PORT", "23456"}});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rdzv_backend, "static");
  EXPECT_EQ(c->origins.at("rdzv_backend"), "torchrun's default (a master address, no endpoint)");
  EXPECT_EQ(c->node_rank, 1);
  // An endpoint, an elastic count or an explicit backend keep c10d.
  EXPECT_EQ(ParseWithEnv({"--rdzv-endpoint=h:1", "./train"}, {{"PET_NNODES", "2"}, {"PET_MASTER_ADDR", "m"}})
                ->rdzv_backend,
            "c10d");
  EXPECT_EQ(ParseWithEnv({"./train"}, {{"PET_NNODES", "1:2"}, {"PET_MASTER_ADDR", "m"}})->rdzv_backend, "c10d");
  EXPECT_EQ(ParseWithEnv({"./train"}, {{"PET_NNODES", "1"}, {"PET_MASTER_ADDR", "m"}})->rdzv_backend, "c10d");
}

}  // namespace
}  // namespace launch
