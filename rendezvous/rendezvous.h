// The rendezvous state machine of one run: no I/O, driven by a Clock, wrapped by the gRPC
// service. Rounds are numbered; a round forms at max nodes, at min nodes after the last call, or
// as soon as every live node of the last round is back; group ranks are stable across rounds for
// nodes that stay; nodes hold a lease by heartbeat; the restart budget is the job's. A node that
// asks in while max nodes hold the places waits as a spare (torchrun's redundancy list) and takes
// the place of a node that is lost or leaves; it gives up after join_timeout.
#pragma once

#include <chrono>
#include <cstdint>
#include <list>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "rendezvous/heartbeat_order.h"
#include "common/clock.h"
#include "common/tunables.h"
#include "launch.pb.h"

namespace launch {

struct RendezvousConfig {
  int min_nodes = 1;
  int max_nodes = 1;
  std::chrono::milliseconds last_call_timeout = kDefaultLastCallTimeout;
  std::chrono::milliseconds join_timeout = kDefaultJoinTimeout;
  // How long an ended run is kept so that late agents learn its verdict; then its id is free.
  std::chrono::milliseconds close_timeout = kDefaultCloseTimeout;
  // A running node that has not been heard from for this long is lost.
  std::chrono::milliseconds heartbeat_timeout = kDefaultHeartbeatTimeout;
  int max_restarts = 0;
  // --straggler-factor (0: stragglers are not looked for).
  double straggler_factor = kDefaultStragglerFactor;

  v1::RunSpec ToSpec() const;
  static absl::StatusOr<RendezvousConfig> FromSpec(const v1::RunSpec& spec);
};

// A straggler factor as --straggler-factor and the run spec take it: 0 (off) or 1-kMaxStragglerFactor.
absl::StatusOr<double> CheckStragglerFactor(double f);

// "--nnodes 2:4, max_restarts 3, ..." for mismatch errors.
std::string DescribeSpec(const v1::RunSpec& spec);

class Rendezvous {
 public:
  enum class Phase { kWaiting, kRunning, kSucceeded, kFailed };

  Rendezvous(std::string run_id, RendezvousConfig config, const Clock* clock);

  // Puts the node in the round being formed (opening a new round if one is running), or among
  // the spares when max nodes hold the places.
  absl::Status Join(const v1::JoinRequest& req);
  // A waiting node's Join went away (its agent died or gave up) before the round formed.
  void CancelJoin(const std::string& node_id);
  // The node's assignment once a round newer than `last_round` has formed with it.
  std::optional<v1::Assignment> AssignmentFor(const std::string& node_id, long last_round) const;
  // Why a spare's join was given up (once; nullopt while it may still get a place).
  std::optional<absl::Status> TakeJoinRefusal(const std::string& node_id);
  bool IsSpare(const std::string& node_id) const;
  // Forms the waiting round at its last call, expires leases, fails a round that cannot form in
  // time; returns when to call again (nullopt: no timer).
  std::optional<Clock::TimePoint> Tick();

  // Renews the node's lease (re-registering it after a coordinator restart when the request
  // carries its assignment) and answers with what the node must do now.
  v1::HeartbeatResponse Heartbeat(const v1::HeartbeatRequest& req);
  // What a heartbeat would be answered now, without renewing the lease (for open Watch streams).
  v1::HeartbeatResponse HeartbeatAnswer(const v1::HeartbeatRequest& req) const;
  // Whether the node has ever joined or re-registered (else a heartbeat is answered unknown_node).
  bool Knows(const std::string& node_id) const { return identities_.contains(node_id); }
  // Whether the node holds a place in the current (or last) round.
  bool IsMember(const std::string& node_id) const { return FindMember(node_id) != nullptr; }
  // Whether the node must act on the answer now (a Watch stream writes only such an answer).
  static bool Urgent(const v1::HeartbeatResponse& r) { return launch::Urgent(OrderOf(r)); }
  v1::ReportExitResponse ReportExit(const v1::ReportExitRequest& req);
  // A lease datagram: renews the node's lease when it is a member of `round` and `seq` is newer
  // than any before (a replay renews nothing).
  bool RenewLease(const std::string& node_id, long round, uint64_t seq);
  // The coordinator itself did not run for `d` (stopped, a paused VM): that time does not count
  // against anyone's lease, so every member's lease is extended by it, nor against an ended
  // run's close_timeout.
  void ForgivePause(Clock::TimePoint::duration d);
  v1::StatusResponse Status() const;

  Phase phase() const { return phase_; }
  bool ended() const { return phase_ == Phase::kSucceeded || phase_ == Phase::kFailed; }
  Clock::TimePoint ended_at() const { return ended_at_; }
  long round() const { return round_; }
  int waiting_nodes() const { return static_cast<int>(waiting_.size()); }
  int spare_nodes() const { return static_cast<int>(spares_.size()); }
  // The node ids the run remembers (members, waiting nodes, spares, and nodes seen before).
  int known_nodes() const { return static_cast<int>(identities_.size()); }
  const RendezvousConfig& config() const { return config_; }
  const std::string& reason() const { return reason_; }
  // Changes whenever an agent may have something new to learn (a round opened or formed, the run
  // ended): held calls are re-answered then.
  uint64_t version() const { return version_; }
  // Whether the run was rebuilt from re-registering agents (the coordinator restarted).
  bool reattached() const { return reattached_; }

  // The node has been answered with the run's end; EveryoneToldEnd: every node still alive has.
  void NoteToldEnd(const std::string& node_id) { told_end_.insert(node_id); }
  bool EveryoneToldEnd() const;

  // Re-creates a run that a restarted coordinator does not know, from a node's heartbeat.
  static absl::StatusOr<RendezvousConfig> ConfigForReattach(const v1::HeartbeatRequest& req);

  // What a replicated coordinator keeps of this run in etcd (rendezvous/run_record.cc); the run's
  // lease key and the nodes' own keys are the service's to add.
  v1::RunRecord ToRecord() const;
  // The run as a new leader carries it on from its record, which is checked like wire input
  // first (etcd is shared infrastructure). Leases stay in the leader's memory, so every member
  // is given a whole heartbeat timeout from now to renew its lease before it is judged lost.
  static absl::StatusOr<std::unique_ptr<Rendezvous>> FromRecord(const v1::RunRecord& record, const Clock* clock);

 private:
  struct Waiting {
    v1::JoinRequest join;
    Clock::TimePoint since;  // for spares: when it asked in
  };
  // A node of the last formed round. Only nodes that are there have one: a run rebuilt after a
  // coordinator restart holds the nodes that re-registered, not a slot per rank they claim.
  struct Member {
    std::string id;
    int group_rank = 0;
    Clock::TimePoint last_seen;
    bool succeeded = false;
    uint64_t lease_seq = 0;  // the newest lease datagram's sequence number
    v1::Assignment assignment;
  };
  void OpenNextRound(std::string why);
  void AddWaiting(const v1::JoinRequest& req);
  void ClearWaiting();
  // The distinct addresses of the round being formed, which its group-rank-0 agent is handed:
  // OK when the node's would keep them under kMaxMemberAddressBytes (else RESOURCE_EXHAUSTED).
  absl::Status AddressesFit(const v1::NodeIdentity& n) const;
  void CountAddresses(const v1::NodeIdentity& n, int delta);
  // RESOURCE_EXHAUSTED when the run holds kMaxSparesPerRun spares already.
  absl::Status AddSpare(const v1::JoinRequest& req);
  // Makes room to remember `id` (forgetting nodes that are neither members, waiting nor spares);
  // RESOURCE_EXHAUSTED when the run remembers KnownNodesLimit(max_nodes) nodes that all are.
  absl::Status RoomToKnow(const std::string& id);
  void RemoveSpare(const std::string& node_id);
  // Moves spares into the waiting round while live members and waiting nodes leave places free.
  void PromoteSpares();
  // Gives up on spares that have waited join_timeout; returns the earliest spare deadline left.
  std::optional<Clock::TimePoint> ExpireSpares();
  bool ReadyToForm() const;
  void FormRound();
  void End(Phase phase, std::string reason);
  Member* FindMember(const std::string& id);
  const Member* FindMember(const std::string& id) const;
  bool Reattach(const v1::HeartbeatRequest& req);
  // Keeps the first few reasons for the join-timeout message, counts the rest.
  void NoteLost(std::string why);
  std::string NodeName(const std::string& id) const;
  // Nodes of the last formed round whose lease is still live and who have not re-joined.
  int LiveMembersNotWaiting() const;

  std::string run_id_;
  RendezvousConfig config_;
  const Clock* clock_;
  Phase phase_ = Phase::kWaiting;
  long round_ = 0;  // the last formed round; the waiting one is round_ + 1
  int restart_count_ = 0;
  uint64_t version_ = 0;
  bool reattached_ = false;
  std::vector<Waiting> waiting_;  // join order
  absl::flat_hash_set<std::string> waiting_ids_;
  absl::flat_hash_map<std::string, int> address_refs_;  // the waiting nodes' addresses, and how many bring each
  size_t address_bytes_ = 0;                            // their bytes on the wire
  std::list<Waiting> spares_;                           // join order
  absl::flat_hash_map<std::string, std::list<Waiting>::iterator> spare_index_;
  absl::flat_hash_map<std::string, absl::Status> refused_;  // spares given up, until told
  Clock::TimePoint waiting_since_;
  std::optional<Clock::TimePoint> last_call_deadline_;
  std::vector<Member> members_;  // the last formed round (by group rank, unless rebuilt by re-registration)
  absl::flat_hash_map<std::string, size_t> member_index_;  // node id -> index in members_
  absl::flat_hash_set<int> ranks_taken_;                   // the group ranks of members_
  int group_world_size_ = 0;                               // the last formed round's size
  Clock::TimePoint reattached_at_;  // when the run was rebuilt: ranks not back by then + heartbeat_timeout are lost
  absl::flat_hash_map<std::string, v1::NodeIdentity> identities_;  // every node ever seen
  std::vector<std::string> lost_;  // why nodes were lost, for the join-timeout message (the first few)
  size_t lost_count_ = 0;          // how many were
  std::optional<v1::Failure> first_failure_;
  absl::flat_hash_set<std::string> told_end_;
  std::string reason_;             // why the run failed or why the last round was reopened
  bool stopped_for_hang_ = false;  // the last round was stopped because a rank hung
  Clock::TimePoint ended_at_;
};

const char* PhaseName(Rendezvous::Phase p);

// Whether a re-registering node's assignment fits the run's spec `c`: every number and string
// that the rebuilt run would keep is bounded by it (InvalidArgument naming them otherwise).
absl::Status CheckReattach(const v1::HeartbeatRequest& req, const RendezvousConfig& c);

}  // namespace launch
