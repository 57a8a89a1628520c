// Every tunable of launch declared once, with its type, default and one line of doc (after Ray's
// ray_config_def.h): the flags' defaults, the options structs, --help, RPC deadlines and gRPC's
// keepalive all read them here, so a default cannot differ between layers.
#pragma once

#include <chrono>
#include <cstddef>

#include "launch_sdk/defaults.h"

namespace launch {

// X(type, Name, default, doc): each row becomes `inline constexpr type kName = default;` and a
// row of kTunables. A row may use the rows above it.
#define LAUNCH_TUNABLES(X)                                                                                     \
  /* Ports. */                                                                                                 \
  X(int, DefaultRendezvousPort, 29400,                                                                         \
    "The coordinator's port where --rdzv-endpoint or --listen gives none (torchrun's)")                        \
  X(int, DefaultMasterPort, launch_sdk::kDefaultMasterPort,                                                    \
    "MASTER_PORT of a static rendezvous without --master-port (torchrun's; shared with the SDK)")              \
  /* Stopping the workers. */                                                                                  \
  X(std::chrono::milliseconds, DefaultStopTimeout, std::chrono::seconds(30),                                   \
    "From SIGTERM to SIGKILL when the workers are stopped (--stop-timeout)")                                   \
  X(std::chrono::milliseconds, CaptureStacksGrace, std::chrono::seconds(30),                                   \
    "How long a hung group's stacks are captured for before the group is stopped")                             \
  X(std::chrono::milliseconds, HangTimeoutFloor, std::chrono::seconds(300),                                    \
    "The automatic --hang-timeout is at least this")                                                           \
  X(int, HangTimeoutFactor, 10, "The automatic --hang-timeout is this many times a worker's median step time") \
  /* The rendezvous (--rdzv-conf). */                                                                          \
  X(std::chrono::milliseconds, DefaultJoinTimeout, std::chrono::seconds(600),                                  \
    "How long a join waits for its round to form (join_timeout)")                                              \
  X(std::chrono::milliseconds, DefaultLastCallTimeout, std::chrono::seconds(30),                               \
    "How long a round that has its minimum of nodes waits for more (last_call_timeout)")                       \
  X(std::chrono::milliseconds, DefaultCloseTimeout, std::chrono::seconds(30),                                  \
    "How long an ended run is kept for late agents, and an unreachable coordinator waited for "                \
    "(close_timeout)")                                                                                         \
  X(std::chrono::milliseconds, DefaultHeartbeatInterval, std::chrono::seconds(1),                              \
    "How often an agent renews its lease while its workers run (heartbeat_interval)")                          \
  X(std::chrono::milliseconds, DefaultHeartbeatTimeout, std::chrono::seconds(3),                               \
    "A running node not heard from for this long is lost (heartbeat_timeout)")                                 \
  /* Monitoring. */                                                                                            \
  X(std::chrono::milliseconds, DefaultMonitorInterval, std::chrono::seconds(5),                                \
    "Between samples of the workers to metrics.jsonl and the coordinator (--monitor-interval)")                \
  X(double, DefaultStragglerFactor, 1.2,                                                                       \
    "A rank whose own work per step is this many times the job's median is a straggler "                       \
    "(--straggler-factor)")                                                                                    \
  X(const char*, DefaultWarmImport, "torch", "What a --warm-start standby imports without --warm-import")      \
  X(std::chrono::milliseconds, DefaultStatusInterval, std::chrono::seconds(1),                                 \
    "Between the screens of `launch status --watch` (--interval)")                                             \
  /* The agent's calls to its coordinator. */                                                                  \
  X(std::chrono::milliseconds, RetryFirstDelay, std::chrono::milliseconds(50),                                 \
    "The first wait before trying an unreachable coordinator again (then doubled)")                            \
  X(std::chrono::milliseconds, RetryMaxDelay, std::chrono::seconds(2),                                         \
    "The longest wait between tries at an unreachable coordinator")                                            \
  X(std::chrono::milliseconds, JoinDeadlineMargin, std::chrono::seconds(2),                                    \
    "A Join's deadline past the join timeout (the coordinator answers by then; this is for one "               \
    "that is never reached)")                                                                                  \
  X(std::chrono::milliseconds, HeartbeatDeadline, std::chrono::seconds(10), "Deadline of one Heartbeat call")  \
  X(std::chrono::milliseconds, ReportDeadline, std::chrono::seconds(10),                                       \
    "Deadline of one ReportExit call that waits for the verdict (retried for the patience)")                   \
  X(std::chrono::milliseconds, EarlyReportDeadline, std::chrono::seconds(1),                                   \
    "Deadline of the ReportExit that tells of a failure before the group has stopped")                         \
  X(std::chrono::milliseconds, LeavingReportDeadline, std::chrono::seconds(2),                                 \
    "Deadline of the ReportExit of a node that leaves because launch was stopped by a signal")                 \
  X(std::chrono::milliseconds, MaxSampleDeadline, std::chrono::seconds(5),                                     \
    "The longest deadline of one Sample call (shorter when samples come more often)")                          \
  X(std::chrono::milliseconds, StatusDeadline, std::chrono::seconds(5), "Deadline of `launch status`'s call")  \
  /* gRPC connections between agents and the coordinator. */                                                   \
  X(std::chrono::milliseconds, KeepaliveTime, std::chrono::seconds(5),                                         \
    "Between an agent's HTTP/2 pings that find its coordinator gone without a word (a cut link)")              \
  X(std::chrono::milliseconds, ServerKeepaliveTime, std::chrono::seconds(30),                                  \
    "Between the coordinator's pings to each agent (a lost agent's lease finds it sooner)")                    \
  X(std::chrono::milliseconds, KeepaliveTimeout, std::chrono::seconds(3),                                      \
    "How long a ping's answer is waited for before the connection is closed")                                  \
  X(std::chrono::milliseconds, MinPingInterval, std::chrono::seconds(4),                                       \
    "The most often the coordinator lets a peer ping without data (below KeepaliveTime)")                      \
  X(std::chrono::milliseconds, LeaseBatchPeriod, std::chrono::milliseconds(5),                                 \
    "The coordinator reads lease datagrams at most this often (in batches), not one wake-up each")             \
  X(std::chrono::milliseconds, ReconnectFirstBackoff, std::chrono::milliseconds(100),                          \
    "An agent's first wait before reconnecting to its coordinator (gRPC's grows to 120 s)")                    \
  X(std::chrono::milliseconds, ReconnectMaxBackoff, std::chrono::seconds(1),                                   \
    "An agent's longest wait between reconnections to its coordinator")                                        \
  X(std::chrono::milliseconds, HandshakeTimeout, std::chrono::seconds(10),                                     \
    "A connection that does not finish its HTTP/2 (and TLS) handshake is closed after this")                   \
  X(std::chrono::milliseconds, MaxConnectionIdle, std::chrono::seconds(600),                                   \
    "A connection with no call for this long is closed (one holding a Watch or a Join never is)")              \
  X(int, MetricsMaxConnections, 16,                                                                            \
    "Connections the metrics port holds at once; one more closes the oldest still being read")                 \
  X(std::chrono::milliseconds, MetricsConnectionDeadline, kHandshakeTimeout,                                   \
    "A metrics connection that has not been read and answered within this is closed (a slow client)")          \
  X(std::chrono::milliseconds, ServerShutdownGrace, std::chrono::seconds(1),                                   \
    "How long answers already given have to reach the agents when the coordinator stops")                      \
  X(std::chrono::milliseconds, RelistenShutdownGrace, std::chrono::milliseconds(500),                          \
    "How long the old listener's connections have to close when the coordinator rebuilds it")                  \
  X(std::chrono::milliseconds, RelistenRetry, std::chrono::seconds(1),                                         \
    "Between tries to listen again after the coordinator ran out of descriptors")                              \
  X(std::chrono::milliseconds, CoordinatorAwakePeriod, std::chrono::milliseconds(250),                         \
    "The coordinator's timer thread wakes at least this often, to notice it was paused")                       \
  X(std::chrono::milliseconds, CoordinatorPauseTolerance, std::chrono::seconds(1),                             \
    "Woken this much later than its period, the coordinator was paused: every lease is extended")

#define LAUNCH_TUNABLE_CONSTANT(type, name, value, doc) inline constexpr type k##name = value;
LAUNCH_TUNABLES(LAUNCH_TUNABLE_CONSTANT)
#undef LAUNCH_TUNABLE_CONSTANT

static_assert(kMinPingInterval < kKeepaliveTime, "the coordinator must accept the agents' keepalive pings");
static_assert(kReconnectFirstBackoff <= kReconnectMaxBackoff && kRetryFirstDelay <= kRetryMaxDelay,
              "a backoff starts at most at its maximum");

// One row of the table, for documentation: the default as written in the table.
struct TunableDoc {
  const char* type;
  const char* name;
  const char* default_value;
  const char* doc;
};
#define LAUNCH_TUNABLE_DOC(type, name, value, doc) TunableDoc{#type, "k" #name, #value, doc},
inline constexpr TunableDoc kTunables[] = {LAUNCH_TUNABLES(LAUNCH_TUNABLE_DOC)};
#undef LAUNCH_TUNABLE_DOC

// A duration as the seconds that flags and YAML take (30 s -> 30, 1.2 s -> 1.2).
constexpr double SecondsOf(std::chrono::milliseconds d) { return static_cast<double>(d.count()) / 1000.0; }

}  // namespace launch
