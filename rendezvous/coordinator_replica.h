// One of several `launch coordinator --state etcd://...` replicas: it campaigns for leadership
// with an etcd lease (a key that exists while the lease lives), leads while it renews that lease
// (carrying on every run kept in etcd), stands by otherwise (its service refuses calls, naming
// the leader), and keeps each run's record in etcd, written by the leader only (every write is
// guarded by the leader key's revision), when a round forms or opens, a node's workers succeed
// or the run ends: never per heartbeat. A thread of its own ("launch-replica") campaigns and
// renews.
#pragma once

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "common/clock.h"
#include "rendezvous/coordinator.h"
#include "rendezvous/etcd_client.h"
#include "rendezvous/run_store.h"
#include "rendezvous/security.h"

namespace launch {

struct ReplicaOptions {
  EtcdOptions etcd;
  // The address agents reach this replica at (what a standby tells them of the leader).
  std::string advertise;
  // The leader's etcd lease: a leader that cannot renew it for this long stands by, and another
  // replica may lead once etcd lets it expire.
  std::chrono::seconds lease_ttl{3};
  // The token and TLS with which a standby asks the leader for a run's status.
  SecurityOptions security;
};

class CoordinatorReplica final : public RunStore {
 public:
  // Checks that etcd answers (a replica without etcd access refuses to start, in one line).
  static absl::StatusOr<std::unique_ptr<CoordinatorReplica>> Start(ReplicaOptions opts, CoordinatorService* service);
  ~CoordinatorReplica() override;
  // Stops campaigning; a leader gives its leadership up at once (its lease revoked).
  void Stop();

  absl::Status Save(const std::vector<v1::RunRecord>& records, const std::vector<std::string>& removed) override;
  v1::ReplicaStatus Describe() override;
  void ForwardStatus(const v1::StatusRequest& req, v1::StatusResponse* resp,
                     std::function<void(absl::Status)> done) override;

  // Every run kept under the prefix, checked like wire input: what a new leader carries on.
  absl::StatusOr<std::vector<v1::RunRecord>> LoadRuns();

  // The keys, under the prefix.
  std::string LeaderKey() const { return opts_.etcd.prefix + "/leader"; }
  std::string RunKey(const std::string& run_id) const { return opts_.etcd.prefix + "/runs/" + run_id; }
  std::string MembersKey(const std::string& run_id) const { return opts_.etcd.prefix + "/members/" + run_id + "/"; }

 private:
  CoordinatorReplica(ReplicaOptions opts, CoordinatorService* service, std::unique_ptr<EtcdClient> etcd);
  void Loop();
  // One campaign: leads (loading every run) or learns who does.
  void Campaign();
  // The leader renews its lease; false: it stands by now.
  bool Renew();
  void StepDown(const std::string& why);
  absl::StatusOr<v1::RunRecord> LoadRun(const EtcdClient::Kv& head);

  ReplicaOptions opts_;
  CoordinatorService* service_;
  std::unique_ptr<EtcdClient> etcd_;
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable wake_;
  bool stop_ = false;
  // Leadership, under mu_.
  int64_t lease_ = 0;
  bool leading_ = false;
  bool stand_by_ = false;        // a write found another leader: the loop stands the service by
  int64_t leader_revision_ = 0;  // the create revision of our leader key
  std::string leader_;           // who leads, as last seen
  std::chrono::steady_clock::time_point renewed_;
  double leading_since_unix_ = 0;
  int64_t leaderships_seen_ = 0;
  std::vector<v1::EtcdEndpointHealth> health_;
  std::chrono::steady_clock::time_point health_at_;
  // For forwarded Status calls: a channel to the leader, remade when the leader changes.
  std::mutex forward_mu_;
  std::string forward_target_;
  std::shared_ptr<grpc::Channel> forward_channel_;
  std::shared_ptr<v1::Rendezvous::Stub> forward_stub_;
};

}  // namespace launch
