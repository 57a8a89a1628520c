// Host:port parsing and TCP port probing for MASTER_PORT and rendezvous endpoints.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace launch {

struct HostPort {
  std::string host;  // without IPv6 brackets
  std::optional<int> port;
};

// "host", "host:port", "1.2.3.4:5", "[::1]:8080", "::1". Errors name the value.
absl::StatusOr<HostPort> ParseHostPort(const std::string& value, const std::string& what);
// Several HOST[:PORT] separated by commas (the replicated coordinators: --rdzv-endpoint
// h1:p,h2:p,h3:p), at most kMaxEndpoints; one is a list of one.
inline constexpr int kMaxEndpoints = 16;
absl::StatusOr<std::vector<HostPort>> ParseEndpoints(const std::string& value, const std::string& what);
// host:port with brackets around IPv6 literals.
std::string JoinHostPort(const std::string& host, int port);

// A port free for listening on `host` now (bind to port 0); the caller hosts it soon after.
// A free TCP port on host, never `avoid` (the last attempt's, so that each attempt gets a new one).
absl::StatusOr<int> PickFreePort(const std::string& host, int avoid = 0);
// Where PickFreePort looks: [min(20000, ephemeral low / 2), ephemeral low - 1].
std::pair<int, int> FreePortRange();
// Whether something already listens on host:port (bind fails with EADDRINUSE).
absl::StatusOr<bool> PortInUse(const std::string& host, int port);

// The numeric addresses of this machine's interfaces, IPv4 and IPv6 (link-local ones left out).
std::vector<std::string> LocalInterfaceAddresses();
// Whether a numeric address is a loopback one (127/8, ::1, ::ffff:127.0.0.0/104).
bool IsLoopbackIp(const std::string& ip);

// The numeric addresses `host` resolves to (IPv4 and IPv6), in resolver order.
absl::StatusOr<std::vector<std::string>> ResolveHost(const std::string& host);
// Whether every address `host` resolves to is a loopback address (127/8, ::1).
absl::StatusOr<bool> IsLoopbackHost(const std::string& host);
// Whether `host` resolves to an address of one of this machine's interfaces.
absl::StatusOr<bool> IsLocalHost(const std::string& host);
// This node's address as other nodes would reach it: the host name's first non-loopback address,
// else the first non-loopback interface address, else the host name's first address.
absl::StatusOr<std::string> DefaultHostAddress();

}  // namespace launch
