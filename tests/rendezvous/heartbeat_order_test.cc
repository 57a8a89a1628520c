// The heartbeat answer's six wire booleans decoded into one order, as a table.
#include "rendezvous/heartbeat_order.h"

#include "gtest/gtest.h"
#include "rendezvous/rendezvous.h"

namespace launch {
namespace {

using O = HeartbeatOrder;

struct Row {
  const char* name;
  bool stop, unknown, succeeded, failed, lease_by_stream, capture;
  O order;
  bool wants_stacks;
};

void PrintTo(const Row& r, std::ostream* os) { *os << r.name; }

v1::HeartbeatResponse Answer(const Row& r) {
  v1::HeartbeatResponse a;
  a.set_stop_workers(r.stop);
  a.set_unknown_node(r.unknown);
  a.set_job_succeeded(r.succeeded);
  a.set_job_failed(r.failed);
  a.set_lease_by_stream(r.lease_by_stream);
  a.set_capture_stacks(r.capture);
  return a;
}

class HeartbeatOrderTable : public ::testing::TestWithParam<Row> {};

TEST_P(HeartbeatOrderTable, Decodes) {
  const Row& r = GetParam();
  const v1::HeartbeatResponse a = Answer(r);
  EXPECT_EQ(OrderOf(a), r.order);
  EXPECT_EQ(WantsStacks(a), r.wants_stacks);
  // The coordinator writes an answer on a Watch stream at once exactly when one of these is set.
  EXPECT_EQ(Rendezvous::Urgent(a), r.stop || r.unknown || r.succeeded || r.failed);
}

INSTANTIATE_TEST_SUITE_P(
    All, HeartbeatOrderTable,
    ::testing::Values(
        // Name; stop, unknown, succeeded, failed, lease_by_stream, capture; order; wants stacks.
        Row{"Nothing", false, false, false, false, false, false, O::kCarryOn, false},
        Row{"UnknownNode", false, true, false, false, false, false, O::kReregister, false},
        Row{"UnknownOutranksTheRest", true, true, false, true, true, true, O::kReregister, false},
        Row{"LeaseByStreamAlone", false, false, false, false, true, false, O::kLeaseByStream,
            false},
        Row{"StopOutranksLeaseByStream", true, false, false, false, true, false, O::kStopWorkers,
            false},
        Row{"NewRound", true, false, false, false, false, false, O::kStopWorkers, false},
        Row{"HangStopCapturesStacks", true, false, false, false, false, true, O::kStopWorkers,
            true},
        Row{"JobFailed", true, false, false, true, false, false, O::kJobFailed, false},
        Row{"JobFailedByAHangCapturesStacks", true, false, false, true, false, true, O::kJobFailed,
            true},
        Row{"JobSucceeded", false, false, true, false, false, false, O::kJobSucceeded, false},
        Row{"SucceededWithLeaseByStream", false, false, true, false, true, false, O::kJobSucceeded,
            false},
        Row{"CaptureWithoutAStopIsNothing", false, false, false, false, false, true, O::kCarryOn,
            false}),
    [](const ::testing::TestParamInfo<Row>& info) { return std::string(info.param.name); });

TEST(HeartbeatOrder, OnlyTheJobsEndEndsIt) {
  for (O o : {O::kCarryOn, O::kReregister, O::kLeaseByStream, O::kStopWorkers})
    EXPECT_FALSE(EndsTheJob(o));
  EXPECT_TRUE(EndsTheJob(O::kJobSucceeded));
  EXPECT_TRUE(EndsTheJob(O::kJobFailed));
}

}  // namespace
}  // namespace launch
