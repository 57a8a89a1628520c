// torchrun's --numa-binding: each worker's CPUs (and preferred memory node) from the machine's
// topology as sysfs describes it, chosen by a pure function of that topology, so that fake
// topologies test every mode. Without GPUs the workers are spread over the NUMA nodes in blocks.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace launch {

enum class NumaBinding { kNone, kNode, kSocket, kExclusive, kCoreComplex };
// "node", "socket", "exclusive", "core-complex" (torchrun's names); an error names the value.
absl::StatusOr<NumaBinding> ParseNumaBinding(const std::string& value);
const char* NumaBindingName(NumaBinding b);

// One logical CPU this process may use.
struct LogicalCpu {
  int id = 0;
  int node = 0;     // NUMA node
  int package = 0;  // socket
  int core = 0;     // its physical core: the lowest id among its hyperthread siblings
  int l3 = -1;      // its L3 cache (a core complex); -1: unknown
};
struct CpuTopology {
  std::vector<LogicalCpu> cpus;  // ascending ids, only those in the affinity mask
};

// Reads /sys/devices/system/{cpu,node} under `sysfs_root` ("/sys" on a real machine) for the CPUs
// in `allowed`. A machine without NUMA information is one node 0.
CpuTopology ReadCpuTopology(const std::string& sysfs_root, const std::vector<int>& allowed);
// The NUMA node of a PCI device ("0000:18:00.0") from sysfs; nullopt when sysfs does not say.
std::optional<int> PciNumaNode(const std::string& sysfs_root, const std::string& pci_address);

struct WorkerCpuBinding {
  std::vector<int> cpus;  // ascending
  int memory_node = -1;   // preferred NUMA node for its memory
  std::string why;        // "GPU 3's node 1", "node 0 (no GPUs: workers 0-3)"
};

// `worker_nodes[i]`: the NUMA node of worker i's GPU (-1: none known). With no GPU at all, the
// workers are divided over the nodes in blocks (workers 0..k-1 on the first, ...). An error when
// a mode cannot give some worker a CPU (more workers than cores for `exclusive`).
absl::StatusOr<std::vector<WorkerCpuBinding>> PlanNumaBinding(NumaBinding mode, const CpuTopology& topology,
                                                              const std::vector<int>& worker_nodes);

// "0-3,8,10-11" -> {0,1,2,3,8,10,11}; at most `max_cpus` ids; nullopt on a malformed list.
std::optional<std::vector<int>> ParseCpuList(const std::string& text, int max_cpus = 65536);
// {0,1,2,3,8} -> "0-3,8".
std::string FormatCpuList(const std::vector<int>& cpus);
// NVML's PCI bus id ("00000000:18:00.0") as sysfs names the device ("0000:18:00.0").
std::string SysfsPciAddress(const std::string& nvml_bus_id);

}  // namespace launch
