// --numa-binding on fake machines: the binding of every mode as a table, and the sysfs reader on a
// fake /sys tree.
#include "probes/numa.h"

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace launch {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Two sockets, each with two NUMA nodes of four physical cores with two threads; every two cores
// share an L3. CPU ids as Linux numbers them on such machines: thread 0 of every core first
// (0-15), then their siblings (16-31).
CpuTopology TwoSockets() {
  CpuTopology t;
  for (int thread = 0; thread < 2; ++thread) {
    for (int core = 0; core < 16; ++core) {
      LogicalCpu c;
      c.id = thread * 16 + core;
      c.core = core;
      c.node = core / 4;
      c.package = core / 8;
      c.l3 = core / 2;
      t.cpus.push_back(c);
    }
  }
  return t;
}

std::vector<std::vector<int>> Cpus(const std::vector<WorkerCpuBinding>& b) {
  std::vector<std::vector<int>> out;
  for (const auto& w : b) out.push_back(w.cpus);
  return out;
}

TEST(NumaBinding, EveryModeOnTwoSockets) {
  const CpuTopology t = TwoSockets();
  // Four GPUs: 0 and 1 on node 0, 2 on node 1, 3 on node 3.
  const std::vector<int> gpu_nodes = {0, 0, 1, 3};

  auto node = PlanNumaBinding(NumaBinding::kNode, t, gpu_nodes);
  ASSERT_TRUE(node.ok()) << node.status();
  EXPECT_THAT((*node)[0].cpus, ElementsAre(0, 1, 2, 3, 16, 17, 18, 19));
  EXPECT_EQ((*node)[1].cpus, (*node)[0].cpus);
  EXPECT_THAT((*node)[2].cpus, ElementsAre(4, 5, 6, 7, 20, 21, 22, 23));
  EXPECT_THAT((*node)[3].cpus, ElementsAre(12, 13, 14, 15, 28, 29, 30, 31));
  EXPECT_EQ((*node)[3].memory_node, 3);
  EXPECT_EQ((*node)[3].why, "its GPU's node 3");

  auto socket = PlanNumaBinding(NumaBinding::kSocket, t, gpu_nodes);
  ASSERT_TRUE(socket.ok()) << socket.status();
  EXPECT_EQ(FormatCpuList((*socket)[0].cpus), "0-7,16-23");
  EXPECT_EQ(FormatCpuList((*socket)[2].cpus), "0-7,16-23");
  EXPECT_EQ(FormatCpuList((*socket)[3].cpus), "8-15,24-31");
  EXPECT_EQ((*socket)[2].memory_node, 1);

  // Node 0's four cores split between the two workers there, with their hyperthreads.
  auto exclusive = PlanNumaBinding(NumaBinding::kExclusive, t, gpu_nodes);
  ASSERT_TRUE(exclusive.ok()) << exclusive.status();
  EXPECT_THAT((*exclusive)[0].cpus, ElementsAre(0, 1, 16, 17));
  EXPECT_THAT((*exclusive)[1].cpus, ElementsAre(2, 3, 18, 19));
  EXPECT_EQ(FormatCpuList((*exclusive)[2].cpus), "4-7,20-23");

  // One L3 (two cores) each on node 0; a lone worker of node 1 takes its first complex.
  auto complex = PlanNumaBinding(NumaBinding::kCoreComplex, t, gpu_nodes);
  ASSERT_TRUE(complex.ok()) << complex.status();
  EXPECT_THAT((*complex)[0].cpus, ElementsAre(0, 1, 16, 17));
  EXPECT_THAT((*complex)[1].cpus, ElementsAre(2, 3, 18, 19));
  EXPECT_THAT((*complex)[2].cpus, ElementsAre(4, 5, 20, 21));
}

TEST(NumaBinding, UnevenCoresGiveTheFirstWorkersOneMore) {
  CpuTopology t;
  for (int id = 0; id < 5; ++id) t.cpus.push_back({id, 0, 0, id, -1});
  auto b = PlanNumaBinding(NumaBinding::kExclusive, t, {0, 0});
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_THAT(Cpus(*b), ElementsAre(ElementsAre(0, 1, 2), ElementsAre(3, 4)));
  // Unknown L3: the node is one complex, shared.
  auto c = PlanNumaBinding(NumaBinding::kCoreComplex, t, {0, 0});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_THAT((*c)[1].cpus, ElementsAre(0, 1, 2, 3, 4));
}

TEST(NumaBinding, WithoutGpusTheNodesAreDividedInBlocks) {
  const CpuTopology t = TwoSockets();
  auto b = PlanNumaBinding(NumaBinding::kNode, t, {-1, -1, -1, -1, -1, -1, -1, -1});
  ASSERT_TRUE(b.ok()) << b.status();
  std::vector<int> nodes;
  for (const auto& w : *b) nodes.push_back(w.memory_node);
  EXPECT_THAT(nodes, ElementsAre(0, 0, 1, 1, 2, 2, 3, 3));
  EXPECT_EQ((*b)[2].why, "node 1 (no GPU: 8 worker(s) over 4 node(s))");
  auto ex = PlanNumaBinding(NumaBinding::kExclusive, t, {-1, -1, -1, -1, -1, -1, -1, -1});
  ASSERT_TRUE(ex.ok()) << ex.status();
  EXPECT_THAT((*ex)[0].cpus, ElementsAre(0, 1, 16, 17));
  EXPECT_THAT((*ex)[1].cpus, ElementsAre(2, 3, 18, 19));
  // Fewer workers than nodes: each its own node.
  auto two = PlanNumaBinding(NumaBinding::kNode, t, {-1, -1});
  ASSERT_TRUE(two.ok()) << two.status();
  EXPECT_EQ((*two)[0].memory_node, 0);
  EXPECT_EQ((*two)[1].memory_node, 2);
}

TEST(NumaBinding, RefusesWhatItCannotBind) {
  const CpuTopology t = TwoSockets();
  auto unknown = PlanNumaBinding(NumaBinding::kNode, t, {0, -1});
  ASSERT_FALSE(unknown.ok());
  EXPECT_THAT(std::string(unknown.status().message()), HasSubstr("local rank 1's GPU is unknown"));
  auto outside = PlanNumaBinding(NumaBinding::kNode, t, {7});
  ASSERT_FALSE(outside.ok());
  EXPECT_THAT(std::string(outside.status().message()), HasSubstr("NUMA node 7, none of whose CPUs"));
  auto crowded = PlanNumaBinding(NumaBinding::kExclusive, t, {0, 0, 0, 0, 0});
  ASSERT_FALSE(crowded.ok());
  EXPECT_THAT(std::string(crowded.status().message()),
              HasSubstr("NUMA node 0 has 4 physical core(s) for 5 workers"));
  EXPECT_FALSE(PlanNumaBinding(NumaBinding::kNode, CpuTopology{}, {-1}).ok());
  auto none = PlanNumaBinding(NumaBinding::kNone, t, {0, 1});
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE((*none)[0].cpus.empty());
  EXPECT_EQ((*none)[0].memory_node, -1);
}

TEST(NumaBinding, ParsesTorchrunsNames) {
  EXPECT_EQ(*ParseNumaBinding("node"), NumaBinding::kNode);
  EXPECT_EQ(*ParseNumaBinding("socket"), NumaBinding::kSocket);
  EXPECT_EQ(*ParseNumaBinding("exclusive"), NumaBinding::kExclusive);
  EXPECT_EQ(*ParseNumaBinding("core-complex"), NumaBinding::kCoreComplex);
  EXPECT_FALSE(ParseNumaBinding("numa").ok());
  EXPECT_EQ(FormatCpuList({0, 1, 2, 3, 8, 10, 11}), "0-3,8,10-11");
  EXPECT_EQ(FormatCpuList({}), "");
}

void Write(const std::filesystem::path& p, const std::string& text) {
  std::filesystem::create_directories(p.parent_path());
  std::ofstream(p) << text << "\n";
}

// A fake /sys: one socket, nodes 0 and 2 (ids with a hole), two cores with two threads each on
// node 0 and one core on node 2; an L3 by id on node 0 and by shared_cpu_list on node 2.
TEST(CpuTopologyReader, ReadsAFakeSysfs) {
  const std::filesystem::path root =
      std::filesystem::temp_directory_path() / absl::StrCat("launch-sysfs-", ::getpid());
  std::filesystem::remove_all(root);
  const auto cpu = [&](int id) { return root / "devices/system/cpu" / absl::StrCat("cpu", id); };
  Write(root / "devices/system/node/node0/cpulist", "0-1,4-5");
  Write(root / "devices/system/node/node2/cpulist", "2");
  Write(root / "devices/system/node/possible", "0-2");
  for (int id : {0, 1, 2, 4, 5}) Write(cpu(id) / "topology/physical_package_id", "0");
  Write(cpu(0) / "topology/thread_siblings_list", "0,4");
  Write(cpu(4) / "topology/thread_siblings_list", "0,4");
  Write(cpu(1) / "topology/thread_siblings_list", "1,5");
  Write(cpu(5) / "topology/thread_siblings_list", "1,5");
  Write(cpu(2) / "topology/thread_siblings_list", "2");
  for (int id : {0, 1, 4, 5}) {
    Write(cpu(id) / "cache/index0/level", "1");
    Write(cpu(id) / "cache/index3/level", "3");
    Write(cpu(id) / "cache/index3/id", "7");
  }
  Write(cpu(2) / "cache/index2/level", "3");
  Write(cpu(2) / "cache/index2/shared_cpu_list", "2");
  Write(root / "bus/pci/devices/0000:18:00.0/numa_node", "2");
  Write(root / "bus/pci/devices/0000:19:00.0/numa_node", "-1");

  const CpuTopology t = ReadCpuTopology(root.string(), {5, 0, 1, 2, 4, 9});
  std::vector<std::string> seen;
  for (const auto& c : t.cpus) seen.push_back(absl::StrCat(c.id, ":", c.node, ":", c.package, ":", c.core, ":", c.l3));
  // CPU 9 is allowed but sysfs knows nothing of it: node 0, its own core.
  EXPECT_THAT(seen, ElementsAre("0:0:0:0:7", "1:0:0:1:7", "2:2:0:2:2", "4:0:0:0:7", "5:0:0:1:7", "9:0:0:9:-1"));
  EXPECT_EQ(PciNumaNode(root.string(), SysfsPciAddress("00000000:18:00.0")), 2);
  EXPECT_EQ(PciNumaNode(root.string(), "0000:19:00.0"), std::nullopt);
  EXPECT_EQ(PciNumaNode(root.string(), "../../etc"), std::nullopt);
  // No sysfs at all: every CPU on node 0.
  const CpuTopology bare = ReadCpuTopology((root / "nothing").string(), {0, 1});
  ASSERT_EQ(bare.cpus.size(), 2u);
  EXPECT_EQ(bare.cpus[1].node, 0);
  std::filesystem::remove_all(root);
}

}  // namespace
}  // namespace launch
