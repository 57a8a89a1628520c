// A heartbeat answer as the agent acts on it. The wire message (v1::HeartbeatResponse) keeps its
// six booleans for compatibility; they are decoded here, once, into the one order they combine to.
#pragma once

#include "launch.pb.h"

namespace launch {

enum class HeartbeatOrder {
  kCarryOn,        // nothing to do: keep renewing the lease
  kReregister,     // unknown_node: the coordinator restarted and forgot this node
  kLeaseByStream,  // this node's lease datagrams do not arrive: heartbeat on the stream instead
  kStopWorkers,    // a new round forms, or this node is not in the running one: stop and re-join
  kJobSucceeded,   // every node's workers of the final round exited 0
  kJobFailed,      // the job failed: stop the workers; no new round comes
};

// The order of `r`: re-registration first (nothing else in the answer holds for a node the
// coordinator does not know), then the job's end, then a stop, then the lease's transport.
HeartbeatOrder OrderOf(const v1::HeartbeatResponse& r);

// Whether `r` asks for the workers' stacks before they are stopped (a rank hung): a modifier of
// kStopWorkers and kJobFailed (a hang can end the job), not an order of its own.
bool WantsStacks(const v1::HeartbeatResponse& r);

// Whether the coordinator answers a held heartbeat with `o` at once (the workers must stop, the
// job ended, or the node must re-register) rather than when it next has news.
inline bool Urgent(HeartbeatOrder o) { return o != HeartbeatOrder::kCarryOn && o != HeartbeatOrder::kLeaseByStream; }
inline bool EndsTheJob(HeartbeatOrder o) {
  return o == HeartbeatOrder::kJobSucceeded || o == HeartbeatOrder::kJobFailed;
}

}  // namespace launch
