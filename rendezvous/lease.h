// Lease datagrams: an agent's heartbeat as one UDP datagram, so that thousands of agents can renew
// their leases at 1 Hz for a few percent of the coordinator's CPU (a gRPC stream message costs
// a read, a window update and a callback each). Each datagram is authenticated with HMAC-SHA256
// under the node's lease key, which its agent gets over the (token/TLS-protected) rendezvous
// channel, and carries a sequence number so that a replayed datagram renews nothing. Each node's
// key is derived from the run's key and the node id: a node can renew only its own lease (with
// one key per run, a member could forge another node's datagram with the largest sequence
// number, after which that node's real datagrams were replays and it was declared lost).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "common/limits.h"
#include "common/unique_fd.h"

namespace launch {

struct LeaseBeat {
  std::string run_id;
  std::string node_id;
  int64_t round = 0;
  uint64_t seq = 0;
};

inline constexpr size_t kLeaseKeyBytes = 32;
inline constexpr size_t kMaxLeaseDatagram = 512;
// The datagram: "LB1", run id length and bytes, node id length and bytes, round, sequence, MAC.
inline constexpr size_t LeaseDatagramBytes(size_t run_id, size_t node_id) {
  return 3 + 1 + run_id + 1 + node_id + 16 + 32;
}
// The longest ids the rendezvous accepts fit one datagram (and their one-byte lengths).
static_assert(LeaseDatagramBytes(kMaxRunIdLength, kMaxNodeIdLength) <= kMaxLeaseDatagram);
static_assert(kMaxRunIdLength <= 255 && kMaxNodeIdLength <= 255);

// A fresh random key (kLeaseKeyBytes).
std::string NewLeaseKey();
// The key of node `node_id`'s datagrams in the run whose key is `run_key`.
std::string NodeLeaseKey(const std::string& run_key, const std::string& node_id);
// The datagram for `beat`; ids longer than the rendezvous limits are an error.
absl::StatusOr<std::string> EncodeLeaseBeat(const LeaseBeat& beat, const std::string& key);
// The beat in `datagram` when it is well formed and its HMAC checks out under the key that
// `key_for(run_id, node_id)` gives (nullptr: unknown run or node); nullopt otherwise.
using LeaseKeyLookup = std::function<const std::string*(const std::string& run_id, const std::string& node_id)>;
std::optional<LeaseBeat> DecodeLeaseBeat(std::string_view datagram, const LeaseKeyLookup& key_for);

// The coordinator's end: a UDP socket on the rendezvous address, read in batches by its own
// thread; each batch of raw datagrams goes to `on_batch`.
class LeaseListener {
 public:
  using OnBatch = std::function<void(const std::vector<std::string>&)>;
  ~LeaseListener() { Stop(); }
  // Binds UDP host:port (the port the gRPC server listens on).
  absl::Status Start(const std::string& host, int port, OnBatch on_batch);
  void Stop();

 private:
  void Loop();
  UniqueFd fd_, stop_;
  OnBatch on_batch_;
  std::thread thread_;
};

// The agent's end: a UDP socket connected to the coordinator's lease port.
class LeaseSender {
 public:
  absl::Status Connect(const std::string& host, int port);
  // One datagram; errors (a full buffer, an unreachable port) are ignored like a lost datagram.
  void Send(const std::string& datagram);

 private:
  UniqueFd fd_;
};

}  // namespace launch
