// What `launch doctor` knows about this machine: plain facts (NVML, the CUDA libraries, LibTorch,
// Python's torch, /dev/shm, CPUs, NUMA, limits, directories), gathered once behind DoctorProbe.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "probes/numa.h"
#include "probes/nvml.h"
#include "agent/worker_env.h"

namespace launch {

// What the doctor is asked about: the workers planned for this node and where they write.
struct DoctorRequest {
  std::optional<int> nproc;               // nullopt: the GPUs in the pool, else 1
  std::optional<int> threads_per_worker;  // --threads-per-worker of the run
  std::vector<std::string> exclude_gpus;  // --exclude-gpus
  // --preflight: the NVML indices of the run's GPU pool; nullopt: every GPU (narrowed by an
  // inherited CUDA_VISIBLE_DEVICES and --exclude-gpus, as launch would).
  std::optional<std::vector<int>> gpu_pool;
  long descriptors_needed = 0;  // the run's plan's count; 0: as launch would count for nproc workers
  std::string log_dir, checkpoint_dir;
  bool check_libtorch = true, check_python = true;  // --preflight asks about the workers' kind only
  // The interpreter to ask about torch (empty: PYTHON_EXEC, else python3 on PATH), and how long
  // it may take: `import torch` takes seconds, more on a cold cache with CUDA libraries to map.
  std::string python;
  std::chrono::milliseconds python_timeout{30000};
};

// A library loaded with dlopen and asked its version.
struct LoadedLibrary {
  bool found = false;
  std::string path;   // as the dynamic loader found it
  int version = 0;    // the library's own encoding (cudart 13000, NCCL 22809, cuDNN 91900); 0: unknown
  std::string error;  // why it is not found
};

struct CudaFacts {
  std::string toolkit_root;    // CUDA_HOME, CUDA_PATH or /usr/local/cuda as found; empty: none
  int toolkit_version = 0;     // CUDA_VERSION of its include/cuda.h (13000); 0: unknown
  LoadedLibrary runtime;       // libcudart: cudaRuntimeGetVersion
  LoadedLibrary nccl;          // ncclGetVersion
  LoadedLibrary cudnn;         // cudnnGetVersion
  int cudnn_cuda_version = 0;  // cudnnGetCudartVersion: the CUDA cuDNN was built for (13010)
};

// One torch: LibTorch (the C++ libraries) or the torch module of a Python.
struct TorchFacts {
  bool found = false;
  std::string where;    // LibTorch: its library directory; Python: the interpreter
  std::string missing;  // why it is not found (no libtorch.so, "No module named 'torch'")
  std::string error;    // found, but asking it failed (the probe timed out, printed garbage)
  std::string version;
  bool cuda = false;         // built with CUDA (LibTorch: libtorch_cuda.so is there)
  std::string cuda_version;  // "12.1"; "12" where only libcudart's soname tells
  // Kernel images and PTX it carries, as torch lists them ("sm_80", "compute_90"); empty: unknown.
  std::vector<std::string> arch_list;
  int cudnn_version = 0;     // Python: torch.backends.cudnn.version()
  std::string nccl_version;  // Python: torch.cuda.nccl.version()
  // Libraries LibTorch needs (its BLAS, a CUDA build's CUDA libraries) that the loader would not
  // find.
  std::vector<std::string> unresolved;
  // The BLAS it computes with: the library's real path ("" when it links none or bundles one),
  // and, for Python's, torch's own word for it (BLAS_INFO).
  std::string blas_library;
  std::string blas_info;
  bool blas_bundled = false;  // MKL (or another BLAS) linked in statically: nothing to swap
};

struct GpuNumaNode {
  int gpu = 0;
  int node = -1;  // -1: unknown
};

struct NumaNode {
  int id = 0;
  std::vector<int> cpus;
  uint64_t memory_bytes = 0;
};

struct DirectoryFacts {
  std::string flag;      // "--log-dir"
  std::string path;      // as given; empty: not given
  std::string existing;  // the path itself or its nearest existing ancestor (launch creates the rest)
  std::string fs_type;   // "ext4", "tmpfs", "nfs", ...
  uint64_t free_bytes = 0;
  bool writable = false;
  std::string error;  // nothing of it could be examined
};

struct DoctorFacts {
  DoctorRequest request;

  // NVML.
  bool nvml_loaded = false;
  std::string nvml_error;  // Nvml::Load's one line
  NvmlSystemInfo driver;
  std::vector<GpuFigures> gpus;
  std::vector<GpuNumaNode> gpu_numa;
  std::string inherited_cuda_visible_devices;  // unset and empty are the same here
  bool cuda_visible_devices_set = false;

  CudaFacts cuda;
  TorchFacts libtorch, python_torch;
  // Where OpenBLAS's libblas.so.3 would come from once selected (empty: not installed), for the
  // fix.
  std::string openblas_blas_library;
  std::string blas_alternative;  // update-alternatives' name for libblas.so.3 here

  // /dev/shm.
  bool shm_found = false;
  uint64_t shm_total_bytes = 0, shm_free_bytes = 0;

  // CPUs and threads.
  int usable_cpus = 1;
  int affinity_cpus = 1;
  std::vector<int> affinity;  // the CPU ids this process may run on
  Env env;                    // for the thread plan (OMP_NUM_THREADS)

  std::vector<NumaNode> numa;  // empty: the kernel shows none

  // Limits; nullopt: unlimited.
  std::optional<uint64_t> open_files_soft, open_files_hard;
  std::optional<uint64_t> memlock_soft;
  std::vector<std::string> rdma_devices;  // /sys/class/infiniband entries

  DirectoryFacts log_dir, checkpoint_dir;
};

// Gathers the facts: the one place `launch doctor` touches the machine.
class SignalFd;

class DoctorProbe {
 public:
  virtual ~DoctorProbe() = default;
  virtual DoctorFacts Gather(const DoctorRequest& request) = 0;
};

// This machine: NVML through Nvml::Load(NvmlLibraryFromEnv()), the CUDA libraries through dlopen,
// LibTorch's files read where the dynamic loader would find them, Python's torch through the
// interpreter with a timeout, the rest from /proc, /sys and statfs. Never fails: what cannot be
// learned is recorded as such.
class SystemDoctorProbe : public DoctorProbe {
 public:
  // `signals` (launch's; may be null): a signal other than SIGCHLD while the interpreter is asked
  // stops the wait, so Ctrl-C is never held up by a hanging `import torch`.
  explicit SystemDoctorProbe(SignalFd* signals = nullptr) : signals_(signals) {}
  DoctorFacts Gather(const DoctorRequest& request) override;
  int stopped_by() const { return stopped_by_; }  // that signal; 0: none came

 private:
  SignalFd* signals_;
  int stopped_by_ = 0;
};

// ---- Pure pieces of the gathering, tested on their own. ----

// CUDA_VERSION from the text of cuda.h ("#define CUDA_VERSION 13000"); 0 when absent.
int ParseCudaVersionDefine(const std::string& cuda_h);
// The directories the dynamic loader searches, in its order: LD_LIBRARY_PATH, then the directories
// named in the ld.so.conf files (their text given), then the system defaults for `triplet`.
std::vector<std::string> LibrarySearchPath(const std::string& ld_library_path,
                                           const std::vector<std::string>& ld_so_conf_texts,
                                           const std::string& triplet);
struct Captured {
  bool timed_out = false;  // killed at the deadline
  int stopped_by = 0;      // a signal to launch that stopped the wait (the child was killed)
  int status = 0;          // waitpid's
  std::string out, err;
};

// Runs argv (argv[0] a path) with the environment `env`, stdin from /dev/null, and collects at most
// kMaxProbeOutput of stdout and kMaxProbeErrorOutput of stderr until it exits or `timeout`
// passes, or a signal other than SIGCHLD arrives on `signals` (when given); then its process group
// is killed. Only this child is waited for: launch's other children
// (the orphan guard) are left to their owners.
absl::StatusOr<Captured> RunCaptured(const std::vector<std::string>& argv, const Env& env,
                                     std::chrono::milliseconds timeout, SignalFd* signals);

// statfs's f_type as a name ("ext4", "tmpfs", ...; "0x1234abcd" when unknown).
std::string FilesystemTypeName(int64_t f_type);
// The Python probe's JSON line into `torch` (bounded: at most kMaxProbeArchs archs, each name cut
// to 64 bytes); InvalidArgument when it is not the probe's JSON.
inline constexpr int kMaxProbeArchs = 64;
absl::Status ParsePythonProbe(const std::string& json, TorchFacts* torch);
// Of the BLAS-like libraries a process maps, the one that computes: OpenBLAS, MKL, BLIS, ATLAS
// or FlexiBLAS by name, else a libblas.so (reference or an alternative behind that name).
std::string PickBlas(const std::vector<std::string>& paths);
// The version in a library's file name: "libtorch.so.1.13.0" -> "1.13.0"; empty when none.
std::string SonameVersion(const std::string& file_name);

}  // namespace launch
