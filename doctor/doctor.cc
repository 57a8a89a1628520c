#include "doctor/doctor.h"

#include <algorithm>
#include <cinttypes>
#include <map>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "agent/log_relay.h"
#include "probes/devices.h"
#include "google/protobuf/util/json_util.h"

namespace launch {
namespace {

constexpr uint64_t kMiB = 1024ull * 1024;
constexpr uint64_t kGiB = 1024 * kMiB;

// /dev/shm per worker: DataLoader workers hand every batch over through it and NCCL's intra-node
// transport keeps its buffers there. Below the first the run is likely to die with "Bus error";
// below the second, large batches or many loader workers will.
constexpr uint64_t kShmPerWorkerMinimum = 128 * kMiB;
constexpr uint64_t kShmPerWorkerAdvised = 1 * kGiB;
// Open files: torch.multiprocessing passes DataLoader tensors as descriptors, so a low limit ends
// in "Too many open files" however few workers launch itself needs.
constexpr uint64_t kOpenFilesAdvised = 8192;
// A GPU this busy before the run starts belongs to someone else.
constexpr int kBusyUtilizationPercent = 10;
constexpr int kBusyMemoryPercent = 10;
// NVIDIA's guidance: a GPU with this many retired pages is due for replacement.
constexpr int kRetiredPagesReplace = 60;
// Directories: less free space than this will not hold a run's logs or a checkpoint.
constexpr uint64_t kLogDirFreeAdvised = 1 * kGiB;
constexpr uint64_t kCheckpointDirFreeAdvised = 10 * kGiB;

std::string Bytes(uint64_t bytes) {
  if (bytes >= kGiB) return absl::StrFormat("%.1f GiB", static_cast<double>(bytes) / kGiB);
  return absl::StrFormat("%d MiB", bytes / kMiB);
}

std::string Plural(uint64_t n, const char* one, const char* many) { return absl::StrCat(n, " ", n == 1 ? one : many); }

std::string FormatCpuList(std::vector<int> cpus) {
  std::sort(cpus.begin(), cpus.end());
  std::vector<std::string> parts;
  for (size_t i = 0; i < cpus.size();) {
    size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    parts.push_back(j == i ? std::to_string(cpus[i]) : absl::StrCat(cpus[i], "-", cpus[j]));
    i = j + 1;
  }
  return parts.empty() ? "none" : absl::StrJoin(parts, ",");
}

// The oldest driver branch for each CUDA major (NVIDIA's compatibility table), for fix lines.
std::string DriverForCuda(int cuda_version) {
  static const std::map<int, const char*> kMinimum = {{11, "R450"}, {12, "R525"}, {13, "R580"}};
  auto it = kMinimum.find(cuda_version / 1000);
  if (it == kMinimum.end()) return absl::StrCat("a driver for CUDA ", CudaVersionText(cuda_version));
  return absl::StrCat(it->second, " or newer (CUDA ", cuda_version / 1000, ".x)");
}

// The first CUDA release that compiles for an architecture (sm_XY as XY), for fix lines.
std::string CudaForArch(int arch) {
  static const std::map<int, const char*> kFirst = {{70, "9.0"},   {75, "10.0"},  {80, "11.0"},  {86, "11.1"},
                                                    {87, "11.4"},  {89, "11.8"},  {90, "11.8"},  {100, "12.8"},
                                                    {101, "12.8"}, {103, "12.9"}, {120, "12.8"}, {121, "12.9"}};
  auto it = kFirst.find(arch);
  return it == kFirst.end() ? "" : it->second;
}

struct Arch {
  int number = 0;         // 90 for sm_90
  bool ptx = false;       // compute_XY
  bool specific = false;  // sm_90a / sm_100f: that capability only
};

std::optional<Arch> ParseArch(const std::string& name) {
  Arch a;
  absl::string_view s = name;
  if (absl::ConsumePrefix(&s, "compute_")) {
    a.ptx = true;
  } else if (!absl::ConsumePrefix(&s, "sm_")) {
    return std::nullopt;
  }
  if (!s.empty() && absl::ascii_isalpha(static_cast<unsigned char>(s.back()))) {
    a.specific = true;
    s.remove_suffix(1);
  }
  if (!absl::SimpleAtoi(s, &a.number) || a.number <= 0 || a.number >= 10000) return std::nullopt;
  return a;
}

// "sm_50, sm_60, ..., sm_86" as a short range where the list is long.
std::string ArchSummary(const std::vector<std::string>& archs) {
  if (archs.size() <= 12) return absl::StrJoin(archs, ", ");
  return absl::StrCat(archs.front(), ", ", archs[1], ", ... ", archs.back(), " (", archs.size(), ")");
}

std::string TorchName(const TorchFacts& t, bool python) {
  return absl::StrCat(python ? "Python torch " : "LibTorch ", t.version);
}

struct Context {
  const DoctorFacts& f;
  std::vector<GpuInfo> infos;  // every GPU NVML shows
  std::set<int> pool;          // NVML indices the workers would use
  std::string pool_error;      // the pool could not be chosen (bad CUDA_VISIBLE_DEVICES)
  int nproc = 1;
  // The torches asked about and found, with whether each is Python's.
  std::vector<std::pair<const TorchFacts*, bool>> torches;
  bool GpusUsable() const { return f.nvml_loaded && !pool.empty(); }
};

Context MakeContext(const DoctorFacts& f) {
  Context c{f, {}, {}, {}, 1, {}};
  for (const GpuFigures& g : f.gpus) c.infos.push_back(GpuInfoFrom(g));
  if (f.request.gpu_pool) {
    c.pool.insert(f.request.gpu_pool->begin(), f.request.gpu_pool->end());
  } else if (f.nvml_loaded) {
    GpuSelection sel;
    if (f.cuda_visible_devices_set) sel.inherited_cuda_visible_devices = f.inherited_cuda_visible_devices;
    sel.exclude = f.request.exclude_gpus;
    auto pool = SelectGpuPool(c.infos, sel);
    if (pool.ok()) {
      for (const GpuInfo& g : pool->gpus) c.pool.insert(g.index);
    } else {
      c.pool_error = std::string(pool.status().message());
    }
  }
  // A lost GPU is in no pool: nothing can run on it.
  for (const GpuFigures& g : f.gpus) {
    if (!g.error.empty()) c.pool.erase(g.index);
  }
  c.nproc = f.request.nproc ? *f.request.nproc : std::max<int>(1, static_cast<int>(c.pool.size()));
  if (f.request.check_libtorch && f.libtorch.found) c.torches.push_back({&f.libtorch, false});
  if (f.request.check_python && f.python_torch.found) c.torches.push_back({&f.python_torch, true});
  return c;
}

// ---- Driver and CUDA ----

DoctorRow DriverRow(const Context& c) {
  const DoctorFacts& f = c.f;
  if (!f.nvml_loaded) {
    return {"driver", CheckStatus::kNotApplicable, f.nvml_error,
            "install the NVIDIA driver (nvidia-smi must work) to train on GPUs"};
  }
  std::string found = absl::StrCat("driver ",
                                   f.driver.driver_version.empty() ? "(version unknown)" : f.driver.driver_version);
  if (f.driver.cuda_driver_version > 0)
    absl::StrAppend(&found, ", supports CUDA up to ", CudaVersionText(f.driver.cuda_driver_version));
  absl::StrAppend(&found, ", ", Plural(f.gpus.size(), "GPU", "GPUs"));
  if (f.gpus.empty()) {
    return {"driver", CheckStatus::kWarn, absl::StrCat(found, ": the driver sees no GPU"),
            "check `nvidia-smi` and `dmesg | grep -i nvrm` (a GPU that fell off the bus needs a "
            "reboot)"};
  }
  return {"driver", CheckStatus::kOk, found, ""};
}

// The driver against every CUDA version that must run on it.
DoctorRow DriverCudaRow(const Context& c) {
  const DoctorFacts& f = c.f;
  const int driver = f.driver.cuda_driver_version;
  if (!f.nvml_loaded || driver <= 0) {
    return {"driver.cuda", CheckStatus::kNotApplicable,
            f.nvml_loaded ? "the driver does not say which CUDA it supports"
                          : "no driver to compare CUDA versions with",
            ""};
  }
  DoctorRow row{"driver.cuda", CheckStatus::kOk, "", ""};
  std::vector<std::string> parts = {absl::StrCat("the driver supports CUDA ", CudaVersionText(driver))};
  // must_run: what cannot start on an older driver (a torch), as against what is merely installed;
  // major_only: only the major is known (a LibTorch's libcudart soname).
  auto compare = [&](const std::string& what, int needed, bool must_run, bool major_only) {
    if (needed <= 0) return;
    if (needed / 1000 > driver / 1000) {
      parts.push_back(absl::StrCat(what, " needs CUDA ", CudaVersionText(needed), ": too new for this driver"));
      const CheckStatus s = must_run ? CheckStatus::kFail : CheckStatus::kWarn;
      if (s > row.status) {
        row.status = s;
        row.fix = absl::StrCat("update the NVIDIA driver to ", DriverForCuda(needed));
      }
    } else if (!major_only && needed > driver) {
      parts.push_back(absl::StrCat(what, " is CUDA ", CudaVersionText(needed),
                                   ": runs through minor-version compatibility, without PTX JIT"));
      if (row.status < CheckStatus::kWarn) {
        row.status = CheckStatus::kWarn;
        row.fix = absl::StrCat("update the NVIDIA driver to one for CUDA ", CudaVersionText(needed), " or newer");
      }
    } else {
      parts.push_back(absl::StrCat(what, " (CUDA ", CudaVersionText(needed), ") ok"));
    }
  };
  for (const auto& [t, python] : c.torches) {
    if (t->cuda) {
      compare(TorchName(*t, python), ParseCudaVersionText(t->cuda_version), true,
              t->cuda_version.find('.') == std::string::npos);
    }
  }
  if (f.cuda.runtime.found)
    compare(absl::StrCat("libcudart ", f.cuda.runtime.path), f.cuda.runtime.version, false, false);
  if (!f.cuda.toolkit_root.empty()) compare("the CUDA toolkit", f.cuda.toolkit_version, false, false);
  row.found = absl::StrJoin(parts, "; ");
  return row;
}

DoctorRow ToolkitRow(const Context& c) {
  const CudaFacts& cuda = c.f.cuda;
  if (cuda.toolkit_root.empty()) {
    return {"cuda.toolkit", CheckStatus::kNotApplicable,
            "no CUDA toolkit (CUDA_HOME, CUDA_PATH, /usr/local/cuda, nvcc on PATH); needed only to "
            "compile CUDA code",
            ""};
  }
  DoctorRow row{"cuda.toolkit", CheckStatus::kOk,
                cuda.toolkit_version > 0
                    ? absl::StrCat("CUDA ", CudaVersionText(cuda.toolkit_version), " toolkit at ", cuda.toolkit_root)
                    : absl::StrCat("a CUDA toolkit at ", cuda.toolkit_root, " (no include/cuda.h: version unknown)"),
                ""};
  // Extensions built with nvcc against torch must use torch's CUDA major (cpp_extension checks).
  for (const auto& [t, python] : c.torches) {
    const int torch_cuda = t->cuda ? ParseCudaVersionText(t->cuda_version) : 0;
    if (torch_cuda > 0 && cuda.toolkit_version > 0 && torch_cuda / 1000 != cuda.toolkit_version / 1000) {
      row.status = CheckStatus::kWarn;
      absl::StrAppend(&row.found, "; ", TorchName(*t, python), " is built for CUDA ", t->cuda_version,
                      ": CUDA code compiled with this toolkit will not link or load with it");
      row.fix = absl::StrCat("install a CUDA ", torch_cuda / 1000, ".x toolkit and point CUDA_HOME at it");
    }
  }
  return row;
}

DoctorRow LibraryRow(const char* id, const char* name, const LoadedLibrary& lib, const std::string& version,
                     const char* needed_for) {
  if (!lib.found) {
    return {id, CheckStatus::kNotApplicable, absl::StrCat("no ", name, " (", lib.error, "); needed for ", needed_for),
            ""};
  }
  if (lib.version <= 0) {
    return {id, CheckStatus::kWarn, absl::StrCat(name, " at ", lib.path, " did not tell its version"),
            absl::StrCat("reinstall ", name, ": this one may be damaged or not NVIDIA's")};
  }
  return {id, CheckStatus::kOk, absl::StrCat(name, " ", version, " at ", lib.path), ""};
}

DoctorRow CudnnRow(const Context& c) {
  const CudaFacts& cuda = c.f.cuda;
  DoctorRow row = LibraryRow("cudnn", "cuDNN", cuda.cudnn, CudnnVersionText(cuda.cudnn.version),
                             "convolutions on GPUs");
  if (row.status != CheckStatus::kOk || cuda.cudnn_cuda_version <= 0) return row;
  absl::StrAppend(&row.found, ", built for CUDA ", CudaVersionText(cuda.cudnn_cuda_version));
  if (cuda.runtime.version > 0 && cuda.runtime.version / 1000 != cuda.cudnn_cuda_version / 1000) {
    row.status = CheckStatus::kWarn;
    absl::StrAppend(&row.found, ", but the CUDA runtime is ", CudaVersionText(cuda.runtime.version));
    row.fix = absl::StrCat("install the cuDNN build for CUDA ", cuda.runtime.version / 1000, " (e.g. cudnn9-cuda-",
                           cuda.runtime.version / 1000, ")");
  }
  return row;
}

DoctorRow TorchRow(const Context& c, const TorchFacts& t, bool python) {
  const char* id = python ? "python.torch" : "libtorch";
  if (!t.found) {
    if (python && !t.error.empty())
      return {id, CheckStatus::kWarn, t.error, "check that the interpreter imports torch: python3 -c 'import torch'"};
    std::string found = python && !t.where.empty() ? absl::StrCat(t.where, ": ", t.missing) : t.missing;
    return {id, CheckStatus::kNotApplicable, found,
            python ? "pip install torch, or set PYTHON_EXEC to a Python that has it (needed for "
                     ".py workers)"
                   : "install LibTorch and add its lib directory to LD_LIBRARY_PATH (needed for "
                     "C++ workers)"};
  }
  DoctorRow row{id, CheckStatus::kOk, absl::StrCat(TorchName(t, python), python ? " in " : " at ", t.where), ""};
  if (!t.cuda) {
    absl::StrAppend(&row.found, ": CPU-only", python ? "" : " (no libtorch_cuda.so)");
  } else {
    absl::StrAppend(&row.found, ": CUDA ", t.cuda_version.empty() ? "(version unknown)" : t.cuda_version);
    if (t.cudnn_version > 0) absl::StrAppend(&row.found, ", cuDNN ", CudnnVersionText(t.cudnn_version));
    if (!t.nccl_version.empty()) absl::StrAppend(&row.found, ", NCCL ", t.nccl_version);
    absl::StrAppend(&row.found, ", kernels ", t.arch_list.empty() ? "unknown" : ArchSummary(t.arch_list));
  }
  if (!t.error.empty()) {
    row.status = CheckStatus::kWarn;
    absl::StrAppend(&row.found, "; ", t.error);
  }
  if (!t.unresolved.empty()) {
    row.status = CheckStatus::kFail;
    absl::StrAppend(&row.found, "; it needs ", absl::StrJoin(t.unresolved, ", "), ", which the loader does not find");
    row.fix = "install them, or add their directory to LD_LIBRARY_PATH";
  } else if (!t.cuda && c.GpusUsable()) {
    row.status = std::max(row.status, CheckStatus::kWarn);
    absl::StrAppend(&row.found, ", so ", python ? ".py" : "C++", " workers cannot use this machine's GPUs");
    row.fix = absl::StrCat("install a CUDA build of ", python ? "torch" : "LibTorch",
                           c.f.driver.cuda_driver_version > 0
                               ? absl::StrCat(" for CUDA ", CudaVersionText(c.f.driver.cuda_driver_version),
                                              " or older")
                               : "");
  }
  return row;
}

// Can torch use GPUs here at all: the one-line answer to "why is torch.cuda.is_available() False".
DoctorRow GpuStackRow(const Context& c) {
  const DoctorFacts& f = c.f;
  std::vector<std::string> cuda_torches, cpu_torches;
  for (const auto& [t, python] : c.torches) {
    (t->cuda ? cuda_torches : cpu_torches).push_back(TorchName(*t, python));
  }
  if (c.GpusUsable()) {
    if (!cuda_torches.empty()) {
      return {"gpu.stack", CheckStatus::kOk,
              absl::StrCat(Plural(c.pool.size(), "GPU", "GPUs"), " for ", absl::StrJoin(cuda_torches, " and "),
                           " (CUDA)"),
              ""};
    }
    const std::string fix = absl::StrCat("install a CUDA build of torch for CUDA ",
                                         CudaVersionText(f.driver.cuda_driver_version), " or older");
    if (cpu_torches.empty()) {
      return {"gpu.stack", CheckStatus::kWarn,
              absl::StrCat(Plural(c.pool.size(), "GPU", "GPUs"), ", but no torch was found to use them"), fix};
    }
    return {"gpu.stack", CheckStatus::kFail,
            absl::StrCat(Plural(c.pool.size(), "GPU", "GPUs"), ", but ", absl::StrJoin(cpu_torches, " and "),
                         cpu_torches.size() == 1 ? " is" : " are", " CPU-only: the GPUs cannot be used"),
            fix};
  }
  // No GPU to use: say so plainly where CUDA pieces are installed for nothing.
  std::vector<std::string> installed;
  const CudaFacts& cuda = f.cuda;
  if (cuda.toolkit_version > 0)
    installed.push_back(absl::StrCat("a CUDA ", CudaVersionText(cuda.toolkit_version), " toolkit"));
  else if (!cuda.toolkit_root.empty()) installed.push_back("a CUDA toolkit");
  if (cuda.runtime.found && cuda.runtime.version > 0 && cuda.runtime.version != cuda.toolkit_version) {
    installed.push_back(absl::StrCat("CUDA runtime ", CudaVersionText(cuda.runtime.version)));
  }
  if (cuda.nccl.found) installed.push_back(absl::StrCat("NCCL ", NcclVersionText(cuda.nccl.version)));
  if (cuda.cudnn.found) installed.push_back(absl::StrCat("cuDNN ", CudnnVersionText(cuda.cudnn.version)));
  for (const auto& t : cuda_torches) installed.push_back(absl::StrCat(t, " (CUDA)"));
  const std::string no_gpu = !f.nvml_loaded          ? "there is no NVIDIA driver"
                             : !c.pool_error.empty() ? "no GPU can be chosen"
                             : f.gpus.empty()        ? "the driver sees no GPU"
                                                     : "no GPU is left in the pool";
  if (installed.empty()) {
    return {"gpu.stack", CheckStatus::kNotApplicable,
            absl::StrCat("a CPU machine: ", no_gpu, " and no CUDA libraries are installed"), ""};
  }
  std::string found = installed.size() == 1 ? absl::StrCat(installed.front(), " is")
                                            : absl::StrCat(absl::StrJoin(installed.begin(), installed.end() - 1, ", "),
                                                           " and ", installed.back(), " are");
  absl::StrAppend(&found, " installed, but ", no_gpu);
  if (!cpu_torches.empty()) {
    absl::StrAppend(&found, " and ", absl::StrJoin(cpu_torches, " and "), cpu_torches.size() == 1 ? " is" : " are",
                    " CPU-only");
  }
  std::string fix;
  // CUDA libraries beside CPU-only torches on a machine without a driver: a CPU machine, which is
  // ready for a CPU run (n-a, exit 0), still told what GPUs would take.
  CheckStatus status = cuda_torches.empty() && !f.nvml_loaded ? CheckStatus::kNotApplicable : CheckStatus::kWarn;
  if (cuda_torches.empty()) {
    absl::StrAppend(&found, ": GPUs could not be used even with a driver");
    const char* torch = !f.request.check_python     ? "LibTorch"
                        : !f.request.check_libtorch ? "torch"
                                                    : "LibTorch or torch";
    fix = absl::StrCat("to use GPUs: install the NVIDIA driver and a CUDA build of ", torch,
                       cuda.toolkit_version > 0
                           ? absl::StrCat(" (for CUDA ", CudaVersionText(cuda.toolkit_version), ")")
                           : "");
  } else {
    absl::StrAppend(&found, ": GPUs cannot be used");
    fix = f.nvml_loaded ? "check `nvidia-smi`, CUDA_VISIBLE_DEVICES and --exclude-gpus" : "install the NVIDIA driver";
  }
  return {"gpu.stack", status, found, fix};
}

// ---- GPUs ----

bool InPool(const Context& c, int index) { return c.pool.count(index) > 0; }

DoctorRow GpuRow(const Context& c, const GpuFigures& g, int numa_node) {
  const std::string id = absl::StrCat("gpu.", g.index);
  if (!g.error.empty()) {
    return {id, CheckStatus::kFail, absl::StrCat("GPU ", g.index, " ", g.name, ": ", g.error),
            absl::StrCat("reset it (nvidia-smi -r -i ", g.index, ") or reboot; drain the node if it comes back")};
  }
  std::string found = absl::StrCat("GPU ", g.index, " ", g.name.empty() ? "(no name)" : g.name);
  if (!g.uuid.empty()) absl::StrAppend(&found, ", ", g.uuid);
  if (g.memory_total_bytes > 0) {
    absl::StrAppend(&found, ", ", Bytes(static_cast<uint64_t>(g.memory_total_bytes)));
    if (g.memory_used_bytes >= 0)
      absl::StrAppend(&found, " (", Bytes(static_cast<uint64_t>(g.memory_used_bytes)), " used)");
  }
  if (g.compute_capability_major >= 0) {
    absl::StrAppend(&found, ", compute capability ", g.compute_capability_major, ".", g.compute_capability_minor);
  }
  if (g.multiprocessor_count > 0) absl::StrAppend(&found, ", ", g.multiprocessor_count, " SMs");
  if (numa_node >= 0) absl::StrAppend(&found, ", NUMA node ", numa_node);
  if (!InPool(c, g.index)) {
    return {id, CheckStatus::kNotApplicable,
            absl::StrCat(found, ": not in the pool (CUDA_VISIBLE_DEVICES, --exclude-gpus)"), ""};
  }
  const bool busy_compute = g.utilization_percent >= kBusyUtilizationPercent;
  const bool busy_memory = g.memory_total_bytes > 0 &&
                           g.memory_used_bytes * 100 >= g.memory_total_bytes * kBusyMemoryPercent;
  if (busy_compute || busy_memory) {
    return {id, CheckStatus::kWarn,
            absl::StrCat(found, ": in use before the run, ", std::max(0, g.utilization_percent),
                         "% busy; another process shares it and every step would wait for it"),
            absl::StrCat("stop the other process (nvidia-smi lists it) or --exclude-gpus ", g.index)};
  }
  absl::StrAppend(&found, g.utilization_percent >= 0 ? absl::StrCat(": idle (", g.utilization_percent, "% busy)") : "");
  return {id, CheckStatus::kOk, found, ""};
}

DoctorRow KernelRow(const Context& c, const GpuFigures& g) {
  const std::string id = absl::StrCat("gpu.", g.index, ".kernels");
  if (g.compute_capability_major < 0) {
    return {id, CheckStatus::kNotApplicable,
            absl::StrCat("GPU ", g.index, ": NVML does not tell its compute capability"), ""};
  }
  const int arch = g.compute_capability_major * 10 + g.compute_capability_minor;
  const std::string sm = absl::StrCat("sm_", arch);
  std::vector<std::string> has, lacks, unknown;
  for (const auto& [t, python] : c.torches) {
    if (!t->cuda) continue;
    if (t->arch_list.empty()) {
      unknown.push_back(TorchName(*t, python));
    } else if (ArchListRuns(t->arch_list, g.compute_capability_major, g.compute_capability_minor)) {
      has.push_back(TorchName(*t, python));
    } else {
      lacks.push_back(absl::StrCat(TorchName(*t, python), " has only ", ArchSummary(t->arch_list)));
    }
  }
  const std::string gpu = absl::StrCat("GPU ", g.index, " (", g.name, ", ", sm, ")");
  if (!lacks.empty()) {
    const std::string first_cuda = CudaForArch(arch);
    return {id, CheckStatus::kFail,
            absl::StrCat(gpu, ": ", absl::StrJoin(lacks, "; "),
                         ": CUDA error 'no kernel image is available for execution on the device'"),
            absl::StrCat("install a torch built for ", sm,
                         first_cuda.empty() ? "" : absl::StrCat(" (that needs CUDA ", first_cuda, " or newer)"),
                         ", or --exclude-gpus ", g.index)};
  }
  if (has.empty()) {
    return {id, CheckStatus::kNotApplicable,
            absl::StrCat(gpu, ": ",
                         unknown.empty()
                             ? "no CUDA build of torch to run on it"
                             : absl::StrCat("the kernels of ", absl::StrJoin(unknown, ", "), " are unknown")),
            ""};
  }
  return {id, CheckStatus::kOk,
          absl::StrCat(gpu, ": ", absl::StrJoin(has, " and "), " ", has.size() == 1 ? "has" : "have",
                       " kernels for it"),
          ""};
}

// XIDs that mean the GPU (or its memory) is damaged or gone, as opposed to one program's fault.
bool SevereXid(int xid) {
  static const std::set<int> kSevere = {48, 61, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120};
  return kSevere.count(xid) > 0;
}

std::string XidName(int xid) {
  static const std::map<int, const char*> kNames = {{13, "graphics engine exception"},
                                                    {31, "GPU memory page fault"},
                                                    {43, "GPU stopped processing"},
                                                    {45, "preemptive cleanup"},
                                                    {48, "double-bit ECC error"},
                                                    {61, "internal micro-controller breakpoint"},
                                                    {62, "internal micro-controller halt"},
                                                    {63, "ECC page retirement or row remapping event"},
                                                    {64, "ECC page retirement or row remapping failure"},
                                                    {74, "NVLink error"},
                                                    {79, "GPU has fallen off the bus"},
                                                    {92, "high single-bit ECC error rate"},
                                                    {94, "contained ECC error"},
                                                    {95, "uncontained ECC error"},
                                                    {119, "GSP RPC timeout"},
                                                    {120, "GSP error"}};
  auto it = kNames.find(xid);
  return absl::StrCat("XID ", xid, it == kNames.end() ? "" : absl::StrCat(" (", it->second, ")"));
}

DoctorRow HealthRow(const GpuFigures& g) {
  const std::string id = absl::StrCat("gpu.", g.index, ".health");
  DoctorRow row{id, CheckStatus::kOk, "", ""};
  std::vector<std::string> found;
  auto raise = [&](CheckStatus s, const std::string& fix) {
    if (s <= row.status) return;
    row.status = s;
    row.fix = fix;
  };
  const std::string reset = absl::StrCat("reset the GPU (nvidia-smi -r -i ", g.index, ") or reboot");
  if (!g.xids.empty()) {
    std::vector<std::string> names;
    bool severe = false;
    for (int x : g.xids) {
      names.push_back(XidName(x));
      severe = severe || SevereXid(x);
    }
    found.push_back(absl::StrJoin(names, ", "));
    raise(severe ? CheckStatus::kFail : CheckStatus::kWarn,
          severe ? absl::StrCat(reset, "; drain the node if it comes back")
                 : "a program faulted on this GPU: check the last job's logs (dmesg shows the XID)");
  }
  if (g.ecc_uncorrected_errors > 0) {
    found.push_back(absl::StrCat(g.ecc_uncorrected_errors, " uncorrected ECC errors since the driver loaded"));
    raise(CheckStatus::kFail, absl::StrCat(reset, "; drain the node if errors come back"));
  } else if (g.ecc_uncorrected_errors == 0) {
    found.push_back("no uncorrected ECC errors");
  }
  if (g.row_remap_pending == 1) {
    found.push_back("a row remap is pending");
    raise(CheckStatus::kWarn, absl::StrCat("reset the GPU (nvidia-smi -r -i ", g.index, ") to apply the remap"));
  }
  if (g.retired_pages > 0) {
    found.push_back(absl::StrCat(g.retired_pages, " retired pages"));
    raise(g.retired_pages >= kRetiredPagesReplace ? CheckStatus::kFail : CheckStatus::kWarn,
          g.retired_pages >= kRetiredPagesReplace ? "the GPU is due for replacement (NVIDIA: 60 or more retired pages)"
                                                  : "watch it: more retired pages mean failing memory");
  } else if (g.retired_pages == 0) {
    found.push_back("no retired pages");
  }
  if (g.xids.empty()) found.push_back("no XIDs");
  row.found = absl::StrCat("GPU ", g.index, ": ", absl::StrJoin(found, ", "));
  return row;
}

DoctorRow PersistenceRow(const GpuFigures& g) {
  const std::string id = absl::StrCat("gpu.", g.index, ".persistence");
  if (g.persistence_mode < 0) {
    return {id, CheckStatus::kNotApplicable, absl::StrCat("GPU ", g.index, ": persistence mode not reported"), ""};
  }
  if (g.persistence_mode == 1)
    return {id, CheckStatus::kOk, absl::StrCat("GPU ", g.index, ": persistence mode on"), ""};
  return {id, CheckStatus::kWarn,
          absl::StrCat("GPU ", g.index,
                       ": persistence mode off: the driver tears the GPU down between processes, "
                       "so every (re)start of the workers waits seconds to bring it up"),
          "sudo nvidia-smi -pm 1 (or run nvidia-persistenced)"};
}

DoctorRow BalanceRow(const Context& c) {
  std::vector<GpuInfo> pool;
  for (const GpuInfo& g : c.infos) {
    if (InPool(c, g.index)) pool.push_back(g);
  }
  if (pool.size() < 2) {
    return {"gpu.balance", CheckStatus::kNotApplicable,
            absl::StrCat(Plural(pool.size(), "GPU", "GPUs"), " in the pool"), ""};
  }
  if (auto imbalance = FindImbalance(pool)) {
    return {"gpu.balance", CheckStatus::kWarn,
            absl::StrCat("imbalanced: ", imbalance->kinds, "; every step waits for the slowest"),
            absl::StrCat("--exclude-gpus ", imbalance->exclude_list)};
  }
  return {"gpu.balance", CheckStatus::kOk,
          absl::StrCat(pool.size(), " GPUs alike (", pool.front().name, ", ", Bytes(pool.front().memory_bytes),
                       pool.front().sm_count > 0 ? absl::StrCat(", ", pool.front().sm_count, " SMs") : "", ")"),
          ""};
}

// ---- Host ----

DoctorRow ShmRow(const Context& c) {
  const DoctorFacts& f = c.f;
  const uint64_t advised = kShmPerWorkerAdvised * static_cast<uint64_t>(c.nproc);
  const uint64_t advised_gib = std::max<uint64_t>(1, (advised + kGiB - 1) / kGiB);
  const std::string fix = absl::StrCat("mount -o remount,size=", advised_gib,
                                       "G /dev/shm (Docker: --shm-size=", advised_gib, "g or --ipc=host)");
  const std::string workers = Plural(c.nproc, "worker", "workers");
  if (!f.shm_found) {
    return {"shm", CheckStatus::kFail, "no /dev/shm: DataLoader workers and NCCL cannot share memory",
            absl::StrCat("mount -t tmpfs -o size=", advised_gib, "G tmpfs /dev/shm")};
  }
  const std::string found = absl::StrCat("/dev/shm ", Bytes(f.shm_total_bytes), " (", Bytes(f.shm_free_bytes),
                                         " free) for ", workers);
  if (f.shm_free_bytes < kShmPerWorkerMinimum * static_cast<uint64_t>(c.nproc)) {
    return {"shm", CheckStatus::kFail,
            absl::StrCat(found, ": under ", Bytes(kShmPerWorkerMinimum),
                         " a worker; DataLoader workers and NCCL die with 'Bus error'"),
            fix};
  }
  if (f.shm_total_bytes < advised) {
    return {"shm", CheckStatus::kWarn,
            absl::StrCat(found, ": under ", Bytes(kShmPerWorkerAdvised),
                         " a worker; large batches or many loader workers will not fit"),
            fix};
  }
  return {"shm", CheckStatus::kOk, found, ""};
}

DoctorRow CpuRow(const Context& c) {
  const DoctorFacts& f = c.f;
  const ThreadPlan threads = PlanThreads(f.env, f.request.threads_per_worker, f.usable_cpus, c.nproc);
  std::string found = absl::StrCat(Plural(f.usable_cpus, "usable CPU", "usable CPUs"));
  if (f.usable_cpus < f.affinity_cpus)
    absl::StrAppend(&found, " (the cgroup's quota; affinity allows ", f.affinity_cpus, ")");
  absl::StrAppend(&found, "; ", Plural(c.nproc, "worker", "workers"), " x ", threads.value,
                  threads.value == "1" ? " thread" : " threads", " (OMP/MKL/OpenBLAS",
                  threads.from_user              ? ", the user's OMP_NUM_THREADS"
                  : f.request.threads_per_worker ? ", --threads-per-worker"
                                                 : "",
                  ")");
  if (c.nproc > f.usable_cpus) {
    return {"cpus", CheckStatus::kWarn, absl::StrCat(found, ": more workers than CPUs, so they take turns on them"),
            absl::StrCat("--nproc-per-node ", f.usable_cpus,
                         " or fewer, or give launch more CPUs (taskset, the cgroup)")};
  }
  int value = 0;
  if (absl::SimpleAtoi(threads.value, &value) && static_cast<long>(value) * c.nproc > f.usable_cpus) {
    return {"cpus", CheckStatus::kWarn,
            absl::StrCat(found, ": ", static_cast<long>(value) * c.nproc, " threads on ", f.usable_cpus,
                         " CPUs thrash"),
            threads.from_user
                ? absl::StrCat("unset OMP_NUM_THREADS (launch then gives each worker ", threads.threads, ")")
                : absl::StrCat("--threads-per-worker ", std::max(1, f.usable_cpus / c.nproc))};
  }
  return {"cpus", CheckStatus::kOk, found, ""};
}

DoctorRow NumaRow(const Context& c) {
  const DoctorFacts& f = c.f;
  if (f.numa.empty()) {
    return {"numa", CheckStatus::kNotApplicable, "the kernel shows no NUMA nodes (/sys/devices/system/node)", ""};
  }
  const std::set<int> usable(f.affinity.begin(), f.affinity.end());
  std::vector<std::string> nodes;
  std::map<int, int> usable_on_node;
  for (const NumaNode& n : f.numa) {
    int count = 0;
    for (int cpu : n.cpus) count += usable.count(cpu) ? 1 : 0;
    usable_on_node[n.id] = count;
    std::string s = absl::StrCat("node", n.id, " CPUs ", FormatCpuList(n.cpus));
    if (count != static_cast<int>(n.cpus.size())) absl::StrAppend(&s, " (", count, " usable)");
    if (n.memory_bytes > 0) absl::StrAppend(&s, ", ", Bytes(n.memory_bytes));
    nodes.push_back(s);
  }
  std::map<int, std::vector<int>> gpus_on_node;
  for (const GpuNumaNode& g : f.gpu_numa) {
    if (g.node >= 0 && InPool(c, g.gpu)) gpus_on_node[g.node].push_back(g.gpu);
  }
  std::string found = absl::StrCat(Plural(f.numa.size(), "node", "nodes"), ": ", absl::StrJoin(nodes, "; "));
  std::vector<std::string> stranded;
  for (const auto& [node, gpus] : gpus_on_node) {
    absl::StrAppend(&found, "; GPUs ", FormatCpuList(gpus), " on node", node);
    if (usable_on_node.count(node) && usable_on_node[node] == 0) stranded.push_back(absl::StrCat("node", node));
  }
  if (!stranded.empty()) {
    return {"numa", CheckStatus::kWarn,
            absl::StrCat(found, ": no usable CPU on ", absl::StrJoin(stranded, ", "),
                         ", so those GPUs' host work crosses the interconnect"),
            absl::StrCat("let launch run on ", absl::StrJoin(stranded, ", "), "'s CPUs too (taskset, cpuset)")};
  }
  return {"numa", CheckStatus::kOk, found, ""};
}

DoctorRow OpenFilesRow(const Context& c) {
  const DoctorFacts& f = c.f;
  const long needed = f.request.descriptors_needed > 0 ? f.request.descriptors_needed
                                                       : DescriptorsNeeded(c.nproc, !f.request.log_dir.empty());
  // launch raises its soft limit to the hard one at start, and its workers inherit it.
  const std::optional<uint64_t> limit = f.open_files_hard;
  const std::string text = [&](const std::optional<uint64_t>& v) {
    return v ? std::to_string(*v) : std::string("unlimited");
  }(limit);
  const std::string found = absl::StrCat("open files: ", text, " (launch raises its soft limit to the hard one); ",
                                         Plural(c.nproc, "worker", "workers"), c.nproc == 1 ? " needs" : " need",
                                         " about ", needed);
  if (limit && *limit < static_cast<uint64_t>(needed)) {
    return {"limits.nofile", CheckStatus::kFail, absl::StrCat(found, ": launch will refuse to start them"),
            absl::StrCat("raise the hard limit to at least ", needed,
                         " (limits.conf nofile, or docker --ulimit nofile=", needed, ")")};
  }
  if (limit && *limit < kOpenFilesAdvised) {
    return {"limits.nofile", CheckStatus::kWarn,
            absl::StrCat(found, ": DataLoader workers pass tensors as descriptors and hit 'Too many open files'"),
            "raise the hard limit to 65536 (limits.conf nofile, or docker --ulimit nofile=65536)"};
  }
  return {"limits.nofile", CheckStatus::kOk, found, ""};
}

DoctorRow MemlockRow(const Context& c) {
  const DoctorFacts& f = c.f;
  if (!f.memlock_soft) return {"limits.memlock", CheckStatus::kOk, "locked memory: unlimited", ""};
  const std::string found = absl::StrCat("locked memory: ", Bytes(*f.memlock_soft));
  if (!f.rdma_devices.empty()) {
    return {"limits.memlock", CheckStatus::kWarn,
            absl::StrCat(found, " with RDMA devices (", absl::StrJoin(f.rdma_devices, ", "),
                         "): NCCL's InfiniBand transport needs it unlimited"),
            "ulimit -l unlimited (limits.conf memlock, or docker --ulimit memlock=-1)"};
  }
  return {"limits.memlock", CheckStatus::kOk, absl::StrCat(found, "; no RDMA devices, so NCCL needs no more"), ""};
}

DoctorRow DirectoryRow(const char* id, const DirectoryFacts& d, bool checkpoints) {
  if (d.path.empty()) {
    return {id, CheckStatus::kNotApplicable,
            checkpoints ? "no --checkpoint-dir given" : "no --log-dir given (the workers' output goes to the console)",
            ""};
  }
  const std::string what = absl::StrCat(d.flag, "=", d.path);
  if (!d.error.empty()) {
    return {id, CheckStatus::kFail, absl::StrCat(what, ": ", d.error), absl::StrCat("choose another ", d.flag)};
  }
  std::string found = absl::StrCat(what, ": ", d.fs_type,
                                   d.existing == d.path ? "" : absl::StrCat(" (", d.existing, " exists)"), ", ",
                                   Bytes(d.free_bytes), " free");
  if (!d.writable) {
    return {id, CheckStatus::kFail, absl::StrCat(found, ", not writable by this user"),
            absl::StrCat("chown or chmod ", d.existing, ", or choose another ", d.flag)};
  }
  if (checkpoints && (d.fs_type == "tmpfs" || d.fs_type == "ramfs")) {
    return {id, CheckStatus::kWarn,
            absl::StrCat(found, ": in memory, so checkpoints are lost at reboot and take RAM from training"),
            absl::StrCat("put ", d.flag, " on a disk or a shared filesystem")};
  }
  if (checkpoints && d.fs_type == "overlay") {
    return {id, CheckStatus::kWarn, absl::StrCat(found, ": a container's writable layer, lost with the container"),
            absl::StrCat("put ", d.flag, " on a mounted volume")};
  }
  const uint64_t advised = checkpoints ? kCheckpointDirFreeAdvised : kLogDirFreeAdvised;
  if (d.free_bytes < advised) {
    return {id, CheckStatus::kWarn, absl::StrCat(found, ": under ", Bytes(advised), " free"),
            absl::StrCat("free space there or choose another ", d.flag)};
  }
  return {id, CheckStatus::kOk, absl::StrCat(found, ", writable"), ""};
}

DoctorRow BlasRow(const Context& c, const TorchFacts& t, bool python) {
  const char* id = python ? "blas.python" : "blas.libtorch";
  const std::string who = TorchName(t, python);
  if (!t.found) return {id, CheckStatus::kNotApplicable, absl::StrCat("no ", python ? "Python torch" : "LibTorch"), ""};
  if (t.blas_bundled) {
    return {id, CheckStatus::kOk,
            absl::StrCat(who, " has its BLAS built in (", t.blas_info.empty() ? "MKL" : t.blas_info, ")"), ""};
  }
  if (t.blas_library.empty()) {
    if (!python && !t.blas_info.empty()) {
      return {id, CheckStatus::kFail, absl::StrCat(who, " needs ", t.blas_info, ", which the loader does not find"),
              "apt-get install libopenblas0-pthread"};
    }
    return {id, CheckStatus::kNotApplicable,
            absl::StrCat(who, ": BLAS unknown",
                         t.blas_info.empty() ? "" : absl::StrCat(" (BLAS_INFO=", t.blas_info, ")")),
            ""};
  }
  switch (ClassifyBlas(t.blas_library)) {
    case BlasKind::kReference: {
      const std::string fix = !c.f.openblas_blas_library.empty()
                                  ? absl::StrCat("select OpenBLAS: update-alternatives --set ", c.f.blas_alternative,
                                                 " ", c.f.openblas_blas_library)
                                  : "apt-get install libopenblas0-pthread (it becomes libblas.so.3)";
      return {id, CheckStatus::kWarn,
              absl::StrCat(who, " computes with the reference BLAS (", t.blas_library,
                           ", package libblas3): CPU matrix products run about 7x slower than with OpenBLAS"),
              fix};
    }
    case BlasKind::kOpenBlas:
      return {id, CheckStatus::kOk, absl::StrCat(who, ": OpenBLAS (", t.blas_library, ")"), ""};
    case BlasKind::kMkl:
      return {id, CheckStatus::kOk, absl::StrCat(who, ": MKL (", t.blas_library, ")"), ""};
    case BlasKind::kBlis:
      return {id, CheckStatus::kOk, absl::StrCat(who, ": BLIS (", t.blas_library, ")"), ""};
    case BlasKind::kAtlas:
      return {id, CheckStatus::kOk, absl::StrCat(who, ": ATLAS (", t.blas_library, ")"), ""};
    case BlasKind::kFlexiBlas:
      return {id, CheckStatus::kOk,
              absl::StrCat(who, ": FlexiBLAS (", t.blas_library, "; `flexiblas list` shows its backend)"), ""};
    case BlasKind::kUnknown:
      break;
  }
  return {id, CheckStatus::kOk, absl::StrCat(who, ": ", t.blas_library), ""};
}

}  // namespace

const char* CheckStatusName(CheckStatus status) {
  switch (status) {
    case CheckStatus::kOk:
      return "ok";
    case CheckStatus::kNotApplicable:
      return "n-a";
    case CheckStatus::kWarn:
      return "warn";
    case CheckStatus::kFail:
      return "fail";
  }
  return "?";
}

std::vector<DoctorRow> Diagnose(const DoctorFacts& f) {
  const Context c = MakeContext(f);
  std::vector<DoctorRow> rows;
  rows.push_back(DriverRow(c));
  rows.push_back(DriverCudaRow(c));
  rows.push_back(ToolkitRow(c));
  rows.push_back(LibraryRow("cuda.runtime", "libcudart", f.cuda.runtime, CudaVersionText(f.cuda.runtime.version),
                            "CUDA programs"));
  rows.push_back(
      LibraryRow("nccl", "NCCL", f.cuda.nccl, NcclVersionText(f.cuda.nccl.version), "collectives between GPUs"));
  rows.push_back(CudnnRow(c));
  if (f.request.check_libtorch) rows.push_back(TorchRow(c, f.libtorch, false));
  if (f.request.check_python) rows.push_back(TorchRow(c, f.python_torch, true));
  rows.push_back(GpuStackRow(c));
  if (!c.pool_error.empty()) {
    rows.push_back({"gpu.pool", CheckStatus::kFail, c.pool_error, "fix CUDA_VISIBLE_DEVICES or --exclude-gpus"});
  }
  if (f.nvml_loaded && !f.gpus.empty()) rows.push_back(BalanceRow(c));
  for (const GpuFigures& g : f.gpus) {
    int node = -1;
    for (const GpuNumaNode& n : f.gpu_numa) {
      if (n.gpu == g.index) node = n.node;
    }
    rows.push_back(GpuRow(c, g, node));
    if (!g.error.empty() || !InPool(c, g.index)) continue;
    rows.push_back(KernelRow(c, g));
    rows.push_back(HealthRow(g));
    rows.push_back(PersistenceRow(g));
  }
  rows.push_back(ShmRow(c));
  rows.push_back(CpuRow(c));
  rows.push_back(NumaRow(c));
  rows.push_back(OpenFilesRow(c));
  rows.push_back(MemlockRow(c));
  rows.push_back(DirectoryRow("dir.log", f.log_dir, false));
  rows.push_back(DirectoryRow("dir.checkpoint", f.checkpoint_dir, true));
  if (f.request.check_libtorch) rows.push_back(BlasRow(c, f.libtorch, false));
  if (f.request.check_python) rows.push_back(BlasRow(c, f.python_torch, true));
  return rows;
}

int DoctorExitCode(const std::vector<DoctorRow>& rows) {
  CheckStatus worst = CheckStatus::kOk;
  for (const DoctorRow& r : rows) worst = std::max(worst, r.status);
  return worst == CheckStatus::kFail ? 2 : worst == CheckStatus::kWarn ? 1 : 0;
}

std::string RenderDoctorTable(const std::vector<DoctorRow>& rows) {
  size_t id_width = 5;
  for (const DoctorRow& r : rows) id_width = std::max(id_width, r.id.size());
  std::string out = absl::StrFormat("%-6s %-*s %s\n", "STATUS", static_cast<int>(id_width), "CHECK",
                                    "FOUND (and the fix)");
  std::map<CheckStatus, int> counts;
  for (const DoctorRow& r : rows) {
    ++counts[r.status];
    absl::StrAppendFormat(&out, "%-6s %-*s %s\n", CheckStatusName(r.status), static_cast<int>(id_width), r.id, r.found);
    if (!r.fix.empty() && r.status != CheckStatus::kOk) {
      absl::StrAppendFormat(&out, "%-6s %-*s fix: %s\n", "", static_cast<int>(id_width), "", r.fix);
    }
  }
  const int code = DoctorExitCode(rows);
  absl::StrAppend(&out, counts[CheckStatus::kFail], " fail, ", counts[CheckStatus::kWarn], " warn, ",
                  counts[CheckStatus::kOk], " ok, ", counts[CheckStatus::kNotApplicable], " n-a: exit ", code, "\n");
  return out;
}

v1::DoctorReport DoctorReportOf(const std::vector<DoctorRow>& rows) {
  v1::DoctorReport report;
  for (const DoctorRow& r : rows) {
    v1::DoctorCheck* check = report.add_checks();
    check->set_id(r.id);
    check->set_status(CheckStatusName(r.status));
    check->set_found(r.found);
    check->set_fix(r.fix);
  }
  report.set_exit_code(DoctorExitCode(rows));
  report.set_verdict(report.exit_code() == 2 ? "fail" : report.exit_code() == 1 ? "warn" : "ok");
  return report;
}

std::string RenderDoctorJson(const std::vector<DoctorRow>& rows) {
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  options.always_print_primitive_fields = true;  // every check has its four keys, a fix too
  std::string json;
  (void)google::protobuf::util::MessageToJsonString(DoctorReportOf(rows), &json, options);
  return json + "\n";
}

int DoctorCommand(const DoctorRequest& request, bool json, DoctorProbe* probe, std::FILE* out) {
  const std::vector<DoctorRow> rows = Diagnose(probe->Gather(request));
  const std::string text = json ? RenderDoctorJson(rows) : RenderDoctorTable(rows);
  std::fwrite(text.data(), 1, text.size(), out);
  std::fflush(out);
  return DoctorExitCode(rows);
}

int Preflight(const DoctorRequest& request, DoctorProbe* probe, std::FILE* out) {
  const std::vector<DoctorRow> rows = Diagnose(probe->Gather(request));
  const int code = DoctorExitCode(rows);
  const std::string text = absl::StrCat("launch --preflight:\n", RenderDoctorTable(rows),
                                        code == 2 ? "launch --preflight: a check failed; no worker was started\n" : "");
  std::fwrite(text.data(), 1, text.size(), out);
  std::fflush(out);
  return code;
}

// ---- Pure helpers ----

std::string CudaVersionText(int v) { return absl::StrCat(v / 1000, ".", (v % 1000) / 10); }

std::string NcclVersionText(int v) {
  // NCCL_VERSION_CODE: major*10000 + minor*100 + patch from 2.9 on, major*1000 + minor*100 + patch
  // before.
  if (v >= 10000) return absl::StrCat(v / 10000, ".", (v % 10000) / 100, ".", v % 100);
  return absl::StrCat(v / 1000, ".", (v % 1000) / 100, ".", v % 100);
}

std::string CudnnVersionText(int v) {
  // CUDNN_VERSION: major*10000 + minor*100 + patch from 9 on, major*1000 + minor*100 + patch
  // before.
  if (v >= 10000) return absl::StrCat(v / 10000, ".", (v % 10000) / 100, ".", v % 100);
  return absl::StrCat(v / 1000, ".", (v % 1000) / 100, ".", v % 100);
}

int ParseCudaVersionText(const std::string& text) {
  std::vector<std::string> parts = absl::StrSplit(text, '.');
  int major = 0, minor = 0;
  if (parts.empty() || parts.size() > 3 || !absl::SimpleAtoi(parts[0], &major) || major <= 0 || major > 99) return 0;
  if (parts.size() >= 2 && (!absl::SimpleAtoi(parts[1], &minor) || minor < 0 || minor > 99)) return 0;
  return major * 1000 + minor * 10;
}

bool ArchListRuns(const std::vector<std::string>& archs, int major, int minor) {
  const int gpu = major * 10 + minor;
  for (const std::string& name : archs) {
    auto a = ParseArch(name);
    if (!a) continue;
    if (a->ptx && !a->specific && a->number <= gpu) return true;
    if (!a->ptx && a->specific && a->number == gpu) return true;
    if (!a->ptx && !a->specific && a->number / 10 == major && a->number % 10 <= minor) return true;
  }
  return false;
}

BlasKind ClassifyBlas(const std::string& path) {
  const std::string p = absl::AsciiStrToLower(path);
  const std::string name = p.substr(p.rfind('/') + 1);
  if (absl::StrContains(p, "openblas")) return BlasKind::kOpenBlas;
  if (absl::StrContains(p, "mkl")) return BlasKind::kMkl;
  if (absl::StrContains(p, "blis")) return BlasKind::kBlis;
  if (absl::StrContains(p, "atlas")) return BlasKind::kAtlas;
  if (absl::StrContains(p, "flexiblas")) return BlasKind::kFlexiBlas;
  // Debian's netlib package installs it as <libdir>/blas/libblas.so.3; others as netlib's.
  if (absl::StartsWith(name, "libblas.so") && (absl::StrContains(p, "/blas/") || absl::StrContains(p, "netlib"))) {
    return BlasKind::kReference;
  }
  if (absl::StrContains(p, "refblas") || absl::StrContains(p, "reference")) return BlasKind::kReference;
  return BlasKind::kUnknown;
}

}  // namespace launch
