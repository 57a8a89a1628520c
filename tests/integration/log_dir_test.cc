// --log-dir under the real `launch`: torchrun's layout, redirects and tee, attempts and error
// files, reruns, and the duplicate filters' files.

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/launch_cmd.h"
#include "tests/test_util.h"

namespace launch::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST(Launch, LogDirLayoutRedirectsAndTee) {
  TempDir dir;
  auto r = RunCmd(Cmd({"--nproc-per-node=2", "--log-dir", dir.path(), "--rdzv-id", "job1", "--redirects", "3",
                    "--tee", "0:1"},
                   {"--print-env", "RANK", "--stderr", "err-line"}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (int lr : {0, 1}) {
    std::string base = dir.path() + "/job1/attempt_0/" + std::to_string(lr);
    EXPECT_EQ(ReadFile(base + "/stdout.log"), "RANK=" + std::to_string(lr) + "\n");
    EXPECT_EQ(ReadFile(base + "/stderr.log"), "err-line\n");
  }
  // Redirected streams leave the console, except local rank 0's stdout, which is teed.
  EXPECT_THAT(r.out, HasSubstr("[0]:RANK=0"));
  EXPECT_THAT(r.out, Not(HasSubstr("[1]:RANK=1")));
  EXPECT_THAT(r.err, Not(HasSubstr("err-line")));
}

TEST(Launch, LogDirKeepsErrorFileAndAttempts) {
  TempDir dir;
  auto r = RunCmd(Cmd({"--nproc-per-node=1", "--max-restarts=1", "--log-dir", dir.path(), "--rdzv-id", "j"},
                   {"--print-env", "TORCHELASTIC_RESTART_COUNT", "--error-file", "RuntimeError: boom", "--exit", "1"}));
  EXPECT_EQ(r.exit_code, 1) << r.err;
  for (int k : {0, 1}) {
    std::string attempt = dir.path() + "/j/attempt_" + std::to_string(k) + "/0";
    EXPECT_THAT(ReadFile(attempt + "/error.json"), HasSubstr("RuntimeError: boom"));
    EXPECT_EQ(ReadFile(attempt + "/stdout.log"), "TORCHELASTIC_RESTART_COUNT=" + std::to_string(k) + "\n");
  }
  EXPECT_THAT(r.err, HasSubstr("logs in " + dir.path() + "/j/attempt_1"));
}

// A rerun with the same --rdzv-id and --log-dir appended to the old files: the old run's
// unfinished line was glued to the new run's first. Each run now gets a directory of its own.
TEST(Launch, ARerunNeverWritesIntoAnEarlierRunsFiles) {
  TempDir dir;
  for (const char* word : {"first", "second", "third"}) {
    auto r = RunCmd(Cmd({"--nproc-per-node=1", "--log-dir", dir.path(), "--rdzv-id", "same", "--redirects=1"},
                        {"--partial", word, "--spew-unended", "3"}));
    ASSERT_EQ(r.exit_code, 0) << r.err;
  }
  EXPECT_EQ(ReadFile(dir / "same/attempt_0/0/stdout.log"), "first\nxxx");
  EXPECT_EQ(ReadFile(dir / "same.1/attempt_0/0/stdout.log"), "second\nxxx");
  EXPECT_EQ(ReadFile(dir / "same.2/attempt_0/0/stdout.log"), "third\nxxx");
}

// torchrun's --duplicate-stdout-filters / --duplicate-stderr-filters: matching lines of every
// worker in attempt_<k>/filtered_std{out,err}.log; --virtual-local-rank: LOCAL_RANK 0 everywhere.
TEST(Launch, DuplicateFiltersAndVirtualLocalRank) {
  TempDir dir;
  auto r = RunCmd(Cmd({"--nproc-per-node=2", "--log-dir", dir.path(), "--rdzv-id=filters", "--virtual-local-rank",
                       "--duplicate-stdout-filters=RANK=1", "--duplicate-stderr-filters=err-,,line"},
                      {"--print-env", "LOCAL_RANK,RANK", "--stderr", "err-,line", "--stderr", "other"}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("[0]:LOCAL_RANK=0\n"));
  EXPECT_THAT(r.out, HasSubstr("[1]:LOCAL_RANK=0\n"));
  EXPECT_EQ(ReadFile(dir / "filters/attempt_0/filtered_stdout.log"), "[1]:RANK=1\n");
  const std::string err = ReadFile(dir / "filters/attempt_0/filtered_stderr.log");
  EXPECT_EQ(CountLines(err, "err-,line"), 2) << err;
  EXPECT_THAT(err, Not(HasSubstr("other")));
  // Each rank's own log keeps its real local rank.
  EXPECT_THAT(ReadFile(dir / "filters/attempt_0/1/stdout.log"), HasSubstr("RANK=1"));
}

}  // namespace
}  // namespace launch::testing
