// The NVML loader through the real dlopen path, against libfake_nvml.so (tests/fakes/fake_nvml.cc), whose
// GPUs each test describes in the file FAKE_NVML_FILE names.
#include "probes/nvml.h"
#include "probes/devices.h"

#include <dlfcn.h>
#include <stdlib.h>

#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace launch {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::StartsWith;

class NvmlTest : public ::testing::Test {
 protected:
  void TearDown() override { unsetenv("FAKE_NVML_FILE"); }

  // The machine the fake NVML shows, in its file format.
  void Machine(const std::string& text) {
    const std::string path =
        absl::StrCat(::testing::TempDir(), "fake_nvml_",
                     ::testing::UnitTest::GetInstance()->current_test_info()->name(), ".txt");
    std::ofstream(path) << text;
    setenv("FAKE_NVML_FILE", path.c_str(), 1);
  }

  static absl::StatusOr<std::unique_ptr<Nvml>> Load() { return Nvml::Load(FAKE_NVML_LIB); }
  // The fake, loaded; null (and the test failed) where it would not load.
  static std::unique_ptr<Nvml> LoadFake() {
    auto nvml = Load();
    EXPECT_TRUE(nvml.ok()) << nvml.status();
    return nvml.ok() ? std::move(*nvml) : nullptr;
  }
};

// Every field in one line, so that a figure read from the wrong place cannot pass and a
// failure shows the whole GPU.
std::string Describe(const GpuFigures& g) {
  return absl::StrCat(
      "index=", g.index, " error='", g.error, "' name='", g.name, "' uuid='", g.uuid, "' pci='",
      g.pci_bus_id, "' memory=", g.memory_total_bytes, "/", g.memory_used_bytes,
      " util=", g.utilization_percent, "/", g.memory_utilization_percent, " temp=", g.temperature_c,
      " power=", g.power_watts, " clocks=", g.sm_clock_mhz, "/", g.memory_clock_mhz,
      " cc=", g.compute_capability_major, ".", g.compute_capability_minor,
      " sms=", g.multiprocessor_count, " ecc=", g.ecc_uncorrected_errors,
      " retired=", g.retired_pages, " remap_pending=", g.row_remap_pending,
      " persistence=", g.persistence_mode, " xids=[", absl::StrJoin(g.xids, ","), "]");
}

std::string Describe(const NvmlSystemInfo& s) {
  return absl::StrCat("driver='", s.driver_version, "' cuda=", s.cuda_driver_version);
}

constexpr char kUnknownFigures[] =
    "memory=-1/-1 util=-1/-1 temp=-1 power=-1 clocks=-1/-1 cc=-1.-1 sms=-1 ecc=-1 retired=-1 "
    "remap_pending=-1 persistence=-1 xids=[]";

TEST_F(NvmlTest, TwoUnequalGpusReadBackExactly) {
  Machine(R"(# an H100 and a busier, smaller A100
system driver=550.54.15 cuda=12040
gpu name="NVIDIA H100 80GB HBM3" uuid=GPU-aaaa pci=00000000:18:00.0 mem_total_mib=81559 mem_used_mib=1024 util=97 mem_util=30 temp=45 power_mw=350250 sm_clock=1980 mem_clock=2619 cc=9.0 sms=132 ecc=0 retired_sbe=0 retired_dbe=1 remap_pending=0 persistence=1

gpu name="NVIDIA A100-SXM4-40GB" uuid=GPU-bbbb pci=00000000:3B:00.0 mem_total_mib=40960 mem_used_mib=39000 util=12 mem_util=7 temp=61 power_mw=98000 sm_clock=1410 mem_clock=1215 cc=8.6 sms=108 ecc=3 retired_sbe=2 retired_dbe=3 remap_pending=1 persistence=0
)");
  std::unique_ptr<Nvml> nvml = LoadFake();
  ASSERT_NE(nvml, nullptr);
  EXPECT_EQ(Describe(nvml->System()), "driver='550.54.15' cuda=12040");

  const std::vector<GpuFigures> gpus = nvml->Sample();
  ASSERT_EQ(gpus.size(), 2u);
  EXPECT_EQ(Describe(gpus[0]),
            "index=0 error='' name='NVIDIA H100 80GB HBM3' uuid='GPU-aaaa' pci='00000000:18:00.0' "
            "memory=85520809984/1073741824 util=97/30 temp=45 power=350.25 clocks=1980/2619 "
            "cc=9.0 sms=132 ecc=0 retired=1 remap_pending=0 persistence=1 xids=[]");
  // Retired pages 2 + 3: more than the one address slot the loader passes, so NVML answers
  // INSUFFICIENT_SIZE with the count.
  EXPECT_EQ(Describe(gpus[1]),
            "index=1 error='' name='NVIDIA A100-SXM4-40GB' uuid='GPU-bbbb' pci='00000000:3B:00.0' "
            "memory=42949672960/40894464000 util=12/7 temp=61 power=98 clocks=1410/1215 cc=8.6 "
            "sms=108 ecc=3 retired=5 remap_pending=1 persistence=0 xids=[]");
}

TEST_F(NvmlTest, IdleGpuReadsZeroNotUnknown) {
  Machine("gpu name=idle util=0 mem_util=0 power_mw=0 temp=0\n");
  std::unique_ptr<Nvml> nvml = LoadFake();
  ASSERT_NE(nvml, nullptr);
  const std::vector<GpuFigures> gpus = nvml->Sample();
  ASSERT_EQ(gpus.size(), 1u);
  EXPECT_EQ(gpus[0].utilization_percent, 0);
  EXPECT_EQ(gpus[0].memory_utilization_percent, 0);
  EXPECT_EQ(gpus[0].power_watts, 0.0);
  EXPECT_EQ(gpus[0].temperature_c, 0);
}

TEST_F(NvmlTest, XidIsReportedOnceOnItsGpu) {
  Machine(
      "gpu name=quiet xid=\n"
      "gpu name=failing xid=79,48\n"
      "gpu name=no-events\n");
  std::unique_ptr<Nvml> nvml = LoadFake();
  ASSERT_NE(nvml, nullptr);
  std::vector<GpuFigures> gpus = nvml->Sample();
  ASSERT_EQ(gpus.size(), 3u);
  EXPECT_THAT(gpus[0].xids, IsEmpty());
  EXPECT_THAT(gpus[1].xids, ElementsAre(79, 48));
  EXPECT_THAT(gpus[2].xids, IsEmpty());

  gpus = nvml->Sample();
  ASSERT_EQ(gpus.size(), 3u);
  for (const GpuFigures& g : gpus) EXPECT_THAT(g.xids, IsEmpty()) << "GPU " << g.index;
}

TEST_F(NvmlTest, FiguresTheGpuDoesNotSupportAreUnknown) {
  Machine("gpu name=bare\n");
  std::unique_ptr<Nvml> nvml = LoadFake();
  ASSERT_NE(nvml, nullptr);
  EXPECT_EQ(Describe(nvml->System()), "driver='' cuda=0");
  const std::vector<GpuFigures> gpus = nvml->Sample();
  ASSERT_EQ(gpus.size(), 1u);
  EXPECT_EQ(Describe(gpus[0]),
            absl::StrCat("index=0 error='' name='bare' uuid='' pci='' ", kUnknownFigures));
}

TEST_F(NvmlTest, LostGpuCarriesItsErrorAndTheOthersTheirFigures) {
  Machine(
      "gpu name=lost lost=1 sms=1\n"
      "gpu name=fine sms=132\n");
  std::unique_ptr<Nvml> nvml = LoadFake();
  ASSERT_NE(nvml, nullptr);
  const std::vector<GpuFigures> gpus = nvml->Sample();
  ASSERT_EQ(gpus.size(), 2u);
  EXPECT_EQ(Describe(gpus[0]),
            absl::StrCat("index=0 error='NVML cannot open GPU 0: GPU is lost (NVML error 15)' "
                         "name='' uuid='' pci='' ",
                         kUnknownFigures));
  EXPECT_EQ(gpus[1].error, "");
  EXPECT_EQ(gpus[1].name, "fine");
  EXPECT_EQ(gpus[1].multiprocessor_count, 132);
}

TEST_F(NvmlTest, GpuCountIsCapped) {
  std::string machine;
  for (int i = 0; i < kMaxNvmlGpus + 6; ++i) absl::StrAppend(&machine, "gpu sms=", i, "\n");
  Machine(machine);
  std::unique_ptr<Nvml> nvml = LoadFake();
  ASSERT_NE(nvml, nullptr);
  const std::vector<GpuFigures> gpus = nvml->Sample();
  ASSERT_EQ(gpus.size(), static_cast<size_t>(kMaxNvmlGpus));
  EXPECT_EQ(gpus.back().index, kMaxNvmlGpus - 1);
  EXPECT_EQ(gpus.back().multiprocessor_count, kMaxNvmlGpus - 1);
}

TEST_F(NvmlTest, NoFileIsNoDriver) {
  unsetenv("FAKE_NVML_FILE");
  auto nvml = Load();
  ASSERT_FALSE(nvml.ok());
  EXPECT_EQ(nvml.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(nvml.status().message(), "NVML init failed: Driver Not Loaded (NVML error 9)");
}

TEST_F(NvmlTest, UnreadableFileIsNoDriver) {
  setenv("FAKE_NVML_FILE", "/nonexistent/fake_nvml.txt", 1);
  auto nvml = Load();
  ASSERT_FALSE(nvml.ok());
  EXPECT_EQ(nvml.status().message(), "NVML init failed: Driver Not Loaded (NVML error 9)");
}

// The fake refuses a key it does not know, so a misspelt one cannot make a test pass vacuously.
TEST_F(NvmlTest, FakeRefusesAnUnknownKey) {
  Machine("gpu name=x colour=green\n");
  auto nvml = Load();
  ASSERT_FALSE(nvml.ok());
  EXPECT_EQ(nvml.status().message(), "NVML init failed: Unknown Error (NVML error 999)");
}

TEST_F(NvmlTest, MissingLibraryIsNamedAsNoDriver) {
  auto nvml = Nvml::Load("/nonexistent/libnvidia-ml.so.1");
  ASSERT_FALSE(nvml.ok());
  EXPECT_EQ(nvml.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(nvml.status().message()),
              StartsWith("no NVIDIA driver: cannot load /nonexistent/libnvidia-ml.so.1 ("));
  EXPECT_THAT(std::string(nvml.status().message()), HasSubstr("No such file"));
}

TEST_F(NvmlTest, LibraryWithoutNvmlIsRefused) {
  auto nvml = Nvml::Load("libm.so.6");
  ASSERT_FALSE(nvml.ok());
  EXPECT_THAT(std::string(nvml.status().message()), StartsWith("libm.so.6 is not a usable NVML"));
}

TEST_F(NvmlTest, DefaultIsTheDriversLibrary) {
  auto nvml = Nvml::Load();
  if (nvml.ok()) GTEST_SKIP() << "this machine has an NVIDIA driver";
  EXPECT_THAT(std::string(nvml.status().message()), HasSubstr("libnvidia-ml.so.1"));
}

// Each Nvml shuts down its own initialization and frees its event set (NVML counts both).
TEST_F(NvmlTest, ReleasesWhatItTakes) {
  // Holding the fake open keeps its state across the loader's dlclose, to read it afterwards.
  void* fake = dlopen(FAKE_NVML_LIB, RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(fake, nullptr) << dlerror();
  auto open_objects = reinterpret_cast<int (*)()>(dlsym(fake, "fake_nvml_open_objects"));
  ASSERT_NE(open_objects, nullptr);

  Machine("gpu name=a xid=\n");
  auto first = Load();
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(open_objects(), 2);  // an initialization and an event set
  auto second = Load();
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(open_objects(), 4);
  first->reset();
  EXPECT_EQ(open_objects(), 2);
  EXPECT_EQ((*second)->Sample().size(), 1u);  // the other still works
  second->reset();
  EXPECT_EQ(open_objects(), 0);

  Machine("gpu name=no-events\n");  // no GPU takes XID events: the set is freed at once
  auto third = Load();
  ASSERT_TRUE(third.ok()) << third.status();
  EXPECT_EQ(open_objects(), 1);
  third->reset();
  EXPECT_EQ(open_objects(), 0);
  dlclose(fake);
}

// The launch plan's GPU discovery goes through the same loader: two unequal GPUs come out as the
// pool sees them, a lost one is left out, and a missing library says why there is none.
TEST_F(NvmlTest, InventoryReadsTheGpusThroughTheSameLoader) {
  Machine(R"(system driver=550.54.15 cuda=12040
gpu name="NVIDIA H100 80GB HBM3" uuid=GPU-aaaa mem_total_mib=81920 sms=132
gpu name=lost uuid=GPU-cccc lost=1
gpu name="NVIDIA A100-SXM4-40GB" uuid=GPU-bbbb mem_total_mib=40960 sms=108
)");
  std::string why;
  const std::vector<GpuInfo> gpus = NvmlInventory(FAKE_NVML_LIB).ListGpus(&why);
  ASSERT_EQ(gpus.size(), 2u) << why;
  EXPECT_EQ(gpus[0].index, 0);
  EXPECT_EQ(gpus[0].uuid, "GPU-aaaa");
  EXPECT_EQ(gpus[0].name, "NVIDIA H100 80GB HBM3");
  EXPECT_EQ(gpus[0].memory_bytes, 81920ull << 20);
  EXPECT_EQ(gpus[0].sm_count, 132);
  EXPECT_EQ(gpus[1].index, 2);
  EXPECT_EQ(gpus[1].sm_count, 108);
  auto imbalance = FindImbalance(gpus);
  ASSERT_TRUE(imbalance.has_value());
  EXPECT_EQ(imbalance->exclude_list, "2");

  EXPECT_TRUE(NvmlInventory("/nonexistent/libnvidia-ml.so.1").ListGpus(&why).empty());
  EXPECT_THAT(why, StartsWith("no NVIDIA driver: cannot load /nonexistent/libnvidia-ml.so.1"));
}

TEST_F(NvmlTest, LaunchNvmlLibraryNamesTheLibrary) {
  unsetenv("LAUNCH_NVML_LIBRARY");
  EXPECT_EQ(NvmlLibraryFromEnv(), "");
  setenv("LAUNCH_NVML_LIBRARY", FAKE_NVML_LIB, 1);
  EXPECT_EQ(NvmlLibraryFromEnv(), FAKE_NVML_LIB);
  unsetenv("LAUNCH_NVML_LIBRARY");
}

}  // namespace
}  // namespace launch
