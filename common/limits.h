// One definition of each limit on what users and peers give launch (durations, ids, counts),
// applied where the input enters: flags, YAML, --rdzv-conf, RPCs.
#pragma once

#include <chrono>
#include <cmath>
#include <cstddef>

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
// Nodes in one run (--nnodes MAX, and every node count on the wire).
inline constexpr int kMaxNodes = 16384;
// A round number as the wire, a lease datagram or etcd carries it: rounds are counted from 1 and
// a round takes at least a worker's start, so no run gets near this; anything above is hostile.
inline constexpr long kMaxRound = 1L << 40;
// A node id (the agent makes "<host>:<pid>:<hex>", its host part cut to fit) and a host name or
// address (a DNS name is at most 253 bytes), as they travel in RPCs and lease datagrams.
inline constexpr size_t kMaxNodeIdLength = 255;
inline constexpr size_t kMaxHostLength = 255;
// The interface addresses one node reports (NodeIdentity.addresses), each a numeric address.
inline constexpr int kMaxNodeAddresses = 64;
inline constexpr size_t kMaxAddressLength = 64;
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
