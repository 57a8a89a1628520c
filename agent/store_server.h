// The agent's c10d TCPStore server (agent/tcp_store.h on sockets): the group-rank-0 agent serves
// the workers' store from before they start and across their restarts, as torchrun's agent does.
//
// The port is bound when the agent proposes it and held (bound, not listening) until the agent
// knows whether it hosts the round; so no other process can take it in between. Who may connect:
// a local connection must come from a socket of the agent's own user (the kernel says whose,
// through sock_diag), a remote one from an address of a node of the round. torch's clients carry
// no credential, so the address and the user are what there is to check.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "agent/tcp_store.h"
#include "common/clock.h"
#include "common/event_loop.h"
#include "common/unique_fd.h"

namespace launch {

// Who may connect.
struct StorePeers {
  uid_t uid = 0;                 // local connections: sockets of this user only
  std::set<std::string> remote;  // other nodes' addresses (numeric); everyone else is refused
};

struct StoreServerStats {
  StoreStats store;
  size_t connections = 0;
  int64_t accepted = 0, refused = 0, dropped = 0;  // dropped: closed for a bad request
};

class StoreServer {
 public:
  struct Options {
    StoreLimits limits;
    size_t max_connections = 4096;
    // Every connection's unparsed bytes together; the connection that would pass it is closed.
    size_t max_buffered = size_t{1} << 30;
  };

  // Binds a TCP port for the store on `host`'s side: 127.0.0.1 when `host` is a loopback address,
  // else every address (IPv6 and IPv4). `port` 0: a random free port below the ephemeral range,
  // never `avoid`.
  static absl::StatusOr<std::unique_ptr<StoreServer>> Bind(const std::string& host, int port, int avoid,
                                                           Options options);
  ~StoreServer();
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;

  int port() const { return port_; }
  bool serving() const { return thread_.joinable(); }
  // Serves from now on with nothing in the store: connections of an earlier serving are closed and
  // its keys forgotten (a new attempt never sees the last one's keys).
  absl::Status Serve(StorePeers peers);
  // Stops serving (the thread joined, every connection closed); the port stays bound and listening
  // connections wait in the backlog until the next Serve.
  void Stop();
  StoreServerStats Stats() const;

 private:
  class Serving;  // one Serve to Stop, on the thread
  StoreServer(UniqueFd listener, int port, Options options);
  void Loop();

  UniqueFd listener_;
  int port_ = 0;
  Options options_;
  bool listening_ = false;
  UniqueFd wake_;                    // eventfd: Stop
  SystemClock clock_;                // the loop's (it arms no timers)
  std::unique_ptr<EventLoop> loop_;  // made by Serve, taken by the thread
  std::thread thread_;
  StorePeers peers_;  // read by the thread only while it runs
  mutable std::mutex mu_;
  StoreServerStats stats_;  // guarded by mu_
};

// The uid owning the local TCP socket at `peer` connected to `local` (both numeric address and
// port), from the kernel's socket table (NETLINK_SOCK_DIAG); NotFound when no local socket is.
absl::StatusOr<uid_t> LocalTcpPeerUid(const std::string& peer_ip, int peer_port, const std::string& local_ip,
                                      int local_port);

}  // namespace launch
