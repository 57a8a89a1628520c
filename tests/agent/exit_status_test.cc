// launch's exit status as one table: DESIGN.md's contract, row by row.
#include "common/exit_status.h"

#include <csignal>

#include "agent/worker_group.h"
#include "gtest/gtest.h"

namespace launch {
namespace {

struct Row {
  const char* name;
  LaunchOutcome outcome;
  int code;
};

void PrintTo(const Row& r, std::ostream* os) { *os << r.name; }

class ExitStatusTable : public ::testing::TestWithParam<Row> {};

TEST_P(ExitStatusTable, Code) { EXPECT_EQ(ExitStatus(GetParam().outcome), GetParam().code); }

INSTANTIATE_TEST_SUITE_P(
    All, ExitStatusTable,
    ::testing::Values(
        Row{"Success", LaunchOutcome::Succeeded(), 0},
        Row{"UsageError", LaunchOutcome::UsageError(), 2},
        Row{"LaunchItselfFailed", LaunchOutcome::LaunchError(), 1},
        Row{"JobFailedWithOnlyAReason", LaunchOutcome::JobFailed(), 1},
        Row{"LaunchInterrupted", LaunchOutcome::Signalled(SIGINT), 128 + SIGINT},
        Row{"LaunchTerminated", LaunchOutcome::Signalled(SIGTERM), 143},
        Row{"WorkerExitCode", LaunchOutcome::WorkerFailed(3, 0), 3},
        Row{"WorkerExitCodeTwoIsNotAUsageError", LaunchOutcome::WorkerFailed(2, 0), 2},
        Row{"WorkerKilled", LaunchOutcome::WorkerFailed(0, SIGKILL), 128 + SIGKILL},
        Row{"WorkerSignalOutranksItsCode", LaunchOutcome::WorkerFailed(1, SIGSEGV), 128 + SIGSEGV},
        Row{"WorkerHung", LaunchOutcome::WorkerFailed(0, SIGTERM, true), kHungExitCode},
        Row{"FailureWithNeitherCodeNorSignal", LaunchOutcome::WorkerFailed(0, 0), 1}),
    [](const ::testing::TestParamInfo<Row>& info) { return std::string(info.param.name); });

// A local worker's result as a process exit code: 0 when it succeeded, else the table's code.
TEST(ExitStatus, AWorkersResultAsAnExitCode) {
  struct Row {
    int code, sig;
    bool hung;
    int want;
  } rows[] = {{0, 0, false, 0},       {3, 0, false, 3},      {0, SIGKILL, false, 128 + SIGKILL},
              {0, SIGTERM, true, kHungExitCode}, {7, SIGSEGV, false, 128 + SIGSEGV}};
  for (const Row& r : rows) {
    WorkerResult w;
    w.exit_code = r.code;
    w.signal = r.sig;
    w.hung = r.hung;
    EXPECT_EQ(w.AsExitCode(), r.want) << r.code << " " << r.sig << " " << r.hung;
  }
}

}  // namespace
}  // namespace launch
