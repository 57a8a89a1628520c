// Stragglers, end to end with train_mlp. These run alone (RUN_SERIAL): a rank that gets less CPU
// than the other because a test next to it takes the cores is a straggler too, truly, and a
// normal run must be normal to report none.
#include <filesystem>
#include <regex>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace launch::testing {
namespace {

using ::testing::HasSubstr;

// A rank that sleeps at every step is a straggler: its own work (its step less its wait in the
// all-reduce) is far over the other rank's, though under DDP both ranks' steps take as long.
TEST(Sdk, ASlowRankIsReportedAsAStragglerOnceWithItsRatio) {
  TempDir dir;
  auto r = RunCmd({LAUNCH_BIN, "--nproc-per-node=2", "--monitor-interval", "1", "--log-dir", dir / "logs", "--rdzv-id",
                   "slow", TRAIN_MLP_BIN, "--dims", "64,128,10", "--steps", "60", "--warmup", "0", "--print-every", "0",
                   "--slow-rank", "1", "--slow-ms", "80"},
                  {}, std::chrono::seconds(180));
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.err, ::testing::ContainsRegex("rank 1 \\(on [^)]+\\) is a straggler: its own work per step takes "
                                              "[0-9.]+x the job's median"));
  EXPECT_THAT(r.err, ::testing::Not(HasSubstr("rank 0 (on")));
  // The end-of-run table: rank 1 with one episode, rank 0 with none.
  EXPECT_THAT(r.err, ::testing::ContainsRegex("\n1 +[^ ]+ +60 +[0-9.]+ ms +1x +0\n"));
  EXPECT_THAT(r.err, ::testing::ContainsRegex("\n0 +[^ ]+ +60 +[0-9.]+ ms +- +0\n"));
}

// An unmodified Python DDP script (no launch_progress) whose rank 1 loads each batch 20 ms later:
// launch counts both ranks' optimizer steps and takes their time in backward as the wait, so rank
// 1 is named a straggler and rank 0 is not.
TEST(Sdk, AnUnmodifiedPythonScriptsSlowRankIsAStraggler) {
  LAUNCH_NEED_PYTHON_TORCH();
  TempDir dir;
  auto r = RunCmd({LAUNCH_BIN, "--nproc-per-node=2", "--monitor-interval", "1", "--log-dir", dir / "logs", "--rdzv-id",
                   "pyslow", std::string(TESTS_DIR) + "/python/ddp_steps.py", "--steps", "300", "--slow-rank", "1",
                   "--slow-ms", "20"},
                  PythonTorchEnv(), std::chrono::seconds(180));
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.err, ::testing::ContainsRegex("rank 1 \\(on [^)]+\\) is a straggler: its own work per step takes "
                                              "[0-9.]+x the job's median"));
  EXPECT_THAT(r.err, ::testing::Not(HasSubstr("rank 0 (on")));
  // The end-of-run table counts every optimizer step of both ranks.
  EXPECT_THAT(r.err, ::testing::ContainsRegex("\n1 +[^ ]+ +300 +[0-9.]+ ms +[1-9][0-9]*x +0\n"));
  EXPECT_THAT(r.err, ::testing::ContainsRegex("\n0 +[^ ]+ +300 +[0-9.]+ ms +- +0\n"));
}

TEST(Sdk, ANormalRunReportsNoStragglerAndWritesItsSamples) {
  TempDir dir;
  auto r = RunCmd({LAUNCH_BIN, "--nproc-per-node=2", "--monitor-interval", "1", "--log-dir", dir / "logs", "--rdzv-id",
                   "even", TRAIN_MLP_BIN, "--steps", "60", "--warmup", "0", "--print-every", "0"},
                  {}, std::chrono::seconds(180));
  EXPECT_EQ(r.exit_code, 0) << r.err;
#if defined(__SANITIZE_ADDRESS__)
  // Under AddressSanitizer two even ranks on 2 cores differed by 1.20x once (rank 0: 62.8 ms of
  // own work per step against 52.1 ms), which is the default factor: that an even run gets no
  // verdict is checked in the other builds; here the run, the table and the samples.
  EXPECT_THAT(r.err, ::testing::ContainsRegex("\n1 +[^ ]+ +60 +[0-9.]+ ms +[-0-9x]+ +0\n"));
#else
  EXPECT_THAT(r.err, ::testing::Not(HasSubstr("is a straggler")));
  EXPECT_THAT(r.err, ::testing::ContainsRegex("\n1 +[^ ]+ +60 +[0-9.]+ ms +- +0\n"));
#endif
  const std::string samples = ReadFile(dir / "logs/even/metrics.jsonl");
  int lines = 0, running = 0;
  for (absl::string_view line : absl::StrSplit(samples, '\n', absl::SkipEmpty())) {
    ++lines;
    EXPECT_TRUE(absl::StartsWith(line, "{\"run_id\":\"even\"") && absl::EndsWith(line, "}")) << line;
    // While rank 1 runs, its memory is sampled.
    if (std::regex_search(std::string(line), std::regex("\"rank\":1,[^}]*\"state\":\"running\""))) {
      ++running;
      EXPECT_THAT(std::string(line), ::testing::ContainsRegex("\"rank\":1,[^}]*\"rss_bytes\":\"[1-9][0-9]*\""));
    }
  }
  EXPECT_GE(running, 1) << samples;
  EXPECT_GE(lines, running);
}

}  // namespace
}  // namespace launch::testing
