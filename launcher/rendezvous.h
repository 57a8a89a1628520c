// The rendezvous state machine of one run: no I/O, driven by a Clock, wrapped by the gRPC
// service. Rounds are numbered; a round forms at max nodes, or at min nodes after the last call;
// group ranks are stable across rounds for nodes that stay; the restart budget is the job's.
#pragma once

#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/clock.h"
#include "launch.pb.h"

namespace launch {

struct RendezvousConfig {
  int min_nodes = 1;
  int max_nodes = 1;
  std::chrono::milliseconds last_call_timeout{30000};
  std::chrono::milliseconds join_timeout{600000};
  int max_restarts = 0;
};

class Rendezvous {
 public:
  enum class Phase { kWaiting, kRunning, kSucceeded, kFailed };

  Rendezvous(std::string run_id, RendezvousConfig config, const Clock* clock);

  // Puts the node in the round being formed (opening a new round if one is running).
  absl::Status Join(const v1::JoinRequest& req);
  // The node's assignment once a round newer than `last_round` has formed with it.
  std::optional<v1::Assignment> AssignmentFor(const std::string& node_id, long last_round) const;
  // Forms the waiting round if its time has come; returns when to call again (nullopt: no timer).
  std::optional<Clock::TimePoint> Tick();

  v1::HeartbeatResponse Heartbeat(const v1::HeartbeatRequest& req);
  v1::ReportExitResponse ReportExit(const v1::ReportExitRequest& req);
  v1::StatusResponse Status() const;

  Phase phase() const { return phase_; }
  long round() const { return round_; }
  int waiting_nodes() const { return static_cast<int>(waiting_.size()); }
  const RendezvousConfig& config() const { return config_; }

 private:
  struct Member {
    v1::JoinRequest join;
    Clock::TimePoint last_seen;
  };
  void OpenNextRound();
  void FormRound();

  std::string run_id_;
  RendezvousConfig config_;
  const Clock* clock_;
  Phase phase_ = Phase::kWaiting;
  long round_ = 0;  // the last formed round; the waiting one is round_ + 1
  int restart_count_ = 0;
  std::vector<Member> waiting_;  // join order
  std::optional<Clock::TimePoint> last_call_deadline_;
  // The formed round.
  std::vector<std::string> members_;  // by group rank
  std::map<std::string, v1::Assignment> assignments_;
  std::map<std::string, Clock::TimePoint> last_seen_;
  std::map<std::string, v1::NodeIdentity> identities_;
  std::map<std::string, bool> succeeded_;
  std::optional<v1::WorkerExit> first_failure_;
};

const char* PhaseName(Rendezvous::Phase p);

}  // namespace launch
