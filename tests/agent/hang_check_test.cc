// Who is hung and who is to blame (agent/hang_check.h), as tables.
#include "agent/hang_check.h"

#include "gtest/gtest.h"

namespace launch {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

Clock::TimePoint At(milliseconds t) { return Clock::TimePoint(t); }

TEST(HangOptions, TimeoutsAndCheckPeriods) {
  struct Row {
    std::optional<milliseconds> timeout;
    double median_step_seconds;
    milliseconds want_timeout, want_period;
  } rows[] = {
      // No --hang-timeout: 10 x the median step, at least the floor (300 s); checked every second.
      {std::nullopt, 0.0, milliseconds(300000), milliseconds(1000)},
      {std::nullopt, 1.0, milliseconds(300000), milliseconds(1000)},
      {std::nullopt, 45.0, milliseconds(450000), milliseconds(1000)},
      // An explicit timeout whatever the steps; checked every quarter of it under 4 s, at least
      // every 10 ms.
      {milliseconds(60000), 45.0, milliseconds(60000), milliseconds(1000)},
      {milliseconds(2000), 0.1, milliseconds(2000), milliseconds(500)},
      {milliseconds(20), 0.1, milliseconds(20), milliseconds(10)},
  };
  for (const Row& r : rows) {
    HangOptions o;
    o.timeout = r.timeout;
    EXPECT_EQ(o.TimeoutFor(r.median_step_seconds), r.want_timeout) << r.median_step_seconds;
    EXPECT_EQ(o.CheckPeriod(), r.want_period);
  }
  HangOptions off;
  off.timeout = milliseconds(0);
  EXPECT_FALSE(off.enabled());
  EXPECT_TRUE(HangOptions().enabled());
}

TEST(FindHung, TheRunningWorkerSilentPastItsTimeoutAndLongestFirst) {
  const auto seen = [](bool running, std::optional<int> last_ms, double median = 0, bool counted = false) {
    ProgressSeen p;
    p.running = running;
    if (last_ms) p.last_progress = At(milliseconds(*last_ms));
    p.median_step_seconds = median;
    p.counted = counted;
    return p;
  };
  HangOptions fixed;
  fixed.timeout = milliseconds(100);
  HangOptions derived;  // 10 x median, floor 300 s
  struct Row {
    const char* what;
    HangOptions opts;
    std::vector<ProgressSeen> workers;
    int now_ms;
    int want;  // -1: none
  } rows[] = {
      {"all reported recently", fixed, {seen(true, 950), seen(true, 960)}, 1000, -1},
      {"exactly at the timeout is not past it", fixed, {seen(true, 900)}, 1000, -1},
      {"one past its timeout", fixed, {seen(true, 950), seen(true, 899)}, 1000, 1},
      {"of two past it, the one silent longest", fixed, {seen(true, 850), seen(true, 800), seen(true, 880)}, 1000, 1},
      {"a tie goes to the first", fixed, {seen(true, 800), seen(true, 800)}, 1000, 0},
      {"a worker that never reported is never hung", fixed, {seen(true, std::nullopt), seen(true, 990)}, 100000, 1},
      {"nor one already reaped", fixed, {seen(false, 0), seen(true, 990)}, 1000, -1},
      {"the floor holds fast steps", derived, {seen(true, 0, 0.5)}, 299000, -1},
      {"past the floor", derived, {seen(true, 0, 0.5)}, 300001, 0},
      {"slow steps get 10 x their median", derived, {seen(true, 0, 60.0)}, 500000, -1},
      {"and no more", derived, {seen(true, 0, 60.0)}, 600001, 0},
      // Steps launch counted (optimizer steps) arm only an explicit timeout.
      {"counted steps: the explicit timeout", fixed, {seen(true, 950, 0, true), seen(true, 899, 0, true)}, 1000, 1},
      {"counted steps never arm the automatic one", derived, {seen(true, 0, 0.5, true)}, 10000000, -1},
      {"a named worker beside a counted one", derived, {seen(true, 0, 0.5, true), seen(true, 1, 0.5)}, 10000000, 1},
  };
  for (const Row& r : rows) {
    const std::optional<HungWorker> got = FindHung(r.opts, r.workers, At(milliseconds(r.now_ms)));
    EXPECT_EQ(got ? got->worker : -1, r.want) << r.what;
  }
  const std::optional<HungWorker> h = FindHung(fixed, {seen(true, 950), seen(true, 700)}, At(milliseconds(1000)));
  ASSERT_TRUE(h.has_value());
  EXPECT_EQ(h->timeout, milliseconds(100));
  EXPECT_DOUBLE_EQ(h->silent_seconds, 0.3);
}

TEST(BlameFromStacks, TheRankOutsideTheCollectiveThatTheSilentOneWaitsIn) {
  const std::vector<std::string> waits = {"gloo::transport::tcp::UnboundBuffer::waitRecv (libgloo.so)",
                                          "train (train_mlp.cc:80)"};
  const std::vector<std::string> computes = {"nanosleep (libc.so.6)", "HangForever (train_mlp.cc:42)"};
  const std::vector<std::string> none;
  const std::vector<std::string> py_backward = {"backward (__init__.py:197)", "timed_backward (launch_progress.py:170)",
                                                "backward (_tensor.py:487)", "main (train.py:40)"};
  const std::vector<std::string> py_sleeps = {"stop_here (train.py:12)", "main (train.py:30)"};
  struct Row {
    const char* what;
    int hung;
    std::vector<std::vector<std::string>> frames;
    int want;
  } rows[] = {
      {"the silent one outside any collective is the one", 0, {computes, waits}, 0},
      {"it waits in one: the one that does not is blamed", 0, {waits, computes}, 1},
      {"the first such one", 1, {waits, waits, computes, computes}, 2},
      {"everyone waits: the silent one stays", 1, {waits, waits}, 1},
      {"a worker whose stacks were not captured is not blamed", 0, {waits, none}, 0},
      {"no hung worker", -1, {waits, computes}, -1},
      {"an index past the stacks", 3, {waits}, 3},
      {"a Python DDP rank in its backward waits", 0, {py_backward, py_sleeps}, 1},
  };
  for (const Row& r : rows) EXPECT_EQ(BlameFromStacks(r.hung, r.frames), r.want) << r.what;
}

}  // namespace
}  // namespace launch
