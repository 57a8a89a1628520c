// NVML (the NVIDIA driver's management library) loaded at run time with dlopen, so launch builds
// and runs where no driver is installed; Sample() reads every GPU's health figures and new XIDs.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace launch {

// NVML's numbers are bounded before they size anything: a driver (or a fake) that reports more
// GPUs than this is read for the first kMaxNvmlGpus only; one Sample() takes at most
// kMaxXidsPerSample XID events off the queue, the rest wait for the next Sample().
inline constexpr int kMaxNvmlGpus = 64;
inline constexpr int kMaxXidsPerSample = 256;

// One GPU as NVML sees it. -1 (or empty) where the GPU or driver does not support the query.
struct GpuFigures {
  int index = 0;      // NVML index (PCI bus order, as nvidia-smi shows)
  std::string error;  // why NVML cannot read this GPU ("GPU is lost"); empty when it can
  std::string name, uuid, pci_bus_id;
  int64_t memory_total_bytes = -1, memory_used_bytes = -1;
  int utilization_percent = -1;         // time a kernel ran, over the driver's last sample period
  int memory_utilization_percent = -1;  // time device memory was read or written, likewise
  int temperature_c = -1;
  double power_watts = -1;
  int sm_clock_mhz = -1, memory_clock_mhz = -1;
  int compute_capability_major = -1, compute_capability_minor = -1;
  int multiprocessor_count = -1;
  int64_t ecc_uncorrected_errors = -1;  // volatile count: since the driver was loaded
  int retired_pages = -1;               // pre-Ampere page retirement, both causes
  int row_remap_pending = -1;           // Ampere and later: 1 when a remapped row awaits a reset
  int persistence_mode = -1;            // 1 on, 0 off
  std::vector<int> xids;                // XID critical errors since the last Sample(), oldest first
};

struct NvmlSystemInfo {
  std::string driver_version;   // "550.54.15"; empty when NVML cannot tell
  int cuda_driver_version = 0;  // the newest CUDA the driver supports, 12040 for 12.4; 0: unknown
};

namespace nvml_abi {
struct nvmlDevice_st;
struct nvmlEventSet_st;
}  // namespace nvml_abi

// The library launch and `launch doctor` load: LAUNCH_NVML_LIBRARY (a path) when set, so a test or
// an unusual install can name another; else empty, which Load() reads as the driver's soname.
std::string NvmlLibraryFromEnv();

// One loaded and initialized NVML. Thread-compatible: Sample() drains the XID queue, so one
// thread at a time; two Nvml objects may coexist (NVML counts its initializations).
class Nvml {
 public:
  // dlopens `library` (empty: libnvidia-ml.so.1, the driver's soname) and initializes NVML.
  // FailedPrecondition with one line a user can act on when there is no usable driver.
  static absl::StatusOr<std::unique_ptr<Nvml>> Load(const std::string& library = "");
  ~Nvml();  // frees the event set, shuts NVML down, dlcloses the library
  Nvml(const Nvml&) = delete;
  Nvml& operator=(const Nvml&) = delete;

  const NvmlSystemInfo& System() const { return system_; }
  // Every GPU's figures now, in index order, with the XIDs that arrived since the last call.
  std::vector<GpuFigures> Sample();

 private:
  struct Gpu {
    nvml_abi::nvmlDevice_st* handle = nullptr;  // null when NVML could not open the GPU
    GpuFigures fixed;                           // what does not change while the driver runs (name, UUID, SMs, ...)
  };
  struct Functions;  // the resolved symbols
  struct LibraryCloser {
    void operator()(void* handle) const;
  };

  Nvml(std::unique_ptr<void, LibraryCloser> library, std::unique_ptr<const Functions> fns);
  void ReadSystem();
  void OpenGpus(unsigned int count);
  void RegisterXidEvents();
  void ReadFixedFigures(nvml_abi::nvmlDevice_st* device, GpuFigures* g) const;
  void ReadVolatileFigures(nvml_abi::nvmlDevice_st* device, GpuFigures* g) const;
  void DrainXids(std::vector<GpuFigures>* figures);

  std::unique_ptr<void, LibraryCloser> library_;  // first member: closed after everything else
  std::unique_ptr<const Functions> fns_;
  NvmlSystemInfo system_;
  std::vector<Gpu> gpus_;
  nvml_abi::nvmlEventSet_st* xid_events_ = nullptr;  // null where XID events are unsupported
};

// The subset of NVML's C ABI that launch uses, exactly as nvml.h (API version 13) declares it, in
// one place so that the loader and the test fake (tests/fakes/fake_nvml.cc) cannot disagree. Type names
// are NVML's own, so each line can be checked against nvml.h; C enums are passed as int.
namespace nvml_abi {

using nvmlReturn_t = int;
inline constexpr nvmlReturn_t kSuccess = 0;                // NVML_SUCCESS
inline constexpr nvmlReturn_t kErrorUninitialized = 1;     // NVML_ERROR_UNINITIALIZED
inline constexpr nvmlReturn_t kErrorInvalidArgument = 2;   // NVML_ERROR_INVALID_ARGUMENT
inline constexpr nvmlReturn_t kErrorNotSupported = 3;      // NVML_ERROR_NOT_SUPPORTED
inline constexpr nvmlReturn_t kErrorInsufficientSize = 7;  // NVML_ERROR_INSUFFICIENT_SIZE
inline constexpr nvmlReturn_t kErrorDriverNotLoaded = 9;   // NVML_ERROR_DRIVER_NOT_LOADED
inline constexpr nvmlReturn_t kErrorTimeout = 10;          // NVML_ERROR_TIMEOUT
inline constexpr nvmlReturn_t kErrorGpuIsLost = 15;        // NVML_ERROR_GPU_IS_LOST
inline constexpr nvmlReturn_t kErrorResetRequired = 16;    // NVML_ERROR_RESET_REQUIRED
inline constexpr nvmlReturn_t kErrorUnknown = 999;         // NVML_ERROR_UNKNOWN

using nvmlDevice_t = nvmlDevice_st*;
using nvmlEventSet_t = nvmlEventSet_st*;

inline constexpr unsigned int kDriverVersionBufferSize = 80;  // NVML_SYSTEM_DRIVER_VERSION_...
inline constexpr unsigned int kDeviceNameBufferSize = 96;     // NVML_DEVICE_NAME_V2_BUFFER_SIZE
inline constexpr unsigned int kDeviceUuidBufferSize = 96;     // NVML_DEVICE_UUID_V2_BUFFER_SIZE

struct nvmlMemory_t {
  unsigned long long total, free, used;  // bytes
};
struct nvmlUtilization_t {
  unsigned int gpu, memory;  // percent
};
struct nvmlPciInfo_t {  // filled by nvmlDeviceGetPciInfo_v3
  char busIdLegacy[16];
  unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
  char busId[32];
};
struct nvmlDeviceAttributes_t {
  unsigned int multiprocessorCount, sharedCopyEngineCount, sharedDecoderCount, sharedEncoderCount, sharedJpegCount,
      sharedOfaCount, gpuInstanceSliceCount, computeInstanceSliceCount;
  unsigned long long memorySizeMB;
};
struct nvmlEventData_t {
  nvmlDevice_t device;
  unsigned long long eventType;
  unsigned long long eventData;  // the XID for an XID event (999: an XID NVML does not know)
  unsigned int gpuInstanceId, computeInstanceId;
};
static_assert(sizeof(nvmlMemory_t) == 24 && sizeof(nvmlUtilization_t) == 8);
static_assert(sizeof(nvmlPciInfo_t) == 68 && sizeof(nvmlDeviceAttributes_t) == 40);
static_assert(sizeof(nvmlEventData_t) == 32);

inline constexpr unsigned long long kEventTypeXidCriticalError = 0x8;  // nvmlEventTypeXid...
inline constexpr int kTemperatureGpu = 0;                              // NVML_TEMPERATURE_GPU
inline constexpr int kClockSm = 1, kClockMem = 2;                      // NVML_CLOCK_SM, NVML_CLOCK_MEM
inline constexpr int kMemoryErrorUncorrected = 1;                      // NVML_MEMORY_ERROR_TYPE_UNCORRECTED
inline constexpr int kVolatileEcc = 0;                                 // NVML_VOLATILE_ECC
inline constexpr int kRetiredSingleBitEcc = 0;                         // NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_...
inline constexpr int kRetiredDoubleBitEcc = 1;                         // NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_...

// The functions' types, named after the exported symbols (the _v2/_v3 ones are what nvml.h's
// macros map the plain names to).
using nvmlInit_v2_fn = nvmlReturn_t();
using nvmlShutdown_fn = nvmlReturn_t();
using nvmlErrorString_fn = const char*(nvmlReturn_t);
using nvmlSystemGetDriverVersion_fn = nvmlReturn_t(char*, unsigned int);
using nvmlSystemGetCudaDriverVersion_fn = nvmlReturn_t(int*);
using nvmlDeviceGetCount_v2_fn = nvmlReturn_t(unsigned int*);
using nvmlDeviceGetHandleByIndex_v2_fn = nvmlReturn_t(unsigned int, nvmlDevice_t*);
using nvmlDeviceGetName_fn = nvmlReturn_t(nvmlDevice_t, char*, unsigned int);
using nvmlDeviceGetUUID_fn = nvmlReturn_t(nvmlDevice_t, char*, unsigned int);
using nvmlDeviceGetPciInfo_v3_fn = nvmlReturn_t(nvmlDevice_t, nvmlPciInfo_t*);
using nvmlDeviceGetCudaComputeCapability_fn = nvmlReturn_t(nvmlDevice_t, int*, int*);
using nvmlDeviceGetAttributes_v2_fn = nvmlReturn_t(nvmlDevice_t, nvmlDeviceAttributes_t*);
using nvmlDeviceGetMemoryInfo_fn = nvmlReturn_t(nvmlDevice_t, nvmlMemory_t*);
using nvmlDeviceGetUtilizationRates_fn = nvmlReturn_t(nvmlDevice_t, nvmlUtilization_t*);
using nvmlDeviceGetTemperature_fn = nvmlReturn_t(nvmlDevice_t, int, unsigned int*);
using nvmlDeviceGetPowerUsage_fn = nvmlReturn_t(nvmlDevice_t, unsigned int*);      // milliwatts
using nvmlDeviceGetClockInfo_fn = nvmlReturn_t(nvmlDevice_t, int, unsigned int*);  // MHz
using nvmlDeviceGetTotalEccErrors_fn = nvmlReturn_t(nvmlDevice_t, int, int, unsigned long long*);
using nvmlDeviceGetRetiredPages_fn = nvmlReturn_t(nvmlDevice_t, int, unsigned int*, unsigned long long*);
using nvmlDeviceGetRemappedRows_fn = nvmlReturn_t(nvmlDevice_t, unsigned int*, unsigned int*, unsigned int*,
                                                  unsigned int*);
using nvmlDeviceGetPersistenceMode_fn = nvmlReturn_t(nvmlDevice_t, int*);
using nvmlEventSetCreate_fn = nvmlReturn_t(nvmlEventSet_t*);
using nvmlDeviceRegisterEvents_fn = nvmlReturn_t(nvmlDevice_t, unsigned long long, nvmlEventSet_t);
using nvmlEventSetWait_v2_fn = nvmlReturn_t(nvmlEventSet_t, nvmlEventData_t*, unsigned int);
using nvmlEventSetFree_fn = nvmlReturn_t(nvmlEventSet_t);

}  // namespace nvml_abi
}  // namespace launch
