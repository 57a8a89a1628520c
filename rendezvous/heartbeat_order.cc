#include "rendezvous/heartbeat_order.h"

namespace launch {

HeartbeatOrder OrderOf(const v1::HeartbeatResponse& r) {
  if (r.unknown_node()) return HeartbeatOrder::kReregister;
  if (r.job_succeeded()) return HeartbeatOrder::kJobSucceeded;
  if (r.job_failed()) return HeartbeatOrder::kJobFailed;
  if (r.stop_workers()) return HeartbeatOrder::kStopWorkers;
  if (r.lease_by_stream()) return HeartbeatOrder::kLeaseByStream;
  return HeartbeatOrder::kCarryOn;
}

bool WantsStacks(const v1::HeartbeatResponse& r) {
  const HeartbeatOrder o = OrderOf(r);
  return r.capture_stacks() && (o == HeartbeatOrder::kStopWorkers || o == HeartbeatOrder::kJobFailed);
}

}  // namespace launch
