#include "probes/numa.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace launch {
namespace {

// A sysfs attribute: small, one line. Anything else is treated as absent.
std::optional<std::string> ReadSmall(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::string text(4096, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<size_t>(in.gcount()));
  if (text.size() == 4096) return std::nullopt;
  return std::string(absl::StripAsciiWhitespace(text));
}

std::optional<int> ReadInt(const std::string& path) {
  auto text = ReadSmall(path);
  int v;
  if (!text || !absl::SimpleAtoi(*text, &v)) return std::nullopt;
  return v;
}

}  // namespace

absl::StatusOr<NumaBinding> ParseNumaBinding(const std::string& value) {
  const std::string v = absl::AsciiStrToLower(absl::StripAsciiWhitespace(value));
  if (v == "node") return NumaBinding::kNode;
  if (v == "socket") return NumaBinding::kSocket;
  if (v == "exclusive") return NumaBinding::kExclusive;
  if (v == "core-complex" || v == "core_complex") return NumaBinding::kCoreComplex;
  return absl::InvalidArgumentError("expected node, socket, exclusive or core-complex");
}

const char* NumaBindingName(NumaBinding b) {
  switch (b) {
    case NumaBinding::kNone:
      return "none";
    case NumaBinding::kNode:
      return "node";
    case NumaBinding::kSocket:
      return "socket";
    case NumaBinding::kExclusive:
      return "exclusive";
    case NumaBinding::kCoreComplex:
      return "core-complex";
  }
  return "none";
}

CpuTopology ReadCpuTopology(const std::string& root, const std::vector<int>& allowed) {
  // cpu -> node, from every node's cpulist.
  std::map<int, int> node_of;
  std::error_code ec;
  int entries = 0;
  for (const auto& e : std::filesystem::directory_iterator(root + "/devices/system/node", ec)) {
    if (++entries > 4096) break;
    const std::string name = e.path().filename().string();
    int node;
    if (!absl::StartsWith(name, "node") || !absl::SimpleAtoi(name.substr(4), &node) || node < 0) continue;
    auto list = ReadSmall(e.path().string() + "/cpulist");
    if (!list) continue;
    if (auto cpus = ParseCpuList(*list)) {
      for (int c : *cpus) node_of.emplace(c, node);
    }
  }
  CpuTopology t;
  std::vector<int> ids = allowed;
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  for (int id : ids) {
    LogicalCpu c;
    c.id = id;
    auto it = node_of.find(id);
    c.node = it == node_of.end() ? 0 : it->second;
    const std::string dir = absl::StrCat(root, "/devices/system/cpu/cpu", id);
    c.package = ReadInt(dir + "/topology/physical_package_id").value_or(0);
    c.core = id;
    if (auto siblings = ReadSmall(dir + "/topology/thread_siblings_list")) {
      if (auto s = ParseCpuList(*siblings); s && !s->empty()) c.core = *std::min_element(s->begin(), s->end());
    }
    for (int index = 0; index < 10; ++index) {
      const std::string cache = absl::StrCat(dir, "/cache/index", index);
      auto level = ReadInt(cache + "/level");
      if (!level) continue;
      if (*level != 3) continue;
      if (auto id_file = ReadInt(cache + "/id")) {
        c.l3 = *id_file;
      } else if (auto shared = ReadSmall(cache + "/shared_cpu_list")) {
        if (auto s = ParseCpuList(*shared); s && !s->empty()) c.l3 = *std::min_element(s->begin(), s->end());
      }
      break;
    }
    t.cpus.push_back(c);
  }
  return t;
}

std::optional<int> PciNumaNode(const std::string& root, const std::string& pci_address) {
  if (pci_address.empty() || absl::StrContains(pci_address, "/") || absl::StrContains(pci_address, "..")) {
    return std::nullopt;
  }
  auto node = ReadInt(absl::StrCat(root, "/bus/pci/devices/", pci_address, "/numa_node"));
  if (!node || *node < 0) return std::nullopt;
  return node;
}

absl::StatusOr<std::vector<WorkerCpuBinding>> PlanNumaBinding(NumaBinding mode, const CpuTopology& t,
                                                              const std::vector<int>& worker_nodes) {
  std::vector<WorkerCpuBinding> out(worker_nodes.size());
  if (mode == NumaBinding::kNone || worker_nodes.empty()) return out;
  if (t.cpus.empty()) return absl::FailedPreconditionError("--numa-binding: no CPU to bind to");
  std::map<int, std::vector<const LogicalCpu*>> by_node;
  for (const LogicalCpu& c : t.cpus) by_node[c.node].push_back(&c);
  std::vector<int> nodes;
  for (const auto& [n, cpus] : by_node) nodes.push_back(n);

  // Each worker's node: its GPU's, or a block of the nodes when no worker has a GPU.
  const bool gpus = std::any_of(worker_nodes.begin(), worker_nodes.end(), [](int n) { return n >= 0; });
  const int n = static_cast<int>(worker_nodes.size());
  std::vector<int> node_of(n);
  for (int i = 0; i < n; ++i) {
    if (!gpus) {
      node_of[i] = nodes[static_cast<size_t>(i) * nodes.size() / n];
      out[i].why = absl::StrCat("node ", node_of[i], " (no GPU: ", n, " worker(s) over ", nodes.size(), " node(s))");
      continue;
    }
    if (worker_nodes[i] < 0) {
      return absl::FailedPreconditionError(absl::StrCat("--numa-binding: the NUMA node of local rank ", i,
                                                        "'s GPU is unknown (sysfs has no numa_node for it)"));
    }
    if (!by_node.count(worker_nodes[i])) {
      return absl::FailedPreconditionError(absl::StrCat("--numa-binding: local rank ", i, "'s GPU is on NUMA node ",
                                                        worker_nodes[i],
                                                        ", none of whose CPUs launch may use (its affinity mask)"));
    }
    node_of[i] = worker_nodes[i];
    out[i].why = absl::StrCat("its GPU's node ", node_of[i]);
  }
  // The workers sharing a node, in local-rank order: exclusive and core-complex divide it.
  std::map<int, std::vector<int>> workers_on;
  for (int i = 0; i < n; ++i) workers_on[node_of[i]].push_back(i);

  for (int i = 0; i < n; ++i) {
    const int node = node_of[i];
    const std::vector<const LogicalCpu*>& cpus = by_node[node];
    const std::vector<int>& sharing = workers_on[node];
    const int slot = static_cast<int>(std::find(sharing.begin(), sharing.end(), i) - sharing.begin());
    std::set<int> chosen;
    switch (mode) {
      case NumaBinding::kNone:
        break;
      case NumaBinding::kNode:
        for (auto* c : cpus) chosen.insert(c->id);
        break;
      case NumaBinding::kSocket: {
        const int package = cpus.front()->package;
        for (const LogicalCpu& c : t.cpus)
          if (c.package == package) chosen.insert(c.id);
        break;
      }
      case NumaBinding::kExclusive: {
        std::map<int, std::vector<int>> cores;  // physical core -> its logical CPUs
        for (auto* c : cpus) cores[c->core].push_back(c->id);
        const int m = static_cast<int>(sharing.size());
        const int count = static_cast<int>(cores.size());
        if (count < m) {
          return absl::FailedPreconditionError(absl::StrCat("--numa-binding=exclusive: NUMA node ", node, " has ",
                                                            count, " physical core(s) for ", m,
                                                            " workers; expected at least one core per worker"));
        }
        const int per = count / m, extra = count % m;
        const int start = slot * per + std::min(slot, extra);
        const int end = start + per + (slot < extra ? 1 : 0);
        int k = 0;
        for (const auto& [core, ids] : cores) {
          if (k >= start && k < end) chosen.insert(ids.begin(), ids.end());
          ++k;
        }
        break;
      }
      case NumaBinding::kCoreComplex: {
        std::map<int, std::vector<int>> complexes;  // L3 -> its logical CPUs (unknown: the node's)
        for (auto* c : cpus) complexes[c->l3].push_back(c->id);
        std::vector<std::vector<int>> ordered;
        for (auto& [l3, ids] : complexes) ordered.push_back(ids);
        std::sort(ordered.begin(), ordered.end());
        const auto& mine = ordered[static_cast<size_t>(slot) % ordered.size()];
        chosen.insert(mine.begin(), mine.end());
        break;
      }
    }
    out[i].cpus.assign(chosen.begin(), chosen.end());
    out[i].memory_node = node;
  }
  return out;
}

std::optional<std::vector<int>> ParseCpuList(const std::string& text, int max_cpus) {
  std::vector<int> cpus;
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    part = absl::StripAsciiWhitespace(part);
    std::vector<absl::string_view> range = absl::StrSplit(part, '-');
    int lo, hi;
    if (range.size() == 1 && absl::SimpleAtoi(range[0], &lo)) {
      hi = lo;
    } else if (range.size() != 2 || !absl::SimpleAtoi(range[0], &lo) || !absl::SimpleAtoi(range[1], &hi)) {
      return std::nullopt;
    }
    if (lo < 0 || hi < lo || hi - lo >= max_cpus) return std::nullopt;
    for (int c = lo; c <= hi; ++c) {
      if (static_cast<int>(cpus.size()) == max_cpus) return std::nullopt;
      cpus.push_back(c);
    }
  }
  return cpus;
}

std::string FormatCpuList(const std::vector<int>& cpus) {
  std::vector<std::string> parts;
  for (size_t i = 0; i < cpus.size();) {
    size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    parts.push_back(j == i ? std::to_string(cpus[i]) : absl::StrCat(cpus[i], "-", cpus[j]));
    i = j + 1;
  }
  return absl::StrJoin(parts, ",");
}

std::string SysfsPciAddress(const std::string& nvml_bus_id) {
  // NVML: "DDDDDDDD:BB:DD.F" (an 8-digit domain); sysfs: "DDDD:BB:DD.F", lower case.
  std::string id = absl::AsciiStrToLower(nvml_bus_id);
  constexpr size_t kSysfsLength = 12;
  return id.size() > kSysfsLength ? id.substr(id.size() - kSysfsLength) : id;
}

}  // namespace launch
