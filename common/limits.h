// One definition of each limit on what users and peers give launch (durations, ids, counts),
// applied where the input enters: flags, YAML, --rdzv-conf, RPCs.
#pragma once

#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>

namespace launch {

// Any duration given in seconds: at most 10,000,000 s (about 115 days); one that must be positive
// at least 1 ms, the resolution every timer here works in.
inline constexpr double kMaxSeconds = 1e7;
inline constexpr double kMinPositiveSeconds = 0.001;

// Seconds to milliseconds, rounded and saturating to 0..kMaxSeconds (NaN counts as 0), so that
// no value, however it got here, overflows into a negative duration.
inline std::chrono::milliseconds SecondsToMs(double s) {
  if (!(s > 0)) return std::chrono::milliseconds(0);
  if (s > kMaxSeconds) s = kMaxSeconds;
  return std::chrono::milliseconds(static_cast<long long>(std::llround(s * 1000)));
}

// A run id names a log directory and travels in every RPC.
inline constexpr size_t kMaxRunIdLength = 128;
// --straggler-factor: 0 (off) or 1 to this.
inline constexpr double kMaxStragglerFactor = 1000;
// The fastest the agent samples its workers (--monitor-interval below it samples this often).
inline constexpr double kMinMonitorInterval = 1.0;
// --warm-import: the modules a standby imports.
inline constexpr size_t kMaxWarmImports = 64;
// Workers on one node (--nproc-per-node, and a node's local world size on the wire).
inline constexpr int kMaxWorkersPerNode = 4096;
// --threads-per-worker: more threads than any machine has cores.
inline constexpr int kMaxThreadsPerWorker = 1024;
// --config: a YAML file of settings.
inline constexpr size_t kMaxConfigBytes = 1 << 20;
// Nodes in one run (--nnodes MAX, and every node count on the wire).
inline constexpr int kMaxNodes = 16384;
// A node id (the agent makes "<host>:<pid>:<hex>", its host part cut to fit) and a host name or
// address (a DNS name is at most 253 bytes), as they travel in RPCs and lease datagrams.
inline constexpr size_t kMaxNodeIdLength = 255;
inline constexpr size_t kMaxHostLength = 255;
// The interface addresses one node reports (NodeIdentity.addresses), each a numeric address.
inline constexpr int kMaxNodeAddresses = 64;
inline constexpr size_t kMaxAddressLength = 64;
// Runs one coordinator holds at once (a Join or re-registration of one more is refused).
inline constexpr int kMaxRunsPerCoordinator = 1024;
// Spare nodes one run keeps waiting for a place (torchrun's redundancy list).
inline constexpr int kMaxSparesPerRun = 1024;
// Node ids one run remembers: its members, the round being formed, its spares, and as many again
// of nodes gone (so that a node cut off is told to stop, not taken for a stranger).
constexpr int KnownNodesLimit(int max_nodes) { return 2 * (2 * max_nodes + kMaxSparesPerRun); }
// A rendezvous round as it travels in RPCs: far more rounds than any job makes, far from
// overflowing the counter that each new round increments.
inline constexpr int64_t kMaxRound = int64_t{1} << 40;
// The rendezvous messages (every RPC and its answer): small, anything bigger is an attack or a bug.
inline constexpr int kMaxRendezvousMessageBytes = 1 << 20;
// The addresses a round's group-rank-0 agent lets into its store (Assignment.member_addresses),
// distinct, as bytes on the wire: a join whose new addresses would go over it is refused, so the
// answer to the largest allowed round stays under the message limit with room for the rest.
inline constexpr size_t kMaxMemberAddressBytes = 768 * 1024;
// One address on the wire: its bytes, a tag and a length of at most two bytes.
constexpr size_t WireAddressBytes(size_t length) { return length + (length < 128 ? 2 : 3); }
static_assert(kMaxMemberAddressBytes + 16 * 1024 < static_cast<size_t>(kMaxRendezvousMessageBytes),
              "an assignment's other fields (ids, hosts, a lease key: under 16 KiB) fit beside its addresses");
// A worker's error-file message as an agent reports it to the coordinator.
inline constexpr size_t kMaxWireErrorMessage = 16 * 1024;

// torch's file-timer requests (agent/file_timer.h): one JSON line a request, which torch's client
// refuses to write over PIPE_BUF (4096) bytes, newline aside; a scope's name, which must fit in
// such a line; the timers one agent holds at once (each up to a scope's name in memory); signals
// as Linux numbers them (1..64, SIGRTMAX).
inline constexpr size_t kMaxTimerRequestBytes = 4096;
inline constexpr size_t kMaxTimerScopeLength = 1024;
static_assert(kMaxTimerScopeLength < kMaxTimerRequestBytes, "a scope must fit in one request");
inline constexpr size_t kMaxLiveTimers = 4096;
// Requests from pids the agent does not know (yet) to be workers of the attempt, held until it
// does or the attempt ends (agent/file_timer.h): a warm worker may write before its pid is known.
inline constexpr size_t kMaxHeldRequests = 1024;
inline constexpr int kMaxSignal = 64;

}  // namespace launch
