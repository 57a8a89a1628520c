// What the coordinator service asks of the replicated coordinators it belongs to (with no etcd
// in it): a store for what must outlive the leader, and the replica's own standing.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "launch.pb.h"

namespace launch {

class RunStore {
 public:
  virtual ~RunStore() = default;
  // Keeps the runs' records and forgets the removed runs, before the service answers any call
  // whose answer depends on them (called unlocked; an error means this replica no longer leads,
  // and those calls are answered UNAVAILABLE so that their agents find the one that does).
  virtual absl::Status Save(const std::vector<v1::RunRecord>& records, const std::vector<std::string>& removed) = 0;
  // Which replica leads, since when, the etcd endpoints' health, the failovers seen.
  virtual v1::ReplicaStatus Describe() = 0;
  // A standby's answer to a Status call: the leader's, asked on the caller's behalf; `done` is
  // called once, from any thread.
  virtual void ForwardStatus(const v1::StatusRequest& req, v1::StatusResponse* resp,
                             std::function<void(absl::Status)> done) = 0;
};

}  // namespace launch
