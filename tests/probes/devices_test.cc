#include "probes/devices.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace launch {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr uint64_t kGiB = 1024ull * 1024 * 1024;

std::vector<GpuInfo> FourH100() {
  std::vector<GpuInfo> v;
  for (int i = 0; i < 4; ++i) v.push_back({i, "GPU-" + std::to_string(i) + "aaaa-1111", "H100", 80 * kGiB, 132});
  return v;
}

TEST(GpuPool, AllGpusByDefault) {
  FakeInventory inv(FourH100());
  auto pool = SelectGpuPool(inv.ListGpus(nullptr), {});
  ASSERT_TRUE(pool.ok());
  EXPECT_THAT(pool->tokens, ElementsAre("0", "1", "2", "3"));
  EXPECT_TRUE(pool->from_nvml_indices);
  EXPECT_TRUE(pool->warnings.empty());
}

TEST(GpuPool, InheritedCudaVisibleDevicesWithUuidsMinusExcluded) {
  GpuSelection sel;
  sel.inherited_cuda_visible_devices = "GPU-3aaaa-1111,GPU-1aaaa,GPU-2";
  sel.exclude = {"1"};
  auto pool = SelectGpuPool(FourH100(), sel);
  ASSERT_TRUE(pool.ok()) << pool.status();
  EXPECT_THAT(pool->tokens, ElementsAre("GPU-3aaaa-1111", "GPU-2"));  // the user's order and spelling
  EXPECT_FALSE(pool->from_nvml_indices);
  EXPECT_EQ(pool->gpus[0].index, 3);
}

TEST(GpuPool, GpusFlagNarrowsAndExcludeTakesUuids) {
  GpuSelection sel;
  sel.gpus = {"0", "2", "3"};
  sel.exclude = {"GPU-2aaaa-1111"};
  auto pool = SelectGpuPool(FourH100(), sel);
  ASSERT_TRUE(pool.ok());
  EXPECT_THAT(pool->tokens, ElementsAre("0", "3"));
}

TEST(GpuPool, UnknownNamesAreErrorsNamingThem) {
  GpuSelection sel;
  sel.exclude = {"7"};
  auto pool = SelectGpuPool(FourH100(), sel);
  ASSERT_FALSE(pool.ok());
  EXPECT_THAT(std::string(pool.status().message()), HasSubstr("--exclude-gpus=7: '7' matches no GPU"));
  GpuSelection inherited;
  inherited.inherited_cuda_visible_devices = "0,GPU-zzz";
  pool = SelectGpuPool(FourH100(), inherited);
  ASSERT_FALSE(pool.ok());
  EXPECT_THAT(std::string(pool.status().message()), HasSubstr("'GPU-zzz' matches no GPU"));
}

TEST(GpuPool, GpusOutsideTheInheritedSetAreRejected) {
  GpuSelection sel;
  sel.inherited_cuda_visible_devices = "0,1";
  sel.gpus = {"2"};
  EXPECT_FALSE(SelectGpuPool(FourH100(), sel).ok());
}

TEST(GpuPool, AmbiguousUuidPrefixMatchesNothing) {
  GpuSelection sel;
  sel.gpus = {"GPU-"};
  EXPECT_FALSE(SelectGpuPool(FourH100(), sel).ok());
}

TEST(GpuPool, ImbalanceWarnsAndNamesTheSlowerGpus) {
  auto gpus = FourH100();
  gpus[2] = {2, "GPU-x", "A100", 40 * kGiB, 108};
  auto pool = SelectGpuPool(gpus, {});
  ASSERT_TRUE(pool.ok());
  ASSERT_EQ(pool->warnings.size(), 1u);
  EXPECT_THAT(pool->warnings[0], HasSubstr("imbalanced"));
  EXPECT_THAT(pool->warnings[0], HasSubstr("--exclude-gpus=2"));
  EXPECT_THAT(pool->warnings[0], HasSubstr("A100, 40 GiB, 108 SMs"));
  GpuSelection sel;
  sel.exclude = {"2"};
  EXPECT_TRUE(SelectGpuPool(gpus, sel)->warnings.empty());
}

TEST(GpuPool, SameMemoryDifferentSmCountIsImbalanced) {
  auto gpus = FourH100();
  gpus[0].sm_count = 114;
  auto pool = SelectGpuPool(gpus, {});
  ASSERT_TRUE(pool.ok());
  ASSERT_EQ(pool->warnings.size(), 1u);
  EXPECT_THAT(pool->warnings[0], HasSubstr("--exclude-gpus=0"));
}

TEST(GpuPool, NoDriverLeavesInheritedVariableAlone) {
  GpuSelection sel;
  sel.inherited_cuda_visible_devices = "0,1";
  auto pool = SelectGpuPool({}, sel);
  ASSERT_TRUE(pool.ok());
  EXPECT_TRUE(pool->tokens.empty());
}

TEST(NvmlInventory, ReportsWhyThereIsNoGpu) {
  NvmlInventory nvml;
  std::string why;
  auto gpus = nvml.ListGpus(&why);
  if (!gpus.empty()) GTEST_SKIP() << "this machine has GPUs";
  EXPECT_FALSE(why.empty());
}

}  // namespace
}  // namespace launch
