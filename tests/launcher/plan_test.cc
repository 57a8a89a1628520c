// PlanLaunch as a table: flags and a fake machine in, a plan or the exact usage error out.
#include "launcher/plan.h"

#include <functional>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/limits.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace launch {
namespace {

using ::testing::ElementsAre;

constexpr FileFacts kExecutable{true, true, true, true};       // an ELF binary or a #! script
constexpr FileFacts kReadable{true, true, false, false};       // a text file
constexpr FileFacts kExecutableText{true, true, true, false};  // chmod +x, but no #! line

// A machine made of data: a file table instead of a file system, name sets instead of DNS.
class FakeHost : public HostQueries {
 public:
  std::map<std::string, FileFacts> files = {{"/usr/bin/python3", kExecutable},
                                            {"./train", kExecutable},
                                            {"train.py", kReadable}};
  absl::StatusOr<std::string> default_address = std::string("10.0.0.5");
  std::set<std::string> loopback = {"127.0.0.1", "127.0.1.1", "::1", "localhost"};
  std::set<std::string> local = {"127.0.0.1", "::1", "localhost", "10.0.0.5", "node0"};
  std::set<std::string> unresolvable = {"nohost"};
  std::set<std::pair<std::string, int>> ports_in_use;

  // As probes/process.h's ResolveExecutable, on the file table.
  absl::StatusOr<std::string> ResolveExecutable(const std::string& program, const std::string& path_env) override {
    if (program.find('/') != std::string::npos) {
      auto it = files.find(program);
      if (it == files.end()) return absl::NotFoundError(absl::StrCat("program '", program, "' does not exist"));
      if (!it->second.executable) {
        return absl::PermissionDeniedError(
            absl::StrCat("program '", program, "' is not executable (chmod +x, or run a .py script)"));
      }
      return program;
    }
    for (absl::string_view dir : absl::StrSplit(path_env, ':', absl::SkipEmpty())) {
      std::string candidate = absl::StrCat(dir, "/", program);
      auto it = files.find(candidate);
      if (it != files.end() && it->second.regular && it->second.executable) return candidate;
    }
    return absl::NotFoundError(absl::StrCat("program '", program, "' was not found on PATH"));
  }
  FileFacts File(const std::string& path) override {
    auto it = files.find(path);
    return it == files.end() ? FileFacts{} : it->second;
  }
  absl::StatusOr<std::string> DefaultHostAddress() override { return default_address; }
  std::map<std::string, std::vector<std::string>> names;  // names with their addresses
  absl::StatusOr<std::vector<std::string>> ResolveHost(const std::string& host) override {
    if (unresolvable.count(host)) return absl::NotFoundError(absl::StrCat("cannot resolve '", host, "'"));
    if (auto it = names.find(host); it != names.end()) return it->second;
    return std::vector<std::string>{host};
  }
  absl::StatusOr<bool> IsLoopbackHost(const std::string& host) override {
    if (unresolvable.count(host)) return absl::NotFoundError(absl::StrCat("cannot resolve '", host, "'"));
    return loopback.count(host) > 0;
  }
  absl::StatusOr<bool> IsLocalHost(const std::string& host) override {
    if (unresolvable.count(host)) return absl::NotFoundError(absl::StrCat("cannot resolve '", host, "'"));
    return local.count(host) > 0;
  }
  absl::StatusOr<bool> PortInUse(const std::string& host, int port) override {
    return ports_in_use.count({host, port}) > 0;
  }
  // "aa...a1", "aa...a2", ...: each draw names its place in the sequence.
  std::set<std::string> declare_warm_start;  // executables holding LAUNCH_SDK_WARM_START()'s mark
  bool DeclaresWarmStart(const std::string& executable) override { return declare_warm_start.count(executable) > 0; }
  std::set<std::string> without_torch;  // interpreters that cannot import torch
  absl::StatusOr<bool> PythonFindsTorch(const std::string& python, const Env&) override {
    return without_torch.count(python) == 0;
  }
  std::string RandomHex(int bytes) override {
    std::string s(2 * bytes, 'a');
    s.back() = static_cast<char>('0' + ++draws_ % 10);
    return s;
  }

 private:
  int draws_ = 0;
};

GpuInfo Gpu(int index, uint64_t gib = 80, int sms = 132) {
  GpuInfo g;
  g.index = index;
  g.uuid = absl::StrCat("GPU-", index);
  g.name = "H100";
  g.memory_bytes = gib << 30;
  g.sm_count = sms;
  return g;
}
std::vector<GpuInfo> Gpus(int n) {
  std::vector<GpuInfo> v;
  for (int i = 0; i < n; ++i) v.push_back(Gpu(i));
  return v;
}

struct Machine {
  HostFacts facts;
  FakeHost host;
};

using Check = std::function<void(const LaunchPlan&)>;
using OnMachine = std::function<void(Machine&)>;
using OnConfig = std::function<void(LaunchConfig&)>;

struct Row {
  std::string name;
  std::string flags;  // launch's command line after "launch", split on spaces
  // A refusal: its code and exact message. Otherwise `check` looks at the plan.
  absl::StatusCode code = absl::StatusCode::kOk;
  std::string error;
  Check check;
  OnMachine machine;  // empty: the default machine
  OnConfig config;    // empty: the flags as parsed
};

std::ostream& operator<<(std::ostream& os, const Row& r) { return os << r.name; }

Row Plans(std::string name, std::string flags, Check check, OnMachine machine = nullptr, OnConfig config = nullptr) {
  return {std::move(name),  std::move(flags),   absl::StatusCode::kOk, "",
          std::move(check), std::move(machine), std::move(config)};
}
Row Refuses(std::string name, std::string flags, absl::StatusCode code, std::string error, OnMachine machine = nullptr,
            OnConfig config = nullptr) {
  return {std::move(name), std::move(flags), code, std::move(error), nullptr, std::move(machine), std::move(config)};
}

constexpr auto kInvalid = absl::StatusCode::kInvalidArgument;
constexpr auto kPrecondition = absl::StatusCode::kFailedPrecondition;

const std::string kLoopbackTail =
    ", which other nodes cannot reach; expected --local-addr=<this node's IP or name on the "
    "cluster network>";

OnMachine WithGpus(int n) {
  return [n](Machine& m) { m.facts.gpus = Gpus(n); };
}
OnMachine WithFile(std::string path, FileFacts f) {
  return [path, f](Machine& m) { m.host.files[path] = f; };
}
OnMachine WithPortInUse(std::string host, int port) {
  return [host, port](Machine& m) { m.host.ports_in_use.insert({host, port}); };
}
// Two NUMA nodes of four CPUs each; the first half of the GPUs on node 0, the rest on node 1.
OnMachine WithTwoNumaNodes(int gpus) {
  return [gpus](Machine& m) {
    for (int id = 0; id < 8; ++id) {
      LogicalCpu cpu;
      cpu.id = cpu.core = id;
      cpu.node = cpu.package = id / 4;
      m.facts.cpu_topology.cpus.push_back(cpu);
    }
    m.facts.gpus = Gpus(gpus);
    for (GpuInfo& g : m.facts.gpus) g.numa_node = g.index * 2 / gpus;
  };
}
OnConfig WithGlobalBatch(int batch) {
  return [batch](LaunchConfig& c) {
    TrainScaling t;
    t.base_lr = 0.1;
    t.global_batch = batch;
    c.train = t;
  };
}

std::vector<Row> Rows() {
  return {
      // How many workers.
      Plans("CountIsTaken", "--nproc-per-node=3 ./train --epochs 3",
            [](const LaunchPlan& p) {
              EXPECT_EQ(p.agent.spec.local_world_size, 3);
              EXPECT_EQ(p.agent.node.local_world_size(), 3);
              EXPECT_THAT(p.agent.argv, ElementsAre("./train", "--epochs", "3"));
              EXPECT_TRUE(p.agent.spec.gpu_pool.empty());
              EXPECT_EQ(p.agent.spec.usable_cpus, 6);
              EXPECT_EQ(p.descriptors_needed, 64 + 3 * 2);
            }),
      Plans("CpuIsUsableCpus", "--nproc-per-node=cpu ./train",
            [](const LaunchPlan& p) { EXPECT_EQ(p.agent.spec.local_world_size, 6); }),
      Plans(
          "GpuIsThePool", "--nproc-per-node=gpu ./train",
          [](const LaunchPlan& p) {
            EXPECT_EQ(p.agent.spec.local_world_size, 2);
            EXPECT_THAT(p.agent.spec.gpu_pool, ElementsAre("0", "1"));
            EXPECT_TRUE(p.agent.spec.gpu_pool_is_nvml_indices);
          },
          WithGpus(2)),
      Refuses("GpuWithoutGpus", "--nproc-per-node=gpu ./train", kInvalid,
              "--nproc-per-node=gpu: no GPU (NVML not found)"),
      Refuses("GpuAllExcluded", "--nproc-per-node=gpu --exclude-gpus=0,1 ./train", kInvalid,
              "--nproc-per-node=gpu: no GPU (every GPU is excluded)", WithGpus(2)),
      Plans("AutoWithoutGpusIsCpus", "--nproc-per-node=auto ./train",
            [](const LaunchPlan& p) { EXPECT_EQ(p.agent.spec.local_world_size, 6); }),
      Plans(
          "AutoWithGpusIsGpus", "--nproc-per-node=auto ./train",
          [](const LaunchPlan& p) { EXPECT_EQ(p.agent.spec.local_world_size, 4); }, WithGpus(4)),
      Plans(
          "InheritedCudaVisibleDevices", "--nproc-per-node=gpu ./train",
          [](const LaunchPlan& p) {
            EXPECT_THAT(p.agent.spec.gpu_pool, ElementsAre("2", "3"));
            EXPECT_FALSE(p.agent.spec.gpu_pool_is_nvml_indices);
          },
          [](Machine& m) {
            m.facts.gpus = Gpus(4);
            m.facts.env["CUDA_VISIBLE_DEVICES"] = "2,3";
          }),
      Refuses("GpusFlagWithoutGpus", "--gpus=0 ./train", kInvalid, "--gpus: no GPU (NVML not found)"),
      Refuses("ExcludeGpusWithoutGpus", "--exclude-gpus=1 ./train", kInvalid,
              "--exclude-gpus: no GPU (NVML not found)"),
      Refuses("GpusFlagNamesNoGpu", "--gpus=7 ./train", kInvalid,
              "--gpus=7: '7' matches no GPU; expected indices or UUIDs of: 0 (GPU-0), 1 (GPU-1)", WithGpus(2)),
      Refuses("IsolateWithTooFewGpus", "--nproc-per-node=4 --gpu-binding=isolate ./train", kInvalid,
              "--gpu-binding=isolate: 4 workers but 2 GPU(s) in the pool; expected at least one "
              "GPU per worker",
              WithGpus(2)),
      Plans("IsolateWithoutGpusIsFine", "--nproc-per-node=4 --gpu-binding=isolate ./train",
            [](const LaunchPlan& p) { EXPECT_EQ(p.agent.spec.gpu_binding, GpuBinding::kIsolate); }),
      Plans(
          "ImbalancedPoolWarns", "--nproc-per-node=gpu ./train",
          [](const LaunchPlan& p) {
            ASSERT_EQ(p.warnings.size(), 1u);
            EXPECT_EQ(p.warnings[0].rfind("the GPU pool is imbalanced: ", 0), 0u) << p.warnings[0];
          },
          [](Machine& m) {
            m.facts.gpus = {Gpu(0), Gpu(1, 40, 108)};
          }),

      // What runs.
      Plans("PyScriptThroughPython", "train.py --lr 0.1",
            [](const LaunchPlan& p) {
              EXPECT_THAT(p.agent.argv, ElementsAre("/usr/bin/python3", "-u", "train.py", "--lr", "0.1"));
            }),
      Plans("ModuleThroughPython", "-m pkg.train",
            [](const LaunchPlan& p) {
              EXPECT_THAT(p.agent.argv, ElementsAre("/usr/bin/python3", "-u", "-m", "pkg.train"));
            }),
      Refuses("PythonExecNotFound", "train.py", kInvalid, "PYTHON_EXEC: program 'python9' was not found on PATH",
              [](Machine& m) { m.facts.env["PYTHON_EXEC"] = "python9"; }),
      Refuses("PyScriptMissing", "missing.py", kInvalid, "script 'missing.py' does not exist or is not readable"),
      Plans(
          "NoPythonRunsPyDirectly", "--no-python ./tool.py",
          [](const LaunchPlan& p) { EXPECT_THAT(p.agent.argv, ElementsAre("./tool.py")); },
          WithFile("./tool.py", kExecutable)),
      Plans(
          "ProgramOnPath", "trainer",
          [](const LaunchPlan& p) { EXPECT_THAT(p.agent.argv, ElementsAre("/bin/trainer")); },
          WithFile("/bin/trainer", kExecutable)),
      Refuses("ProgramNotFound", "trainer", kInvalid, "program 'trainer' was not found on PATH"),
      // As torchrun: a script without .py runs through Python too; binaries and #! scripts do not.
      Plans(
          "TextScriptHereThroughPython", "run_me --x",
          [](const LaunchPlan& p) {
            EXPECT_THAT(p.agent.argv, ElementsAre("/usr/bin/python3", "-u", "run_me", "--x"));
            EXPECT_TRUE(p.agent.warm_python);
            EXPECT_EQ(p.python, "/usr/bin/python3");
          },
          WithFile("run_me", kReadable)),
      Plans(
          "ExecutableTextWithoutShebangThroughPython", "./run_me",
          [](const LaunchPlan& p) { EXPECT_THAT(p.agent.argv, ElementsAre("/usr/bin/python3", "-u", "./run_me")); },
          WithFile("./run_me", kExecutableText)),
      Plans(
          "BinaryHereRunsWithoutDotSlash", "trainer",
          [](const LaunchPlan& p) {
            EXPECT_THAT(p.agent.argv, ElementsAre("./trainer"));
            EXPECT_FALSE(p.agent.warm_python);
          },
          [](Machine& m) {
            m.host.files["trainer"] = kExecutable;
            m.host.files["./trainer"] = kExecutable;
            m.host.files["/bin/trainer"] = kExecutable;  // here wins, as Python opens it here
          }),
      Refuses("PythonOnPathWithoutTorch", "train.py", kPrecondition,
              "python3 on PATH (/usr/bin/python3) cannot import torch; set PYTHON_EXEC to the interpreter of your "
              "training environment (PYTHON_EXEC=python3 runs the script there anyway)",
              [](Machine& m) { m.host.without_torch.insert("/usr/bin/python3"); }),
      Plans(
          "PythonExecChosenIsNotAsked", "train.py",
          [](const LaunchPlan& p) { EXPECT_THAT(p.agent.argv, ElementsAre("/usr/bin/python3", "-u", "train.py")); },
          [](Machine& m) {
            m.host.without_torch.insert("/usr/bin/python3");
            m.facts.env["PYTHON_EXEC"] = "python3";
          }),
      Refuses("NoPythonNotExecutableHasNoHint", "--no-python ./run_me", kInvalid,
              "program './run_me' is not executable (chmod +x, or run a .py script)", WithFile("./run_me", kReadable)),

      // Descriptors.
      Refuses("DescriptorBudgetRefused", "--nproc-per-node=500 ./train", kInvalid,
              "--nproc-per-node=500: 500 workers need about 1064 open files, and the limit is "
              "1024 (ulimit -n; the hard limit is 4096); expected at most 480 workers, or a "
              "higher limit"),
      Refuses("DescriptorBudgetWithLogFiles", "--nproc-per-node=300 --redirects=3 ./train", kInvalid,
              "--nproc-per-node=300: 300 workers with log files need about 1264 open files, and "
              "the limit is 1024 (ulimit -n; the hard limit is unlimited); expected at most 240 "
              "workers, or a higher limit",
              [](Machine& m) { m.facts.open_files_hard.reset(); }),
      Plans(
          "DescriptorBudgetUnlimited", "--nproc-per-node=500 ./train",
          [](const LaunchPlan& p) { EXPECT_EQ(p.descriptors_needed, 64 + 500 * 2); },
          [](Machine& m) { m.facts.open_files_soft.reset(); }),
      Plans(
          "DryRunSkipsHostChecks", "--dry-run --nproc-per-node=500 --master-port=29500 --redirects=3 ./train",
          [](const LaunchPlan& p) {
            EXPECT_EQ(p.descriptors_needed, 0);
            EXPECT_FALSE(p.make_temp_log_dir);
            EXPECT_FALSE(p.ensure_log_dir);
            EXPECT_TRUE(p.agent.dry_run);
          },
          WithPortInUse("127.0.0.1", 29500)),

      // Log directories.
      Plans("RedirectsWithoutLogDirMakeOne", "--redirects=3 ./train",
            [](const LaunchPlan& p) {
              EXPECT_TRUE(p.make_temp_log_dir);
              EXPECT_TRUE(p.ensure_log_dir);
              EXPECT_EQ(p.agent.redirects.all, 3);
              EXPECT_EQ(p.descriptors_needed, 64 + 4);
            }),
      Plans("LogDirIsEnsured", "--log-dir=/tmp/logs ./train",
            [](const LaunchPlan& p) {
              EXPECT_FALSE(p.make_temp_log_dir);
              EXPECT_TRUE(p.ensure_log_dir);
              EXPECT_EQ(p.agent.log_dir, "/tmp/logs");
            }),

      // Topology and addresses.
      Plans("SingleNodeInProcess", "./train",
            [](const LaunchPlan& p) {
              EXPECT_EQ(p.topology, Topology::kSingleNode);
              EXPECT_EQ(p.coordinator, CoordinatorRole::kInProcess);
              EXPECT_EQ(p.agent.master_addr, "127.0.0.1");
              EXPECT_EQ(p.agent.node.host_address(), "127.0.0.1");
              EXPECT_EQ(p.rendezvous.min_nodes, 1);
              EXPECT_EQ(p.rendezvous.max_nodes, 1);
              // The in-process coordinator's lease never expires.
              EXPECT_EQ(p.rendezvous.heartbeat_timeout, SecondsToMs(kMaxSeconds));
              EXPECT_EQ(p.rendezvous.close_timeout, std::chrono::milliseconds(30000));
            }),
      Refuses("MultiNodeWithoutEndpoint", "--nnodes=2 ./train", kInvalid,
              "--nnodes=2: a multi-node run needs --rdzv-endpoint=HOST[:PORT] (the coordinator)"),
      Refuses("ElasticWithoutEndpoint", "--nnodes=1:4 ./train", kInvalid,
              "--nnodes=1:4: a multi-node run needs --rdzv-endpoint=HOST[:PORT] (the "
              "coordinator)"),
      Plans("MultiNodeHostsWhenEndpointIsHere", "--nnodes=1:4 --rdzv-endpoint=node0 ./train",
            [](const LaunchPlan& p) {
              EXPECT_EQ(p.topology, Topology::kMultiNode);
              EXPECT_EQ(p.coordinator, CoordinatorRole::kHostUnlessTaken);
              EXPECT_EQ(p.rdzv_endpoint, "node0:29400");
              EXPECT_EQ(p.rdzv_host, "node0");
              EXPECT_EQ(p.agent.node.host_address(), "10.0.0.5");
              EXPECT_EQ(p.agent.master_addr, "10.0.0.5");
              EXPECT_EQ(p.rendezvous.min_nodes, 1);
              EXPECT_EQ(p.rendezvous.max_nodes, 4);
              EXPECT_EQ(p.rendezvous.heartbeat_timeout, std::chrono::milliseconds(3000));
            }),
      Plans("MultiNodeJoinsElsewhere", "--nnodes=2 --rdzv-endpoint=node1:29555 ./train",
            [](const LaunchPlan& p) {
              EXPECT_EQ(p.coordinator, CoordinatorRole::kJoin);
              EXPECT_EQ(p.rdzv_endpoint, "node1:29555");
            }),
      Plans("IsHostForced", "--nnodes=2 --rdzv-endpoint=node1 --rdzv-conf=is_host=1 ./train",
            [](const LaunchPlan& p) { EXPECT_EQ(p.coordinator, CoordinatorRole::kHost); }),
      // A pod whose DNS record comes after it starts: joined, retried until join_timeout.
      Plans("EndpointNotResolvableYetIsJoined", "--nnodes=2 --rdzv-endpoint=nohost:29400 --local-addr=10.0.0.5 ./train",
            [](const LaunchPlan& p) {
              EXPECT_EQ(p.coordinator, CoordinatorRole::kJoin);
              ASSERT_EQ(p.warnings.size(), 1u);
              EXPECT_EQ(p.warnings[0],
                        "--rdzv-endpoint=nohost:29400: cannot resolve 'nohost' (yet): joining it, retried until "
                        "join_timeout");
            }),
      // This machine's own name is here even before DNS knows it.
      Plans(
          "EndpointIsThisHostsName", "--nnodes=2 --rdzv-endpoint=pod-0:29400 --local-addr=10.0.0.5 ./train",
          [](const LaunchPlan& p) { EXPECT_EQ(p.coordinator, CoordinatorRole::kHostUnlessTaken); },
          [](Machine& m) {
            m.facts.hostname = "pod-0";
            m.host.unresolvable.insert("pod-0");
          }),
      Plans(
          "EndpointUnderThisHostsNameNotResolvingYetIsHere",
          "--nnodes=2 --rdzv-endpoint=pod-0.sub:29400 --local-addr=10.0.0.5 ./train",
          [](const LaunchPlan& p) {
            EXPECT_EQ(p.coordinator, CoordinatorRole::kHostUnlessTaken);
            EXPECT_TRUE(p.warnings.empty());
          },
          [](Machine& m) {
            m.facts.hostname = "pod-0";
            m.host.unresolvable.insert("pod-0.sub");
          }),
      Plans(
          "EndpointOfAnotherHostUnderTheSameDomainIsJoined",
          "--nnodes=2 --rdzv-endpoint=pod-0.sub:29400 --local-addr=10.0.0.5 ./train",
          [](const LaunchPlan& p) { EXPECT_EQ(p.coordinator, CoordinatorRole::kJoin); },
          [](Machine& m) {
            m.facts.hostname = "pod-1";
            m.host.unresolvable.insert("pod-0.sub");
          }),
      // Port 0: hosted here on a free port (run.cc joins it); refused where another node would need it.
      Plans("EndpointPortZeroIsHostedHere", "--nnodes=1 --rdzv-endpoint=localhost:0 ./train",
            [](const LaunchPlan& p) {
              EXPECT_EQ(p.coordinator, CoordinatorRole::kHost);
              EXPECT_EQ(p.rdzv_endpoint, "localhost:0");
            }),
      Refuses("EndpointPortZeroForSeveralNodes", "--nnodes=1:2 --rdzv-endpoint=localhost:0 ./train", kInvalid,
              "--rdzv-endpoint=localhost:0: port 0 (any free port) works only for a coordinator hosted here with "
              "--nnodes=1, since no other node could learn the port; give the coordinator's port"),
      Refuses("EndpointPortZeroOnAnotherMachine", "--nnodes=1 --rdzv-endpoint=node1:0 ./train", kInvalid,
              "--rdzv-endpoint=node1:0: port 0 (any free port) works only for a coordinator hosted here with "
              "--nnodes=1, since no other node could learn the port; give the coordinator's port"),
      // Replicas behind one name: every agent joins them, even on a replica's own machine.
      Plans(
          "NameOverSeveralAddressesIsReplicasJoinedEvenFromOneOfThem",
          "--nnodes=2 --rdzv-endpoint=replicas:29444 --local-addr=10.0.0.5 ./train",
          [](const LaunchPlan& p) {
            EXPECT_EQ(p.coordinator, CoordinatorRole::kJoin);
            EXPECT_EQ(p.rdzv_replicas,
                      (std::vector<std::string>{"10.0.0.5:29444", "10.0.0.6:29444", "10.0.0.7:29444"}));
            EXPECT_EQ(p.rdzv_replicas_name, "replicas");
          },
          [](Machine& m) {
            m.host.names["replicas"] = {"10.0.0.5", "10.0.0.6", "fd00::6", "10.0.0.7", "10.0.0.6"};
            m.host.local.insert("replicas");
          }),
      // One address of each family is one host: hosted here as before; with is_host=false, one
      // coordinator joined.
      Plans(
          "NameWithOneAddressPerFamilyIsOneHost", "--nnodes=2 --rdzv-endpoint=node0b ./train",
          [](const LaunchPlan& p) {
            EXPECT_EQ(p.coordinator, CoordinatorRole::kHostUnlessTaken);
            EXPECT_TRUE(p.rdzv_replicas.empty());
          },
          [](Machine& m) {
            m.host.names["node0b"] = {"10.0.0.5", "fd00::5"};
            m.host.local.insert("node0b");
          }),
      Plans(
          "NameOverSeveralAddressesWithIsHostFalseIsReplicas",
          "--nnodes=2 --rdzv-endpoint=replicas --rdzv-conf=is_host=0 --local-addr=10.0.0.5 ./train",
          [](const LaunchPlan& p) {
            EXPECT_EQ(p.coordinator, CoordinatorRole::kJoin);
            EXPECT_EQ(p.rdzv_replicas, (std::vector<std::string>{"10.0.0.6:29400", "10.0.0.7:29400"}));
          },
          [](Machine& m) {
            m.host.names["replicas"] = {"10.0.0.6", "10.0.0.7"};
          }),
      // Static ranks on a node that is not the master: the master's port is not this machine's.
      Plans(
          "StaticMasterPortOnAnotherMachineIsNotChecked",
          "--rdzv-backend=static --nnodes=2 --node-rank=1 --master-addr=node1 --master-port=29500 ./train",
          [](const LaunchPlan& p) { EXPECT_EQ(p.agent.static_topology->master_port, 29500); },
          WithPortInUse("node1", 29500)),
      Refuses("StaticMasterPortHereInUse",
              "--rdzv-backend=static --nnodes=2 --node-rank=0 --master-addr=node0 --master-port=29500 ./train",
              kPrecondition,
              "--master-port=29500: the port is already in use on node0; expected a free port (or omit the flag to "
              "get one)",
              WithPortInUse("node0", 29500)),
      // A dry run meets nobody: the ranks are the node rank's, the endpoint need not resolve.
      Plans("MultiNodeDryRunShowsTheNodeRanksRanks",
            "--dry-run --nnodes=4 --node-rank=2 --nproc-per-node=2 --rdzv-endpoint=nohost:29400 ./train",
            [](const LaunchPlan& p) {
              EXPECT_EQ(p.topology, Topology::kMultiNode);
              EXPECT_TRUE(p.dry_run_without_rendezvous);
              ASSERT_TRUE(p.agent.static_topology.has_value());
              EXPECT_EQ(p.agent.static_topology->group_rank, 2);
              EXPECT_EQ(p.agent.static_topology->group_world_size, 4);
              EXPECT_EQ(p.agent.static_topology->master_addr, "nohost");
              EXPECT_EQ(p.rendezvous.max_nodes, 1);  // its in-process coordinator waits for no one
              EXPECT_EQ(p.rdzv_endpoint, "nohost:29400");
              ASSERT_EQ(p.warnings.size(), 1u);
              EXPECT_EQ(p.warnings[0],
                        "--rdzv-endpoint=nohost:29400: cannot resolve 'nohost' (yet): joining it, retried until "
                        "join_timeout");
            }),
      Plans("MultiNodeRunRendezvouses", "--nnodes=4 --node-rank=2 --rdzv-endpoint=node1:29400 ./train",
            [](const LaunchPlan& p) {
              EXPECT_FALSE(p.dry_run_without_rendezvous);
              EXPECT_FALSE(p.agent.static_topology.has_value());
              EXPECT_EQ(p.rendezvous.max_nodes, 4);
            }),
      Plans(
          "SlurmCpusBoundTheUsableOnes", "--nproc-per-node=cpu ./train",
          [](const LaunchPlan& p) {
            EXPECT_EQ(p.agent.spec.local_world_size, 4);
            EXPECT_EQ(p.agent.spec.usable_cpus, 4);
          },
          nullptr, [](LaunchConfig& c) { c.slurm_cpus_on_node = 4; }),
      Plans(
          "SlurmCpusFewerThanWorkersWarn", "--nproc-per-node=2 ./train",
          [](const LaunchPlan& p) {
            ASSERT_EQ(p.warnings.size(), 1u);
            EXPECT_EQ(p.warnings[0],
                      "Slurm gave this task 1 CPU(s) on this node (SLURM_CPUS_ON_NODE) for 2 workers: ask srun for "
                      "more (srun -c 2 or more)");
          },
          nullptr, [](LaunchConfig& c) { c.slurm_cpus_on_node = 1; }),
      Plans(
          "SlurmCpusNeverWidenTheAffinity", "--nproc-per-node=cpu ./train",
          [](const LaunchPlan& p) { EXPECT_EQ(p.agent.spec.local_world_size, 6); }, nullptr,
          [](LaunchConfig& c) { c.slurm_cpus_on_node = 64; }),
      Refuses("LoopbackLocalAddrRefused", "--nnodes=2 --rdzv-endpoint=node1 --local-addr=127.0.0.1 ./train", kInvalid,
              "--local-addr=127.0.0.1 resolves to loopback 127.0.0.1" + kLoopbackTail),
      Refuses("LoopbackHostNameRefused", "--nnodes=2 --rdzv-endpoint=node1 ./train", kInvalid,
              "this host's name resolves to loopback 127.0.1.1" + kLoopbackTail,
              [](Machine& m) { m.host.default_address = std::string("127.0.1.1"); }),
      Plans("LoopbackEndpointMeansOneMachine", "--nnodes=2 --rdzv-endpoint=[::1]:29400 ./train",
            [](const LaunchPlan& p) {
              EXPECT_EQ(p.agent.node.host_address(), "::1");
              EXPECT_EQ(p.rdzv_endpoint, "[::1]:29400");
            }),
      Refuses("NoAddressToGuess", "--nnodes=2 --rdzv-endpoint=node1 ./train", kInvalid,
              "cannot tell this node's address (no interface); give --local-addr",
              [](Machine& m) { m.host.default_address = absl::UnavailableError("no interface"); }),
      Refuses("LocalAddrUnresolvable", "--nnodes=2 --rdzv-endpoint=node1 --local-addr=nohost ./train", kInvalid,
              "--local-addr=nohost: cannot resolve 'nohost'"),
      Refuses("StaticWithoutMasterAddr", "--nnodes=2 --rdzv-backend=static --node-rank=1 ./train", kInvalid,
              "--rdzv-backend=static: --master-addr is needed (the address of node rank 0)"),
      Plans("StaticGivesRanks", "--nnodes=2 --rdzv-backend=static --node-rank=1 --master-addr=node1 ./train",
            [](const LaunchPlan& p) {
              EXPECT_EQ(p.topology, Topology::kStatic);
              EXPECT_EQ(p.coordinator, CoordinatorRole::kInProcess);
              ASSERT_TRUE(p.agent.static_topology.has_value());
              EXPECT_EQ(p.agent.static_topology->group_rank, 1);
              EXPECT_EQ(p.agent.static_topology->group_world_size, 2);
              EXPECT_EQ(p.agent.static_topology->master_addr, "node1");
              EXPECT_EQ(p.agent.static_topology->master_port, 29500);
              EXPECT_EQ(p.agent.node.host_address(), "10.0.0.5");
              EXPECT_EQ(p.rendezvous.max_nodes, 1);  // the in-process coordinator sees this node
            }),
      Refuses("MasterPortInUse", "--master-port=29500 ./train", kPrecondition,
              "--master-port=29500: the port is already in use on 127.0.0.1; expected a free port "
              "(or omit the flag to get one)",
              WithPortInUse("127.0.0.1", 29500)),
      Plans("MasterPortFree", "--master-port=29501 ./train",
            [](const LaunchPlan& p) { EXPECT_EQ(p.agent.master_port, 29501); }),

      // Ids.
      Plans("SingleNodeRunIdIsRandom", "./train",
            [](const LaunchPlan& p) { EXPECT_EQ(p.agent.spec.run_id, "aaaaaaaaaaaaaaa1"); }),
      Plans("MultiNodeRunIdIsNone", "--nnodes=2 --rdzv-endpoint=node1 ./train",
            [](const LaunchPlan& p) { EXPECT_EQ(p.agent.spec.run_id, "none"); }),
      Plans("RunIdGiven", "--rdzv-id=job7 ./train",
            [](const LaunchPlan& p) { EXPECT_EQ(p.agent.spec.run_id, "job7"); }),
      Plans("NodeIdForm", "./train",
            [](const LaunchPlan& p) {
              EXPECT_EQ(p.agent.node.hostname(), "node0");
              EXPECT_EQ(p.agent.node.node_id(), "node0:4242:aaaaaaa2");
            }),
      Plans(
          "NodeIdOfALongHostNameFits", "--rdzv-id=job7 ./train",
          [](const LaunchPlan& p) {
            EXPECT_EQ(p.agent.node.node_id(), std::string(kMaxNodeIdLength - 32, 'h') + ":4242:aaaaaaa1");
            EXPECT_LE(p.agent.node.node_id().size(), kMaxNodeIdLength);
          },
          [](Machine& m) { m.facts.hostname = std::string(300, 'h'); }),

      // Warm starts: on by default for Python workers and programs that declare them; for another
      // program only when asked for.
      Plans("WarmStartIsOnForAPythonScript", "train.py",
            [](const LaunchPlan& p) {
              EXPECT_TRUE(p.agent.warm_start);
              EXPECT_TRUE(p.agent.warm_python);
            }),
      Plans("WarmStartIsOffForAProgram", "./train", [](const LaunchPlan& p) { EXPECT_FALSE(p.agent.warm_start); }),
      Plans(
          "WarmStartIsOnForAProgramThatDeclaresIt", "./train",
          [](const LaunchPlan& p) {
            EXPECT_TRUE(p.agent.warm_start);
            EXPECT_FALSE(p.agent.warm_python);
          },
          [](Machine& m) { m.host.declare_warm_start.insert("./train"); }),
      Plans(
          "WarmStartFalseIsOffForAProgramThatDeclaresIt", "--warm-start=false ./train",
          [](const LaunchPlan& p) { EXPECT_FALSE(p.agent.warm_start); },
          [](Machine& m) { m.host.declare_warm_start.insert("./train"); }),
      Plans("WarmStartAskedForAProgramIsTried", "--warm-start ./train",
            [](const LaunchPlan& p) { EXPECT_TRUE(p.agent.warm_start); }),
      Plans("WarmStartFalseIsOff", "--warm-start=false train.py",
            [](const LaunchPlan& p) { EXPECT_FALSE(p.agent.warm_start); }),

      // The worker group's spec.
      Plans(
          "GroupSpecCarriesTheFlags",
          "--role=trainer --max-restarts=3 --cuda-alloc-conf=expandable_segments:True --threads-per-worker=2 "
          "--no-flight-recorder --virtual-local-rank --nproc-per-node=2 ./train",
          [](const LaunchPlan& p) {
            const WorkerGroupSpec& s = p.agent.spec;
            EXPECT_EQ(s.role, "trainer");
            EXPECT_EQ(s.max_restarts, 3);
            EXPECT_EQ(s.cuda_alloc_conf, "expandable_segments:True");
            EXPECT_EQ(s.threads_per_worker, 2);
            EXPECT_FALSE(s.flight_recorder);
            EXPECT_TRUE(s.virtual_local_rank);
            EXPECT_EQ(s.gpu_binding, GpuBinding::kIsolate);  // implied by --virtual-local-rank
            EXPECT_EQ(s.python_dir, "/opt/launch/python");
          },
          [](Machine& m) { m.facts.python_dir = "/opt/launch/python"; }),

      // Supervision.
      Plans(
          "SupervisionSettings", "--stop-timeout=3 --restart-backoff=2 --hang-timeout=7 --monitor-interval=0.5 ./train",
          [](const LaunchPlan& p) {
            EXPECT_EQ(p.agent.stop_timeout, std::chrono::milliseconds(3000));
            EXPECT_EQ(p.agent.restart_backoff, std::chrono::milliseconds(2000));
            EXPECT_EQ(p.agent.hang_timeout, std::chrono::milliseconds(7000));
            // Raised to the least interval.
            EXPECT_EQ(p.agent.monitor_interval, SecondsToMs(kMinMonitorInterval));
            EXPECT_EQ(p.agent.debugger, "/usr/bin/gdb");
          },
          WithFile("/usr/bin/gdb", kExecutable)),
      Plans("NoMonitorNoHangTimeoutNoGdb", "--monitor-interval=0 ./train",
            [](const LaunchPlan& p) {
              EXPECT_FALSE(p.agent.monitor_interval.has_value());
              EXPECT_FALSE(p.agent.hang_timeout.has_value());  // automatic
              EXPECT_EQ(p.agent.debugger, "");
              EXPECT_TRUE(p.agent.numa.empty());
            }),

      // Console line prefixes.
      Plans("LinePrefixOnOneNode", "./train",
            [](const LaunchPlan& p) { EXPECT_EQ(p.agent.line_prefix_template, "[${rank}]:"); }),
      Plans("LinePrefixOnSeveralNodesNamesTheHost", "--nnodes=2 --rdzv-endpoint=node1 ./train",
            [](const LaunchPlan& p) { EXPECT_EQ(p.agent.line_prefix_template, "[${hostname}:${rank}]:"); }),
      Plans("LinePrefixOfStaticRanksNamesTheHost",
            "--nnodes=2 --rdzv-backend=static --node-rank=1 --master-addr=node1 ./train",
            [](const LaunchPlan& p) { EXPECT_EQ(p.agent.line_prefix_template, "[${hostname}:${rank}]:"); }),
      Plans("LinePrefixOfOneNodeWithAnEndpointNamesNoHost", "--nnodes=1 --rdzv-endpoint=node1 ./train",
            [](const LaunchPlan& p) { EXPECT_EQ(p.agent.line_prefix_template, "[${rank}]:"); }),
      Plans("LinePrefixTurnedOff", "--log-line-prefix-template= ./train",
            [](const LaunchPlan& p) { EXPECT_EQ(p.agent.line_prefix_template, ""); }),
      Plans("LinePrefixGiven", "--nnodes=2 --rdzv-endpoint=node1 --log-line-prefix-template=<${rank}> ./train",
            [](const LaunchPlan& p) { EXPECT_EQ(p.agent.line_prefix_template, "<${rank}>"); }),

      // NUMA binding.
      Plans(
          "NumaBindingFollowsEachWorkersGpu", "--numa-binding=node --nproc-per-node=2 ./train",
          [](const LaunchPlan& p) {
            ASSERT_EQ(p.agent.numa.size(), 2u);
            EXPECT_THAT(p.agent.numa[0].cpus, ElementsAre(0, 1, 2, 3));
            EXPECT_EQ(p.agent.numa[0].memory_node, 0);
            EXPECT_EQ(p.agent.numa[0].why, "its GPU's node 0");
            EXPECT_THAT(p.agent.numa[1].cpus, ElementsAre(4, 5, 6, 7));
            EXPECT_EQ(p.agent.numa[1].memory_node, 1);
          },
          WithTwoNumaNodes(2)),
      Plans(
          "NumaBindingOfSharedGpusFollowsTheLocalRanksGpu", "--numa-binding=node --nproc-per-node=2 ./train",
          [](const LaunchPlan& p) {
            ASSERT_EQ(p.agent.numa.size(), 2u);
            EXPECT_EQ(p.agent.numa[1].memory_node, 0);  // GPU 1
          },
          WithTwoNumaNodes(4)),
      Plans(
          "NumaBindingOfIsolatedGpusFollowsTheSlicesFirstGpu",
          "--numa-binding=node --nproc-per-node=2 --gpu-binding=isolate ./train",
          [](const LaunchPlan& p) {
            ASSERT_EQ(p.agent.numa.size(), 2u);
            EXPECT_EQ(p.agent.numa[1].memory_node, 1);  // GPUs 2 and 3
          },
          WithTwoNumaNodes(4)),
      Plans(
          "NumaBindingWithoutGpusDividesTheNodes", "--numa-binding=node --nproc-per-node=2 ./train",
          [](const LaunchPlan& p) {
            ASSERT_EQ(p.agent.numa.size(), 2u);
            EXPECT_THAT(p.agent.numa[1].cpus, ElementsAre(4, 5, 6, 7));
            EXPECT_EQ(p.agent.numa[1].why, "node 1 (no GPU: 2 worker(s) over 2 node(s))");
          },
          WithTwoNumaNodes(0)),

      // This node and the rendezvous.
      Plans("AGivenNodeRankOrdersTheFirstRound", "--nnodes=2 --node-rank=1 --rdzv-endpoint=node1 ./train",
            [](const LaunchPlan& p) { EXPECT_EQ(p.agent.node.node_rank(), 1); }),
      Plans("RendezvousSettingsFromRdzvConf",
            "--nnodes=2 --rdzv-endpoint=node1 "
            "--rdzv-conf=join_timeout=60,heartbeat_interval=2,heartbeat_timeout=9,close_timeout=5 ./train",
            [](const LaunchPlan& p) {
              EXPECT_EQ(p.rendezvous.join_timeout, std::chrono::milliseconds(60000));
              EXPECT_EQ(p.rendezvous.heartbeat_timeout, std::chrono::milliseconds(9000));
              EXPECT_EQ(p.rendezvous.close_timeout, std::chrono::milliseconds(5000));
              EXPECT_EQ(p.agent.heartbeat_interval, std::chrono::milliseconds(2000));
              EXPECT_EQ(p.agent.coordinator_patience, std::chrono::milliseconds(5000));
            }),
      Plans("DryRunOfANodeRankBeyondTheCountShowsGroupRankZero",
            "--dry-run --nnodes=4 --node-rank=5 --rdzv-endpoint=node1 ./train",
            [](const LaunchPlan& p) {
              ASSERT_TRUE(p.agent.static_topology.has_value());
              EXPECT_EQ(p.agent.static_topology->group_rank, 0);
              EXPECT_EQ(p.agent.static_topology->master_addr, "node1");
              ASSERT_EQ(p.warnings.size(), 1u);
              EXPECT_EQ(p.warnings[0], "node rank 5 is not below the node count 4: the dry run shows group rank 0");
            }),
      Plans(
          "DryRunWithoutAnAddressGoesOn", "--dry-run --nnodes=2 --rdzv-endpoint=node1 ./train",
          [](const LaunchPlan& p) {
            EXPECT_EQ(p.agent.node.host_address(), "node0");  // the host name
            ASSERT_EQ(p.warnings.size(), 1u);
            EXPECT_EQ(p.warnings[0],
                      "a real run would stop here: cannot tell this node's address (no interface); give --local-addr");
          },
          [](Machine& m) { m.host.default_address = absl::UnavailableError("no interface"); }),

      // Training scaling.
      Refuses("TrainBatchCannotSplit", "--nproc-per-node=3 ./train", kInvalid,
              "train.global_batch=10 is not divisible by world size 3 x grad_accum_steps 1; "
              "expected a multiple of 3",
              nullptr, WithGlobalBatch(10)),
      Plans(
          "TrainBatchSplits", "--nproc-per-node=2 ./train",
          [](const LaunchPlan& p) { ASSERT_TRUE(p.agent.spec.train.has_value()); }, nullptr, WithGlobalBatch(10)),
  };
}

class PlanTable : public ::testing::TestWithParam<Row> {};

TEST_P(PlanTable, Plans) {
  const Row& row = GetParam();
  std::vector<std::string> argv = {"launch"};
  for (absl::string_view w : absl::StrSplit(row.flags, ' ', absl::SkipEmpty())) argv.emplace_back(w);
  auto parsed = ParseLaunchArgs(argv);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  LaunchConfig config = parsed->config;
  if (row.config) row.config(config);

  Machine m;
  m.facts.env = {{"PATH", "/usr/bin:/bin"}};
  m.facts.why_no_gpu = "NVML not found";
  m.facts.usable_cpus = 6;
  m.facts.hostname = "node0";
  m.facts.pid = 4242;
  m.facts.open_files_soft = 1024;
  m.facts.open_files_hard = 4096;
  if (row.machine) row.machine(m);
  m.facts.queries = &m.host;

  auto plan = PlanLaunch(config, m.facts);
  if (row.code != absl::StatusCode::kOk) {
    ASSERT_FALSE(plan.ok()) << "expected: " << row.error;
    EXPECT_EQ(plan.status().code(), row.code) << plan.status();
    EXPECT_EQ(plan.status().message(), row.error);
    return;
  }
  ASSERT_TRUE(plan.ok()) << plan.status();
  if (row.check) row.check(*plan);
}

INSTANTIATE_TEST_SUITE_P(Rows, PlanTable, ::testing::ValuesIn(Rows()),
                         [](const ::testing::TestParamInfo<Row>& info) { return info.param.name; });

// --dry-run's header: each setting with where it came from.
TEST(Plan, DescribePlanNamesEveryOrigin) {
  auto parsed = ParseLaunchArgs({"launch", "--dry-run", "--nproc-per-node=2", "./train"},
                                {{"SLURM_JOB_ID", "1234"},
                                 {"SLURM_STEP_ID", "0"},
                                 {"SLURM_JOB_NODELIST", "node[01-04]"},
                                 {"SLURM_NNODES", "4"},
                                 {"SLURM_NODEID", "2"},
                                 {"PET_MAX_RESTARTS", "3"}});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  FakeHost host;
  host.unresolvable.insert("node01");
  HostFacts facts;
  facts.env = {{"PATH", "/usr/bin:/bin"}};
  facts.usable_cpus = 6;
  facts.hostname = "node0";
  facts.queries = &host;
  auto plan = PlanLaunch(parsed->config, facts);
  ASSERT_TRUE(plan.ok()) << plan.status();
  const std::string text = DescribePlan(parsed->config, *plan);
  EXPECT_THAT(text, ::testing::StartsWith("launch --dry-run: node rank 2 of 4, 2 worker(s) on this node, rendezvous "
                                          "at node01:29634 (another host's), run id 1234.0\n"));
  EXPECT_THAT(text, ::testing::HasSubstr("  nnodes             4                         SLURM_NNODES\n"));
  EXPECT_THAT(text, ::testing::HasSubstr("  node_rank          2                         SLURM_NODEID\n"));
  EXPECT_THAT(text, ::testing::HasSubstr("  nproc_per_node     2                         --nproc-per-node\n"));
  EXPECT_THAT(text, ::testing::HasSubstr("  rdzv_backend       c10d                      default\n"));
  EXPECT_THAT(text,
              ::testing::HasSubstr("  rdzv_endpoint      node01:29634              SLURM_JOB_NODELIST (first host)\n"));
  EXPECT_THAT(text, ::testing::HasSubstr("  max_restarts       3                         PET_MAX_RESTARTS\n"));
  EXPECT_THAT(text, ::testing::HasSubstr("a dry run meets no other node"));
}

TEST(Plan, NeedsItsQueries) {
  HostFacts facts;
  EXPECT_FALSE(PlanLaunch(LaunchConfig{}, facts).ok());
}

}  // namespace
}  // namespace launch
