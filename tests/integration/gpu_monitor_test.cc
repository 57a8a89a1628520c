// The monitor's samples under the real `launch`, with GPUs from the fake NVML library.

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/launch_cmd.h"
#include "tests/test_util.h"

namespace launch::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// Where NVML answers (the fake library here, through launch's real loader), every sample carries
// each GPU's figures, and an XID the driver queued is a warning naming the GPU, once.
TEST(Launch, SamplesCarryTheGpusFiguresAndAnXidIsAWarning) {
  TempDir dir;
  WriteFile(dir / "gpus.txt",
            "system driver=550.54.15 cuda=12040\n"
            "gpu name=\"Fake A\" uuid=GPU-aaaa mem_total_mib=81559 mem_used_mib=1024 util=0 temp=45 "
            "power_mw=350000 sm_clock=1980 mem_clock=2619 cc=9.0 sms=132 ecc=0 xid=\n"
            "gpu name=\"Fake B\" uuid=GPU-bbbb mem_total_mib=40960 mem_used_mib=0 util=97 temp=50 "
            "power_mw=200000 sm_clock=1410 mem_clock=1215 cc=8.0 sms=108 ecc=2 xid=79\n");
  const std::string samples = dir / "logs/gpus/metrics.jsonl";
  auto r = RunCmd({LAUNCH_BIN, "--nproc-per-node=1", "--monitor-interval", "1", "--log-dir", dir / "logs", "--rdzv-id",
                   "gpus", TEST_WORKER_BIN, "--wait-lines", samples, "3"},
                  {std::string("LAUNCH_NVML_LIBRARY=") + FAKE_NVML_LIB, "FAKE_NVML_FILE=" + (dir / "gpus.txt")});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("GPU 1 (Fake B) reported XID error(s) 79"));
  EXPECT_THAT(r.err, Not(HasSubstr("GPU 0 (Fake A) reported")));
  int lines = 0, xids = 0;
  for (const std::string& line : std::vector<std::string>(absl::StrSplit(ReadFile(samples), '\n', absl::SkipEmpty()))) {
    ++lines;
    EXPECT_THAT(line, HasSubstr("\"gpus\":[{\"index\":0,\"name\":\"Fake A\",\"uuid\":\"GPU-aaaa\","
                                "\"utilization_percent\":0,\"memory_used_bytes\":\"1073741824\","
                                "\"memory_total_bytes\":\"85520809984\",\"temperature_c\":45,\"power_watts\":350,"
                                "\"sm_clock_mhz\":1980,\"memory_clock_mhz\":2619,\"ecc_uncorrected_errors\":\"0\","
                                "\"xids\":[]},{\"index\":1,\"name\":\"Fake B\""));
    xids += absl::StrContains(line, "\"xids\":[79]");
  }
  EXPECT_GE(lines, 3);
  EXPECT_EQ(xids, 1);  // drained by the first sample that read it
}

}  // namespace
}  // namespace launch::testing
