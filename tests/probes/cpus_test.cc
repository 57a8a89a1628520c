#include "probes/cpus.h"

#include "gtest/gtest.h"

namespace launch {
namespace {

TEST(Cpus, CgroupV2CpuMax) {
  EXPECT_EQ(ParseCgroupV2CpuMax("max 100000\n"), std::nullopt);
  EXPECT_EQ(ParseCgroupV2CpuMax("200000 100000\n"), 2);
  EXPECT_EQ(ParseCgroupV2CpuMax("150000 100000"), 2);  // 1.5 CPUs: round up
  EXPECT_EQ(ParseCgroupV2CpuMax("50000 100000"), 1);
  EXPECT_EQ(ParseCgroupV2CpuMax(""), std::nullopt);
  EXPECT_EQ(ParseCgroupV2CpuMax("garbage"), std::nullopt);
}

TEST(Cpus, CgroupV1Quota) {
  EXPECT_EQ(ParseCgroupV1Quota("-1", "100000"), std::nullopt);
  EXPECT_EQ(ParseCgroupV1Quota("400000\n", "100000\n"), 4);
  EXPECT_EQ(ParseCgroupV1Quota("", ""), std::nullopt);
}

TEST(Cpus, UsableIsWithinAffinity) {
  int usable = UsableCpuCount();
  EXPECT_GE(usable, 1);
  EXPECT_LE(usable, AffinityCpuCount());
}

}  // namespace
}  // namespace launch
