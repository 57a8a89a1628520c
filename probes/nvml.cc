#include "probes/nvml.h"

#include <dlfcn.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/launch_env.h"
#include "spdlog/spdlog.h"

namespace launch {

namespace abi = nvml_abi;

// Each member is named after the symbol it holds and typed by that symbol's nvml_abi alias, so
// that resolving by the member's own name (LAUNCH_NVML_RESOLVE) cannot pair a name with the
// wrong type. Null where the library lacks the symbol (an older driver).
struct Nvml::Functions {
  // Required: without them there is nothing to read.
  abi::nvmlInit_v2_fn* nvmlInit_v2 = nullptr;
  abi::nvmlShutdown_fn* nvmlShutdown = nullptr;
  abi::nvmlDeviceGetCount_v2_fn* nvmlDeviceGetCount_v2 = nullptr;
  abi::nvmlDeviceGetHandleByIndex_v2_fn* nvmlDeviceGetHandleByIndex_v2 = nullptr;
  // Optional: a missing one leaves its figure unknown.
  abi::nvmlErrorString_fn* nvmlErrorString = nullptr;
  abi::nvmlSystemGetDriverVersion_fn* nvmlSystemGetDriverVersion = nullptr;
  abi::nvmlSystemGetCudaDriverVersion_fn* nvmlSystemGetCudaDriverVersion = nullptr;
  abi::nvmlDeviceGetName_fn* nvmlDeviceGetName = nullptr;
  abi::nvmlDeviceGetUUID_fn* nvmlDeviceGetUUID = nullptr;
  abi::nvmlDeviceGetPciInfo_v3_fn* nvmlDeviceGetPciInfo_v3 = nullptr;
  abi::nvmlDeviceGetCudaComputeCapability_fn* nvmlDeviceGetCudaComputeCapability = nullptr;
  abi::nvmlDeviceGetAttributes_v2_fn* nvmlDeviceGetAttributes_v2 = nullptr;
  abi::nvmlDeviceGetMemoryInfo_fn* nvmlDeviceGetMemoryInfo = nullptr;
  abi::nvmlDeviceGetUtilizationRates_fn* nvmlDeviceGetUtilizationRates = nullptr;
  abi::nvmlDeviceGetTemperature_fn* nvmlDeviceGetTemperature = nullptr;
  abi::nvmlDeviceGetPowerUsage_fn* nvmlDeviceGetPowerUsage = nullptr;
  abi::nvmlDeviceGetClockInfo_fn* nvmlDeviceGetClockInfo = nullptr;
  abi::nvmlDeviceGetTotalEccErrors_fn* nvmlDeviceGetTotalEccErrors = nullptr;
  abi::nvmlDeviceGetRetiredPages_fn* nvmlDeviceGetRetiredPages = nullptr;
  abi::nvmlDeviceGetRemappedRows_fn* nvmlDeviceGetRemappedRows = nullptr;
  abi::nvmlDeviceGetPersistenceMode_fn* nvmlDeviceGetPersistenceMode = nullptr;
  abi::nvmlEventSetCreate_fn* nvmlEventSetCreate = nullptr;
  abi::nvmlDeviceRegisterEvents_fn* nvmlDeviceRegisterEvents = nullptr;
  abi::nvmlEventSetWait_v2_fn* nvmlEventSetWait_v2 = nullptr;
  abi::nvmlEventSetFree_fn* nvmlEventSetFree = nullptr;

  void Resolve(void* library);
  bool HasRequired() const {
    return nvmlInit_v2 && nvmlShutdown && nvmlDeviceGetCount_v2 && nvmlDeviceGetHandleByIndex_v2;
  }
};

namespace {

constexpr char kDefaultLibrary[] = "libnvidia-ml.so.1";
// NVML_ERROR_FUNCTION_NOT_FOUND: what a missing optional symbol answers, as NVML itself would.
constexpr abi::nvmlReturn_t kErrorFunctionNotFound = 13;
// nvmlErrorString's text is the library's; a sane one is short.
constexpr size_t kMaxErrorStringLength = 200;

template <typename F>
void ResolveSymbol(void* library, const char* name, F** fn) {
  *fn = reinterpret_cast<F*>(dlsym(library, name));
}

int ToInt(unsigned long long v) { return v > INT_MAX ? INT_MAX : static_cast<int>(v); }
int64_t ToInt64(unsigned long long v) {
  return v > static_cast<unsigned long long>(INT64_MAX) ? INT64_MAX : static_cast<int64_t>(v);
}
// A string NVML wrote into a fixed buffer: up to the first NUL, never past the buffer.
std::string FromBuffer(const char* buffer, size_t size) { return std::string(buffer, strnlen(buffer, size)); }

std::string ErrorText(abi::nvmlErrorString_fn* error_string, abi::nvmlReturn_t code) {
  const char* text = error_string ? error_string(code) : nullptr;
  if (text == nullptr) return absl::StrCat("NVML error ", code);
  return absl::StrCat(FromBuffer(text, kMaxErrorStringLength), " (NVML error ", code, ")");
}

// Calls an optional NVML function about one GPU and returns its answer. A lost GPU, or one that
// needs a reset, is recorded in `g->error`: that, not the unknown figures, is what users need.
template <typename F, typename... Args>
abi::nvmlReturn_t Ask(abi::nvmlErrorString_fn* error_string, GpuFigures* g, F* fn, Args... args) {
  if (fn == nullptr) return kErrorFunctionNotFound;
  const abi::nvmlReturn_t rc = fn(args...);
  if ((rc == abi::kErrorGpuIsLost || rc == abi::kErrorResetRequired) && g->error.empty()) {
    g->error = ErrorText(error_string, rc);
  }
  return rc;
}

}  // namespace

std::string NvmlLibraryFromEnv() {
  const char* library = std::getenv(kNvmlLibraryEnv);
  return library ? library : "";
}

void Nvml::Functions::Resolve(void* library) {
#define LAUNCH_NVML_RESOLVE(symbol) ResolveSymbol(library, #symbol, &symbol)
  LAUNCH_NVML_RESOLVE(nvmlInit_v2);
  LAUNCH_NVML_RESOLVE(nvmlShutdown);
  LAUNCH_NVML_RESOLVE(nvmlDeviceGetCount_v2);
  LAUNCH_NVML_RESOLVE(nvmlDeviceGetHandleByIndex_v2);
  LAUNCH_NVML_RESOLVE(nvmlErrorString);
  LAUNCH_NVML_RESOLVE(nvmlSystemGetDriverVersion);
  LAUNCH_NVML_RESOLVE(nvmlSystemGetCudaDriverVersion);
  LAUNCH_NVML_RESOLVE(nvmlDeviceGetName);
  LAUNCH_NVML_RESOLVE(nvmlDeviceGetUUID);
  LAUNCH_NVML_RESOLVE(nvmlDeviceGetPciInfo_v3);
  LAUNCH_NVML_RESOLVE(nvmlDeviceGetCudaComputeCapability);
  LAUNCH_NVML_RESOLVE(nvmlDeviceGetAttributes_v2);
  LAUNCH_NVML_RESOLVE(nvmlDeviceGetMemoryInfo);
  LAUNCH_NVML_RESOLVE(nvmlDeviceGetUtilizationRates);
  LAUNCH_NVML_RESOLVE(nvmlDeviceGetTemperature);
  LAUNCH_NVML_RESOLVE(nvmlDeviceGetPowerUsage);
  LAUNCH_NVML_RESOLVE(nvmlDeviceGetClockInfo);
  LAUNCH_NVML_RESOLVE(nvmlDeviceGetTotalEccErrors);
  LAUNCH_NVML_RESOLVE(nvmlDeviceGetRetiredPages);
  LAUNCH_NVML_RESOLVE(nvmlDeviceGetRemappedRows);
  LAUNCH_NVML_RESOLVE(nvmlDeviceGetPersistenceMode);
  LAUNCH_NVML_RESOLVE(nvmlEventSetCreate);
  LAUNCH_NVML_RESOLVE(nvmlDeviceRegisterEvents);
  LAUNCH_NVML_RESOLVE(nvmlEventSetWait_v2);
  LAUNCH_NVML_RESOLVE(nvmlEventSetFree);
#undef LAUNCH_NVML_RESOLVE
}

void Nvml::LibraryCloser::operator()(void* handle) const {
  if (handle != nullptr) dlclose(handle);
}

Nvml::Nvml(std::unique_ptr<void, LibraryCloser> library, std::unique_ptr<const Functions> fns)
    : library_(std::move(library)), fns_(std::move(fns)) {}

// Only an initialized NVML is ever wrapped, so the shutdown always matches an init.
Nvml::~Nvml() {
  if (xid_events_ != nullptr) fns_->nvmlEventSetFree(xid_events_);
  fns_->nvmlShutdown();
}

absl::StatusOr<std::unique_ptr<Nvml>> Nvml::Load(const std::string& library) {
  const std::string name = library.empty() ? kDefaultLibrary : library;
  dlerror();  // clear a stale message
  std::unique_ptr<void, LibraryCloser> handle(dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL));
  if (handle == nullptr) {
    const char* why = dlerror();
    return absl::FailedPreconditionError(
        absl::StrCat("no NVIDIA driver: cannot load ", name, " (", why ? why : "no reason given", ")"));
  }
  auto fns = std::make_unique<Functions>();
  fns->Resolve(handle.get());
  if (!fns->HasRequired()) {
    return absl::FailedPreconditionError(
        absl::StrCat(name,
                     " is not a usable NVML: it lacks nvmlInit_v2, nvmlShutdown, nvmlDeviceGetCount_v2 "
                     "or nvmlDeviceGetHandleByIndex_v2"));
  }
  if (const abi::nvmlReturn_t rc = fns->nvmlInit_v2(); rc != abi::kSuccess) {
    return absl::FailedPreconditionError(absl::StrCat("NVML init failed: ", ErrorText(fns->nvmlErrorString, rc)));
  }
  std::unique_ptr<Nvml> nvml(new Nvml(std::move(handle), std::move(fns)));
  unsigned int count = 0;
  if (const abi::nvmlReturn_t rc = nvml->fns_->nvmlDeviceGetCount_v2(&count); rc != abi::kSuccess) {
    return absl::FailedPreconditionError(
        absl::StrCat("NVML cannot count the GPUs: ", ErrorText(nvml->fns_->nvmlErrorString, rc)));
  }
  if (count > static_cast<unsigned int>(kMaxNvmlGpus)) {
    spdlog::warn("NVML reports {} GPUs; reading the first {}", count, kMaxNvmlGpus);
    count = kMaxNvmlGpus;
  }
  nvml->ReadSystem();
  nvml->OpenGpus(count);
  nvml->RegisterXidEvents();
  return nvml;
}

void Nvml::ReadSystem() {
  char version[abi::kDriverVersionBufferSize] = {};
  if (fns_->nvmlSystemGetDriverVersion &&
      fns_->nvmlSystemGetDriverVersion(version, abi::kDriverVersionBufferSize) == abi::kSuccess) {
    system_.driver_version = FromBuffer(version, sizeof version);
  }
  int cuda = 0;
  if (fns_->nvmlSystemGetCudaDriverVersion && fns_->nvmlSystemGetCudaDriverVersion(&cuda) == abi::kSuccess &&
      cuda > 0) {
    system_.cuda_driver_version = cuda;
  }
}

void Nvml::OpenGpus(unsigned int count) {
  gpus_.reserve(count);
  for (unsigned int i = 0; i < count; ++i) {
    Gpu gpu;
    gpu.fixed.index = static_cast<int>(i);
    const abi::nvmlReturn_t rc = fns_->nvmlDeviceGetHandleByIndex_v2(i, &gpu.handle);
    if (rc != abi::kSuccess) {
      gpu.handle = nullptr;
      gpu.fixed.error = absl::StrCat("NVML cannot open GPU ", i, ": ", ErrorText(fns_->nvmlErrorString, rc));
    } else {
      ReadFixedFigures(gpu.handle, &gpu.fixed);
    }
    gpus_.push_back(std::move(gpu));
  }
}

void Nvml::ReadFixedFigures(abi::nvmlDevice_t device, GpuFigures* g) const {
  const Functions& f = *fns_;
  auto ask = [&](auto* fn, auto... args) { return Ask(f.nvmlErrorString, g, fn, args...); };
  char name[abi::kDeviceNameBufferSize] = {};
  if (ask(f.nvmlDeviceGetName, device, name, abi::kDeviceNameBufferSize) == abi::kSuccess) {
    g->name = FromBuffer(name, sizeof name);
  }
  char uuid[abi::kDeviceUuidBufferSize] = {};
  if (ask(f.nvmlDeviceGetUUID, device, uuid, abi::kDeviceUuidBufferSize) == abi::kSuccess) {
    g->uuid = FromBuffer(uuid, sizeof uuid);
  }
  abi::nvmlPciInfo_t pci{};
  if (ask(f.nvmlDeviceGetPciInfo_v3, device, &pci) == abi::kSuccess) {
    g->pci_bus_id = FromBuffer(pci.busId, sizeof pci.busId);
  }
  int major = -1, minor = -1;
  if (ask(f.nvmlDeviceGetCudaComputeCapability, device, &major, &minor) == abi::kSuccess) {
    g->compute_capability_major = major;
    g->compute_capability_minor = minor;
  }
  abi::nvmlDeviceAttributes_t attributes{};
  if (ask(f.nvmlDeviceGetAttributes_v2, device, &attributes) == abi::kSuccess) {
    g->multiprocessor_count = ToInt(attributes.multiprocessorCount);
  }
}

void Nvml::ReadVolatileFigures(abi::nvmlDevice_t device, GpuFigures* g) const {
  const Functions& f = *fns_;
  auto ask = [&](auto* fn, auto... args) { return Ask(f.nvmlErrorString, g, fn, args...); };
  abi::nvmlMemory_t memory{};
  if (ask(f.nvmlDeviceGetMemoryInfo, device, &memory) == abi::kSuccess) {
    g->memory_total_bytes = ToInt64(memory.total);
    g->memory_used_bytes = ToInt64(memory.used);
  }
  abi::nvmlUtilization_t utilization{};
  if (ask(f.nvmlDeviceGetUtilizationRates, device, &utilization) == abi::kSuccess) {
    g->utilization_percent = ToInt(utilization.gpu);
    g->memory_utilization_percent = ToInt(utilization.memory);
  }
  unsigned int value = 0;
  if (ask(f.nvmlDeviceGetTemperature, device, abi::kTemperatureGpu, &value) == abi::kSuccess) {
    g->temperature_c = ToInt(value);
  }
  if (ask(f.nvmlDeviceGetPowerUsage, device, &value) == abi::kSuccess) {
    g->power_watts = value / 1000.0;  // NVML reports milliwatts
  }
  if (ask(f.nvmlDeviceGetClockInfo, device, abi::kClockSm, &value) == abi::kSuccess) {
    g->sm_clock_mhz = ToInt(value);
  }
  if (ask(f.nvmlDeviceGetClockInfo, device, abi::kClockMem, &value) == abi::kSuccess) {
    g->memory_clock_mhz = ToInt(value);
  }
  unsigned long long ecc = 0;
  if (ask(f.nvmlDeviceGetTotalEccErrors, device, abi::kMemoryErrorUncorrected, abi::kVolatileEcc, &ecc) ==
      abi::kSuccess) {
    g->ecc_uncorrected_errors = ToInt64(ecc);
  }
  int64_t retired = -1;
  for (int cause : {abi::kRetiredSingleBitEcc, abi::kRetiredDoubleBitEcc}) {
    // Only the count matters: with one address slot NVML answers INSUFFICIENT_SIZE and the count
    // when more pages match, so nothing here is sized by what NVML says.
    unsigned int pages = 1;
    unsigned long long address = 0;
    const abi::nvmlReturn_t rc = ask(f.nvmlDeviceGetRetiredPages, device, cause, &pages, &address);
    if (rc == abi::kSuccess || rc == abi::kErrorInsufficientSize) {
      retired = std::max<int64_t>(retired, 0) + pages;
    }
  }
  if (retired >= 0) g->retired_pages = retired > INT_MAX ? INT_MAX : static_cast<int>(retired);
  unsigned int corrected = 0, uncorrected = 0, pending = 0, failed = 0;
  if (ask(f.nvmlDeviceGetRemappedRows, device, &corrected, &uncorrected, &pending, &failed) == abi::kSuccess) {
    g->row_remap_pending = pending != 0 ? 1 : 0;
  }
  int mode = 0;
  if (ask(f.nvmlDeviceGetPersistenceMode, device, &mode) == abi::kSuccess) {
    g->persistence_mode = mode != 0 ? 1 : 0;
  }
}

void Nvml::RegisterXidEvents() {
  const Functions& f = *fns_;
  if (!f.nvmlEventSetCreate || !f.nvmlDeviceRegisterEvents || !f.nvmlEventSetWait_v2 || !f.nvmlEventSetFree) {
    return;
  }
  abi::nvmlEventSet_t set = nullptr;
  if (f.nvmlEventSetCreate(&set) != abi::kSuccess || set == nullptr) return;
  bool any = false;
  for (const Gpu& gpu : gpus_) {
    // A GPU that cannot report XIDs (NOT_SUPPORTED, or no permission) simply never has any.
    if (gpu.handle != nullptr &&
        f.nvmlDeviceRegisterEvents(gpu.handle, abi::kEventTypeXidCriticalError, set) == abi::kSuccess) {
      any = true;
    }
  }
  if (any) {
    xid_events_ = set;
  } else {
    f.nvmlEventSetFree(set);
  }
}

void Nvml::DrainXids(std::vector<GpuFigures>* figures) {
  if (xid_events_ == nullptr) return;
  for (int n = 0; n < kMaxXidsPerSample; ++n) {
    abi::nvmlEventData_t event{};
    // Timeout 0: take what is queued, never wait (TIMEOUT means the queue is empty).
    if (fns_->nvmlEventSetWait_v2(xid_events_, &event, 0) != abi::kSuccess) return;
    if ((event.eventType & abi::kEventTypeXidCriticalError) == 0) continue;
    for (size_t i = 0; i < gpus_.size(); ++i) {
      if (gpus_[i].handle == event.device) {
        (*figures)[i].xids.push_back(ToInt(event.eventData));
        break;
      }
    }
  }
}

std::vector<GpuFigures> Nvml::Sample() {
  std::vector<GpuFigures> figures;
  figures.reserve(gpus_.size());
  for (const Gpu& gpu : gpus_) {
    GpuFigures g = gpu.fixed;
    if (gpu.handle != nullptr) ReadVolatileFigures(gpu.handle, &g);
    figures.push_back(std::move(g));
  }
  DrainXids(&figures);
  return figures;
}

}  // namespace launch
