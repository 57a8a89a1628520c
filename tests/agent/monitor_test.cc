// The agent's monitor: /proc parsing, the live figures the worker group keeps, and a whole sample
// from a fake /proc tree to metrics.jsonl and a scripted coordinator.
#include "agent/monitor.h"

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "agent/worker_group.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "tests/fakes/fake_coordinator_client.h"
#include "tests/test_util.h"

namespace launch {
namespace {

using testing::TempDir;
using testing::WriteFile;

using ::testing::HasSubstr;

TEST(ProcFiles, StatCountsFieldsAfterTheLastParenthesis) {
  // A command name with spaces and a ')' of its own.
  const std::string stat =
      "4242 (python3 a) b) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 17 0 123 456 789 ...";
  auto st = ParseProcStat(stat);
  ASSERT_TRUE(st.has_value());
  EXPECT_EQ(st->cpu_ticks, 300u);
  EXPECT_EQ(st->threads, 17);
  EXPECT_EQ(st->ppid, 1);
  EXPECT_FALSE(ParseProcStat("4242 (x) S 1 2").has_value());
  EXPECT_FALSE(ParseProcStat("no parenthesis at all").has_value());
  EXPECT_FALSE(ParseProcStat("1 (x) S 1 1 1 0 -1 0 0 0 0 0 abc 50 0 0 20 0 17").has_value());
}

TEST(ProcFiles, StatmMeminfoAndLoadavg) {
  EXPECT_EQ(ParseStatmResidentPages("1000 250 30 1 0 400 0\n"), 250);
  EXPECT_FALSE(ParseStatmResidentPages("1000").has_value());
  EXPECT_FALSE(ParseStatmResidentPages("1000 -3").has_value());
  auto m = ParseMeminfo("MemTotal:       24683664 kB\nMemFree:         1000 kB\nMemAvailable:   23790000 kB\n");
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->total_bytes, int64_t{24683664} * 1024);
  EXPECT_EQ(m->available_bytes, int64_t{23790000} * 1024);
  EXPECT_FALSE(ParseMeminfo("MemTotal: 5 kB\n").has_value());
  EXPECT_EQ(ParseLoadavg("3.38 2.10 1.00 3/400 12345\n"), 3.38);
  EXPECT_FALSE(ParseLoadavg("-1 0 0").has_value());
  EXPECT_FALSE(ParseLoadavg("").has_value());
}

WorkerLaunch Launch(int rank, int local_rank, const std::string& visible = "") {
  WorkerLaunch w;
  w.rank = rank;
  w.local_rank = local_rank;
  if (!visible.empty()) w.env.push_back("CUDA_VISIBLE_DEVICES=" + visible);
  return w;
}

TEST(LiveRanks, WorkerGpuIsItsOnlyDeviceOrItsLocalRanksOne) {
  EXPECT_EQ(WorkerGpu(Launch(5, 1)), -1);
  EXPECT_EQ(WorkerGpu(Launch(5, 1, "3")), 3);
  EXPECT_EQ(WorkerGpu(Launch(5, 1, "2,6")), 6);
  EXPECT_EQ(WorkerGpu(Launch(5, 2, "2,6")), -1);
  EXPECT_EQ(WorkerGpu(Launch(5, 0, "GPU-8f3c")), -1);
}

TEST(LiveRanks, OwnWorkIsTheStepLessItsWaitAndTotalsOutliveAnAttempt) {
  LiveRanks live;
  FakeClock clock;
  live.StartAttempt({Launch(0, 0), Launch(1, 1)});
  live.Spawned(1, 42);
  for (int step = 1; step <= 30; ++step) {
    live.Progress(0, step, 0.100, 0.060, clock.Now());
    live.Progress(1, step, 0.100, 0.010, clock.Now());
  }
  live.Progress(1, 31, std::nan(""), 0, clock.Now());  // a step without a usable time
  live.Progress(5, 1, 0.1, 0, clock.Now());            // no such worker
  auto figs = live.Snapshot();
  ASSERT_EQ(figs.size(), 2u);
  EXPECT_EQ(figs[1].pid, 42);
  EXPECT_TRUE(figs[1].running);
  EXPECT_EQ(figs[1].last_step, 31);
  EXPECT_EQ(figs[1].steps, 31);
  EXPECT_EQ(figs[1].step_window.size(), LiveRanks::kWindow);
  EXPECT_DOUBLE_EQ(figs[0].BusySeconds(), 0.100 - 0.060);
  EXPECT_DOUBLE_EQ(figs[1].BusySeconds(), 0.100 - 0.010);
  EXPECT_DOUBLE_EQ(figs[1].StepSeconds(), 0.100);
  live.NoteStraggler(1);
  EXPECT_FALSE(live.Snapshot()[0].exited);  // not spawned: starting
  live.Exited(1);
  EXPECT_FALSE(live.Snapshot()[1].running);
  EXPECT_TRUE(live.Snapshot()[1].exited);

  // The next attempt: ranks renumbered (another node left), counts of this attempt start again,
  // the run's totals go on by local rank.
  live.StartAttempt({Launch(2, 0), Launch(3, 1)});
  live.Progress(1, 32, 0.200, 0, clock.Now());
  figs = live.Snapshot();
  EXPECT_EQ(figs[1].rank, 3);
  EXPECT_EQ(figs[1].steps, 1);
  EXPECT_EQ(figs[1].total_steps, 32);
  EXPECT_EQ(figs[1].straggler_episodes, 1);
  const std::string table = live.EndTable("node-a", 1);
  // Rank 3: 32 steps, of which 31 timed: (30 x 100 ms + 200 ms) / 31.
  EXPECT_THAT(table, ::testing::ContainsRegex("\n3 +node-a +32 +103.2 ms +1x +1\n"));
  EXPECT_THAT(table, ::testing::ContainsRegex("\n2 +node-a +30 +100.0 ms +- +1\n"));
}

TEST(LiveRanks, NoTableWithoutProgress) {
  LiveRanks live;
  live.StartAttempt({Launch(0, 0)});
  EXPECT_EQ(live.EndTable("node-a", 0), "");
}

TEST(Monitor, ASampleFromProcToTheFileAndTheCoordinator) {
  TempDir dir;
  const std::string proc = dir.path() + "/proc";
  std::filesystem::create_directories(proc + "/4242");
  WriteFile(proc + "/loadavg", "1.50 1.00 0.50 2/300 999\n");
  WriteFile(proc + "/meminfo", "MemTotal: 2000 kB\nMemAvailable: 1000 kB\n");
  const long ticks = ::sysconf(_SC_CLK_TCK);
  auto stat = [&](long cpu_ticks) {
    WriteFile(proc + "/4242/stat", absl::StrCat("4242 (train) R 1 1 1 0 -1 0 0 0 0 0 ", cpu_ticks, " 0 0 0 20 0 5 0"));
  };
  stat(0);
  WriteFile(proc + "/4242/statm", "5000 1000 10 1 0 100 0\n");

  LiveRanks live;
  FakeClock clock;
  live.StartAttempt({Launch(7, 0, "1")});
  live.Spawned(0, 4242);
  for (int step = 1; step <= 10; ++step) live.Progress(0, step, 0.5, 0.1, clock.Now());
  testing::FakeCoordinatorClient coordinator;
  v1::StragglerEvent* e = coordinator.sample_answer.add_events();
  e->set_seq(4);
  e->set_round(3);
  e->set_rank(7);
  e->set_ratio(2);
  v1::StragglerEvent* old = coordinator.sample_answer.add_events();  // an earlier round's: not this run's workers
  old->set_seq(2);
  old->set_round(2);
  old->set_rank(7);

  Monitor::Options o;
  o.run_id = "job";
  o.node_id = "node-a:1:ff";
  o.hostname = "node-a";
  o.metrics_file = dir.path() + "/metrics.jsonl";
  o.coordinator = &coordinator;
  o.proc_dir = proc;
  o.shm_dir = dir.path();
  o.gpus = [] {
    GpuFigures g;
    g.index = 1;
    g.name = "Fake";
    g.utilization_percent = 0;
    g.xids = {79};
    return std::vector<v1::GpuSample>{ToGpuSample(g)};
  };
  Monitor monitor(o, &live, &clock);
  monitor.SetRound(3);
  monitor.SampleOnce();  // the file is opened by Start; this one goes to the coordinator only
  clock.Advance(std::chrono::seconds(2));
  stat(ticks);  // one second of CPU in two
  clock.Advance(std::chrono::seconds(1));
  v1::SampleRequest s = monitor.SampleOnce();

  ASSERT_EQ(s.ranks_size(), 1);
  const v1::RankSample& r = s.ranks(0);
  EXPECT_EQ(r.rank(), 7);
  EXPECT_EQ(r.pid(), 4242);
  EXPECT_EQ(r.state(), "running");
  EXPECT_EQ(r.last_step(), 10);
  EXPECT_DOUBLE_EQ(r.step_seconds(), 0.5);
  EXPECT_DOUBLE_EQ(r.busy_seconds(), 0.4);
  EXPECT_DOUBLE_EQ(r.seconds_since_step(), 3.0);
  EXPECT_NEAR(r.cpu_percent(), 100.0 / 3, 1e-6);
  EXPECT_EQ(r.rss_bytes(), 1000 * ::sysconf(_SC_PAGESIZE));
  EXPECT_EQ(r.threads(), 5);
  EXPECT_EQ(r.gpu(), 1);
  EXPECT_EQ(s.round(), 3);
  EXPECT_DOUBLE_EQ(s.node().load1(), 1.5);
  EXPECT_EQ(s.node().memory_available_bytes(), 1000 * 1024);
  ASSERT_EQ(s.gpus_size(), 1);
  EXPECT_EQ(s.gpus(0).xids(0), 79);
  // The coordinator got both samples; the second says which events the node has seen.
  const std::vector<v1::SampleRequest> sent = coordinator.samples();
  ASSERT_EQ(sent.size(), 2u);
  EXPECT_EQ(sent[0].events_seen(), 0u);
  EXPECT_EQ(sent[1].events_seen(), 4u);
  // This round's event counts once as an episode of rank 7 (the second answer repeats it).
  EXPECT_EQ(live.Snapshot()[0].straggler_episodes, 1);

  // Exited and not reaped yet (a zombie), or exiting with its memory gone: sampled as exited,
  // with no figures, though the worker group has not seen the exit.
  WriteFile(proc + "/4242/stat", "4242 (train) Z 1 1 1 0 -1 0 0 0 0 0 5 0 0 0 20 0 1 0");
  WriteFile(proc + "/4242/statm", "0 0 0 0 0 0 0\n");
  v1::SampleRequest zombie = monitor.SampleOnce();
  ASSERT_EQ(zombie.ranks_size(), 1);
  EXPECT_EQ(zombie.ranks(0).state(), "exited");
  EXPECT_EQ(zombie.ranks(0).rss_bytes(), 0);
  EXPECT_EQ(zombie.ranks(0).threads(), 0);
  stat(ticks);
  v1::SampleRequest exiting = monitor.SampleOnce();
  EXPECT_EQ(exiting.ranks(0).state(), "exited");
}

TEST(Monitor, EachSampleIsOneJsonLineThatReadsBack) {
  TempDir dir;
  LiveRanks live;
  FakeClock clock;
  live.StartAttempt({Launch(0, 0)});
  Monitor::Options o;
  o.run_id = "job";
  o.metrics_file = dir.path() + "/metrics.jsonl";
  o.interval = std::chrono::hours(1);  // the thread never samples: the test does
  Monitor monitor(o, &live, &clock);
  monitor.Start();
  monitor.SampleOnce();
  monitor.SampleOnce();
  monitor.Stop();
  std::ifstream in(o.metrics_file);
  std::string line;
  int lines = 0;
  while (std::getline(in, line)) {
    ++lines;
    v1::SampleRequest back;
    ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(line, &back).ok()) << line;
    EXPECT_EQ(back.run_id(), "job");
    ASSERT_EQ(back.ranks_size(), 1);
    EXPECT_EQ(back.ranks(0).state(), "starting");  // never spawned: it said "exited"
    EXPECT_THAT(line, HasSubstr("\"last_step\":\"-1\""));
  }
  EXPECT_EQ(lines, 2);
}

// The sampling thread waits on the clock: on simulated time a sample comes each time the test
// moves the clock past an interval, and none before.
TEST(Monitor, TheThreadSamplesOnceAnIntervalOfTheClock) {
  TempDir dir;
  LiveRanks live;
  SimulatedClock clock;
  testing::FakeCoordinatorClient coordinator;
  Monitor::Options o;
  o.run_id = "job";
  o.node_id = "node-a:1:ff";
  o.hostname = "node-a";
  o.interval = std::chrono::seconds(5);
  o.coordinator = &coordinator;
  o.proc_dir = dir.path();
  o.shm_dir = dir.path();
  Monitor monitor(o, &live, &clock);
  monitor.Start();
  for (size_t n = 1; n <= 3; ++n) {
    ASSERT_TRUE(clock.AwaitWaits(n));
    EXPECT_EQ(coordinator.samples().size(), n - 1);
    clock.Advance(std::chrono::milliseconds(4999));
    clock.Advance(std::chrono::milliseconds(1));
  }
  ASSERT_TRUE(clock.AwaitWaits(4));
  EXPECT_EQ(coordinator.samples().size(), 3u);
  monitor.Stop();
  EXPECT_EQ(clock.waits(), 4u);
}

}  // namespace
}  // namespace launch
