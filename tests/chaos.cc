// The chaos soak (see chaos.h), shared by the single coordinator's and the replicated
// coordinators' tests.
#include "tests/chaos.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

#ifdef TRAIN_MLP_BIN
namespace launch::testing {

using ::testing::HasSubstr;

namespace {
const std::string kLaunch = LAUNCH_BIN;

std::vector<RunResult> WaitAll(std::vector<std::unique_ptr<Child>>& agents, std::chrono::milliseconds timeout) {
  std::vector<RunResult> out;
  for (auto& a : agents) out.push_back(a->Wait(timeout));
  return out;
}

// An environment variable as a count within [lo, hi], or `dflt` when unset.
int EnvCount(const char* name, int dflt, int lo, int hi) {
  const char* v = std::getenv(name);
  int n = dflt;
  if (v && *v && (!absl::SimpleAtoi(v, &n) || n < lo || n > hi)) {
    ADD_FAILURE() << name << "=" << v << ": expected an integer in " << lo << ".." << hi;
    return dflt;
  }
  return n;
}

}  // namespace

std::vector<std::string> TrainMlpArgv(const std::string& steps, const std::string& ckpt_dir,
                                      const std::string& params) {
  return {TRAIN_MLP_BIN, "--dims",         "32,64,64,10", "--batch",          "16",     "--steps",
          steps,         "--dataset-size", "512",         "--warmup",         "0",      "--checkpoint-every",
          "5",           "--keep",         "3",           "--print-every",    "0",      "--slow-rank",
          "0",           "--slow-ms",      "10",          "--checkpoint-dir", ckpt_dir, "--save-params",
          params};
}

void RunChaos(const ChaosPlane& plane) {
  TempDir dir;
  const int kills = EnvCount("LAUNCH_SOAK_KILLS", 6, 1, 1000);
  const unsigned seed = static_cast<unsigned>(
      EnvCount("LAUNCH_SOAK_SEED", static_cast<int>(std::random_device{}() >> 1), 0, INT32_MAX));
  std::printf("chaos: %d disruptions, seed %u (LAUNCH_SOAK_SEED=%u replays it)\n", kills, seed, seed);
  std::fflush(stdout);
  SCOPED_TRACE("LAUNCH_SOAK_SEED=" + std::to_string(seed));
  // The job is held open until its disruptions are done: its workers take no step past the
  // budget in a file the test raises (train_mlp --step-budget-file), kBudgetAhead steps past the
  // newest checkpoint at each disruption, and to the end only after the last. Racing a fixed step
  // count instead lost on a busy machine (600 steps ended before the second disruption). Steps
  // of at least 10 ms (rank 0 sleeps that long in each) leave each disruption a random point
  // inside a round; enough of them for every disruption to come after a checkpoint of its own.
  const long kBudgetAhead = 60;
  const long steps = std::max<long>(600, kBudgetAhead * (kills + 2));
  const std::string kSteps = std::to_string(steps);
  const std::string kMaxRestarts = std::to_string(kills + 5);
  const std::string budget_file = dir / "step-budget";
  long budget = 0;
  auto raise_budget = [&](long to) {
    budget = std::max(budget, std::min(to, steps));
    WriteFile(budget_file + ".new", std::to_string(budget) + "\n");
    EXPECT_EQ(::rename((budget_file + ".new").c_str(), budget_file.c_str()), 0) << budget_file;
  };
  auto agent_argv = [&](const std::string& run, const std::string& out) {
    std::vector<std::string> argv = {kLaunch,
                                     "--rdzv-endpoint",
                                     plane.endpoint,
                                     "--rdzv-id",
                                     run,
                                     "--nnodes=2",
                                     "--nproc-per-node=2",
                                     "--max-restarts=" + kMaxRestarts,
                                     "--stop-timeout=5",
                                     "--rdzv-conf",
                                     "heartbeat_timeout=1,heartbeat_interval=0.2"};
    for (std::string& a : TrainMlpArgv(kSteps, dir / (out + "-ckpt"), dir / (out + ".bin"))) argv.push_back(a);
    if (run == "chaos") argv.insert(argv.end(), {"--step-budget-file", budget_file});
    return argv;
  };
  // The same training, undisturbed.
  {
    std::vector<std::unique_ptr<Child>> agents;
    for (int i = 0; i < 2; ++i) agents.push_back(std::make_unique<Child>(agent_argv("straight", "straight")));
    for (const auto& r : WaitAll(agents, std::chrono::seconds(180))) ASSERT_EQ(r.exit_code, 0) << r.err;
  }

  raise_budget(kBudgetAhead);                  // the first disruption comes after the first checkpoint too
  std::vector<std::unique_ptr<Child>> agents;  // every agent ever started, the killed one too
  for (int i = 0; i < 2; ++i) agents.push_back(std::make_unique<Child>(agent_argv("chaos", "chaos")));
  auto live_agents = [&] {
    if (plane.pump) plane.pump();
    std::vector<pid_t> pids;
    for (auto& a : agents) {
      a->Pump(1);
      if (ProcessAlive(a->pid())) pids.push_back(a->pid());
    }
    return pids;
  };
  std::mt19937 rng(seed);
  std::set<pid_t> seen_workers;
  long last_kill_step = 0;  // the first disruption waits for the first checkpoint too
  int worker_kills = 0;
  bool agent_killed = false;
  // "resumed from step" lines so far, over every agent's output.
  auto resumes = [&] {
    int n = 0;
    for (auto& a : agents)
      for (size_t pos = a->out().find("resumed from step"); pos != std::string::npos;
           pos = a->out().find("resumed from step", pos + 1))
        ++n;
    return n;
  };
  // Each disruption once the round before has made progress: a full set of workers that did not
  // exist at the last disruption, whose rank 0 has resumed (a checkpoint newer than the last
  // disruption alone can come from the old round's last step, before the new round printed).
  int agent_kills = 0;
  int leader_kills = 0;
  for (int disruption = 0; disruption < kills; ++disruption) {
    std::vector<pid_t> workers;
    ASSERT_TRUE(WaitUntil(
        [&] {
          workers = TrainWorkers(live_agents());
          bool fresh = workers.size() == 4 &&
                       std::none_of(workers.begin(), workers.end(), [&](pid_t p) { return seen_workers.count(p); });
          return fresh && NewestCheckpoint(dir / "chaos-ckpt") > last_kill_step && resumes() >= disruption;
        },
        std::chrono::seconds(60)))
        << "disruption " << disruption << ": no new round made progress; coordinator:\n"
        << plane.logs() << [&] {
             // Which condition held, and what the workers printed: enough to tell a round that
             // never started from one that did not resume or wrote no checkpoint.
             std::string tails = absl::StrCat("\nworkers found ", workers.size(), ", newest checkpoint ",
                                              NewestCheckpoint(dir / "chaos-ckpt"), " (last disruption at ",
                                              last_kill_step, "), resumes ", resumes(), " of ", disruption, " needed");
             for (auto& a : agents) {
               const std::string& e = a->err();
               const std::string& o = a->out();
               tails += absl::StrCat("\nagent ", a->pid(), ":\n", e.size() > 4000 ? e.substr(e.size() - 4000) : e,
                                     "stdout:\n", o.size() > 2000 ? o.substr(o.size() - 2000) : o);
             }
             return tails;
           }();
    seen_workers.insert(workers.begin(), workers.end());
    std::this_thread::sleep_for(std::chrono::milliseconds(std::uniform_int_distribution<int>(0, 30)(rng)));
    last_kill_step = NewestCheckpoint(dir / "chaos-ckpt");
    // The next round resumes from at most last_kill_step; it may go kBudgetAhead steps past it
    // (a checkpoint newer than it, never the job's end: steps >= kBudgetAhead * (kills + 2)).
    raise_budget(last_kill_step + kBudgetAhead);
    if (plane.kill_leader && disruption % 4 == 1) {
      // The control plane's leader goes first: the worker's failure waits for the next leader.
      plane.kill_leader();
      ++leader_kills;
    }
    if (disruption % 4 == 3) {
      // One agent dies with its workers (kill -9); its replacement (as a cluster manager would
      // start one) joins the job.
      auto live = live_agents();
      pid_t victim = live[std::uniform_int_distribution<size_t>(0, live.size() - 1)(rng)];
      ASSERT_EQ(::kill(victim, SIGKILL), 0);
      agent_killed = true;
      ++agent_kills;
      agents.push_back(std::make_unique<Child>(agent_argv("chaos", "chaos")));
    } else {
      pid_t victim = workers[std::uniform_int_distribution<size_t>(0, workers.size() - 1)(rng)];
      ASSERT_EQ(::kill(victim, SIGKILL), 0);
      ++worker_kills;
    }
  }
  EXPECT_EQ(worker_kills + agent_kills, kills);
  EXPECT_EQ(agent_killed, kills >= 4);
  if (plane.kill_leader) {
    EXPECT_EQ(leader_kills, (kills + 2) / 4);
  }
  std::printf("chaos: %d worker, %d agent and %d leader kill(s)\n", worker_kills, agent_kills, leader_kills);
  EXPECT_LT(budget, steps) << "the job could end before its last disruption";
  raise_budget(steps);  // the disruptions are done: the job runs to its end
  std::string out, err;
  int succeeded = 0;
  for (auto& a : agents) {
    RunResult r = a->Wait(std::chrono::seconds(180));
    out += r.out;
    err += r.err;
    succeeded += r.exit_code == 0;
    if (r.exit_code != 0) EXPECT_EQ(r.exit_code, 128 + SIGKILL) << r.err;  // only the killed agents
  }
  EXPECT_EQ(succeeded, 2) << err;
  // The final step is exactly --steps, and the parameters equal the undisturbed run's: every
  // step was taken once, from the right checkpoint, over all four ranks.
  EXPECT_THAT(out, HasSubstr("done: steps=" + kSteps));
  EXPECT_EQ(NewestCheckpoint(dir / "chaos-ckpt"), std::stol(kSteps));
  int resumed = 0;
  for (size_t pos = out.find("resumed from step"); pos != std::string::npos;
       pos = out.find("resumed from step", pos + 1))
    ++resumed;
  EXPECT_GE(resumed, kills) << out;
  auto a = ReadFloats(dir / "straight.bin");
  auto b = ReadFloats(dir / "chaos.bin");
  ASSERT_EQ(a.size(), b.size());
  ASSERT_FALSE(a.empty());
  EXPECT_LE(MaxAbsDiff(a, b), 1e-6);
  for (pid_t p : seen_workers) EXPECT_FALSE(ProcessAlive(p)) << "worker " << p << " survived";
}
}  // namespace launch::testing
#endif  // TRAIN_MLP_BIN
