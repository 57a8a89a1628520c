// The rendezvous coordinator as a gRPC service: a thin, locked wrapper around one Rendezvous
// state machine per run id. Joins are held and Watch streams kept open (gRPC callback API, no
// thread per call); both are answered the moment their answer changes, so every agent learns of
// a new round at once. Leases are renewed by Watch messages or lease datagrams.
// Single-node runs host it in-process on 127.0.0.1 (port 0); `launch coordinator` and the
// agent-hosted coordinator serve many nodes and many runs.
#pragma once

#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "common/clock.h"
#include "common/limits.h"
#include "rendezvous/lease.h"
#include "common/unique_fd.h"
#include "launch.grpc.pb.h"
#include "rendezvous/job_view.h"
#include "rendezvous/local_token.h"
#include "rendezvous/rendezvous.h"
#include "rendezvous/run_store.h"
#include "rendezvous/security.h"

namespace launch {

struct CoordinatorOptions {
  // For joins that carry no run spec (older agents, tests): the run's settings.
  RendezvousConfig defaults;
  std::string token;        // required on every RPC when not empty
  bool owner_only = false;  // the token is one it took and published for its user (local_token.h)
};

class CoordinatorService final : public v1::Rendezvous::CallbackService {
 public:
  CoordinatorService(CoordinatorOptions opts, const Clock* clock);
  ~CoordinatorService() override;

  grpc::ServerUnaryReactor* Join(grpc::CallbackServerContext* ctx, const v1::JoinRequest* req,
                                 v1::JoinResponse* resp) override;
  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* ctx, const v1::HeartbeatRequest* req,
                                      v1::HeartbeatResponse* resp) override;
  grpc::ServerUnaryReactor* ReportExit(grpc::CallbackServerContext* ctx, const v1::ReportExitRequest* req,
                                       v1::ReportExitResponse* resp) override;
  grpc::ServerUnaryReactor* Status(grpc::CallbackServerContext* ctx, const v1::StatusRequest* req,
                                   v1::StatusResponse* resp) override;
  grpc::ServerBidiReactor<v1::HeartbeatRequest, v1::HeartbeatResponse>* Watch(
      grpc::CallbackServerContext* ctx) override;
  grpc::ServerUnaryReactor* Sample(grpc::CallbackServerContext* ctx, const v1::SampleRequest* req,
                                   v1::SampleResponse* resp) override;

  // Every run's status as the Status RPC answers it (for the metrics endpoint).
  std::vector<v1::StatusResponse> AllStatus();

  // Replicated coordinators (rendezvous/coordinator_replica.h): the store that keeps what must
  // outlive the leader, set before Start. With one, the service stands by until Lead.
  void set_store(RunStore* store);
  // This replica leads now: it carries on the runs of `records` (each member given a whole
  // heartbeat timeout to renew its lease); a record that fails its checks is left out, with a line.
  void Lead(const std::vector<v1::RunRecord>& records);
  // This replica does not lead (any more): every held call and stream is ended UNAVAILABLE, the
  // runs are forgotten (they live on in the store), and every call is answered UNAVAILABLE,
  // naming `leader` when known, so that agents go there.
  void StandBy(const std::string& leader);
  bool leading();
  // This replica's standing (nullopt: the coordinator is not replicated).
  std::optional<v1::ReplicaStatus> Replica();

  // Starts the timer thread (last calls, leases, spares, closing ended runs).
  void Start();
  // Answers every held call UNAVAILABLE and stops the timer thread.
  void Shutdown();

  // Waits until every run has ended and each of its live nodes has been told (bounded).
  bool WaitUntilEveryNodeKnowsTheEnd(std::chrono::milliseconds timeout);

  int runs_for_test();

  // The UDP port lease datagrams go to (0: none), handed to agents in their assignments.
  void set_lease_port(int port);
  // Lease datagrams as read by the LeaseListener: each authentic one renews its node's lease.
  void OnLeaseBatch(const std::vector<std::string>& datagrams);

 private:
  class HeldCall;
  class WatchReactor;
  struct Run {
    std::unique_ptr<Rendezvous> rdzv;
    std::unique_ptr<JobView> view;  // the nodes' monitor samples, stragglers
    std::set<HeldCall*> held;       // joins waiting for their round
    std::set<WatchReactor*> watchers;
    // When the run's Tick is due (its last answer); nullopt: no timer. Heartbeats only push
    // leases later, so they need not tick the run.
    std::optional<Clock::TimePoint> next_tick;
    std::string lease_key;  // the run's key: each node's datagram key is derived from it
    // Nodes that re-registered with a restarted coordinator keep the key they were given.
    std::map<std::string, std::string> node_keys;
    std::set<std::string> udp_seen;  // nodes whose lease datagrams arrive
  };
  // The run's record, with the keys its nodes' lease datagrams are checked with; mu_ held.
  static v1::RunRecord RecordOf(const Run& run);
  Run NewRun(const std::string& run_id, const RendezvousConfig& cfg);
  // OK when one more run fits under kMaxRunsPerCoordinator; mu_ held.
  absl::Status RoomForRun(const std::string& run_id) const;
  // The key of `node_id`'s lease datagrams; `scratch` holds a derived one.
  static const std::string& NodeKey(const Run& run, const std::string& node_id, std::string* scratch);
  // What a section under mu_ decided, done once mu_ is released: the one locking rule is decide
  // under mu_, then finish calls and streams and write log lines unlocked (gRPC may run a
  // reactor's OnDone, which takes mu_, inside Finish; a log line may wait on a slow console).
  struct Finishes {
    std::vector<std::pair<HeldCall*, grpc::Status>> calls;
    std::vector<WatchReactor*> streams;              // each finishes as it decided (answer or status)
    std::vector<std::pair<bool, std::string>> logs;  // (warning?, line)
    // For the store (replicated coordinators): kept before any call or stream is answered.
    std::vector<v1::RunRecord> records;
    std::vector<std::string> removed;
    void emplace_back(HeldCall* c, grpc::Status st) { calls.emplace_back(c, std::move(st)); }
    void Info(std::string line) { logs.emplace_back(false, std::move(line)); }
    void Warn(std::string line) { logs.emplace_back(true, std::move(line)); }
    bool empty() const {
      return calls.empty() && streams.empty() && logs.empty() && records.empty() && removed.empty();
    }
  };

  grpc::Status CheckToken(grpc::CallbackServerContext* ctx, const char* rpc);
  // Whether `presented` is the key of `node_id` in `run` (derived from the run's key, or the one
  // it re-registered with); PERMISSION_DENIED, logged with the peer, otherwise. mu_ held.
  absl::Status CheckNodeKey(const Run& run, const std::string& node_id, const std::string& presented,
                            const std::string& peer, const char* rpc, Finishes* f) const;
  // The token, then the message size: the first refusal, logged with the peer.
  grpc::Status Admit(grpc::CallbackServerContext* ctx, const google::protobuf::Message& req, const char* rpc);
  // Answers the run's held calls whose answer is ready; mu_ held. Finish happens after unlock.
  void Pump(Run& run, Finishes* out);
  // Answers `call` when its answer is ready (it stays in the run's containers); mu_ held.
  bool AnswerIfReady(Run& run, HeldCall* call, Finishes* out);
  // A heartbeat (unary or on a Watch stream): renews the lease, re-registers a node a restarted
  // coordinator does not know, answers held joins and streams the change concerns; mu_ held.
  // nullptr: the run is unknown and the node sent nothing to rebuild it from (ans says
  // unknown_node).
  // `node_key`: the key the caller presented (kNodeKeyMetadataKey).
  absl::StatusOr<Run*> HeartbeatLocked(const std::string& peer, const std::string& node_key,
                                       const v1::HeartbeatRequest& req, v1::HeartbeatResponse* ans, Finishes* f);
  void Cancelled(HeldCall* call);
  // The run's status with its nodes' latest samples; mu_ held.
  v1::StatusResponse StatusLocked(const Run& run) const;
  // Ticks the run now and notes when it is due again, waking the timer thread only when that is
  // sooner than it sleeps (a round of 16,384 joins is not 16,384 thread wake-ups); mu_ held.
  void TickNow(Run& run);
  void TimerLoop();
  // Keeps the records, then answers; false: the store refused them (this replica no longer
  // leads), and every answer became UNAVAILABLE.
  bool FinishAll(Finishes& f);
  // A standby's refusal; mu_ held.
  grpc::Status NotLeaderLocked() const;

  CoordinatorOptions opts_;
  const Clock* clock_;
  std::mutex mu_;
  std::condition_variable wake_;  // the timer thread
  // Under mu_: when the timer thread wakes next by itself; TimePoint::min() while it runs.
  Clock::TimePoint timer_sleeps_until_ = Clock::TimePoint::min();
  std::condition_variable settled_;  // WaitUntilEveryNodeKnowsTheEnd
  bool stopping_ = false;
  std::map<std::string, Run> runs_;
  std::thread timer_;
  int lease_port_ = 0;  // under mu_
  RunStore* store_ = nullptr;
  bool standby_ = false;                            // under mu_: a replica that does not lead
  std::string leader_;                              // under mu_: where the leader is, when a standby knows
  std::mutex store_mu_;                             // orders the store's writes
  std::map<std::string, uint64_t> stored_version_;  // under store_mu_
};

// A coordinator listening on an address, with its own gRPC threads.
class CoordinatorServer {
 public:
  // "127.0.0.1:0" picks a free port; port() tells which. An address already in use is an
  // AlreadyExists error (another agent on this host hosts it: be its client).
  static absl::StatusOr<std::unique_ptr<CoordinatorServer>> Start(const std::string& listen, CoordinatorOptions opts,
                                                                  const SecurityOptions& security, const Clock* clock);
  ~CoordinatorServer();
  int port() const { return port_; }
  std::string address() const { return address_; }
  // Where an owner-only coordinator (loopback, no token) published its token; empty otherwise.
  std::string local_token_path() const { return local_token_ ? local_token_->path() : ""; }
  CoordinatorService* service() { return service_.get(); }
  // A channel to this server inside the process (no socket): for fuzzing the RPC handlers.
  std::shared_ptr<grpc::Channel> InProcessChannel();

 private:
  CoordinatorServer() = default;
  std::unique_ptr<grpc::Server> BuildServer(const std::string& address, int* port);
  // The keeper thread: when gRPC's listener stops accepting (see rendezvous/grpc_log.h), builds a
  // new server on the same port around the same service, retrying until descriptors allow it.
  void KeepListening();

  std::shared_ptr<grpc::ServerCredentials> creds_;
  std::unique_ptr<CoordinatorService> service_;
  std::unique_ptr<grpc::Server> server_;  // replaced by the keeper thread; keeper_mu_
  std::unique_ptr<LeaseListener> leases_;
  std::unique_ptr<LocalTokenFile> local_token_;
  int port_ = 0;
  std::string address_;
  std::mutex keeper_mu_;
  std::condition_variable keeper_wake_;
  bool listener_failed_ = false;  // keeper_mu_
  bool stopping_ = false;         // keeper_mu_
  int failure_subscription_ = 0;
  // Descriptors held in reserve (on /dev/null) for the listener's rebuild; keeper thread only.
  void ReserveDescriptors();
  UniqueFd spare_fds_[4];
  std::thread keeper_;
};

// What gRPC itself accepts: messages between the two limits are refused by the service, with a
// log line naming the peer; larger ones by gRPC before they are parsed.
constexpr int kGrpcReceiveLimitBytes = 4 * kMaxRendezvousMessageBytes;
// What a Status answer's nodes may take: the message limit less room for the rest (the replicas'
// status, a failure, the reason).
constexpr size_t kMaxStatusNodesBytes = kMaxRendezvousMessageBytes - 128 * 1024;
// A Status answer as it goes on the wire: nodes without their addresses, and only as many (in
// group rank order) as fit in `budget` bytes, the rest counted in nodes_omitted.
void BoundStatusForWire(v1::StatusResponse* s, size_t budget);

}  // namespace launch
