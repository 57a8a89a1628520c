// The agent's store (MASTER_PORT) under the real `launch`, through torch's own TCPStore client.

#include <chrono>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/launch_cmd.h"
#include "tests/test_util.h"

namespace launch::testing {
namespace {

using ::testing::HasSubstr;

// torch's own TCPStore client against the agent's store: every operation this torch's Python has
// (1.13 here; 2.6 in the Debian 13 run, where append, multi_get/set and check too), across ranks;
// then a process group through it.
TEST(Launch, TorchsStoreClientDoesEveryOperationOnTheAgentsStore) {
  LAUNCH_NEED_PYTHON_TORCH();
  auto r = RunCmd({kLaunch, "--nproc-per-node=2", std::string(TESTS_DIR) + "/python/store_ops.py"},
                  {"PYTHON_EXEC=/usr/bin/python3"}, std::chrono::seconds(120));
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  EXPECT_THAT(r.out, ::testing::ContainsRegex("\\[0\\]:rank 0 attempt 0: 1[59] store checks passed"));
  EXPECT_THAT(r.out, ::testing::ContainsRegex("\\[1\\]:rank 1 attempt 0: 1[59] store checks passed"));
}

// Keys of a failed attempt are gone in the next: torch 2.x workers do not prefix them per attempt
// as 1.x's do, so the store itself must start empty.
TEST(Launch, TheAgentsStoreForgetsTheLastAttemptsKeys) {
  LAUNCH_NEED_PYTHON_TORCH();
  auto r = RunCmd({kLaunch, "--nproc-per-node=2", "--max-restarts=1", std::string(TESTS_DIR) + "/python/store_ops.py"},
                  {"PYTHON_EXEC=/usr/bin/python3", "STORE_OPS_FAIL=1"}, std::chrono::seconds(120));
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  EXPECT_THAT(r.err, HasSubstr("rank 1 failed (exit 3)"));
  EXPECT_THAT(r.out, HasSubstr("[0]:rank 0 attempt 1: "));
  EXPECT_THAT(r.out, HasSubstr("[1]:rank 1 attempt 1: "));
}

}  // namespace
}  // namespace launch::testing
