// A fake NVML shared library (libfake_nvml.so) for tests: it exports the NVML symbols launch loads,
// with GPUs described by a text file, so the loader is tested through dlopen without a driver.
//
// The file is named by the environment variable FAKE_NVML_FILE and read by nvmlInit_v2. Without
// the variable, or with a file that cannot be read, nvmlInit_v2 answers
// NVML_ERROR_DRIVER_NOT_LOADED, as a machine with no driver would. Format: one item a line;
// blank lines and lines starting with '#' are skipped; words are key=value, a value with spaces
// in double quotes:
//
//   system driver=550.54.15 cuda=12040
//   gpu name="NVIDIA H100 80GB HBM3" uuid=GPU-aaaa pci=00000000:18:00.0 mem_total_mib=81559
//       mem_used_mib=1024 util=97 mem_util=30 temp=45 power_mw=350000 sm_clock=1980
//       mem_clock=2619 cc=9.0 sms=132 ecc=0 retired_sbe=0 retired_dbe=0 remap_pending=0
//       persistence=1 xid=79,48
//
// (a gpu is one line; it is wrapped here to fit). GPUs take NVML indices in file order. A key left
// out makes its function answer NVML_ERROR_NOT_SUPPORTED; where one function reports two keys
// (mem_total_mib and mem_used_mib, util and mem_util, retired_sbe and retired_dbe) the first, or
// either, enables it and an absent partner reads 0. xid= lists the XIDs queued for an event set
// when the GPU is registered on it (an empty list: XID events supported, none pending). lost=1
// makes nvmlDeviceGetHandleByIndex_v2 answer NVML_ERROR_GPU_IS_LOST. An unknown key, or a number
// that does not parse, fails nvmlInit_v2 with NVML_ERROR_UNKNOWN and a line on stderr.
//
// fake_nvml_open_objects() (not NVML) counts initializations not yet shut down plus event sets not
// yet freed, so a test can check that the loader releases what it took.

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "probes/nvml.h"

namespace nv = launch::nvml_abi;

// The opaque NVML handle types, completed here: a handle is the address of the fake's object.
struct launch::nvml_abi::nvmlDevice_st {
  std::map<std::string, std::string> values;  // the gpu line's keys, checked at init
  std::vector<unsigned long long> xids;
};
struct launch::nvml_abi::nvmlEventSet_st {
  std::deque<nv::nvmlEventData_t> queue;
};

namespace {

// A C library's process-wide state, as NVML's own is: the library is the unit a test loads, and
// its lifetime (dlopen to dlclose) bounds this. Tests use it from one thread.
struct FakeState {
  int init_count = 0;
  std::map<std::string, std::string> system;
  std::deque<nv::nvmlDevice_st> gpus;  // a deque: handles (addresses) stay valid as it grows
  std::set<nv::nvmlEventSet_st*> event_sets;
};

FakeState& State() {
  static FakeState state;
  return state;
}

const std::set<std::string> kGpuStringKeys = {"name", "uuid", "pci", "cc", "xid"};
const std::set<std::string> kGpuNumberKeys = {
    "mem_total_mib", "mem_used_mib", "util",          "mem_util",    "temp",
    "power_mw",      "sm_clock",     "mem_clock",     "sms",         "ecc",
    "retired_sbe",   "retired_dbe",  "remap_pending", "persistence", "lost"};

bool ParseNumber(const std::string& text, unsigned long long* out) {
  if (text.empty() || text[0] < '0' || text[0] > '9') return false;
  char* end = nullptr;
  errno = 0;
  *out = std::strtoull(text.c_str(), &end, 10);
  return errno == 0 && *end == '\0';
}

const std::string* Value(const std::map<std::string, std::string>& values, const char* key) {
  auto it = values.find(key);
  return it == values.end() ? nullptr : &it->second;
}

// "key=value key2=\"a b\"" -> {key: value, key2: a b}; false on a word without '=' or an
// unterminated quote.
bool SplitWords(const std::string& rest, std::map<std::string, std::string>* out) {
  size_t i = 0;
  while (true) {
    while (i < rest.size() && rest[i] == ' ') ++i;
    if (i == rest.size()) return true;
    const size_t eq = rest.find('=', i);
    if (eq == std::string::npos) return false;
    const std::string key = rest.substr(i, eq - i);
    if (key.find(' ') != std::string::npos) return false;
    i = eq + 1;
    std::string value;
    if (i < rest.size() && rest[i] == '"') {
      const size_t close = rest.find('"', i + 1);
      if (close == std::string::npos) return false;
      value = rest.substr(i + 1, close - i - 1);
      i = close + 1;
    } else {
      const size_t space = std::min(rest.find(' ', i), rest.size());
      value = rest.substr(i, space - i);
      i = space;
    }
    (*out)[key] = value;
  }
}

// Why the gpu line's keys are not valid (empty when they are); fills in the XID list.
std::string CheckGpu(nv::nvmlDevice_st* gpu) {
  unsigned long long n;
  for (const auto& [key, value] : gpu->values) {
    if (kGpuNumberKeys.count(key)) {
      if (!ParseNumber(value, &n)) return "bad number for " + key;
    } else if (!kGpuStringKeys.count(key)) {
      return "unknown gpu key " + key;
    }
  }
  if (const std::string* cc = Value(gpu->values, "cc")) {
    const size_t dot = cc->find('.');
    if (dot == std::string::npos || !ParseNumber(cc->substr(0, dot), &n) ||
        !ParseNumber(cc->substr(dot + 1), &n)) {
      return "cc is not major.minor";
    }
  }
  if (const std::string* pci = Value(gpu->values, "pci"); pci && pci->size() >= 32) {
    return "pci is longer than NVML's 32-byte field";
  }
  if (const std::string* xid = Value(gpu->values, "xid")) {
    for (size_t start = 0; start < xid->size();) {
      const size_t comma = std::min(xid->find(',', start), xid->size());
      if (!ParseNumber(xid->substr(start, comma - start), &n)) {
        return "xid is not a comma list of numbers";
      }
      gpu->xids.push_back(n);
      start = comma + 1;
    }
  }
  return "";
}

nv::nvmlReturn_t ReadFile(FakeState* state) {
  const char* path = std::getenv("FAKE_NVML_FILE");
  if (path == nullptr) return nv::kErrorDriverNotLoaded;
  std::ifstream in(path);
  if (!in) return nv::kErrorDriverNotLoaded;
  std::string line;
  int number = 0;
  while (std::getline(in, line)) {
    ++number;
    if (line.empty() || line[0] == '#') continue;
    const size_t space = line.find(' ');
    const std::string kind = line.substr(0, space);
    const std::string rest = space == std::string::npos ? "" : line.substr(space + 1);
    std::string why;
    if (kind == "system") {
      if (!SplitWords(rest, &state->system)) why = "bad words";
      for (const auto& [key, value] : state->system) {
        unsigned long long n;
        if (key == "cuda" && !ParseNumber(value, &n)) why = "bad number for cuda";
        if (key != "cuda" && key != "driver") why = "unknown system key " + key;
      }
    } else if (kind == "gpu") {
      nv::nvmlDevice_st& gpu = state->gpus.emplace_back();
      why = SplitWords(rest, &gpu.values) ? CheckGpu(&gpu) : "bad words";
    } else {
      why = "a line is system or gpu";
    }
    if (!why.empty()) {
      std::fprintf(stderr, "fake NVML: %s line %d: %s\n", path, number, why.c_str());
      state->system.clear();
      state->gpus.clear();
      return nv::kErrorUnknown;
    }
  }
  return nv::kSuccess;
}

// The GPU behind a handle, or null for a handle the fake never gave out (or NVML not initialized).
nv::nvmlDevice_st* Gpu(nv::nvmlDevice_t device) {
  for (nv::nvmlDevice_st& gpu : State().gpus) {
    if (&gpu == device) return &gpu;
  }
  return nullptr;
}

// The key's number (0 when absent: the caller has checked the key that enables the function).
unsigned long long Number(const nv::nvmlDevice_st& gpu, const char* key) {
  unsigned long long n = 0;
  if (const std::string* v = Value(gpu.values, key)) ParseNumber(*v, &n);
  return n;
}

// Copies a string out as NVML does: the whole of it and its NUL, or INSUFFICIENT_SIZE.
nv::nvmlReturn_t CopyOut(const std::string* value, char* buffer, unsigned int length) {
  if (value == nullptr) return nv::kErrorNotSupported;
  if (buffer == nullptr) return nv::kErrorInvalidArgument;
  if (length < value->size() + 1) return nv::kErrorInsufficientSize;
  std::memcpy(buffer, value->c_str(), value->size() + 1);
  return nv::kSuccess;
}

// The GPU for a device call with one output, or the error the call answers: NOT_SUPPORTED where
// the GPU's line lacks `key` (null: the call needs none).
nv::nvmlReturn_t Check(nv::nvmlDevice_t device, const void* out, const char* key,
                       nv::nvmlDevice_st** gpu) {
  if (State().init_count == 0) return nv::kErrorUninitialized;
  *gpu = Gpu(device);
  if (*gpu == nullptr || out == nullptr) return nv::kErrorInvalidArgument;
  if (key != nullptr && !Value((*gpu)->values, key)) return nv::kErrorNotSupported;
  return nv::kSuccess;
}

// The functions that report one key as one unsigned int.
nv::nvmlReturn_t ReportKey(nv::nvmlDevice_t device, const char* key, unsigned int* out) {
  nv::nvmlDevice_st* gpu;
  if (nv::nvmlReturn_t rc = Check(device, out, key, &gpu); rc != nv::kSuccess) return rc;
  *out = static_cast<unsigned int>(Number(*gpu, key));
  return nv::kSuccess;
}

}  // namespace

// Declared through the loader's own types: a definition below that differs from the ABI the
// loader expects is a compile error (a second C function of the same name).
extern "C" {
nv::nvmlInit_v2_fn nvmlInit_v2;
nv::nvmlShutdown_fn nvmlShutdown;
nv::nvmlErrorString_fn nvmlErrorString;
nv::nvmlSystemGetDriverVersion_fn nvmlSystemGetDriverVersion;
nv::nvmlSystemGetCudaDriverVersion_fn nvmlSystemGetCudaDriverVersion;
nv::nvmlDeviceGetCount_v2_fn nvmlDeviceGetCount_v2;
nv::nvmlDeviceGetHandleByIndex_v2_fn nvmlDeviceGetHandleByIndex_v2;
nv::nvmlDeviceGetName_fn nvmlDeviceGetName;
nv::nvmlDeviceGetUUID_fn nvmlDeviceGetUUID;
nv::nvmlDeviceGetPciInfo_v3_fn nvmlDeviceGetPciInfo_v3;
nv::nvmlDeviceGetCudaComputeCapability_fn nvmlDeviceGetCudaComputeCapability;
nv::nvmlDeviceGetAttributes_v2_fn nvmlDeviceGetAttributes_v2;
nv::nvmlDeviceGetMemoryInfo_fn nvmlDeviceGetMemoryInfo;
nv::nvmlDeviceGetUtilizationRates_fn nvmlDeviceGetUtilizationRates;
nv::nvmlDeviceGetTemperature_fn nvmlDeviceGetTemperature;
nv::nvmlDeviceGetPowerUsage_fn nvmlDeviceGetPowerUsage;
nv::nvmlDeviceGetClockInfo_fn nvmlDeviceGetClockInfo;
nv::nvmlDeviceGetTotalEccErrors_fn nvmlDeviceGetTotalEccErrors;
nv::nvmlDeviceGetRetiredPages_fn nvmlDeviceGetRetiredPages;
nv::nvmlDeviceGetRemappedRows_fn nvmlDeviceGetRemappedRows;
nv::nvmlDeviceGetPersistenceMode_fn nvmlDeviceGetPersistenceMode;
nv::nvmlEventSetCreate_fn nvmlEventSetCreate;
nv::nvmlDeviceRegisterEvents_fn nvmlDeviceRegisterEvents;
nv::nvmlEventSetWait_v2_fn nvmlEventSetWait_v2;
nv::nvmlEventSetFree_fn nvmlEventSetFree;
int fake_nvml_open_objects();

int fake_nvml_open_objects() {
  return State().init_count + static_cast<int>(State().event_sets.size());
}

nv::nvmlReturn_t nvmlInit_v2() {
  FakeState& state = State();
  if (state.init_count == 0) {
    if (const nv::nvmlReturn_t rc = ReadFile(&state); rc != nv::kSuccess) return rc;
  }
  ++state.init_count;
  return nv::kSuccess;
}

nv::nvmlReturn_t nvmlShutdown() {
  FakeState& state = State();
  if (state.init_count == 0) return nv::kErrorUninitialized;
  if (--state.init_count == 0) {
    state.system.clear();
    state.gpus.clear();
  }
  return nv::kSuccess;
}

const char* nvmlErrorString(nv::nvmlReturn_t result) {
  static constexpr struct {
    nv::nvmlReturn_t code;
    const char* text;  // NVML's own wording
  } kTexts[] = {{nv::kSuccess, "Success"},
                {nv::kErrorUninitialized, "Uninitialized"},
                {nv::kErrorInvalidArgument, "Invalid Argument"},
                {nv::kErrorNotSupported, "Not Supported"},
                {nv::kErrorInsufficientSize, "Insufficient Size"},
                {nv::kErrorDriverNotLoaded, "Driver Not Loaded"},
                {nv::kErrorTimeout, "Timeout"},
                {nv::kErrorGpuIsLost, "GPU is lost"},
                {nv::kErrorResetRequired, "GPU requires reset"}};
  for (const auto& t : kTexts) {
    if (t.code == result) return t.text;
  }
  return "Unknown Error";
}

nv::nvmlReturn_t nvmlSystemGetDriverVersion(char* version, unsigned int length) {
  if (State().init_count == 0) return nv::kErrorUninitialized;
  return CopyOut(Value(State().system, "driver"), version, length);
}

nv::nvmlReturn_t nvmlSystemGetCudaDriverVersion(int* version) {
  if (State().init_count == 0) return nv::kErrorUninitialized;
  const std::string* v = Value(State().system, "cuda");
  if (v == nullptr) return nv::kErrorNotSupported;
  if (version == nullptr) return nv::kErrorInvalidArgument;
  *version = std::atoi(v->c_str());
  return nv::kSuccess;
}

nv::nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int* count) {
  if (State().init_count == 0) return nv::kErrorUninitialized;
  if (count == nullptr) return nv::kErrorInvalidArgument;
  *count = static_cast<unsigned int>(State().gpus.size());
  return nv::kSuccess;
}

nv::nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nv::nvmlDevice_t* device) {
  FakeState& state = State();
  if (state.init_count == 0) return nv::kErrorUninitialized;
  if (device == nullptr || index >= state.gpus.size()) return nv::kErrorInvalidArgument;
  if (Number(state.gpus[index], "lost") != 0) return nv::kErrorGpuIsLost;
  *device = &state.gpus[index];
  return nv::kSuccess;
}

nv::nvmlReturn_t nvmlDeviceGetName(nv::nvmlDevice_t device, char* name, unsigned int length) {
  nv::nvmlDevice_st* gpu;
  if (nv::nvmlReturn_t rc = Check(device, name, nullptr, &gpu); rc != nv::kSuccess) return rc;
  return CopyOut(Value(gpu->values, "name"), name, length);
}

nv::nvmlReturn_t nvmlDeviceGetUUID(nv::nvmlDevice_t device, char* uuid, unsigned int length) {
  nv::nvmlDevice_st* gpu;
  if (nv::nvmlReturn_t rc = Check(device, uuid, nullptr, &gpu); rc != nv::kSuccess) return rc;
  return CopyOut(Value(gpu->values, "uuid"), uuid, length);
}

nv::nvmlReturn_t nvmlDeviceGetPciInfo_v3(nv::nvmlDevice_t device, nv::nvmlPciInfo_t* pci) {
  nv::nvmlDevice_st* gpu;
  if (nv::nvmlReturn_t rc = Check(device, pci, nullptr, &gpu); rc != nv::kSuccess) return rc;
  *pci = {};
  return CopyOut(Value(gpu->values, "pci"), pci->busId, sizeof pci->busId);
}

nv::nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nv::nvmlDevice_t device, int* major,
                                                    int* minor) {
  nv::nvmlDevice_st* gpu;
  if (nv::nvmlReturn_t rc = Check(device, major, nullptr, &gpu); rc != nv::kSuccess) return rc;
  const std::string* cc = Value(gpu->values, "cc");
  if (cc == nullptr) return nv::kErrorNotSupported;
  if (minor == nullptr) return nv::kErrorInvalidArgument;
  *major = std::atoi(cc->c_str());
  *minor = std::atoi(cc->c_str() + cc->find('.') + 1);
  return nv::kSuccess;
}

nv::nvmlReturn_t nvmlDeviceGetAttributes_v2(nv::nvmlDevice_t device,
                                            nv::nvmlDeviceAttributes_t* attributes) {
  nv::nvmlDevice_st* gpu;
  if (nv::nvmlReturn_t rc = Check(device, attributes, "sms", &gpu); rc != nv::kSuccess) return rc;
  *attributes = {};
  attributes->multiprocessorCount = static_cast<unsigned int>(Number(*gpu, "sms"));
  attributes->memorySizeMB = Number(*gpu, "mem_total_mib");
  return nv::kSuccess;
}

nv::nvmlReturn_t nvmlDeviceGetMemoryInfo(nv::nvmlDevice_t device, nv::nvmlMemory_t* memory) {
  nv::nvmlDevice_st* gpu;
  if (nv::nvmlReturn_t rc = Check(device, memory, "mem_total_mib", &gpu); rc != nv::kSuccess) {
    return rc;
  }
  memory->total = Number(*gpu, "mem_total_mib") << 20;
  memory->used = Number(*gpu, "mem_used_mib") << 20;
  memory->free = memory->total - memory->used;
  return nv::kSuccess;
}

nv::nvmlReturn_t nvmlDeviceGetUtilizationRates(nv::nvmlDevice_t device,
                                               nv::nvmlUtilization_t* utilization) {
  nv::nvmlDevice_st* gpu;
  if (nv::nvmlReturn_t rc = Check(device, utilization, "util", &gpu); rc != nv::kSuccess) return rc;
  utilization->gpu = static_cast<unsigned int>(Number(*gpu, "util"));
  utilization->memory = static_cast<unsigned int>(Number(*gpu, "mem_util"));
  return nv::kSuccess;
}

nv::nvmlReturn_t nvmlDeviceGetTemperature(nv::nvmlDevice_t device, int sensor,
                                          unsigned int* temperature) {
  if (sensor != nv::kTemperatureGpu) return nv::kErrorInvalidArgument;
  return ReportKey(device, "temp", temperature);
}

nv::nvmlReturn_t nvmlDeviceGetPowerUsage(nv::nvmlDevice_t device, unsigned int* milliwatts) {
  return ReportKey(device, "power_mw", milliwatts);
}

nv::nvmlReturn_t nvmlDeviceGetClockInfo(nv::nvmlDevice_t device, int type, unsigned int* mhz) {
  if (type == nv::kClockSm) return ReportKey(device, "sm_clock", mhz);
  if (type == nv::kClockMem) return ReportKey(device, "mem_clock", mhz);
  return nv::kErrorNotSupported;  // graphics and video clocks: nothing in the file
}

nv::nvmlReturn_t nvmlDeviceGetTotalEccErrors(nv::nvmlDevice_t device, int error_type,
                                             int counter_type, unsigned long long* count) {
  nv::nvmlDevice_st* gpu;
  if (nv::nvmlReturn_t rc = Check(device, count, "ecc", &gpu); rc != nv::kSuccess) return rc;
  if (error_type < 0 || error_type > 1 || counter_type < 0 || counter_type > 1) {
    return nv::kErrorInvalidArgument;
  }
  // Only the volatile uncorrected counter is in the file; the others read 0, so a loader that
  // asks for the wrong one sees a different number.
  const bool asked = error_type == nv::kMemoryErrorUncorrected && counter_type == nv::kVolatileEcc;
  *count = asked ? Number(*gpu, "ecc") : 0;
  return nv::kSuccess;
}

nv::nvmlReturn_t nvmlDeviceGetRetiredPages(nv::nvmlDevice_t device, int cause,
                                           unsigned int* page_count,
                                           unsigned long long* addresses) {
  nv::nvmlDevice_st* gpu;
  if (nv::nvmlReturn_t rc = Check(device, page_count, nullptr, &gpu); rc != nv::kSuccess) return rc;
  if (!Value(gpu->values, "retired_sbe") && !Value(gpu->values, "retired_dbe")) {
    return nv::kErrorNotSupported;
  }
  if (cause != nv::kRetiredSingleBitEcc && cause != nv::kRetiredDoubleBitEcc) {
    return nv::kErrorInvalidArgument;
  }
  const unsigned long long pages =
      Number(*gpu, cause == nv::kRetiredSingleBitEcc ? "retired_sbe" : "retired_dbe");
  if (*page_count < pages) {
    *page_count = static_cast<unsigned int>(pages);
    return nv::kErrorInsufficientSize;
  }
  if (pages > 0 && addresses == nullptr) return nv::kErrorInvalidArgument;
  for (unsigned long long i = 0; i < pages; ++i) addresses[i] = (i + 1) << 12;
  *page_count = static_cast<unsigned int>(pages);
  return nv::kSuccess;
}

nv::nvmlReturn_t nvmlDeviceGetRemappedRows(nv::nvmlDevice_t device, unsigned int* corrected,
                                           unsigned int* uncorrected, unsigned int* pending,
                                           unsigned int* failed) {
  if (!corrected || !uncorrected || !failed) return nv::kErrorInvalidArgument;
  *corrected = *uncorrected = *failed = 0;
  return ReportKey(device, "remap_pending", pending);
}

nv::nvmlReturn_t nvmlDeviceGetPersistenceMode(nv::nvmlDevice_t device, int* mode) {
  unsigned int value = 0;
  if (mode == nullptr) return nv::kErrorInvalidArgument;
  const nv::nvmlReturn_t rc = ReportKey(device, "persistence", &value);
  if (rc == nv::kSuccess) *mode = static_cast<int>(value);
  return rc;
}

nv::nvmlReturn_t nvmlEventSetCreate(nv::nvmlEventSet_t* set) {
  if (State().init_count == 0) return nv::kErrorUninitialized;
  if (set == nullptr) return nv::kErrorInvalidArgument;
  *set = new nv::nvmlEventSet_st();
  State().event_sets.insert(*set);
  return nv::kSuccess;
}

// Registering a GPU queues its file's XIDs on the set, as if they happened right after.
nv::nvmlReturn_t nvmlDeviceRegisterEvents(nv::nvmlDevice_t device, unsigned long long types,
                                          nv::nvmlEventSet_t set) {
  nv::nvmlDevice_st* gpu;
  if (!State().event_sets.count(set)) return nv::kErrorInvalidArgument;
  if (nv::nvmlReturn_t rc = Check(device, set, "xid", &gpu); rc != nv::kSuccess) return rc;
  if (types & nv::kEventTypeXidCriticalError) {
    for (unsigned long long xid : gpu->xids) {
      set->queue.push_back({device, nv::kEventTypeXidCriticalError, xid, 0xFFFFFFFF, 0xFFFFFFFF});
    }
  }
  return nv::kSuccess;
}

// Never sleeps: an empty queue answers TIMEOUT at once, whatever the timeout.
nv::nvmlReturn_t nvmlEventSetWait_v2(nv::nvmlEventSet_t set, nv::nvmlEventData_t* data,
                                     unsigned int /*timeout_ms*/) {
  if (State().init_count == 0) return nv::kErrorUninitialized;
  if (data == nullptr || !State().event_sets.count(set)) return nv::kErrorInvalidArgument;
  if (set->queue.empty()) return nv::kErrorTimeout;
  *data = set->queue.front();
  set->queue.pop_front();
  return nv::kSuccess;
}

nv::nvmlReturn_t nvmlEventSetFree(nv::nvmlEventSet_t set) {
  if (State().init_count == 0) return nv::kErrorUninitialized;
  if (!State().event_sets.erase(set)) return nv::kErrorInvalidArgument;
  delete set;
  return nv::kSuccess;
}

}  // extern "C"
