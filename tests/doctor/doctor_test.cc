// launch doctor's pure parts: Diagnose() as a table of machines one fact away from a healthy one,
// the helpers it rests on, the ELF reader on files written here, the command with a fake probe,
// and its flags.
#include "doctor/doctor.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <functional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "probes/devices.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "doctor/doctor_facts.h"
#include "doctor/elf_facts.h"

namespace launch {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;

constexpr uint64_t kGiB = 1024ull * 1024 * 1024;
constexpr uint64_t kMiB = 1024ull * 1024;

GpuFigures H100(int index) {
  GpuFigures g;
  g.index = index;
  g.name = "NVIDIA H100 80GB HBM3";
  g.uuid = absl::StrCat("GPU-", index, "aaa");
  g.pci_bus_id = absl::StrCat("00000000:1", index, ":00.0");
  g.memory_total_bytes = 80 * kGiB;
  g.memory_used_bytes = 512 * kMiB;
  g.utilization_percent = 0;
  g.compute_capability_major = 9;
  g.compute_capability_minor = 0;
  g.multiprocessor_count = 132;
  g.ecc_uncorrected_errors = 0;
  g.retired_pages = 0;
  g.row_remap_pending = 0;
  g.persistence_mode = 1;
  return g;
}

GpuFigures A100(int index) {
  GpuFigures g = H100(index);
  g.name = "NVIDIA A100-SXM4-40GB";
  g.memory_total_bytes = 40 * kGiB;
  g.compute_capability_major = 8;
  g.multiprocessor_count = 108;
  return g;
}

const std::vector<std::string> kArchsTo90 = {"sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90"};

TorchFacts CudaTorch(const std::string& where) {
  TorchFacts t;
  t.found = true;
  t.where = where;
  t.version = "2.3.0+cu121";
  t.cuda = true;
  t.cuda_version = "12.1";
  t.arch_list = kArchsTo90;
  t.blas_bundled = true;
  return t;
}

// A healthy two-GPU machine: every row ok or n-a. Each case below changes one fact.
DoctorFacts Healthy() {
  DoctorFacts f;
  f.nvml_loaded = true;
  f.driver = {"550.54.15", 12040};
  f.gpus = {H100(0), H100(1)};
  f.gpu_numa = {{0, 0}, {1, 0}};
  f.cuda.toolkit_root = "/usr/local/cuda-12.4";
  f.cuda.toolkit_version = 12040;
  f.cuda.runtime = {true, "/usr/local/cuda-12.4/lib64/libcudart.so.12", 12040, ""};
  f.cuda.nccl = {true, "/usr/lib/x86_64-linux-gnu/libnccl.so.2", 22005, ""};
  f.cuda.cudnn = {true, "/usr/lib/x86_64-linux-gnu/libcudnn.so.9", 90100, ""};
  f.cuda.cudnn_cuda_version = 12020;
  f.libtorch = CudaTorch("/opt/libtorch/lib");
  f.python_torch = CudaTorch("/usr/bin/python3");
  TorchFacts& py = f.python_torch;
  py.cudnn_version = 8902;
  py.nccl_version = "2.20.5";
  py.blas_info = "mkl";
  py.blas_bundled = true;
  f.openblas_blas_library = "/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3";
  f.blas_alternative = "libblas.so.3-x86_64-linux-gnu";
  f.shm_found = true;
  f.shm_total_bytes = f.shm_free_bytes = 64 * kGiB;
  f.usable_cpus = f.affinity_cpus = 32;
  for (int i = 0; i < 32; ++i) f.affinity.push_back(i);
  f.numa = {{0, f.affinity, 256 * kGiB}};
  f.open_files_soft = f.open_files_hard = 1048576;
  return f;
}

const DoctorRow* Find(const std::vector<DoctorRow>& rows, const std::string& id) {
  for (const auto& r : rows) {
    if (r.id == id) return &r;
  }
  return nullptr;
}

std::string Show(const std::vector<DoctorRow>& rows) { return RenderDoctorTable(rows); }

TEST(Diagnose, AHealthyMachineIsAllOkAndExitsZero) {
  const auto rows = Diagnose(Healthy());
  for (const DoctorRow& r : rows) {
    EXPECT_TRUE(r.status == CheckStatus::kOk || r.status == CheckStatus::kNotApplicable) << Show(rows);
  }
  EXPECT_EQ(DoctorExitCode(rows), 0);
  // Every check the issue names has its row.
  for (const char* id : {"driver",  "driver.cuda",    "cuda.toolkit",  "cuda.runtime",      "nccl",
                         "cudnn",   "libtorch",       "python.torch",  "gpu.stack",         "gpu.balance",
                         "gpu.0",   "gpu.0.kernels",  "gpu.0.health",  "gpu.0.persistence", "gpu.1",
                         "shm",     "cpus",           "numa",          "limits.nofile",     "limits.memlock",
                         "dir.log", "dir.checkpoint", "blas.libtorch", "blas.python"}) {
    EXPECT_NE(Find(rows, id), nullptr) << id << "\n" << Show(rows);
  }
  EXPECT_THAT(Find(rows, "gpu.0")->found,
              AllOf(HasSubstr("NVIDIA H100 80GB HBM3"), HasSubstr("GPU-0aaa"), HasSubstr("80.0 GiB"),
                    HasSubstr("compute capability 9.0"), HasSubstr("132 SMs"), HasSubstr("idle (0% busy)")));
}

struct Case {
  const char* name;
  std::function<void(DoctorFacts&)> change;
  const char* row;
  CheckStatus status;
  std::vector<std::string> found;  // substrings of the row's found
  std::string fix;                 // a substring of its fix ("" : not checked)
};

TEST(Diagnose, OneFactAwayFromHealthy) {
  const std::vector<Case> cases = {
      {"no driver, CUDA libraries and a CPU LibTorch installed (this machine)",
       [](DoctorFacts& f) {
         f.nvml_loaded = false;
         f.nvml_error = "no NVIDIA driver: cannot load libnvidia-ml.so.1 (not found)";
         f.gpus.clear();
         f.cuda.toolkit_version = 13000;
         f.cuda.runtime.version = 13000;
         f.libtorch = {};
         f.libtorch.found = true;
         f.libtorch.version = "1.13.0";
         f.libtorch.where = "/usr/lib/x86_64-linux-gnu";
         f.python_torch = {};
         f.python_torch.missing = "No module named 'torch'";
       },
       "gpu.stack",
       CheckStatus::kNotApplicable,  // a CPU machine: ready for a CPU run, exit 0
       {"a CUDA 13.0 toolkit, NCCL 2.20.5 and cuDNN 9.1.0 are installed", "there is no NVIDIA driver",
        "LibTorch 1.13.0 is CPU-only", "GPUs could not be used even with a driver"},
       "install the NVIDIA driver and a CUDA build of LibTorch or torch (for CUDA 13.0)"},
      {"no driver: the driver row says so",
       [](DoctorFacts& f) {
         f.nvml_loaded = false;
         f.nvml_error = "no NVIDIA driver: cannot load libnvidia-ml.so.1 (not found)";
         f.gpus.clear();
       },
       "driver",
       CheckStatus::kNotApplicable,
       {"no NVIDIA driver"},
       "install the NVIDIA driver"},
      {"a CPU machine with nothing of CUDA",
       [](DoctorFacts& f) {
         f.nvml_loaded = false;
         f.gpus.clear();
         f.cuda = {};
         f.libtorch.cuda = f.python_torch.cuda = false;
       },
       "gpu.stack",
       CheckStatus::kNotApplicable,
       {"a CPU machine"},
       ""},
      {"driver older than the torch's CUDA major",
       [](DoctorFacts& f) { f.driver.cuda_driver_version = 11080; },
       "driver.cuda",
       CheckStatus::kFail,
       {"the driver supports CUDA 11.8", "Python torch 2.3.0+cu121 needs CUDA 12.1: too new for this driver"},
       "update the NVIDIA driver to R525 or newer (CUDA 12.x)"},
      {"driver one minor behind the torch's CUDA",
       [](DoctorFacts& f) {
         f.driver.cuda_driver_version = 12000;
         f.cuda.runtime.version = f.cuda.toolkit_version = 12000;
       },
       "driver.cuda",
       CheckStatus::kWarn,
       {"minor-version compatibility"},
       "for CUDA 12.1 or newer"},
      {"a LibTorch known by its libcudart soname only is compared by major",
       [](DoctorFacts& f) {
         f.driver.cuda_driver_version = 12000;
         f.cuda.runtime.version = f.cuda.toolkit_version = 12000;
         f.python_torch.found = false;
         f.libtorch.cuda_version = "12";
       },
       "driver.cuda",
       CheckStatus::kOk,
       {"LibTorch 2.3.0+cu121 (CUDA 12.0) ok"},
       ""},
      {"two unequal GPUs: the seed's imbalance warning",
       [](DoctorFacts& f) { f.gpus[1] = A100(1); },
       "gpu.balance",
       CheckStatus::kWarn,
       {"1 (NVIDIA A100-SXM4-40GB, 40 GiB, 108 SMs) vs 0 (NVIDIA H100 80GB HBM3, 80 GiB, 132 SMs)"},
       "--exclude-gpus 1"},
      {"--exclude-gpus takes the imbalance away",
       [](DoctorFacts& f) {
         f.gpus.push_back(A100(2));
         f.request.exclude_gpus = {"2"};
       },
       "gpu.balance",
       CheckStatus::kOk,
       {"2 GPUs alike"},
       ""},
      {"the torch lacks the GPU's architecture: no kernel image",
       [](DoctorFacts& f) { f.python_torch.arch_list = {"sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86"}; },
       "gpu.0.kernels",
       CheckStatus::kFail,
       {"GPU 0 (NVIDIA H100 80GB HBM3, sm_90)", "Python torch 2.3.0+cu121 has only sm_50",
        "no kernel image is available"},
       "install a torch built for sm_90 (that needs CUDA 11.8 or newer), or --exclude-gpus 0"},
      {"PTX for an older architecture is JIT-compiled for the GPU",
       [](DoctorFacts& f) {
         f.python_torch.arch_list = f.libtorch.arch_list = {"sm_80", "compute_80"};
       },
       "gpu.0.kernels",
       CheckStatus::kOk,
       {"LibTorch 2.3.0+cu121 and Python torch 2.3.0+cu121 have kernels"},
       ""},
      {"a CPU-only torch and GPUs",
       [](DoctorFacts& f) {
         f.python_torch.cuda = f.libtorch.cuda = false;
         f.python_torch.cuda_version = f.libtorch.cuda_version = "";
       },
       "gpu.stack",
       CheckStatus::kFail,
       {"2 GPUs, but LibTorch 2.3.0+cu121 and Python torch 2.3.0+cu121 are CPU-only"},
       "install a CUDA build of torch for CUDA 12.4 or older"},
      {"a CPU-only LibTorch next to a CUDA Python torch",
       [](DoctorFacts& f) { f.libtorch.cuda = false; },
       "libtorch",
       CheckStatus::kWarn,
       {"CPU-only", "C++ workers cannot use this machine's GPUs"},
       "install a CUDA build of LibTorch for CUDA 12.4 or older"},
      {"a CUDA LibTorch whose CUDA libraries are missing",
       [](DoctorFacts& f) {
         f.libtorch.unresolved = {"libcudart.so.12", "libnccl.so.2"};
       },
       "libtorch",
       CheckStatus::kFail,
       {"it needs libcudart.so.12, libnccl.so.2, which the loader does not find"},
       "LD_LIBRARY_PATH"},
      {"a toolkit of another CUDA major than torch's",
       [](DoctorFacts& f) {
         f.cuda.toolkit_version = 13000;
         f.driver.cuda_driver_version = 13000;
       },
       "cuda.toolkit",
       CheckStatus::kWarn,
       {"CUDA 13.0 toolkit", "is built for CUDA 12.1"},
       "CUDA 12.x toolkit"},
      {"cuDNN built for another CUDA major than the runtime",
       [](DoctorFacts& f) { f.cuda.cudnn_cuda_version = 11080; },
       "cudnn",
       CheckStatus::kWarn,
       {"cuDNN 9.1.0", "built for CUDA 11.8", "the CUDA runtime is 12.4"},
       "cudnn9-cuda-12"},
      {"reference BLAS with OpenBLAS installed",
       [](DoctorFacts& f) {
         f.libtorch.blas_bundled = false;
         f.libtorch.blas_info = "libblas.so.3";
         f.libtorch.blas_library = "/usr/lib/x86_64-linux-gnu/blas/libblas.so.3";
       },
       "blas.libtorch",
       CheckStatus::kWarn,
       {"reference BLAS", "package libblas3", "about 7x slower"},
       "update-alternatives --set libblas.so.3-x86_64-linux-gnu "
       "/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3"},
      {"reference BLAS without OpenBLAS: name the package",
       [](DoctorFacts& f) {
         f.openblas_blas_library.clear();
         f.python_torch.blas_bundled = false;
         f.python_torch.blas_library = "/usr/lib/x86_64-linux-gnu/blas/libblas.so.3";
       },
       "blas.python",
       CheckStatus::kWarn,
       {"reference BLAS"},
       "apt-get install libopenblas0-pthread"},
      {"LibTorch needs a BLAS the loader does not find",
       [](DoctorFacts& f) {
         f.libtorch.blas_bundled = false;
         f.libtorch.blas_info = "libblas.so.3";
       },
       "blas.libtorch",
       CheckStatus::kFail,
       {"needs libblas.so.3"},
       "libopenblas0-pthread"},
      {"Docker's 64 MiB /dev/shm for 8 workers",
       [](DoctorFacts& f) {
         f.request.nproc = 8;
         f.shm_total_bytes = f.shm_free_bytes = 64 * kMiB;
       },
       "shm",
       CheckStatus::kFail,
       {"/dev/shm 64 MiB (64 MiB free) for 8 workers", "Bus error"},
       "mount -o remount,size=8G /dev/shm (Docker: --shm-size=8g or --ipc=host)"},
      {"a /dev/shm smaller than advised",
       [](DoctorFacts& f) {
         f.request.nproc = 8;
         f.shm_total_bytes = f.shm_free_bytes = 4 * kGiB;
       },
       "shm",
       CheckStatus::kWarn,
       {"4.0 GiB"},
       "size=8G"},
      {"no /dev/shm",
       [](DoctorFacts& f) { f.shm_found = false; },
       "shm",
       CheckStatus::kFail,
       {"no /dev/shm"},
       "mount -t tmpfs"},
      {"a severe XID",
       [](DoctorFacts& f) { f.gpus[1].xids = {79}; },
       "gpu.1.health",
       CheckStatus::kFail,
       {"XID 79 (GPU has fallen off the bus)"},
       "nvidia-smi -r -i 1"},
      {"an application's XID",
       [](DoctorFacts& f) { f.gpus[0].xids = {13}; },
       "gpu.0.health",
       CheckStatus::kWarn,
       {"XID 13 (graphics engine exception)"},
       "last job's logs"},
      {"uncorrected ECC errors",
       [](DoctorFacts& f) { f.gpus[0].ecc_uncorrected_errors = 3; },
       "gpu.0.health",
       CheckStatus::kFail,
       {"3 uncorrected ECC errors"},
       "nvidia-smi -r -i 0"},
      {"a few retired pages",
       [](DoctorFacts& f) { f.gpus[0].retired_pages = 4; },
       "gpu.0.health",
       CheckStatus::kWarn,
       {"4 retired pages"},
       ""},
      {"retired pages past NVIDIA's replacement mark",
       [](DoctorFacts& f) { f.gpus[0].retired_pages = 60; },
       "gpu.0.health",
       CheckStatus::kFail,
       {"60 retired pages"},
       "replacement"},
      {"a pending row remap",
       [](DoctorFacts& f) { f.gpus[0].row_remap_pending = 1; },
       "gpu.0.health",
       CheckStatus::kWarn,
       {"a row remap is pending"},
       "to apply the remap"},
      {"persistence mode off",
       [](DoctorFacts& f) { f.gpus[1].persistence_mode = 0; },
       "gpu.1.persistence",
       CheckStatus::kWarn,
       {"persistence mode off"},
       "nvidia-smi -pm 1"},
      {"a GPU busy before the run",
       [](DoctorFacts& f) {
         f.gpus[1].utilization_percent = 97;
         f.gpus[1].memory_used_bytes = 70 * kGiB;
       },
       "gpu.1",
       CheckStatus::kWarn,
       {"in use before the run, 97% busy"},
       "--exclude-gpus 1"},
      {"a lost GPU",
       [](DoctorFacts& f) { f.gpus[1].error = "GPU is lost (NVML error 15)"; },
       "gpu.1",
       CheckStatus::kFail,
       {"GPU is lost"},
       "nvidia-smi -r -i 1"},
      {"CUDA_VISIBLE_DEVICES naming no GPU",
       [](DoctorFacts& f) {
         f.cuda_visible_devices_set = true;
         f.inherited_cuda_visible_devices = "7";
       },
       "gpu.pool",
       CheckStatus::kFail,
       {"CUDA_VISIBLE_DEVICES=7: '7' matches no GPU"},
       ""},
      {"more workers than CPUs",
       [](DoctorFacts& f) {
         f.usable_cpus = f.affinity_cpus = 4;
         f.request.nproc = 8;
       },
       "cpus",
       CheckStatus::kWarn,
       {"4 usable CPUs; 8 workers x 1 thread", "more workers than CPUs"},
       "--nproc-per-node 4 or fewer"},
      {"the user's OMP_NUM_THREADS oversubscribes",
       [](DoctorFacts& f) { f.env["OMP_NUM_THREADS"] = "32"; },
       "cpus",
       CheckStatus::kWarn,
       {"2 workers x 32 threads (OMP/MKL/OpenBLAS, the user's OMP_NUM_THREADS)", "64 threads on 32 CPUs"},
       "unset OMP_NUM_THREADS (launch then gives each worker 16)"},
      {"a cgroup quota below the affinity",
       [](DoctorFacts& f) { f.usable_cpus = 8; },
       "cpus",
       CheckStatus::kOk,
       {"8 usable CPUs (the cgroup's quota; affinity allows 32); 2 workers x 4 threads"},
       ""},
      {"GPUs on a NUMA node with no usable CPU",
       [](DoctorFacts& f) {
         f.numa = {{0, {0, 1, 2, 3}, 128 * kGiB}, {1, {4, 5, 6, 7}, 128 * kGiB}};
         f.affinity = {0, 1, 2, 3};
         f.gpu_numa = {{0, 0}, {1, 1}};
       },
       "numa",
       CheckStatus::kWarn,
       {"node1 CPUs 4-7 (0 usable)", "GPUs 1 on node1", "no usable CPU on node1"},
       "node1's CPUs"},
      {"an open-file limit launch would refuse",
       [](DoctorFacts& f) {
         f.request.nproc = 100;
         f.usable_cpus = 128;
         f.open_files_hard = 200;
       },
       "limits.nofile",
       CheckStatus::kFail,
       {"open files: 200", "100 workers need about 264"},
       "at least 264"},
      {"--preflight checks the plan's own descriptor count",
       [](DoctorFacts& f) {
         f.request.descriptors_needed = 5000;
         f.open_files_hard = 4096;
       },
       "limits.nofile",
       CheckStatus::kFail,
       {"2 workers need about 5000"},
       "at least 5000"},
      {"a low open-file limit",
       [](DoctorFacts& f) { f.open_files_hard = 4096; },
       "limits.nofile",
       CheckStatus::kWarn,
       {"Too many open files"},
       "65536"},
      {"locked memory limited with RDMA devices",
       [](DoctorFacts& f) {
         f.memlock_soft = 8 * kMiB;
         f.rdma_devices = {"mlx5_0"};
       },
       "limits.memlock",
       CheckStatus::kWarn,
       {"8 MiB with RDMA devices (mlx5_0)"},
       "ulimit -l unlimited"},
      {"locked memory limited without RDMA",
       [](DoctorFacts& f) { f.memlock_soft = 8 * kMiB; },
       "limits.memlock",
       CheckStatus::kOk,
       {"no RDMA devices"},
       ""},
      {"a log directory that cannot be written",
       [](DoctorFacts& f) { f.log_dir = {"--log-dir", "/var/log/train", "/var/log", "ext4", 100 * kGiB, false, ""}; },
       "dir.log",
       CheckStatus::kFail,
       {"--log-dir=/var/log/train: ext4 (/var/log exists)", "not writable"},
       "chown or chmod /var/log"},
      {"checkpoints in /dev/shm",
       [](DoctorFacts& f) {
         f.checkpoint_dir = {"--checkpoint-dir", "/dev/shm/ckpt", "/dev/shm/ckpt", "tmpfs", 32 * kGiB, true, ""};
       },
       "dir.checkpoint",
       CheckStatus::kWarn,
       {"tmpfs", "lost at reboot"},
       "on a disk"},
      {"checkpoints in a container's layer",
       [](DoctorFacts& f) { f.checkpoint_dir = {"--checkpoint-dir", "/ckpt", "/", "overlay", 32 * kGiB, true, ""}; },
       "dir.checkpoint",
       CheckStatus::kWarn,
       {"writable layer"},
       "mounted volume"},
      {"a log directory that is a file",
       [](DoctorFacts& f) {
         f.log_dir = {"--log-dir", "/etc/hosts/x", "", "", 0, false, "/etc/hosts exists and is not a directory"};
       },
       "dir.log",
       CheckStatus::kFail,
       {"is not a directory"},
       "choose another --log-dir"},
      {"a Python whose torch probe fails",
       [](DoctorFacts& f) {
         f.python_torch = {};
         f.python_torch.where = "/usr/bin/python3";
         f.python_torch.error = "/usr/bin/python3 did not answer within 30 s";
       },
       "python.torch",
       CheckStatus::kWarn,
       {"did not answer"},
       "import torch"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    DoctorFacts f = Healthy();
    c.change(f);
    const auto rows = Diagnose(f);
    const DoctorRow* row = Find(rows, c.row);
    ASSERT_NE(row, nullptr) << Show(rows);
    EXPECT_EQ(CheckStatusName(row->status), std::string(CheckStatusName(c.status))) << Show(rows);
    for (const auto& s : c.found) EXPECT_THAT(row->found, HasSubstr(s));
    if (!c.fix.empty()) {
      EXPECT_THAT(row->fix, HasSubstr(c.fix));
    }
    // The exit code follows the worst row.
    CheckStatus worst = CheckStatus::kOk;
    for (const auto& r : rows) worst = std::max(worst, r.status);
    EXPECT_EQ(DoctorExitCode(rows), worst == CheckStatus::kFail ? 2 : worst == CheckStatus::kWarn ? 1 : 0);
  }
}

TEST(Diagnose, ALostGpuHasOneRowAndLeavesThePool) {
  DoctorFacts f = Healthy();
  f.gpus[1].error = "GPU is lost (NVML error 15)";
  const auto rows = Diagnose(f);
  EXPECT_EQ(Find(rows, "gpu.1.kernels"), nullptr);
  EXPECT_EQ(Find(rows, "gpu.1.health"), nullptr);
  EXPECT_EQ(Find(rows, "gpu.balance")->status, CheckStatus::kNotApplicable);  // one GPU left
  EXPECT_EQ(DoctorExitCode(rows), 2);
}

TEST(Diagnose, PreflightChecksThePlansGpusAndItsKindOfTorch) {
  DoctorFacts f = Healthy();
  f.gpus[1] = A100(1);
  f.gpus[1].xids = {79};
  f.request.gpu_pool = std::vector<int>{0};
  f.request.check_libtorch = false;
  const auto rows = Diagnose(f);
  EXPECT_EQ(Find(rows, "gpu.1")->status, CheckStatus::kNotApplicable) << Show(rows);
  EXPECT_THAT(Find(rows, "gpu.1")->found, HasSubstr("not in the pool"));
  EXPECT_EQ(Find(rows, "gpu.1.health"), nullptr);  // its XID does not stop a run without it
  EXPECT_EQ(Find(rows, "gpu.balance")->status, CheckStatus::kNotApplicable);
  EXPECT_EQ(Find(rows, "libtorch"), nullptr);
  EXPECT_EQ(Find(rows, "blas.libtorch"), nullptr);
  EXPECT_NE(Find(rows, "python.torch"), nullptr);
  EXPECT_EQ(DoctorExitCode(rows), 0) << Show(rows);
}

TEST(Diagnose, DefaultWorkersAreTheGpusInThePool) {
  DoctorFacts f = Healthy();
  f.gpus.push_back(H100(2));
  EXPECT_THAT(Find(Diagnose(f), "shm")->found, HasSubstr("for 3 workers"));
  f.request.exclude_gpus = {"0"};
  EXPECT_THAT(Find(Diagnose(f), "shm")->found, HasSubstr("for 2 workers"));
  f.nvml_loaded = false;
  f.gpus.clear();
  EXPECT_THAT(Find(Diagnose(f), "shm")->found, HasSubstr("for 1 worker"));
}

TEST(DoctorRender, TableAlignsAndPutsTheFixUnderItsRow) {
  const std::vector<DoctorRow> rows = {{"driver", CheckStatus::kNotApplicable, "no NVIDIA driver", "install it"},
                                       {"gpu.balance", CheckStatus::kWarn, "imbalanced", "--exclude-gpus 1"},
                                       {"shm", CheckStatus::kOk, "/dev/shm 1 GiB", ""}};
  EXPECT_EQ(RenderDoctorTable(rows),
            "STATUS CHECK       FOUND (and the fix)\n"
            "n-a    driver      no NVIDIA driver\n"
            "                   fix: install it\n"
            "warn   gpu.balance imbalanced\n"
            "                   fix: --exclude-gpus 1\n"
            "ok     shm         /dev/shm 1 GiB\n"
            "0 fail, 1 warn, 1 ok, 1 n-a: exit 1\n");
}

TEST(DoctorRender, ExitCodes) {
  EXPECT_EQ(DoctorExitCode({}), 0);
  EXPECT_EQ(DoctorExitCode({{"a", CheckStatus::kNotApplicable, "", ""}, {"b", CheckStatus::kOk, "", ""}}), 0);
  EXPECT_EQ(DoctorExitCode({{"a", CheckStatus::kWarn, "", ""}, {"b", CheckStatus::kOk, "", ""}}), 1);
  EXPECT_EQ(DoctorExitCode({{"a", CheckStatus::kWarn, "", ""}, {"b", CheckStatus::kFail, "", ""}}), 2);
}

// A probe that hands out the facts it was built with and keeps the request it was asked.
class FakeDoctorProbe : public DoctorProbe {
 public:
  explicit FakeDoctorProbe(DoctorFacts facts) : facts_(std::move(facts)) {}
  DoctorFacts Gather(const DoctorRequest& request) override {
    asked = request;
    DoctorFacts f = facts_;
    f.request = request;
    return f;
  }
  DoctorRequest asked;

 private:
  DoctorFacts facts_;
};

std::string RunCommand(DoctorProbe* probe, const DoctorRequest& request, bool json, int* code, bool preflight = false) {
  char* buf = nullptr;
  size_t size = 0;
  std::FILE* out = open_memstream(&buf, &size);
  *code = preflight ? Preflight(request, probe, out) : DoctorCommand(request, json, probe, out);
  std::fclose(out);
  std::string text(buf, size);
  std::free(buf);
  return text;
}

TEST(DoctorCommand, JsonParsesBackAndTheExitCodeIsTheVerdicts) {
  for (const auto& [name, change, code] : std::vector<std::tuple<const char*, std::function<void(DoctorFacts&)>, int>>{
           {"healthy", [](DoctorFacts&) {}, 0},
           {"persistence off", [](DoctorFacts& f) { f.gpus[0].persistence_mode = 0; }, 1},
           {"missing sm_90", [](DoctorFacts& f) { f.python_torch.arch_list = {"sm_80"}; }, 2}}) {
    SCOPED_TRACE(name);
    DoctorFacts f = Healthy();
    change(f);
    FakeDoctorProbe probe(f);
    DoctorRequest request;
    request.nproc = 2;
    request.log_dir = "/tmp/logs";
    int exit_code = -1;
    const std::string json = RunCommand(&probe, request, true, &exit_code);
    EXPECT_EQ(exit_code, code);
    EXPECT_EQ(probe.asked.log_dir, "/tmp/logs");
    v1::DoctorReport report;
    ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(json, &report).ok()) << json;
    EXPECT_EQ(report.exit_code(), code);
    EXPECT_EQ(report.verdict(), code == 0 ? "ok" : code == 1 ? "warn" : "fail");
    EXPECT_GT(report.checks_size(), 20);
    for (const auto& c : report.checks()) {
      EXPECT_THAT(c.status(), testing::AnyOf("ok", "warn", "fail", "n-a"));
      EXPECT_FALSE(c.id().empty());
      EXPECT_FALSE(c.found().empty()) << c.id();
    }
    // Every key is there, the empty fix too.
    EXPECT_THAT(json,
                AllOf(HasSubstr("\"id\""), HasSubstr("\"status\""), HasSubstr("\"found\""), HasSubstr("\"fix\":\"\"")));
  }
}

TEST(DoctorCommand, PreflightSaysNothingStartedOnlyOnAFailure) {
  DoctorFacts f = Healthy();
  f.gpus[0].persistence_mode = 0;
  FakeDoctorProbe warn(f);
  int code = -1;
  std::string text = RunCommand(&warn, {}, false, &code, true);
  EXPECT_EQ(code, 1);
  EXPECT_THAT(text, AllOf(HasSubstr("launch --preflight:\n"), HasSubstr("warn   gpu.0.persistence")));
  EXPECT_THAT(text, Not(HasSubstr("no worker was started")));
  f.gpus[0].ecc_uncorrected_errors = 2;
  FakeDoctorProbe fail(f);
  text = RunCommand(&fail, {}, false, &code, true);
  EXPECT_EQ(code, 2);
  EXPECT_THAT(text, HasSubstr("a check failed; no worker was started"));
}

// ---- Helpers ----

TEST(DoctorHelpers, Versions) {
  EXPECT_EQ(CudaVersionText(12040), "12.4");
  EXPECT_EQ(CudaVersionText(13000), "13.0");
  EXPECT_EQ(CudaVersionText(11080), "11.8");
  EXPECT_EQ(NcclVersionText(22809), "2.28.9");
  EXPECT_EQ(NcclVersionText(2708), "2.7.8");
  EXPECT_EQ(CudnnVersionText(91900), "9.19.0");
  EXPECT_EQ(CudnnVersionText(8902), "8.9.2");
  EXPECT_EQ(ParseCudaVersionText("12.1"), 12010);
  EXPECT_EQ(ParseCudaVersionText("12"), 12000);
  EXPECT_EQ(ParseCudaVersionText("11.8.0"), 11080);
  for (const char* bad : {"", "x", "12.x", "-1.0", "100.0", "12.100", "1.2.3.4"}) {
    EXPECT_EQ(ParseCudaVersionText(bad), 0) << bad;
  }
}

TEST(DoctorHelpers, ArchListRuns) {
  struct Row {
    std::vector<std::string> archs;
    int major, minor;
    bool runs;
  };
  for (const Row& r : std::vector<Row>{
           {{"sm_90"}, 9, 0, true},
           {{"sm_80"}, 8, 6, true},       // binary compatible within a major, to newer minors
           {{"sm_86"}, 8, 0, false},      // not to older ones
           {{"sm_80"}, 9, 0, false},      // nor across majors
           {{"compute_80"}, 9, 0, true},  // PTX is JIT-compiled forward
           {{"compute_90"}, 8, 6, false},
           {{"sm_90a"}, 9, 0, true},  // arch-specific: its own capability only
           {{"sm_90a"}, 9, 1, false},
           {{"sm_100", "sm_120"}, 12, 0, true},
           {{"sm_100"}, 10, 3, true},
           {{}, 9, 0, false},
           {{"garbage", "sm_", "sm_x0", "compute_"}, 9, 0, false},
       }) {
    EXPECT_EQ(ArchListRuns(r.archs, r.major, r.minor), r.runs)
        << absl::StrJoin(r.archs, ",") << " on " << r.major << "." << r.minor;
  }
}

TEST(DoctorHelpers, ClassifyBlas) {
  EXPECT_EQ(ClassifyBlas("/usr/lib/x86_64-linux-gnu/blas/libblas.so.3.11.0"), BlasKind::kReference);
  EXPECT_EQ(ClassifyBlas("/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3"), BlasKind::kOpenBlas);
  EXPECT_EQ(ClassifyBlas("/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblasp-r0.3.21.so"), BlasKind::kOpenBlas);
  EXPECT_EQ(ClassifyBlas("/opt/intel/mkl/lib/intel64/libmkl_rt.so.2"), BlasKind::kMkl);
  EXPECT_EQ(ClassifyBlas("/usr/lib/x86_64-linux-gnu/blis-openmp/libblas.so.3"), BlasKind::kBlis);
  EXPECT_EQ(ClassifyBlas("/usr/lib/x86_64-linux-gnu/atlas/libblas.so.3"), BlasKind::kAtlas);
  EXPECT_EQ(ClassifyBlas("/usr/lib64/libflexiblas.so.3"), BlasKind::kFlexiBlas);
  EXPECT_EQ(ClassifyBlas("/usr/lib64/libblas.so.3"), BlasKind::kUnknown);
  EXPECT_EQ(PickBlas({"/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3",
                      "/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblasp-r0.3.21.so"}),
            "/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblasp-r0.3.21.so");
  EXPECT_EQ(PickBlas({"/usr/lib/liblapack.so.3", "/usr/lib/x86_64-linux-gnu/blas/libblas.so.3"}),
            "/usr/lib/x86_64-linux-gnu/blas/libblas.so.3");
  EXPECT_EQ(PickBlas({"/usr/lib/libcblas.so.3"}), "");
}

TEST(DoctorHelpers, SmallParsers) {
  EXPECT_EQ(ParseCudaVersionDefine("#ifndef X\n#define CUDA_VERSION_MAJOR 1\n#define CUDA_VERSION 13000\n"), 13000);
  EXPECT_EQ(ParseCudaVersionDefine("  #  define CUDA_VERSION 12040 /* x */"),
            0);  // not what cuda.h writes
  EXPECT_EQ(ParseCudaVersionDefine("#define CUDA_VERSION 12040"), 12040);
  EXPECT_EQ(ParseCudaVersionDefine("no define"), 0);
  EXPECT_THAT(*ParseCpuList("0-3,8,10-11"), ElementsAre(0, 1, 2, 3, 8, 10, 11));
  EXPECT_THAT(*ParseCpuList(""), IsEmpty());
  EXPECT_FALSE(ParseCpuList("3-1"));
  EXPECT_FALSE(ParseCpuList("a"));
  EXPECT_FALSE(ParseCpuList("0-4294967295"));  // bounded, never a four-billion-entry vector
  EXPECT_FALSE(ParseCpuList("0-9", 4));
  EXPECT_EQ(FilesystemTypeName(0xEF53), "ext4");
  EXPECT_EQ(FilesystemTypeName(0x01021994), "tmpfs");
  EXPECT_EQ(FilesystemTypeName(0x6969), "nfs");
  EXPECT_EQ(FilesystemTypeName(0x12345678), "0x12345678");
  EXPECT_EQ(SysfsPciAddress("00000000:18:00.0"), "0000:18:00.0");
  EXPECT_EQ(SysfsPciAddress("0000:3B:00.0"), "0000:3b:00.0");
  EXPECT_EQ(SonameVersion("libtorch.so.1.13.0"), "1.13.0");
  EXPECT_EQ(SonameVersion("libcudart.so.12"), "12");
  EXPECT_EQ(SonameVersion("libtorch.so"), "");
  EXPECT_EQ(SonameVersion("libfoo.so.1a"), "");
}

TEST(DoctorHelpers, LibrarySearchPathInTheLoadersOrder) {
  EXPECT_THAT(LibrarySearchPath("/opt/a:/opt/b/::relative",
                                {"# comment\ninclude /etc/ld.so.conf.d/*.conf\n/usr/local/lib\n",
                                 "/usr/local/cuda-13.0/lib  # cuda\n/opt/a\n"},
                                "x86_64-linux-gnu"),
              ElementsAre("/opt/a", "/opt/b", "/usr/local/lib", "/usr/local/cuda-13.0/lib", "/lib/x86_64-linux-gnu",
                          "/usr/lib/x86_64-linux-gnu", "/lib64", "/usr/lib64", "/lib", "/usr/lib"));
}

TEST(DoctorHelpers, PythonProbeJson) {
  TorchFacts t;
  ASSERT_TRUE(ParsePythonProbe(R"({"python": "/usr/bin/python3", "version": "2.1.0+cu118", "cuda": "11.8",
      "arch_list": ["sm_50", "sm_86", "compute_86"], "cudnn_version": 8700, "nccl_version": "2.18.1",
      "blas_info": "mkl", "blas_libraries": [], "something_new": 1})",
                               &t)
                  .ok());
  EXPECT_TRUE(t.found);
  EXPECT_TRUE(t.cuda);
  EXPECT_EQ(t.version, "2.1.0+cu118");
  EXPECT_EQ(t.cuda_version, "11.8");
  EXPECT_THAT(t.arch_list, ElementsAre("sm_50", "sm_86", "compute_86"));
  EXPECT_EQ(t.cudnn_version, 8700);
  EXPECT_TRUE(t.blas_bundled);

  TorchFacts cpu;
  ASSERT_TRUE(ParsePythonProbe(
                  R"({"version": "1.13.0a0", "cuda": "", "arch_list": [], "blas_info": "generic",
      "blas_libraries": ["/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3",
                         "/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblasp-r0.3.21.so"]})",
                  &cpu)
                  .ok());
  EXPECT_FALSE(cpu.cuda);
  EXPECT_FALSE(cpu.blas_bundled);
  EXPECT_EQ(cpu.blas_library, "/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblasp-r0.3.21.so");

  TorchFacts missing;
  ASSERT_TRUE(
      ParsePythonProbe(R"({"python": "/x", "missing": "ModuleNotFoundError: No module named 'torch'"})", &missing)
          .ok());
  EXPECT_FALSE(missing.found);
  EXPECT_THAT(missing.missing, HasSubstr("No module named 'torch'"));

  // Hostile or broken output: an error, or bounded figures, never a crash.
  for (const char* bad :
       {"", "not json", "[1,2]", "{\"version\": 3}", "{\"cuda\": \"12.1\"}", "{\"version\": \"2.0\""}) {
    TorchFacts b;
    EXPECT_FALSE(ParsePythonProbe(bad, &b).ok()) << bad;
  }
  std::vector<std::string> many(1000, "\"sm_80\"");
  TorchFacts big;
  ASSERT_TRUE(ParsePythonProbe(absl::StrCat(R"({"version": ")", std::string(5000, 'v'), R"(", "arch_list": [)",
                                            absl::StrJoin(many, ","), "]}"),
                               &big)
                  .ok());
  EXPECT_EQ(big.arch_list.size(), static_cast<size_t>(kMaxProbeArchs));
  EXPECT_LE(big.version.size(), 64u);
}

// ---- ELF ----

// A little ELF64 shared object: a .dynamic naming `needed` through .dynstr, and a .nv_fatbin
// with one fat binary holding `entries` (kind, arch).
std::string MakeElf(const std::vector<std::string>& needed, const std::vector<std::pair<uint16_t, uint32_t>>& entries,
                    bool corrupt_fatbin = false) {
  auto put = [](std::string& s, size_t at, auto v) { std::memcpy(&s[at], &v, sizeof v); };
  std::string dynstr(1, '\0');
  std::vector<uint64_t> offsets;
  for (const auto& n : needed) {
    offsets.push_back(dynstr.size());
    dynstr += n + '\0';
  }
  std::string dynamic((needed.size() + 1) * 16, '\0');
  for (size_t i = 0; i < needed.size(); ++i) {
    put(dynamic, i * 16, int64_t{1});
    put(dynamic, i * 16 + 8, offsets[i]);
  }
  std::string fatbin(16, '\0');
  std::string body;
  for (const auto& [kind, arch] : entries) {
    std::string e(64, '\0');
    put(e, 0, kind);
    put(e, 4, uint32_t{64});  // entry header size
    put(e, 8, uint64_t{32});  // payload size
    put(e, 28, arch);
    body += e + std::string(32, 'x');
  }
  put(fatbin, 0, uint32_t{0xBA55ED50});
  put(fatbin, 4, uint16_t{1});
  put(fatbin, 6, uint16_t{16});
  put(fatbin, 8, uint64_t{corrupt_fatbin ? 1ull << 60 : body.size()});
  fatbin += body;
  const std::string shstrtab = std::string("\0.dynstr\0.dynamic\0.nv_fatbin\0.shstrtab\0", 38);
  // Layout: header, dynstr, dynamic, fatbin, shstrtab, section headers.
  std::string file(64, '\0');
  const uint64_t dynstr_off = file.size();
  file += dynstr;
  const uint64_t dynamic_off = file.size();
  file += dynamic;
  const uint64_t fatbin_off = file.size();
  file += fatbin;
  const uint64_t shstrtab_off = file.size();
  file += shstrtab;
  const uint64_t shoff = file.size();
  std::string sh(5 * 64, '\0');
  auto section = [&](int i, uint32_t name, uint32_t type, uint64_t off, uint64_t size, uint32_t link) {
    put(sh, i * 64, name);
    put(sh, i * 64 + 4, type);
    put(sh, i * 64 + 24, off);
    put(sh, i * 64 + 32, size);
    put(sh, i * 64 + 40, link);
  };
  section(1, 1, 3, dynstr_off, dynstr.size(), 0);       // .dynstr (STRTAB)
  section(2, 9, 6, dynamic_off, dynamic.size(), 1);     // .dynamic, linked to .dynstr
  section(3, 18, 1, fatbin_off, fatbin.size(), 0);      // .nv_fatbin (PROGBITS)
  section(4, 29, 3, shstrtab_off, shstrtab.size(), 0);  // .shstrtab
  file += sh;
  std::memcpy(&file[0],
              "\x7f"
              "ELF",
              4);
  file[4] = 2;  // 64-bit
  file[5] = 1;  // little-endian
  put(file, 0x28, shoff);
  put(file, 0x3A, uint16_t{64});
  put(file, 0x3C, uint16_t{5});
  put(file, 0x3E, uint16_t{4});
  return file;
}

std::string WriteTemp(const std::string& name, const std::string& bytes) {
  const std::string path = absl::StrCat(::testing::TempDir(), "doctor_", getpid(), "_", name);
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

TEST(ElfFacts, ReadsNeededAndFatbinArchitectures) {
  const std::string path = WriteTemp("cuda.so", MakeElf({"libc10_cuda.so", "libcudart.so.12", "libnccl.so.2"},
                                                        {{2, 80}, {2, 90}, {1, 90}, {2, 50}}));
  auto facts = ReadElfFacts(path);
  ASSERT_TRUE(facts.ok()) << facts.status();
  EXPECT_THAT(facts->needed, ElementsAre("libc10_cuda.so", "libcudart.so.12", "libnccl.so.2"));
  EXPECT_TRUE(facts->has_fatbin);
  EXPECT_THAT(facts->gpu_archs, ElementsAre("sm_50", "sm_80", "sm_90", "compute_90"));
  EXPECT_EQ(std::remove(path.c_str()), 0);
}

TEST(ElfFacts, HostileFilesAreErrorsOrEmptyNeverCrashes) {
  EXPECT_FALSE(ReadElfFacts("/nonexistent/libtorch.so").ok());
  EXPECT_FALSE(
      ReadElfFacts(WriteTemp("text", "not an elf file at all, but long enough to have a header........")).ok());
  const std::string good = MakeElf({"libblas.so.3"}, {{2, 90}});
  EXPECT_FALSE(ReadElfFacts(WriteTemp("short", good.substr(0, 40))).ok());
  EXPECT_FALSE(ReadElfFacts(WriteTemp("truncated", good.substr(0, good.size() - 100))).ok());
  std::string huge_sections = good;
  const uint16_t n = 65535;
  std::memcpy(&huge_sections[0x3C], &n, 2);
  EXPECT_FALSE(ReadElfFacts(WriteTemp("sections", huge_sections)).ok());
  // A fat binary claiming an exabyte: its architectures are not read, the rest is.
  auto corrupt = ReadElfFacts(WriteTemp("fatbin", MakeElf({"libcudart.so.12"}, {{2, 90}}, true)));
  ASSERT_TRUE(corrupt.ok()) << corrupt.status();
  EXPECT_THAT(corrupt->needed, ElementsAre("libcudart.so.12"));
  EXPECT_THAT(corrupt->gpu_archs, IsEmpty());
  // A FIFO is not read (it would block).
  const std::string fifo = absl::StrCat(::testing::TempDir(), "doctor_fifo_", getpid());
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  int fd = ::open(fifo.c_str(), O_RDWR | O_NONBLOCK);  // a writer, so that opening it does not block
  EXPECT_FALSE(ReadElfFacts(fifo).ok());
  ::close(fd);
  ::unlink(fifo.c_str());
}

// ---- The Python probe through a real subprocess ----

// A python3 stand-in: a shell script with `body`.
std::string FakePython(const std::string& name, const std::string& body) {
  const std::string path = WriteTemp(name, "#!/bin/sh\n" + body);
  ::chmod(path.c_str(), 0755);
  return path;
}

bool Alive(pid_t pid) {
  std::ifstream stat(absl::StrCat("/proc/", pid, "/stat"));
  std::string line;
  if (!std::getline(stat, line)) return false;
  const size_t close = line.rfind(')');
  return close != std::string::npos && close + 2 < line.size() && line[close + 2] != 'Z';
}

pid_t ReadPid(const std::string& path) {
  std::ifstream f(path);
  pid_t pid = 0;
  f >> pid;
  return pid;
}

TorchFacts ProbePython(const std::string& python, std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
  DoctorRequest request;
  request.check_libtorch = false;
  request.python = python;
  request.python_timeout = timeout;
  return SystemDoctorProbe().Gather(request).python_torch;
}

TEST(DoctorPythonProbe, ATorchAnswers) {
  const TorchFacts t = ProbePython(FakePython("answers", R"(echo "noise from a sitecustomize"
echo '{"version": "2.1.0+cu121", "cuda": "12.1", "arch_list": ["sm_80", "sm_90"]}')"));
  EXPECT_TRUE(t.found) << t.error << t.missing;
  EXPECT_EQ(t.version, "2.1.0+cu121");
  EXPECT_THAT(t.arch_list, ElementsAre("sm_80", "sm_90"));
}

TEST(DoctorPythonProbe, AHangingInterpreterIsKilledAtTheDeadline) {
  const std::string pid_file = absl::StrCat(::testing::TempDir(), "doctor_hang_pid_", getpid());
  const auto start = std::chrono::steady_clock::now();
  const TorchFacts t = ProbePython(FakePython("hangs", absl::StrCat("echo $$ > ", pid_file, "\nexec sleep 100\n")),
                                   std::chrono::milliseconds(300));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  EXPECT_FALSE(t.found);
  EXPECT_THAT(t.error, HasSubstr("did not answer within 300ms"));
  const pid_t pid = ReadPid(pid_file);
  ASSERT_GT(pid, 0);
  EXPECT_FALSE(Alive(pid));  // killed and reaped
}

TEST(DoctorPythonProbe, WhatItLeavesHoldingItsOutputIsKilledToo) {
  const std::string pid_file = absl::StrCat(::testing::TempDir(), "doctor_leftover_pid_", getpid());
  const TorchFacts t = ProbePython(FakePython("leaves", absl::StrCat(R"(echo '{"version": "2.1.0", "cuda": ""}'
sleep 100 &
echo $! > )",
                                                                     pid_file, "\n")),
                                   std::chrono::milliseconds(300));
  EXPECT_TRUE(t.found) << t.error;  // it did answer
  const pid_t pid = ReadPid(pid_file);
  ASSERT_GT(pid, 0);
  bool gone = false;
  for (int i = 0; i < 500 && !gone; ++i) {  // reparented to init, which reaps it
    gone = !Alive(pid);
    if (!gone) ::usleep(10000);
  }
  EXPECT_TRUE(gone);
}

TEST(DoctorPythonProbe, GarbageAndCrashesAreOneLine) {
  TorchFacts t = ProbePython(FakePython("traceback",
                                        "echo 'not json'\necho 'Traceback:' >&2\necho 'ImportError: "
                                        "libcudart.so.12: cannot open' >&2\nexit 1\n"));
  EXPECT_FALSE(t.found);
  EXPECT_THAT(t.error, HasSubstr(": ImportError: libcudart.so.12: cannot open"));
  t = ProbePython(FakePython("flood", "head -c 1000000 /dev/zero | tr '\\0' x\n"));
  EXPECT_FALSE(t.found);
  EXPECT_THAT(t.error, HasSubstr("printed no JSON"));
  t = ProbePython(FakePython("segv", "kill -SEGV $$\n"));
  EXPECT_THAT(t.error, HasSubstr("was killed by SIGSEGV"));
  t = ProbePython("/nonexistent/python3");
  EXPECT_FALSE(t.found);
  EXPECT_THAT(t.missing, HasSubstr("/nonexistent/python3"));
}

}  // namespace
}  // namespace launch
