// GPU discovery (through probes/nvml.h, loaded at run time, so nothing links the driver) and the
// choice of the GPU pool this node's workers use: inherited CUDA_VISIBLE_DEVICES, --gpus,
// --exclude-gpus, imbalance checks.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "probes/nvml.h"

namespace launch {

struct GpuInfo {
  int index = 0;  // NVML index (PCI bus order, as nvidia-smi shows)
  std::string uuid;
  std::string name;
  uint64_t memory_bytes = 0;
  int sm_count = -1;       // -1 when NVML cannot tell
  std::string pci_bus_id;  // NVML's "00000000:18:00.0"; empty when unknown
  int numa_node = -1;      // from sysfs, where --numa-binding asks; -1: unknown
};

class DeviceInventory {
 public:
  virtual ~DeviceInventory() = default;
  // The GPUs of this machine; empty with a reason in `why_none` when there are none.
  virtual std::vector<GpuInfo> ListGpus(std::string* why_none) = 0;
};

// What the pool needs to know of one GPU as NVML reports it.
GpuInfo GpuInfoFrom(const GpuFigures& figures);

// Reads the GPUs through NVML (Nvml::Load: `library`, empty for the driver's own).
class NvmlInventory : public DeviceInventory {
 public:
  explicit NvmlInventory(std::string library = "") : library_(std::move(library)) {}
  std::vector<GpuInfo> ListGpus(std::string* why_none) override;

 private:
  std::string library_;
};

class FakeInventory : public DeviceInventory {
 public:
  explicit FakeInventory(std::vector<GpuInfo> gpus) : gpus_(std::move(gpus)) {}
  std::vector<GpuInfo> ListGpus(std::string* why_none) override {
    if (gpus_.empty() && why_none) *why_none = "no GPU in the fake inventory";
    return gpus_;
  }

 private:
  std::vector<GpuInfo> gpus_;
};

struct GpuPool {
  std::vector<std::string> tokens;  // CUDA_VISIBLE_DEVICES entries for the workers
  std::vector<GpuInfo> gpus;        // the same GPUs, described
  bool from_nvml_indices = false;   // tokens are NVML indices we chose (no inherited variable)
  std::vector<std::string> warnings;
};

struct GpuSelection {
  std::optional<std::string> inherited_cuda_visible_devices;
  std::vector<std::string> gpus;     // --gpus: indices or UUIDs (empty: all)
  std::vector<std::string> exclude;  // --exclude-gpus
};

// GPUs that differ in memory or SM count: data parallelism runs at the pace of the slowest, so
// all but the largest kind (most memory, then most SMs) are the ones to leave out.
struct GpuImbalance {
  std::string kinds;         // "0,2 (H100, 80 GiB, 132 SMs) vs 1 (A100, 40 GiB, 108 SMs)"
  std::vector<int> slower;   // NVML indices of the GPUs to exclude
  std::string exclude_list;  // the same as --exclude-gpus takes them: "1"
};
// nullopt when every GPU is alike (or there are fewer than two).
std::optional<GpuImbalance> FindImbalance(const std::vector<GpuInfo>& gpus);

// The pool: the inherited CUDA_VISIBLE_DEVICES if set, else every GPU, narrowed by --gpus and
// minus --exclude-gpus. Names that match no GPU are errors naming the value.
absl::StatusOr<GpuPool> SelectGpuPool(const std::vector<GpuInfo>& all, const GpuSelection& sel);

}  // namespace launch
