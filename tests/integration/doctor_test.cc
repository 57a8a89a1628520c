// `launch doctor` and `launch --preflight`, the real binary: against this machine as it is, and
// against a fake NVML (LAUNCH_NVML_LIBRARY, tests/fakes/fake_nvml.cc) and a fake python3 first on PATH
// that play GPUs and a torch, through the same dlopen and subprocess paths as on a GPU machine.
#include <dlfcn.h>
#include <signal.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "launch.pb.h"
#include "tests/test_util.h"

namespace launch::testing {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

const std::string kLaunch = LAUNCH_BIN;

v1::DoctorReport ParseReport(const RunResult& r) {
  v1::DoctorReport report;
  const auto st = google::protobuf::util::JsonStringToMessage(r.out, &report);
  EXPECT_TRUE(st.ok()) << st << "\n" << r.out << r.err;
  EXPECT_EQ(report.exit_code(), r.exit_code);
  return report;
}

// The check with this id; a failed expectation (and an empty check) when there is none.
v1::DoctorCheck Check(const v1::DoctorReport& report, const std::string& id) {
  for (const auto& c : report.checks()) {
    if (c.id() == id) return c;
  }
  ADD_FAILURE() << "no check " << id;
  return {};
}

bool HasCheck(const v1::DoctorReport& report, const std::string& id) {
  for (const auto& c : report.checks()) {
    if (c.id() == id) return true;
  }
  return false;
}

// A machine played by the fakes: its GPUs in the fake NVML's file, its torch in a python3 script
// that prints the probe's JSON for `-c` and, run as a worker, leaves a file behind.
class FakeMachine {
 public:
  FakeMachine() { std::filesystem::create_directories(dir_ / "bin"); }

  void Gpus(const std::string& nvml_file) { WriteFile(dir_ / "nvml.txt", nvml_file); }
  void Torch(const std::string& probe_json) {
    const std::string python = dir_ / "bin/python3";
    WriteFile(python, absl::StrCat("#!/bin/sh\nif [ \"$1\" = -c ]; then\n  echo '", probe_json,
                                   "'\n  exit 0\nfi\ntouch '", WorkerRanFile(), "'\n"));
    ::chmod(python.c_str(), 0755);
  }
  std::string WorkerRanFile() const { return dir_ / "worker_ran"; }
  bool WorkerRan() const { return std::filesystem::exists(WorkerRanFile()); }
  std::string Script() {
    WriteFile(dir_ / "train.py", "print('training')\n");
    return dir_ / "train.py";
  }

  // The environment launch runs in: the fakes, and nothing of the test's own that would change it.
  std::vector<std::string> Env() const {
    const char* path = std::getenv("PATH");
    return {absl::StrCat("LAUNCH_NVML_LIBRARY=", FAKE_NVML_LIB),
            "FAKE_NVML_FILE=" + (dir_ / "nvml.txt"),
            absl::StrCat("PATH=", dir_ / "bin", ":", path ? path : "/usr/bin:/bin"),
            "PYTHON_EXEC",
            "CUDA_VISIBLE_DEVICES",
            "CUDA_HOME=" + (dir_ / "bin"),
            "OMP_NUM_THREADS"};
  }
  RunResult Run(std::vector<std::string> args) const {
    args.insert(args.begin(), kLaunch);
    return RunCmd(args, Env(), std::chrono::seconds(60));
  }
  // A python3 whose `import torch` never returns; it writes its pid first.
  void HangingTorch() {
    const std::string python = dir_ / "bin/python3";
    WriteFile(python, absl::StrCat("#!/bin/sh\necho $$ > '", PidFile(), "'\nexec sleep 1000\n"));
    ::chmod(python.c_str(), 0755);
  }
  std::string PidFile() const { return dir_ / "python.pid"; }

 private:
  TempDir dir_;
};

constexpr char kTwoUnequalGpus[] = R"(system driver=580.65.06 cuda=13000
gpu name="NVIDIA H100 80GB HBM3" uuid=GPU-aaaa pci=00000000:18:00.0 mem_total_mib=81559 mem_used_mib=500 util=0 mem_util=0 cc=9.0 sms=132 ecc=0 retired_sbe=0 retired_dbe=0 remap_pending=0 persistence=1 xid=
gpu name="NVIDIA A100-SXM4-40GB" uuid=GPU-bbbb pci=00000000:3B:00.0 mem_total_mib=40960 mem_used_mib=39000 util=97 mem_util=40 cc=8.0 sms=108 ecc=0 retired_sbe=0 retired_dbe=0 remap_pending=0 persistence=1 xid=79
)";

// A torch built for CUDA 11.8 with kernels up to sm_86: no sm_90, so nothing runs on an H100.
constexpr char kTorchWithoutSm90[] =
    R"({"python": "fake", "version": "2.0.1+cu118", "cuda": "11.8", "arch_list": ["sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86"], "cudnn_version": 8700, "nccl_version": "2.14.3", "blas_info": "mkl", "blas_libraries": []})";
constexpr char kTorchWithSm90[] =
    R"({"python": "fake", "version": "2.6.0+cu130", "cuda": "13.0", "arch_list": ["sm_80", "sm_90", "compute_90"], "blas_info": "mkl", "blas_libraries": []})";

TEST(DoctorFakeGpus, TwoUnequalGpusAnXidAnIdleGpuAndATorchWithoutTheGpusKernels) {
  FakeMachine m;
  m.Gpus(kTwoUnequalGpus);
  m.Torch(kTorchWithoutSm90);
  RunResult r = m.Run({"doctor", "--json"});
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  const v1::DoctorReport report = ParseReport(r);
  EXPECT_EQ(report.verdict(), "fail");

  EXPECT_EQ(Check(report, "driver").status(), "ok");
  EXPECT_THAT(Check(report, "driver").found(),
              HasSubstr("driver 580.65.06, supports CUDA up to 13.0, 2 GPUs"));
  EXPECT_EQ(Check(report, "python.torch").status(), "ok");
  EXPECT_THAT(Check(report, "python.torch").found(), HasSubstr("Python torch 2.0.1+cu118 in "));

  // The seed's imbalance warning, with the GPU to leave out.
  const auto balance = Check(report, "gpu.balance");
  EXPECT_EQ(balance.status(), "warn");
  EXPECT_THAT(balance.found(), HasSubstr("1 (NVIDIA A100-SXM4-40GB, 40 GiB, 108 SMs) vs 0 (NVIDIA "
                                         "H100 80GB HBM3, 79 GiB, 132 SMs)"));
  EXPECT_EQ(balance.fix(), "--exclude-gpus 1");

  // The GPU at 0% is idle and fine; the other is busy with someone else's work.
  EXPECT_EQ(Check(report, "gpu.0").status(), "ok");
  EXPECT_THAT(
      Check(report, "gpu.0").found(),
      AllOf(HasSubstr("GPU 0 NVIDIA H100 80GB HBM3, GPU-aaaa"), HasSubstr("compute capability 9.0"),
            HasSubstr("132 SMs"), HasSubstr("idle (0% busy)")));
  EXPECT_EQ(Check(report, "gpu.1").status(), "warn");
  EXPECT_THAT(Check(report, "gpu.1").found(), HasSubstr("97% busy"));

  // XID 79: the GPU fell off the bus.
  EXPECT_EQ(Check(report, "gpu.1.health").status(), "fail");
  EXPECT_THAT(Check(report, "gpu.1.health").found(),
              HasSubstr("XID 79 (GPU has fallen off the bus)"));
  EXPECT_THAT(Check(report, "gpu.1.health").fix(), HasSubstr("nvidia-smi -r -i 1"));
  EXPECT_EQ(Check(report, "gpu.0.health").status(), "ok");

  // "no kernel image is available": named with the GPU and its architecture.
  const auto kernels = Check(report, "gpu.0.kernels");
  EXPECT_EQ(kernels.status(), "fail");
  EXPECT_THAT(kernels.found(), AllOf(HasSubstr("GPU 0 (NVIDIA H100 80GB HBM3, sm_90)"),
                                     HasSubstr("Python torch 2.0.1+cu118 has only sm_50, sm_60"),
                                     HasSubstr("no kernel image is available")));
  EXPECT_THAT(kernels.fix(), HasSubstr("install a torch built for sm_90"));
  EXPECT_EQ(Check(report, "gpu.1.kernels").status(), "ok");  // sm_80 is in its list

  // The table says the same, with each fix under its row.
  r = m.Run({"doctor"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.out, AllOf(HasSubstr("warn   gpu.balance"), HasSubstr("fix: --exclude-gpus 1"),
                           HasSubstr("fail   gpu.0.kernels"), HasSubstr("fail   gpu.1.health")));
  EXPECT_THAT(r.out, HasSubstr(" fail, "));
}

TEST(DoctorFakeGpus, FollowingTheExcludeFixLeavesTheOtherGpuOut) {
  FakeMachine m;
  m.Gpus(kTwoUnequalGpus);
  m.Torch(kTorchWithSm90);
  const RunResult r = m.Run({"doctor", "--json", "--exclude-gpus", "1"});
  const v1::DoctorReport report = ParseReport(r);
  EXPECT_EQ(Check(report, "gpu.balance").status(), "n-a");
  EXPECT_EQ(Check(report, "gpu.1").status(), "n-a");
  EXPECT_FALSE(HasCheck(report, "gpu.1.health"));  // its XID no longer matters
  EXPECT_EQ(Check(report, "gpu.0.kernels").status(), "ok");
  for (const auto& c : report.checks())
    EXPECT_NE(c.status(), "fail") << c.id() << ": " << c.found();
  EXPECT_EQ(r.exit_code, 1);  // the CPU-only LibTorch next to GPUs is still a warning
  EXPECT_EQ(Check(report, "libtorch").status(), "warn");
}

TEST(DoctorFakeGpus, WarningsOnlyExitOne) {
  FakeMachine m;
  m.Gpus(R"(system driver=580.65.06 cuda=13000
gpu name="NVIDIA H100 80GB HBM3" uuid=GPU-aaaa mem_total_mib=81559 mem_used_mib=500 util=0 cc=9.0 sms=132 ecc=0 persistence=1
gpu name="NVIDIA H100 80GB HBM3" uuid=GPU-cccc mem_total_mib=81559 mem_used_mib=500 util=0 cc=9.0 sms=132 ecc=0 persistence=0
)");
  m.Torch(kTorchWithSm90);
  const RunResult r = m.Run({"doctor", "--json"});
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  const v1::DoctorReport report = ParseReport(r);
  EXPECT_EQ(report.verdict(), "warn");
  EXPECT_EQ(Check(report, "gpu.1.persistence").status(), "warn");
  EXPECT_EQ(Check(report, "gpu.1.persistence").fix(),
            "sudo nvidia-smi -pm 1 (or run nvidia-persistenced)");
  EXPECT_EQ(Check(report, "gpu.balance").status(), "ok");
  EXPECT_EQ(Check(report, "gpu.stack").status(), "ok");
  for (const auto& c : report.checks())
    EXPECT_NE(c.status(), "fail") << c.id() << ": " << c.found();
}

TEST(DoctorFakeGpus, CtrlCIsNotHeldUpByAHangingImportTorch) {
  FakeMachine m;
  m.Gpus(kTwoUnequalGpus);
  m.HangingTorch();
  Child doctor({kLaunch, "doctor"}, m.Env());
  ASSERT_TRUE(WaitUntil([&] { return !ReadFile(m.PidFile()).empty(); }, std::chrono::seconds(20)));
  const pid_t python = std::atoi(ReadFile(m.PidFile()).c_str());
  const auto start = std::chrono::steady_clock::now();
  ::kill(doctor.pid(), SIGINT);
  const RunResult r = doctor.Wait(std::chrono::seconds(20));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));  // not the 30 s deadline
  EXPECT_EQ(r.exit_code, 128 + SIGINT) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("stopped by SIGINT while asking"));
  EXPECT_TRUE(WaitUntil([&] { return !ProcessAlive(python); }, std::chrono::seconds(5)));
}

TEST(DoctorFakeGpus, BadFlagsAreOneLineAndExitTwo) {
  const RunResult r = RunCmd({kLaunch, "doctor", "--nproc-per-node", "zero"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, AllOf(HasSubstr("launch doctor: "), HasSubstr("--nproc-per-node")));
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
}

// What is true here, found out by the test on its own, is what doctor says: no fakes.
TEST(DoctorThisMachine, SaysWhatIsTrueHere) {
  const RunResult r =
      RunCmd({kLaunch, "doctor", "--json"},
             {"LAUNCH_NVML_LIBRARY", "FAKE_NVML_FILE", "CUDA_HOME", "CUDA_PATH", "PYTHON_EXEC"});
  const v1::DoctorReport report = ParseReport(r);
  std::cout << RunCmd({kLaunch, "doctor"},
                      {"LAUNCH_NVML_LIBRARY", "CUDA_HOME", "CUDA_PATH", "PYTHON_EXEC"})
                   .out;
  int facts = 0;

  void* nvml = dlopen("libnvidia-ml.so.1", RTLD_LAZY | RTLD_LOCAL);
  const bool driver = nvml != nullptr;
  if (nvml) dlclose(nvml);
  if (!driver) {
    ++facts;
    EXPECT_EQ(Check(report, "driver").status(), "n-a");
    EXPECT_THAT(Check(report, "driver").found(),
                HasSubstr("no NVIDIA driver: cannot load libnvidia-ml.so.1"));
    EXPECT_EQ(Check(report, "driver.cuda").status(), "n-a");
    EXPECT_FALSE(HasCheck(report, "gpu.0"));
  }

  const std::string cuda_h = ReadFile("/usr/local/cuda/include/cuda.h");
  const size_t at = cuda_h.find("#define CUDA_VERSION ");
  if (at != std::string::npos) {
    ++facts;
    const int version = std::atoi(cuda_h.c_str() + at + 21);
    const std::string text = absl::StrCat(version / 1000, ".", version % 1000 / 10);
    EXPECT_EQ(Check(report, "cuda.toolkit").status(), "ok");
    EXPECT_THAT(Check(report, "cuda.toolkit").found(),
                AllOf(HasSubstr(absl::StrCat("CUDA ", text, " toolkit at ")),
                      HasSubstr(std::filesystem::canonical("/usr/local/cuda").string())));
  }

  for (const auto& [id, library, name] :
       std::vector<std::tuple<const char*, const char*, const char*>>{
           {"nccl", "libnccl.so.2", "NCCL 2."},
           {"cudnn", "libcudnn.so", "cuDNN "},
           {"cuda.runtime", "libcudart.so", "libcudart "}}) {
    void* lib = dlopen(library, RTLD_LAZY | RTLD_LOCAL);
    if (lib == nullptr) continue;
    dlclose(lib);
    ++facts;
    EXPECT_EQ(Check(report, id).status(), "ok") << id;
    EXPECT_THAT(Check(report, id).found(), HasSubstr(name)) << id;
  }

  const std::string libdir = "/usr/lib/x86_64-linux-gnu";
  if (std::filesystem::exists(libdir + "/libtorch.so") &&
      !std::filesystem::exists(libdir + "/libtorch_cuda.so")) {
    ++facts;
    const auto libtorch = Check(report, "libtorch");
    EXPECT_THAT(libtorch.found(),
                AllOf(HasSubstr("LibTorch "), HasSubstr("at " + libdir), HasSubstr("CPU-only")));
    if (!driver && at != std::string::npos) {
      // Installed CUDA pieces, and nothing that could use them.
      // A CPU machine for a CPU run: not a warning (launch doctor exits 0 on it).
      const auto stack = Check(report, "gpu.stack");
      EXPECT_EQ(stack.status(), "n-a");
      EXPECT_THAT(stack.found(),
                  AllOf(HasSubstr("there is no NVIDIA driver"), HasSubstr("is CPU-only"),
                        HasSubstr("GPUs could not be used even with a driver")));
    }
  }
  if (facts == 0)
    GTEST_SKIP() << "neither a driver-less machine nor any CUDA library or LibTorch to check";
  // Whatever else, every row is one of the four and the code follows the worst.
  EXPECT_THAT(r.exit_code, ::testing::AnyOf(0, 1, 2));
}

// `launch --preflight` of a .py worker on one H100 whose persistence mode is `persistence`, with
// the torch `probe_json` describes; `m` tells whether the worker ran.
RunResult RunPreflight(FakeMachine& m, int persistence, const char* probe_json) {
  m.Gpus(absl::StrCat(R"(system driver=580.65.06 cuda=13000
gpu name="NVIDIA H100 80GB HBM3" uuid=GPU-aaaa mem_total_mib=81559 mem_used_mib=500 util=0 cc=9.0 sms=132 ecc=0 persistence=)",
                      persistence, "\n"));
  m.Torch(probe_json);
  return m.Run({"--preflight", "--nproc-per-node", "1", m.Script()});
}

TEST(Preflight, AFailureStopsTheRunBeforeAnyWorkerStarts) {
  FakeMachine m;
  const RunResult r = RunPreflight(m, 1, kTorchWithoutSm90);
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_THAT(r.err, AllOf(HasSubstr("launch --preflight:"), HasSubstr("fail   gpu.0.kernels"),
                           HasSubstr("no worker was started")));
  EXPECT_THAT(r.err, Not(HasSubstr("libtorch")));  // a .py worker runs on Python's torch
  EXPECT_FALSE(m.WorkerRan());
}

TEST(Preflight, WarningsArePrintedAndTheRunGoesOn) {
  FakeMachine m;
  const RunResult r = RunPreflight(m, 0, kTorchWithSm90);
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(r.err, AllOf(HasSubstr("launch --preflight:"), HasSubstr("warn   gpu.0.persistence"),
                           HasSubstr("0 fail, ")));
  EXPECT_THAT(r.err, Not(HasSubstr("no worker was started")));
  EXPECT_TRUE(m.WorkerRan());
}

TEST(Preflight, WithoutTheFlagNothingIsChecked) {
  FakeMachine m;
  m.Gpus(R"(system driver=580.65.06 cuda=13000
gpu name="NVIDIA H100 80GB HBM3" uuid=GPU-aaaa mem_total_mib=81559 cc=9.0 sms=132
)");
  m.Torch(kTorchWithoutSm90);
  const RunResult r = m.Run({"--nproc-per-node", "1", m.Script()});
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(r.err, Not(HasSubstr("preflight")));
  EXPECT_TRUE(m.WorkerRan());
}

}  // namespace
}  // namespace launch::testing
