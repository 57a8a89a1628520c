#include "common/net.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/unique_fd.h"

namespace launch {

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
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_' || c == ':' ||
          c == '%')) {
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
absl::StatusOr<UniqueFd> BindTcp(const std::string& host, int port, int* bound_port,
                                 int* bind_errno = nullptr) {
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

absl::StatusOr<int> PickFreePort(const std::string& host) {
  int port = 0;
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

}  // namespace launch
