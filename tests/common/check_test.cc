#include "common/check.h"

#include "gtest/gtest.h"

namespace launch {
namespace {

TEST(LaunchCheck, PassingStreamsNothing) {
  int streamed = 0;
  auto count = [&] { return ++streamed; };
  LAUNCH_CHECK(1 + 1 == 2) << count();
  EXPECT_EQ(streamed, 0);  // the detail is built only on failure
}

TEST(LaunchCheckDeathTest, FailingLogsTheConditionWhereAndDetailThenAborts) {
  const int rank = 7;
  EXPECT_DEATH(LAUNCH_CHECK(rank < 4) << "rank " << rank << " of " << 4,
               "invariant violated at .*check_test.cc:[0-9]+: rank < 4: rank 7 of 4");
}

TEST(LaunchCheck, IsOneStatementInAnIfWithoutBraces) {
  bool taken = false;
  if (taken)
    LAUNCH_CHECK(false) << "not reached";
  else
    taken = true;
  EXPECT_TRUE(taken);
}

}  // namespace
}  // namespace launch
