// The agent's watch on the coordinator, a named thread with Start/Stop (none when the coordinator
// is in this process and answers the watch itself) and an eventfd the agent's poll loop watches: CoordinatorWatch holds the node's lease while its workers run: on one Watch stream it sends a
//   heartbeat every interval, and the coordinator answers the moment the workers must stop; it
//   rides out a coordinator that goes away and re-registers with one that comes back (every stream
//   opens with what the coordinator needs to rebuild the run), as its CoordinatorSession says.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "rendezvous/coordinator_client.h"
#include "rendezvous/coordinator_session.h"
#include "common/unique_fd.h"

namespace launch {

// What the watch does with the coordinator's answer on a stream.
enum class WatchAnswer {
  kReregister,         // the coordinator does not know this node (it restarted): register again
  kHeartbeatOnStream,  // no lease datagram arrives: heartbeats go on the stream, which is opened anew
  kDeliver,            // the workers must stop, or the job ended: fd() says so
};
WatchAnswer ClassifyWatchAnswer(const v1::HeartbeatResponse& resp);

class LeaseSender;
struct LeaseBeat;

class CoordinatorWatch {
 public:
  // Follows `session`'s retry pacing, patience and registration; a heartbeat every `interval`.
  CoordinatorWatch(const CoordinatorSession* session, std::chrono::milliseconds interval)
      : session_(session), client_(session->client()), interval_(interval) {}
  ~CoordinatorWatch() { Stop(); }

  // Starts watching the round `a`.
  absl::Status Start(const v1::Assignment& a);
  void Stop();
  // Readable once the coordinator said the workers must stop, or the job ended.
  int fd() const { return event_.get(); }
  // The answer that made fd() readable.
  v1::HeartbeatResponse answer() const;
  // Whether the coordinator was unreachable at the last try.
  bool unreachable() const { return unreachable_; }

 private:
  // How one Watch stream ended: the coordinator's answer, or the stream's status without one.
  struct StreamEnd {
    bool got = false;
    v1::HeartbeatResponse resp;
    absl::Status status;
  };

  void Loop(v1::Assignment a);
  // One stream: opened with the registration, renewed until it ends; nullopt once Stop is called.
  std::optional<StreamEnd> WatchOnce(const v1::Assignment& a, bool by_udp, LeaseBeat* beat, LeaseSender* lease);
  // Heartbeats (on the stream, or as datagrams) every interval until the stream ends (`*ended`,
  // under mu_) or Stop; true for Stop.
  bool Renew(WatchStream* stream, const v1::Assignment& a, bool by_udp, LeaseBeat* beat, LeaseSender* lease,
             const bool* ended);
  // A stream ended without an answer: false once the watch is over (the coordinator refused this
  // node, or its hosting node is gone past the patience), else true after the retry's wait.
  bool RideOut(const v1::Assignment& a, const absl::Status& ended_with, RetryPacer* pacer);
  // The answer the agent reads once fd() is readable.
  void Deliver(const v1::HeartbeatResponse& resp);
  void Backoff(std::chrono::milliseconds d);

  const CoordinatorSession* session_;
  CoordinatorClient* client_;
  std::chrono::milliseconds interval_;
  UniqueFd event_;
  std::unique_ptr<InProcessWatch> in_process_;  // the watch, when the coordinator is in this process
  std::thread thread_;                          // else the one that holds the stream
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  WatchStream* stream_ = nullptr;  // the stream in use, for Stop to cancel
  v1::HeartbeatResponse answer_;
  std::atomic<bool> unreachable_{false};
};

}  // namespace launch
