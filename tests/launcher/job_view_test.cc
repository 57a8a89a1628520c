// The coordinator's view of a run's ranks: straggler episodes from the nodes' samples, the events
// agents are told, the bounds on a sample from the wire, and what Status and the metrics
// endpoint make of them.
#include "rendezvous/job_view.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "launcher/metrics_text.h"
#include "launcher/status_view.h"

namespace launch {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

struct RankSpec {
  int rank;
  double busy;
  int64_t steps = 50;
};

v1::SampleRequest SampleOf(const std::string& node, int64_t round, const std::vector<RankSpec>& ranks) {
  v1::SampleRequest s;
  s.set_run_id("job");
  s.set_node_id(node);
  s.set_hostname(node + ".host");
  s.set_round(round);
  for (const RankSpec& r : ranks) {
    v1::RankSample* x = s.add_ranks();
    x->set_rank(r.rank);
    x->set_local_rank(r.rank % 8);
    x->set_state("running");
    x->set_steps(r.steps);
    x->set_last_step(r.steps);
    x->set_step_seconds(0.2);
    x->set_busy_seconds(r.busy);
    x->set_gpu(r.rank % 8);
  }
  return s;
}

// Feeds the same figures `n` times, as a node's monitor would, and returns the events they made.
std::vector<v1::StragglerEvent> Feed(JobView* view, const v1::SampleRequest& s, int n, uint64_t* seen) {
  FakeClock clock;
  for (int i = 0; i < n; ++i) view->Update(s, clock.Now());
  std::vector<v1::StragglerEvent> events = view->EventsAfter(*seen);
  if (!events.empty()) *seen = events.back().seq();
  return events;
}

TEST(JobView, ARankSlowerThanTheFactorInThreeSamplesInARowIsAStragglerOnce) {
  JobView view(1.2);
  uint64_t seen = 0;
  const auto slow = SampleOf("a", 1, {{0, 0.050}, {1, 0.050}, {2, 0.051}, {3, 0.080}});
  EXPECT_TRUE(Feed(&view, slow, JobView::kSlowSamples - 1, &seen).empty());
  auto events = Feed(&view, slow, 1, &seen);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].rank(), 3);
  EXPECT_EQ(events[0].hostname(), "a.host");
  EXPECT_EQ(events[0].gpu(), 3);
  EXPECT_FALSE(events[0].recovered());
  EXPECT_DOUBLE_EQ(events[0].median_seconds(), 0.050);
  EXPECT_NEAR(events[0].ratio(), 1.6, 1e-9);
  // Still slow: no new event.
  EXPECT_TRUE(Feed(&view, slow, 5, &seen).empty());
  v1::StatusResponse st;
  view.Fill(&st, FakeClock().Now());
  EXPECT_THAT(st.straggling_ranks(), ::testing::ElementsAre(3));
  EXPECT_EQ(st.straggler_episodes(), 1);
}

TEST(JobView, ASpikeShorterThanThreeSamplesIsNotAStraggler) {
  JobView view(1.2);
  uint64_t seen = 0;
  const auto slow = SampleOf("a", 1, {{0, 0.050}, {1, 0.090}});
  const auto normal = SampleOf("a", 1, {{0, 0.050}, {1, 0.051}});
  for (int i = 0; i < 10; ++i) {
    EXPECT_TRUE(Feed(&view, slow, JobView::kSlowSamples - 1, &seen).empty());
    EXPECT_TRUE(Feed(&view, normal, 1, &seen).empty());
  }
}

TEST(JobView, AnEpisodeEndsOnlyBelowHalfTheFactorsMargin) {
  JobView view(1.4);
  uint64_t seen = 0;
  ASSERT_EQ(Feed(&view, SampleOf("a", 1, {{0, 0.100}, {1, 0.150}}), 3, &seen).size(), 1u);
  // 1.3x: under the factor but over 1.2 (1 + 0.4 / 2): still one episode.
  EXPECT_TRUE(Feed(&view, SampleOf("a", 1, {{0, 0.100}, {1, 0.130}}), 3, &seen).empty());
  auto events = Feed(&view, SampleOf("a", 1, {{0, 0.100}, {1, 0.110}}), 1, &seen);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_TRUE(events[0].recovered());
  EXPECT_EQ(events[0].rank(), 1);
  // A second episode counts again.
  ASSERT_EQ(Feed(&view, SampleOf("a", 1, {{0, 0.100}, {1, 0.150}}), 3, &seen).size(), 1u);
  v1::StatusResponse st;
  view.Fill(&st, FakeClock().Now());
  EXPECT_EQ(st.straggler_episodes(), 2);
}

TEST(JobView, WithTwoRanksTheSlowOneIsMeasuredAgainstTheFastOne) {
  // The mean of the two would put the reference half way to the straggler: 1.25x the mean, but
  // 1.5x the other rank.
  JobView view(1.4);
  uint64_t seen = 0;
  auto events = Feed(&view, SampleOf("a", 1, {{0, 0.100}, {1, 0.150}}), 3, &seen);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_NEAR(events[0].ratio(), 1.5, 1e-9);
}

TEST(JobView, RanksOnOtherNodesAreComparedWhenTheirNodeSends) {
  JobView view(1.2);
  uint64_t seen = 0;
  Feed(&view, SampleOf("b", 1, {{2, 0.200}, {3, 0.050}}), 1, &seen);
  // Node a's samples compare only a's ranks, with the job's median over both nodes.
  EXPECT_TRUE(Feed(&view, SampleOf("a", 1, {{0, 0.050}, {1, 0.050}}), 5, &seen).empty());
  auto events = Feed(&view, SampleOf("b", 1, {{2, 0.200}, {3, 0.050}}), 2, &seen);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].rank(), 2);
  EXPECT_EQ(events[0].hostname(), "b.host");
  EXPECT_DOUBLE_EQ(events[0].median_seconds(), 0.050);
}

TEST(JobView, WarmUpTinyGapsExitedRanksAndFactorZeroAreNotCompared) {
  uint64_t seen = 0;
  JobView off(0);
  EXPECT_TRUE(Feed(&off, SampleOf("a", 1, {{0, 0.01}, {1, 1.0}}), 5, &seen).empty());
  JobView warm(1.2);
  EXPECT_TRUE(Feed(&warm, SampleOf("a", 1, {{0, 0.01}, {1, 1.0, JobView::kMinSteps - 1}}), 5, &seen).empty());
  JobView tiny(1.2);  // 2x, but 0.5 ms apart: timer noise
  EXPECT_TRUE(Feed(&tiny, SampleOf("a", 1, {{0, 0.0005}, {1, 0.001}}), 5, &seen).empty());
  JobView exited(1.2);
  auto s = SampleOf("a", 1, {{0, 0.01}, {1, 1.0}});
  s.mutable_ranks(1)->set_state("exited");
  EXPECT_TRUE(Feed(&exited, s, 5, &seen).empty());
}

TEST(JobView, ANewRoundEndsEpisodesAndLateSamplesOfTheOldOneAreDropped) {
  JobView view(1.2);
  uint64_t seen = 0;
  ASSERT_EQ(Feed(&view, SampleOf("a", 1, {{0, 0.05}, {1, 0.2}}), 3, &seen).size(), 1u);
  Feed(&view, SampleOf("a", 2, {{0, 0.05}, {1, 0.05}}), 1, &seen);
  Feed(&view, SampleOf("a", 1, {{0, 0.05}, {1, 0.2}}), 3, &seen);  // late
  v1::StatusResponse st;
  st.add_nodes()->mutable_node()->set_node_id("a");
  view.Fill(&st, FakeClock().Now());
  EXPECT_EQ(st.straggling_ranks_size(), 0);
  EXPECT_EQ(st.nodes(0).sample().round(), 2);
}

TEST(JobView, EventsAreKeptBoundedAndHungRanksCountOnce) {
  JobView view(1.2);
  uint64_t seen = 0;
  for (size_t i = 0; i < JobView::kMaxEvents; ++i) {
    Feed(&view, SampleOf("a", 1, {{0, 0.05}, {1, 0.2}}), 3, &seen);
    Feed(&view, SampleOf("a", 1, {{0, 0.05}, {1, 0.05}}), 1, &seen);
  }
  EXPECT_EQ(view.EventsAfter(0).size(), JobView::kMaxEvents);
  EXPECT_EQ(view.EventsAfter(0).back().seq(), 2 * JobView::kMaxEvents);
  view.NoteHung(1, 3);
  view.NoteHung(1, 3);  // the same report again
  view.NoteHung(2, 3);
  v1::StatusResponse st;
  view.Fill(&st, FakeClock().Now());
  EXPECT_EQ(st.hung_ranks(), 2);
}

TEST(ValidateSample, BoundsEveryNumberAndSizeFromTheWire) {
  EXPECT_TRUE(ValidateSample(SampleOf("a", 1, {{0, 0.1}})).ok());
  auto bad = [](auto mutate) {
    v1::SampleRequest s = SampleOf("a", 1, {{0, 0.1}});
    mutate(&s);
    return ValidateSample(s);
  };
  EXPECT_FALSE(bad([](v1::SampleRequest* s) { s->mutable_ranks(0)->set_rank(-1); }).ok());
  EXPECT_FALSE(bad([](v1::SampleRequest* s) { s->mutable_ranks(0)->set_local_rank(1 << 20); }).ok());
  EXPECT_FALSE(bad([](v1::SampleRequest* s) { s->mutable_ranks(0)->set_busy_seconds(std::nan("")); }).ok());
  EXPECT_FALSE(bad([](v1::SampleRequest* s) { s->mutable_ranks(0)->set_cpu_percent(INFINITY); }).ok());
  EXPECT_FALSE(bad([](v1::SampleRequest* s) { s->mutable_ranks(0)->set_state(std::string(100, 'x')); }).ok());
  EXPECT_FALSE(bad([](v1::SampleRequest* s) { s->set_round(-1); }).ok());
  EXPECT_FALSE(bad([](v1::SampleRequest* s) { s->set_hostname(std::string(300, 'h')); }).ok());
  EXPECT_FALSE(bad([](v1::SampleRequest* s) {
                 for (int i = 0; i < 65; ++i) s->add_gpus()->set_index(i % 64);
               }).ok());
  EXPECT_FALSE(bad([](v1::SampleRequest* s) {
                 auto* g = s->add_gpus();
                 for (int i = 0; i < 65; ++i) g->add_xids(79);
               }).ok());
  EXPECT_FALSE(bad([](v1::SampleRequest* s) { s->mutable_node()->set_load1(-5); }).ok());
  auto many = bad([](v1::SampleRequest* s) {
    for (int i = 0; i < 5000; ++i) s->add_ranks()->set_state("running");
  });
  EXPECT_THAT(std::string(many.message()), HasSubstr("5001 ranks"));
}

v1::StatusResponse RunningJob() {
  v1::StatusResponse s;
  s.set_run_id("job\"7");
  s.set_round(2);
  s.set_state("running");
  s.set_restart_count(1);
  s.set_max_restarts(3);
  s.set_straggler_factor(1.2);
  s.add_straggling_ranks(1);
  s.set_straggler_episodes(1);
  v1::NodeStatus* n = s.add_nodes();
  n->mutable_node()->set_node_id("a");
  n->mutable_node()->set_hostname("node-a");
  n->mutable_node()->set_host_address("10.0.0.1");
  n->set_seconds_since_heartbeat(0.4);
  *n->mutable_sample() = SampleOf("a", 2, {{0, 0.050}, {1, 0.080}});
  n->mutable_sample()->mutable_ranks(0)->set_cpu_percent(97);
  n->mutable_sample()->mutable_ranks(0)->set_rss_bytes(170 << 20);
  n->mutable_sample()->mutable_ranks(0)->set_threads(9);
  v1::GpuSample* g = n->mutable_sample()->add_gpus();
  g->set_index(0);
  g->set_name("NVIDIA H100");
  g->set_uuid("GPU-aaaa");
  g->set_utilization_percent(0);
  g->set_memory_used_bytes(int64_t{1} << 30);
  g->set_memory_total_bytes(int64_t{80} << 30);
  g->set_temperature_c(45);
  g->set_power_watts(350);
  g->set_sm_clock_mhz(1980);
  g->set_ecc_uncorrected_errors(0);
  g->add_xids(79);
  n->mutable_sample()->mutable_node()->set_shm_used_bytes(int64_t{3} << 30);
  return s;
}

TEST(StatusView, OneScreenWithTheJobItsNodesRanksAndGpus) {
  const std::string screen = RenderStatus(RunningJob());
  EXPECT_THAT(screen, HasSubstr("round 2  running  restarts 1/3  stragglers 1 now, 1 episodes"));
  EXPECT_THAT(screen, HasSubstr("node-a (10.0.0.1)"));
  EXPECT_THAT(screen, HasSubstr("3.0 GiB"));  // /dev/shm used
  EXPECT_THAT(screen, testing::ContainsRegex(
                          "\n0 +node-a +running +50 +200.0 +50.0 .* 97 +170.0 MiB +9 +0 +0% +1.0 GiB/80.0 GiB\n"));
  EXPECT_THAT(screen, testing::ContainsRegex("\n1 +node-a +running slow +50 +200.0 +80.0 "));
  EXPECT_THAT(screen,
              testing::ContainsRegex("node-a +0 NVIDIA H100 +0% +1.0 GiB/80.0 GiB +45 C +350 W +1980 MHz XID 79\n"));
}

v1::ReplicaStatus Standby() {
  v1::ReplicaStatus r;
  r.set_replica("10.0.0.2:29400");
  r.set_leader("10.0.0.1:29400");
  r.set_failovers(2);
  auto* ok = r.add_etcd();
  ok->set_endpoint("10.0.0.5:2379");
  ok->set_healthy(true);
  auto* down = r.add_etcd();
  down->set_endpoint("10.0.0.6:2379");
  down->set_error("connection refused");
  return r;
}

TEST(StatusView, AReplicatedCoordinatorSaysWhoLeadsAndHowEtcdIs) {
  v1::StatusResponse s = RunningJob();
  *s.mutable_replica() = Standby();
  EXPECT_THAT(RenderStatus(s), HasSubstr("coordinator: leader 10.0.0.1:29400, answered by 10.0.0.2:29400 (a standby), "
                                         "failovers seen 2; etcd 10.0.0.5:2379 ok, 10.0.0.6:2379 down (connection "
                                         "refused)\n"));
  EXPECT_THAT(RenderStatus(RunningJob()), Not(HasSubstr("coordinator:")));
}

TEST(StatusView, NodesLeftOutOfALargeAnswerAreCounted) {
  v1::StatusResponse s = RunningJob();
  EXPECT_THAT(RenderStatus(s), Not(HasSubstr("left out")));
  s.set_nodes_omitted(12000);
  EXPECT_THAT(RenderStatus(s), HasSubstr("(12000 more node(s), of the highest group ranks, left out: the answer is "
                                         "kept under 1 MiB; the metrics port counts every node)\n"));
}

TEST(PrometheusText, AReplicaExportsWhetherItLeadsItsFailoversAndEtcdsHealth) {
  v1::ReplicaStatus r = Standby();
  const std::string text = PrometheusText({}, &r);
  EXPECT_THAT(text, HasSubstr("launch_coordinator_leader{replica=\"10.0.0.2:29400\",leader=\"10.0.0.1:29400\"} 0\n"));
  EXPECT_THAT(text,
              HasSubstr(
                  "launch_coordinator_failovers_total{replica=\"10.0.0.2:29400\",leader=\"10.0.0.1:29400\"} 2\n"));
  EXPECT_THAT(text, HasSubstr("launch_etcd_endpoint_healthy{endpoint=\"10.0.0.5:2379\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("launch_etcd_endpoint_healthy{endpoint=\"10.0.0.6:2379\"} 0\n"));
  EXPECT_THAT(PrometheusText({}), Not(HasSubstr("launch_coordinator_leader")));
}

TEST(PrometheusText, FamiliesOnceLabelsEscapedUnitsInBaseUnits) {
  const std::string text = PrometheusText({RunningJob(), RunningJob()});
  // One HELP and TYPE per family, however many runs.
  size_t n = 0;
  for (size_t at = 0; (at = text.find("# TYPE launch_rank_steps_per_second gauge\n", at)) != std::string::npos; ++at)
    ++n;
  EXPECT_EQ(n, 1u);
  EXPECT_THAT(text, HasSubstr("launch_run_info{run=\"job\\\"7\",state=\"running\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("launch_run_restarts_total{run=\"job\\\"7\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("launch_rank_steps_per_second{run=\"job\\\"7\",rank=\"0\",node=\"node-a\"} 5\n"));
  EXPECT_THAT(text, HasSubstr("launch_rank_straggler{run=\"job\\\"7\",rank=\"1\",node=\"node-a\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("launch_rank_cpu_usage_ratio{run=\"job\\\"7\",rank=\"0\",node=\"node-a\"} 0.97\n"));
  EXPECT_THAT(
      text,
      HasSubstr(
          "launch_gpu_sm_clock_hertz{run=\"job\\\"7\",node=\"node-a\",gpu=\"0\",uuid=\"GPU-aaaa\"} 1980000000\n"));
  EXPECT_THAT(text,
              HasSubstr(
                  "launch_gpu_utilization_ratio{run=\"job\\\"7\",node=\"node-a\",gpu=\"0\",uuid=\"GPU-aaaa\"} 0\n"));
  EXPECT_THAT(text,
              HasSubstr("launch_gpu_xid_errors{run=\"job\\\"7\",node=\"node-a\",gpu=\"0\",uuid=\"GPU-aaaa\"} 1\n"));
  // Every line is a comment or "name{labels} value".
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    EXPECT_THAT(std::string(line),
                testing::MatchesRegex("(# (HELP|TYPE) launch_[a-z0-9_]+ .*|launch_[a-z0-9_]+(\\{.*\\})? [-0-9.e+]+)"));
  }
  EXPECT_EQ(EscapeLabelValue("a\\b\"c\nd"), "a\\\\b\\\"c\\nd");
}

}  // namespace
}  // namespace launch
