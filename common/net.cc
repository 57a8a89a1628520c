#include "common/net.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <random>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"
#include "common/unique_fd.h"

namespace launch {

absl::StatusOr<std::vector<HostPort>> ParseEndpoints(const std::string& value, const std::string& what) {
  std::vector<HostPort> out;
  if (value.find(',') == std::string::npos) {
    ASSIGN_OR_RETURN(HostPort hp, ParseHostPort(value, what));
    out.push_back(std::move(hp));
    return out;
  }
  for (absl::string_view part : absl::StrSplit(value, ',')) {
    if (static_cast<int>(out.size()) == kMaxEndpoints) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, "=", value, ": more than ", kMaxEndpoints, " endpoints; expected HOST[:PORT],..."));
    }
    ASSIGN_OR_RETURN(HostPort hp, ParseHostPort(std::string(part), what));
    out.push_back(std::move(hp));
  }
  return out;
}

absl::StatusOr<HostPort> ParseHostPort(const std::string& value, const std::string& what) {
  auto bad = [&](const std::string& why) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, "=", value, ": ", why, "; expected HOST[:PORT] or [IPv6]:PORT"));
  };
  HostPort hp;
  std::string port_text;
  if (value.empty()) return bad("empty");
  if (value[0] == '[') {
    auto close = value.find(']');
    if (close == std::string::npos) return bad("unclosed '['");
    hp.host = value.substr(1, close - 1);
    std::string rest = value.substr(close + 1);
    if (!rest.empty()) {
      if (rest[0] != ':') return bad("junk after ']'");
      port_text = rest.substr(1);
      if (port_text.empty()) return bad("empty port");
    }
  } else if (std::count(value.begin(), value.end(), ':') > 1) {
    hp.host = value;  // a bare IPv6 literal, no port
    in6_addr a;
    if (inet_pton(AF_INET6, value.c_str(), &a) != 1) return bad("not an IPv6 address");
  } else {
    auto colon = value.find(':');
    hp.host = value.substr(0, colon);
    if (colon != std::string::npos) {
      port_text = value.substr(colon + 1);
      if (port_text.empty()) return bad("empty port");
    }
  }
  if (hp.host.empty()) return bad("empty host");
  for (char c : hp.host) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_' || c == ':' || c == '%')) {
      return bad(absl::StrCat("'", hp.host, "' is not a host name or address"));
    }
  }
  if (!port_text.empty()) {
    int port;
    if (!absl::SimpleAtoi(port_text, &port) || port < 0 || port > 65535) {
      return bad(absl::StrCat("port '", port_text, "' is not 0-65535"));
    }
    hp.port = port;
  }
  return hp;
}

std::string JoinHostPort(const std::string& host, int port) {
  if (host.find(':') != std::string::npos) return absl::StrCat("[", host, "]:", port);
  return absl::StrCat(host, ":", port);
}

namespace {

// Binds a TCP socket to host:port (SO_REUSEADDR, as TCPStore does); returns the socket.
absl::StatusOr<UniqueFd> BindTcp(const std::string& host, int port, int* bound_port, int* bind_errno = nullptr) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  std::string service = std::to_string(port);
  int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &res);
  if (rc != 0) {
    return absl::InvalidArgumentError(absl::StrCat("cannot resolve '", host, "': ", gai_strerror(rc)));
  }
  absl::Status last = absl::UnavailableError("no address");
  for (addrinfo* ai = res; ai; ai = ai->ai_next) {
    UniqueFd fd(::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol));
    if (!fd.valid()) continue;
    int one = 1;
    ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd.get(), ai->ai_addr, ai->ai_addrlen) != 0) {
      if (bind_errno) *bind_errno = errno;
      last = ErrnoStatus(absl::StrCat("bind ", JoinHostPort(host, port)));
      continue;
    }
    sockaddr_storage ss{};
    socklen_t len = sizeof ss;
    ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&ss), &len);
    *bound_port = ntohs(ss.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port
                                                 : reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
    freeaddrinfo(res);
    return fd;
  }
  freeaddrinfo(res);
  return last;
}

}  // namespace

std::pair<int, int> FreePortRange() {
  int eph_lo = 32768;
  std::ifstream range("/proc/sys/net/ipv4/ip_local_port_range");
  int lo = 0, hi = 0;
  if (range >> lo >> hi && lo > 1024) eph_lo = lo;
  return {std::min(20000, eph_lo / 2), eph_lo - 1};
}

absl::StatusOr<int> PickFreePort(const std::string& host, int avoid) {
  // Not port 0: the kernel hands out the port it just freed again, so two launches picking at
  // once got the same MASTER_PORT (seen in CI), and that range is also where outgoing
  // connections take their ports. A random free port below the ephemeral range instead.
  const auto [lo, hi] = FreePortRange();
  std::random_device rd;
  std::uniform_int_distribution<int> pick(lo, hi);
  for (int i = 0; i < 64; ++i) {
    const int port = pick(rd);
    if (port == avoid) continue;
    auto used = PortInUse(host, port);
    if (!used.ok()) return used.status();
    if (!*used) return port;
  }
  int port = 0;  // nearly everything below the range is taken: let the kernel choose
  ASSIGN_OR_RETURN(UniqueFd fd, BindTcp(host, 0, &port));
  return port;
}

absl::StatusOr<bool> PortInUse(const std::string& host, int port) {
  int bound = 0, err = 0;
  auto fd = BindTcp(host, port, &bound, &err);
  if (fd.ok()) {
    // Bound is not enough: also listen, which fails when another socket listens (SO_REUSEADDR).
    if (::listen(fd->get(), 1) != 0) return errno == EADDRINUSE;
    return false;
  }
  if (absl::IsInvalidArgument(fd.status())) return fd.status();
  if (err == EADDRINUSE) return true;
  return fd.status();
}

namespace {

std::string NumericAddress(const sockaddr* sa) {
  char buf[INET6_ADDRSTRLEN] = {0};
  if (sa->sa_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(sa)->sin_addr, buf, sizeof buf);
  } else if (sa->sa_family == AF_INET6) {
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr, buf, sizeof buf);
  }
  return buf;
}

bool IsLoopbackAddress(const std::string& ip) {
  in_addr a4;
  if (inet_pton(AF_INET, ip.c_str(), &a4) == 1) return (ntohl(a4.s_addr) >> 24) == 127;
  in6_addr a6;
  if (inet_pton(AF_INET6, ip.c_str(), &a6) == 1) {
    if (IN6_IS_ADDR_LOOPBACK(&a6)) return true;
    if (IN6_IS_ADDR_V4MAPPED(&a6)) return a6.s6_addr[12] == 127;
  }
  return false;
}

std::vector<std::string> InterfaceAddresses() {
  std::vector<std::string> out;
  ifaddrs* ifs = nullptr;
  if (getifaddrs(&ifs) != 0) return out;
  for (ifaddrs* i = ifs; i; i = i->ifa_next) {
    if (!i->ifa_addr || (i->ifa_addr->sa_family != AF_INET && i->ifa_addr->sa_family != AF_INET6)) continue;
    std::string ip = NumericAddress(i->ifa_addr);
    if (ip.rfind("fe80:", 0) == 0) continue;  // link-local needs a scope id; not a node address
    out.push_back(ip);
  }
  freeifaddrs(ifs);
  return out;
}

}  // namespace

std::vector<std::string> LocalInterfaceAddresses() { return InterfaceAddresses(); }
bool IsLoopbackIp(const std::string& ip) { return IsLoopbackAddress(ip); }

absl::StatusOr<std::vector<std::string>> ResolveHost(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  int rc = getaddrinfo(host.c_str(), nullptr, &hints, &res);
  if (rc != 0) {
    return absl::InvalidArgumentError(absl::StrCat("cannot resolve '", host, "': ", gai_strerror(rc)));
  }
  std::vector<std::string> out;
  for (addrinfo* ai = res; ai; ai = ai->ai_next) {
    std::string ip = NumericAddress(ai->ai_addr);
    if (!ip.empty() && std::find(out.begin(), out.end(), ip) == out.end()) out.push_back(ip);
  }
  freeaddrinfo(res);
  return out;
}

absl::StatusOr<bool> IsLoopbackHost(const std::string& host) {
  ASSIGN_OR_RETURN(std::vector<std::string> ips, ResolveHost(host));
  for (const auto& ip : ips)
    if (!IsLoopbackAddress(ip)) return false;
  return !ips.empty();
}

absl::StatusOr<bool> IsLocalHost(const std::string& host) {
  ASSIGN_OR_RETURN(std::vector<std::string> ips, ResolveHost(host));
  std::vector<std::string> mine = InterfaceAddresses();
  for (const auto& ip : ips) {
    if (IsLoopbackAddress(ip) || std::find(mine.begin(), mine.end(), ip) != mine.end()) return true;
  }
  return false;
}

absl::StatusOr<std::string> DefaultHostAddress() {
  char name[256] = {0};
  ::gethostname(name, sizeof name - 1);
  auto ips = ResolveHost(name);
  if (ips.ok()) {
    for (const auto& ip : *ips)
      if (!IsLoopbackAddress(ip)) return ip;
  }
  for (const auto& ip : InterfaceAddresses())
    if (!IsLoopbackAddress(ip)) return ip;
  if (ips.ok() && !ips->empty()) return ips->front();
  return absl::NotFoundError(absl::StrCat("host name '", name, "' has no address"));
}

}  // namespace launch
