// launch_sdk/contract.h: the go message as both sides encode and read it, with its version, and
// the line a standby of another version says.
#include "launch_sdk/contract.h"

#include <cstring>
#include <set>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "launch_sdk/exit_notice.h"

namespace launch_sdk {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(ContractGo, IsMagicVersionLengthAndNulSeparatedEntries) {
  EXPECT_EQ(kContractVersion, 2u);
  const std::string go = EncodeGo({"A=1", "B=x=y"});
  EXPECT_EQ(go, std::string("LGOV\x02\x00\x00\x00\x09\x00\x00\x00"
                            "A=1\0B=x=y",
                            21));
  EXPECT_EQ(EncodeGo({}), std::string("LGOV\x02\0\0\0\0\0\0\0", 12));
  EXPECT_EQ(EncodeGo({"A=1"}, 0x01020304), std::string("LGOV\x04\x03\x02\x01\x03\0\0\0A=1", 15));
  ASSERT_EQ(go.size(), kGoHeaderBytes + 9);
  EXPECT_EQ(GoVersion(go.data()), kContractVersion);
  EXPECT_EQ(GoBodyLength(go.data()), 9u);
  EXPECT_THAT(DecodeGoBody(go.substr(kGoHeaderBytes)), ElementsAre("A=1", "B=x=y"));
}

// A standby reads the version from the first 8 bytes of any version's go: version 1's ("LGO1" and
// its length) counts as 1, anything without a go's magic as 0.
TEST(ContractGo, TheVersionIsReadFromAnyVersionsGo) {
  EXPECT_EQ(GoVersion(EncodeGo({"A=1"}, 7).data()), 7u);
  EXPECT_EQ(GoVersion(std::string("LGO1\x03\0\0\0", 8).data()), 1u);
  EXPECT_EQ(GoVersion(std::string("LGOX\x02\0\0\0", 8).data()), 0u);
  EXPECT_EQ(GoVersion(std::string("\0\0\0\0\0\0\0\0", 8).data()), 0u);
}

TEST(ContractGo, EmptyEntriesAreSkipped) {
  EXPECT_THAT(DecodeGoBody(std::string("\0A=1\0\0B=\0", 9)), ElementsAre("A=1", "B="));
  EXPECT_THAT(DecodeGoBody(""), ElementsAre());
}

TEST(ContractGo, AVersionSkewNamesBothVersionsAndWhatToDo) {
  EXPECT_EQ(VersionSkew(3, 2, "launch_sdk"),
            "launch speaks worker contract version 3, this standby's launch_sdk version 2: install "
            "launch and "
            "launch-sdk (or launch's Python modules) of one release");
}

// Each LAUNCH_* name is declared once: no two constants share a value.
TEST(ContractNames, AreDistinctAndLaunchs) {
  std::set<std::string> seen;
  for (const ContractName& n : kContractEnvNames) {
    EXPECT_TRUE(seen.insert(n.value).second) << n.value;
    EXPECT_EQ(std::strncmp(n.value, "LAUNCH_", 7), 0) << n.value;
  }
  EXPECT_EQ(seen.size(), 20u);
}

TEST(ContractExitNotice, TheSlotIsTheContractsLayout) {
  EXPECT_EQ(sizeof(ExitNoticeSlot), kExitNoticeSlotBytes);
  EXPECT_EQ(offsetof(ExitNoticeSlot, mutex), kExitNoticeMutexOffset);
}

}  // namespace
}  // namespace launch_sdk
