#include "agent/devices.h"

#include <dlfcn.h>

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

// The few NVML declarations used here (nvml.h ABI), so the build needs no driver headers.
using nvmlReturn_t = int;
using nvmlDevice_t = void*;
struct nvmlMemory_t {
  unsigned long long total, free, used;
};
struct nvmlDeviceAttributes_t {
  unsigned int multiprocessorCount, sharedCopyEngineCount, sharedDecoderCount,
      sharedEncoderCount, sharedJpegCount, sharedOfaCount, gpuInstanceSliceCount,
      computeInstanceSliceCount;
  unsigned long long memorySizeMB;
};

class NvmlLibrary {
 public:
  NvmlLibrary() { handle_ = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL); }
  ~NvmlLibrary() {
    if (handle_ && initialized_) Sym<nvmlReturn_t (*)()>("nvmlShutdown")();
    if (handle_) dlclose(handle_);
  }
  bool loaded() const { return handle_ != nullptr; }
  template <typename F>
  F Sym(const char* name) const {
    return handle_ ? reinterpret_cast<F>(dlsym(handle_, name)) : nullptr;
  }
  bool Init() {
    auto init = Sym<nvmlReturn_t (*)()>("nvmlInit_v2");
    initialized_ = init && init() == 0;
    return initialized_;
  }

 private:
  void* handle_ = nullptr;
  bool initialized_ = false;
};

std::string Describe(const GpuInfo& g) {
  std::string s = absl::StrCat(g.name.empty() ? "GPU" : g.name, ", ",
                               g.memory_bytes / (1024ull * 1024 * 1024), " GiB");
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

std::vector<GpuInfo> NvmlInventory::ListGpus(std::string* why_none) {
  std::vector<GpuInfo> out;
  NvmlLibrary nvml;
  if (!nvml.loaded()) {
    if (why_none) *why_none = "no NVIDIA driver (libnvidia-ml.so.1 not found)";
    return out;
  }
  if (!nvml.Init()) {
    if (why_none) *why_none = "the NVIDIA driver did not initialize (nvmlInit failed)";
    return out;
  }
  auto count_fn = nvml.Sym<nvmlReturn_t (*)(unsigned*)>("nvmlDeviceGetCount_v2");
  auto handle_fn =
      nvml.Sym<nvmlReturn_t (*)(unsigned, nvmlDevice_t*)>("nvmlDeviceGetHandleByIndex_v2");
  auto uuid_fn = nvml.Sym<nvmlReturn_t (*)(nvmlDevice_t, char*, unsigned)>("nvmlDeviceGetUUID");
  auto name_fn = nvml.Sym<nvmlReturn_t (*)(nvmlDevice_t, char*, unsigned)>("nvmlDeviceGetName");
  auto mem_fn = nvml.Sym<nvmlReturn_t (*)(nvmlDevice_t, nvmlMemory_t*)>("nvmlDeviceGetMemoryInfo");
  auto attr_fn = nvml.Sym<nvmlReturn_t (*)(nvmlDevice_t, nvmlDeviceAttributes_t*)>(
      "nvmlDeviceGetAttributes_v2");
  unsigned count = 0;
  if (!count_fn || !handle_fn || count_fn(&count) != 0 || count == 0) {
    if (why_none) *why_none = "the NVIDIA driver reports no GPU";
    return out;
  }
  for (unsigned i = 0; i < count; ++i) {
    nvmlDevice_t dev;
    if (handle_fn(i, &dev) != 0) continue;
    GpuInfo g;
    g.index = static_cast<int>(i);
    char buf[96] = {0};
    if (uuid_fn && uuid_fn(dev, buf, sizeof buf) == 0) g.uuid = buf;
    char name[96] = {0};
    if (name_fn && name_fn(dev, name, sizeof name) == 0) g.name = name;
    nvmlMemory_t mem{};
    if (mem_fn && mem_fn(dev, &mem) == 0) g.memory_bytes = mem.total;
    nvmlDeviceAttributes_t attr{};
    if (attr_fn && attr_fn(dev, &attr) == 0) g.sm_count = static_cast<int>(attr.multiprocessorCount);
    out.push_back(std::move(g));
  }
  if (out.empty() && why_none) *why_none = "no GPU could be opened through NVML";
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
        return absl::InvalidArgumentError(absl::StrCat(
            "CUDA_VISIBLE_DEVICES=", *sel.inherited_cuda_visible_devices, ": '", tok,
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
        return absl::InvalidArgumentError(absl::StrCat(flag, "=", absl::StrJoin(names, ","), ": '",
                                                       n, "' matches no GPU; expected indices or UUIDs of: ",
                                                       Known(all)));
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
      return absl::InvalidArgumentError(absl::StrCat(
          "--gpus=", absl::StrJoin(sel.gpus, ","),
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

  // Imbalance: data parallelism runs at the pace of the slowest GPU.
  using Key = std::tuple<uint64_t, int>;
  std::map<Key, std::vector<const GpuInfo*>> kinds;
  for (const auto& g : pool.gpus) kinds[{g.memory_bytes / (1024ull * 1024 * 1024), g.sm_count}].push_back(&g);
  if (kinds.size() > 1) {
    // The largest kind (most memory, then most SMs) stays; the rest are the ones to exclude.
    auto best = std::prev(kinds.end());
    std::vector<std::string> groups, slower;
    for (const auto& [key, gs] : kinds) {
      std::vector<std::string> ids;
      for (auto* g : gs) ids.push_back(std::to_string(g->index));
      groups.push_back(absl::StrCat(absl::StrJoin(ids, ","), " (", Describe(*gs.front()), ")"));
      if (key != best->first)
        for (auto* g : gs) slower.push_back(std::to_string(g->index));
    }
    pool.warnings.push_back(absl::StrCat(
        "the GPU pool is imbalanced: ", absl::StrJoin(groups, " vs "),
        "; every step waits for the slowest, consider --exclude-gpus=", absl::StrJoin(slower, ",")));
  }
  return pool;
}

}  // namespace launch
