#include "probes/devices.h"

#include <algorithm>
#include <map>
#include <set>
#include <tuple>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/strings.h"

namespace launch {
namespace {

std::string Describe(const GpuInfo& g) {
  std::string s = absl::StrCat(g.name.empty() ? "GPU" : g.name, ", ", g.memory_bytes / (1024ull * 1024 * 1024), " GiB");
  if (g.sm_count > 0) absl::StrAppend(&s, ", ", g.sm_count, " SMs");
  return s;
}

// Finds a GPU by NVML index or (a unique prefix of) its UUID, as CUDA_VISIBLE_DEVICES accepts.
const GpuInfo* FindGpu(const std::vector<GpuInfo>& all, const std::string& token) {
  int idx;
  if (absl::SimpleAtoi(token, &idx)) {
    for (const auto& g : all)
      if (g.index == idx) return &g;
    return nullptr;
  }
  const GpuInfo* found = nullptr;
  for (const auto& g : all) {
    if (!g.uuid.empty() && g.uuid.compare(0, token.size(), token) == 0) {
      if (found) return nullptr;  // ambiguous prefix
      found = &g;
    }
  }
  return found;
}

std::string Known(const std::vector<GpuInfo>& all) {
  std::vector<std::string> v;
  for (const auto& g : all) v.push_back(absl::StrCat(g.index, " (", g.uuid, ")"));
  return all.empty() ? "none" : absl::StrJoin(v, ", ");
}

}  // namespace

GpuInfo GpuInfoFrom(const GpuFigures& f) {
  GpuInfo g;
  g.index = f.index;
  g.uuid = f.uuid;
  g.name = f.name;
  g.memory_bytes = f.memory_total_bytes > 0 ? static_cast<uint64_t>(f.memory_total_bytes) : 0;
  g.sm_count = f.multiprocessor_count;
  g.pci_bus_id = f.pci_bus_id;
  return g;
}

std::vector<GpuInfo> NvmlInventory::ListGpus(std::string* why_none) {
  std::vector<GpuInfo> out;
  auto nvml = Nvml::Load(library_);
  if (!nvml.ok()) {
    if (why_none) *why_none = std::string(nvml.status().message());
    return out;
  }
  for (const GpuFigures& f : (*nvml)->Sample()) {
    if (f.error.empty()) out.push_back(GpuInfoFrom(f));  // a lost GPU is no GPU to plan on
  }
  if (out.empty() && why_none) *why_none = "the NVIDIA driver reports no usable GPU";
  return out;
}

std::optional<GpuImbalance> FindImbalance(const std::vector<GpuInfo>& gpus) {
  using Key = std::tuple<uint64_t, int>;
  std::map<Key, std::vector<const GpuInfo*>> kinds;
  for (const auto& g : gpus) kinds[{g.memory_bytes / (1024ull * 1024 * 1024), g.sm_count}].push_back(&g);
  if (kinds.size() < 2) return std::nullopt;
  GpuImbalance out;
  const auto best = std::prev(kinds.end());
  std::vector<std::string> groups, slower;
  for (const auto& [key, gs] : kinds) {
    std::vector<std::string> ids;
    for (auto* g : gs) ids.push_back(std::to_string(g->index));
    groups.push_back(absl::StrCat(absl::StrJoin(ids, ","), " (", Describe(*gs.front()), ")"));
    if (key == best->first) continue;
    for (auto* g : gs) out.slower.push_back(g->index);
  }
  std::sort(out.slower.begin(), out.slower.end());
  out.kinds = absl::StrJoin(groups, " vs ");
  out.exclude_list = absl::StrJoin(out.slower, ",");
  return out;
}

absl::StatusOr<GpuPool> SelectGpuPool(const std::vector<GpuInfo>& all, const GpuSelection& sel) {
  GpuPool pool;
  // Start: inherited CUDA_VISIBLE_DEVICES, or every GPU.
  std::vector<std::pair<std::string, const GpuInfo*>> members;
  if (sel.inherited_cuda_visible_devices) {
    for (const auto& tok : SplitCommaList(*sel.inherited_cuda_visible_devices)) {
      const GpuInfo* g = FindGpu(all, tok);
      if (!g && all.empty()) continue;  // no driver: nothing to narrow, the variable passes through
      if (!g) {
        return absl::InvalidArgumentError(absl::StrCat("CUDA_VISIBLE_DEVICES=", *sel.inherited_cuda_visible_devices,
                                                       ": '", tok,
                                                       "' matches no GPU; expected indices or UUIDs of: ", Known(all)));
      }
      members.emplace_back(tok, g);
    }
  } else {
    for (const auto& g : all) members.emplace_back(std::to_string(g.index), &g);
    pool.from_nvml_indices = true;
  }

  auto resolve = [&](const std::vector<std::string>& names,
                     const char* flag) -> absl::StatusOr<std::set<const GpuInfo*>> {
    std::set<const GpuInfo*> out;
    for (const auto& n : names) {
      const GpuInfo* g = FindGpu(all, n);
      if (!g) {
        return absl::InvalidArgumentError(absl::StrCat(flag, "=", absl::StrJoin(names, ","), ": '", n,
                                                       "' matches no GPU; expected indices or UUIDs of: ", Known(all)));
      }
      out.insert(g);
    }
    return out;
  };
  if (!sel.gpus.empty()) {
    auto keep = resolve(sel.gpus, "--gpus");
    if (!keep.ok()) return keep.status();
    std::vector<std::pair<std::string, const GpuInfo*>> narrowed;
    for (auto& m : members)
      if (keep->count(m.second)) narrowed.push_back(m);
    if (narrowed.size() != keep->size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--gpus=", absl::StrJoin(sel.gpus, ","),
                       ": some of these GPUs are outside the inherited CUDA_VISIBLE_DEVICES=",
                       sel.inherited_cuda_visible_devices.value_or("")));
    }
    members = std::move(narrowed);
  }
  if (!sel.exclude.empty()) {
    auto drop = resolve(sel.exclude, "--exclude-gpus");
    if (!drop.ok()) return drop.status();
    members.erase(std::remove_if(members.begin(), members.end(),
                                 [&](const auto& m) { return drop->count(m.second) > 0; }),
                  members.end());
  }
  for (auto& m : members) {
    pool.tokens.push_back(m.first);
    pool.gpus.push_back(*m.second);
  }

  if (auto imbalance = FindImbalance(pool.gpus)) {
    pool.warnings.push_back(
        absl::StrCat("the GPU pool is imbalanced: ", imbalance->kinds,
                     "; every step waits for the slowest, consider --exclude-gpus=", imbalance->exclude_list));
  }
  return pool;
}

}  // namespace launch
