// --numa-binding under the real `launch`, on a fake /sys made of the CPUs the test may use.

#include <sched.h>

#include <filesystem>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/launch_cmd.h"
#include "tests/test_util.h"

namespace launch::testing {
namespace {

using ::testing::HasSubstr;

// --numa-binding on a fake /sys (LAUNCH_SYSFS_ROOT) made of the CPUs this test may use: the dry
// run shows each worker's binding, and a real run's workers run on exactly their CPUs.
TEST(Launch, NumaBindingFollowsTheTopology) {
  cpu_set_t set;
  CPU_ZERO(&set);
  ASSERT_EQ(sched_getaffinity(0, sizeof set, &set), 0);
  std::vector<int> cpus;
  for (int c = 0; c < CPU_SETSIZE && cpus.size() < 2; ++c)
    if (CPU_ISSET(c, &set)) cpus.push_back(c);
  if (cpus.size() < 2) GTEST_SKIP() << "needs two usable CPUs, has " << cpus.size();
  const std::string a = std::to_string(cpus[0]), b = std::to_string(cpus[1]);
  TempDir two_nodes, one_node;
  auto cpu_dir = [](const TempDir& d, const std::string& id) { return d / ("devices/system/cpu/cpu" + id); };
  auto write = [](const std::string& path, const std::string& text) {
    std::filesystem::create_directories(std::filesystem::path(path).parent_path());
    WriteFile(path, text + "\n");
  };
  write(two_nodes / "devices/system/node/node0/cpulist", a);
  write(two_nodes / "devices/system/node/node1/cpulist", b);
  write(one_node / "devices/system/node/node0/cpulist", a + "," + b);
  for (const std::string& id : {a, b}) {
    write(cpu_dir(one_node, id) + "/topology/thread_siblings_list", id);
    write(cpu_dir(two_nodes, id) + "/topology/thread_siblings_list", id);
  }
  auto dry = RunCmd({kLaunch, "--numa-binding=node", "--nproc-per-node=2", "--dry-run", "--no-python", "/bin/true"},
                    {"LAUNCH_SYSFS_ROOT=" + two_nodes.path()});
  ASSERT_EQ(dry.exit_code, 0) << dry.err;
  EXPECT_THAT(dry.out, HasSubstr("numa_binding       node"));
  EXPECT_THAT(dry.out, HasSubstr("numa: CPUs " + a + ", memory preferred on node 0 (node 0 (no GPU: 2 worker(s) over 2 "
                                 "node(s)))"));
  EXPECT_THAT(dry.out, HasSubstr("numa: CPUs " + b + ", memory preferred on node 1"));

  auto run = RunCmd({kLaunch, "--numa-binding=exclusive", "--nproc-per-node=2", "--no-python", "/bin/grep",
                     "Cpus_allowed_list", "/proc/self/status"},
                    {"LAUNCH_SYSFS_ROOT=" + one_node.path()});
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_THAT(run.out, HasSubstr("[0]:Cpus_allowed_list:\t" + a + "\n"));
  EXPECT_THAT(run.out, HasSubstr("[1]:Cpus_allowed_list:\t" + b + "\n"));

  auto bad = RunCmd({kLaunch, "--numa-binding=numa", "/bin/true"});
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_THAT(bad.err, HasSubstr("--numa-binding=numa: expected node, socket, exclusive or core-complex"));
  auto crowded = RunCmd({kLaunch, "--numa-binding=exclusive", "--nproc-per-node=3", "--no-python", "/bin/true"},
                        {"LAUNCH_SYSFS_ROOT=" + one_node.path()});
  EXPECT_EQ(crowded.exit_code, 2);
  EXPECT_THAT(crowded.err, HasSubstr("has 2 physical core(s) for 3 workers"));
}

}  // namespace
}  // namespace launch::testing
