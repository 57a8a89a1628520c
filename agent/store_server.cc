#include "agent/store_server.h"

#include <arpa/inet.h>
#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/sock_diag.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <random>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/net.h"
#include "common/status_macros.h"
#include "spdlog/spdlog.h"

namespace launch {
namespace {

absl::Status Errno(const std::string& what) { return absl::UnavailableError(absl::StrCat(what, ": ", std::strerror(errno))); }

// The numeric address and port of a socket address; an IPv4 peer of a dual-stack socket
// (::ffff:a.b.c.d) as plain IPv4.
std::pair<std::string, int> AddressOf(const sockaddr_storage& ss) {
  char buf[INET6_ADDRSTRLEN] = {0};
  if (ss.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&ss);
    inet_ntop(AF_INET, &a->sin_addr, buf, sizeof buf);
    return {buf, ntohs(a->sin_port)};
  }
  const auto* a = reinterpret_cast<const sockaddr_in6*>(&ss);
  if (IN6_IS_ADDR_V4MAPPED(&a->sin6_addr)) {
    inet_ntop(AF_INET, a->sin6_addr.s6_addr + 12, buf, sizeof buf);
  } else {
    inet_ntop(AF_INET6, &a->sin6_addr, buf, sizeof buf);
  }
  return {buf, ntohs(a->sin6_port)};
}

// Binds without SO_REUSEADDR when the port is ours to choose, so that no other socket (even one
// with SO_REUSEADDR) can bind it while the agent holds it unlisened.
absl::StatusOr<UniqueFd> BindOne(bool loopback, int port, bool reuse) {
  auto attempt = [&](int family) -> absl::StatusOr<UniqueFd> {
    UniqueFd fd(::socket(family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    if (!fd.valid()) return Errno("socket");
    int one = 1, zero = 0;
    if (reuse) ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    int rc = 0;
    if (family == AF_INET6) {
      ::setsockopt(fd.get(), IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
      sockaddr_in6 a{};
      a.sin6_family = AF_INET6;
      a.sin6_addr = in6addr_any;
      a.sin6_port = htons(static_cast<uint16_t>(port));
      rc = ::bind(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof a);
    } else {
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_addr.s_addr = htonl(loopback ? INADDR_LOOPBACK : INADDR_ANY);
      a.sin_port = htons(static_cast<uint16_t>(port));
      rc = ::bind(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof a);
    }
    if (rc != 0) return Errno(absl::StrCat("bind port ", port));
    return fd;
  };
  if (loopback) return attempt(AF_INET);
  auto v6 = attempt(AF_INET6);
  if (v6.ok() || errno == EADDRINUSE) return v6;
  return attempt(AF_INET);  // no IPv6 on this machine
}

int BoundPort(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len);
  return AddressOf(ss).second;
}

constexpr size_t kReadChunk = 64 << 10;
// A connection whose replies wait unsent past this is not read further until they drain.
constexpr size_t kMaxPendingReplies = 1 << 20;

}  // namespace

absl::StatusOr<uid_t> LocalTcpPeerUid(const std::string& peer_ip, int peer_port, const std::string& local_ip,
                                      int local_port) {
  UniqueFd nl(::socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG));
  if (!nl.valid()) return Errno("netlink socket");
  struct {
    nlmsghdr h;
    inet_diag_req_v2 r;
  } req{};
  req.h.nlmsg_len = sizeof req;
  req.h.nlmsg_type = SOCK_DIAG_BY_FAMILY;
  req.h.nlmsg_flags = NLM_F_REQUEST;
  req.r.sdiag_protocol = IPPROTO_TCP;
  req.r.idiag_states = ~0u;
  // The peer's own socket: its source is the peer's address, its destination ours.
  in_addr a4{}, b4{};
  in6_addr a6{}, b6{};
  if (inet_pton(AF_INET, peer_ip.c_str(), &a4) == 1 && inet_pton(AF_INET, local_ip.c_str(), &b4) == 1) {
    req.r.sdiag_family = AF_INET;
    std::memcpy(req.r.id.idiag_src, &a4, sizeof a4);
    std::memcpy(req.r.id.idiag_dst, &b4, sizeof b4);
  } else if (inet_pton(AF_INET6, peer_ip.c_str(), &a6) == 1 && inet_pton(AF_INET6, local_ip.c_str(), &b6) == 1) {
    req.r.sdiag_family = AF_INET6;
    std::memcpy(req.r.id.idiag_src, &a6, sizeof a6);
    std::memcpy(req.r.id.idiag_dst, &b6, sizeof b6);
  } else {
    return absl::InvalidArgumentError(absl::StrCat("not a numeric address pair: ", peer_ip, ", ", local_ip));
  }
  req.r.id.idiag_sport = htons(static_cast<uint16_t>(peer_port));
  req.r.id.idiag_dport = htons(static_cast<uint16_t>(local_port));
  req.r.id.idiag_cookie[0] = req.r.id.idiag_cookie[1] = INET_DIAG_NOCOOKIE;
  sockaddr_nl kernel{};
  kernel.nl_family = AF_NETLINK;
  if (::sendto(nl.get(), &req, sizeof req, 0, reinterpret_cast<sockaddr*>(&kernel), sizeof kernel) < 0) {
    return Errno("sock_diag request");
  }
  alignas(nlmsghdr) char buf[8192];
  ssize_t n = ::recv(nl.get(), buf, sizeof buf, 0);
  if (n < 0) return Errno("sock_diag reply");
  for (auto* h = reinterpret_cast<nlmsghdr*>(buf); NLMSG_OK(h, static_cast<size_t>(n)); h = NLMSG_NEXT(h, n)) {
    if (h->nlmsg_type == NLMSG_ERROR) {
      const auto* e = static_cast<const nlmsgerr*>(NLMSG_DATA(h));
      if (e->error == -ENOENT) return absl::NotFoundError(absl::StrCat("no local socket at ", peer_ip, ":", peer_port));
      errno = -e->error;
      return Errno("sock_diag");
    }
    if (h->nlmsg_type == SOCK_DIAG_BY_FAMILY && h->nlmsg_len >= NLMSG_LENGTH(sizeof(inet_diag_msg))) {
      return static_cast<uid_t>(static_cast<const inet_diag_msg*>(NLMSG_DATA(h))->idiag_uid);
    }
  }
  return absl::NotFoundError(absl::StrCat("no local socket at ", peer_ip, ":", peer_port));
}

StoreServer::StoreServer(UniqueFd listener, int port, Options options)
    : listener_(std::move(listener)), port_(port), options_(std::move(options)) {}

StoreServer::~StoreServer() { Stop(); }

absl::StatusOr<std::unique_ptr<StoreServer>> StoreServer::Bind(const std::string& host, int port, int avoid,
                                                               Options options) {
  const bool loopback = IsLoopbackIp(host) || host == "localhost";
  if (port > 0) {
    auto fd = BindOne(loopback, port, /*reuse=*/true);
    if (!fd.ok()) {
      return absl::FailedPreconditionError(absl::StrCat("cannot host the workers' store on port ", port, ": ",
                                                        fd.status().message(), "; expected a free port"));
    }
    return std::unique_ptr<StoreServer>(new StoreServer(std::move(*fd), port, std::move(options)));
  }
  // Not port 0 first: the kernel hands out a port it just freed again, and takes outgoing
  // connections' ports from that range. A random free port below it instead.
  const auto [lo, hi] = FreePortRange();
  std::random_device rd;
  std::uniform_int_distribution<int> pick(lo, hi);
  for (int i = 0; i < 64; ++i) {
    const int p = pick(rd);
    if (p == avoid) continue;
    auto fd = BindOne(loopback, p, /*reuse=*/false);
    if (fd.ok()) return std::unique_ptr<StoreServer>(new StoreServer(std::move(*fd), p, std::move(options)));
  }
  ASSIGN_OR_RETURN(UniqueFd fd, BindOne(loopback, 0, false));
  const int p = BoundPort(fd.get());
  return std::unique_ptr<StoreServer>(new StoreServer(std::move(fd), p, std::move(options)));
}

absl::Status StoreServer::Serve(StorePeers peers) {
  Stop();
  if (!listening_) {
    if (::listen(listener_.get(), 1024) != 0) return Errno(absl::StrCat("listen on port ", port_));
    listening_ = true;
  }
  wake_ = UniqueFd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!wake_.valid()) return Errno("eventfd");
  peers_ = std::move(peers);
  thread_ = std::thread([this] { Loop(); });
  return absl::OkStatus();
}

void StoreServer::Stop() {
  if (!thread_.joinable()) return;
  uint64_t one = 1;
  (void)!::write(wake_.get(), &one, sizeof one);
  thread_.join();
  wake_.Reset();
}

StoreServerStats StoreServer::Stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

namespace {

struct Connection {
  explicit Connection(UniqueFd f, const StoreLimits& limits) : fd(std::move(f)), reader(limits) {}
  UniqueFd fd;
  StoreRequestReader reader;
  std::string out;
  size_t out_sent = 0;
  uint32_t events = 0;  // what epoll watches for it now
  size_t counted = 0;   // its unparsed bytes as counted in the total
  size_t pending() const { return out.size() - out_sent; }
};

}  // namespace

void StoreServer::Loop() {
  UniqueFd ep(::epoll_create1(EPOLL_CLOEXEC));
  if (!ep.valid()) {
    spdlog::error("the workers' store stopped: {}", std::string(Errno("epoll_create1").message()));
    return;
  }
  auto watch = [&](int fd, uint32_t events, int op) {
    epoll_event e{};
    e.events = events;
    e.data.fd = fd;
    ::epoll_ctl(ep.get(), op, fd, &e);
  };
  watch(wake_.get(), EPOLLIN, EPOLL_CTL_ADD);
  watch(listener_.get(), EPOLLIN, EPOLL_CTL_ADD);

  StoreState state(options_.limits);
  std::map<int, std::unique_ptr<Connection>> conns;  // by fd, which is also the store's connection id
  std::set<std::string> local = [] {
    auto v = LocalInterfaceAddresses();
    return std::set<std::string>(v.begin(), v.end());
  }();
  const uid_t uid = peers_.uid;
  size_t buffered = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stats_ = StoreServerStats();
  }
  // Counted as it happens (before the connection closes), so a client that saw it sees the count.
  auto count = [&](int64_t StoreServerStats::*field) {
    std::lock_guard<std::mutex> lock(mu_);
    ++(stats_.*field);
    stats_.connections = conns.size();
  };
  std::set<std::string> warned;  // peers already told of, so a scan does not flood the log

  auto close_conn = [&](int fd) {
    auto it = conns.find(fd);
    if (it == conns.end()) return;
    buffered -= it->second->counted;
    state.Disconnect(fd);
    ::epoll_ctl(ep.get(), EPOLL_CTL_DEL, fd, nullptr);
    conns.erase(it);
    std::lock_guard<std::mutex> lock(mu_);
    stats_.connections = conns.size();
  };
  // Sends what it can; false: the connection is gone.
  auto flush = [&](Connection& c) {
    while (c.pending() > 0) {
      ssize_t n = ::send(c.fd.get(), c.out.data() + c.out_sent, c.pending(), MSG_NOSIGNAL);
      if (n > 0) {
        c.out_sent += static_cast<size_t>(n);
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
      return false;
    }
    if (c.out_sent == c.out.size()) {
      c.out.clear();
      c.out_sent = 0;
    } else if (c.out_sent > (1 << 20)) {
      c.out.erase(0, c.out_sent);
      c.out_sent = 0;
    }
    return true;
  };
  auto rewatch = [&](Connection& c) {
    uint32_t want = (c.pending() < kMaxPendingReplies ? EPOLLIN : 0) | (c.pending() ? EPOLLOUT : 0) | EPOLLRDHUP;
    if (want != c.events) {
      c.events = want;
      watch(c.fd.get(), want, EPOLL_CTL_MOD);
    }
  };
  std::vector<int> dead;
  // Serves the connection's whole requests while its replies are under the bound.
  auto process = [&](int fd) {
    Connection& c = *conns.at(fd);
    std::vector<StoreReply> replies;
    while (c.pending() < kMaxPendingReplies) {
      auto next = c.reader.Next();
      if (!next.ok() || !*next) {
        if (!next.ok()) {
          spdlog::warn("workers' store: a connection closed for its request: {}", std::string(next.status().message()));
          count(&StoreServerStats::dropped);
          dead.push_back(fd);
        }
        break;
      }
      replies.clear();
      if (auto st = state.Apply(fd, **next, &replies); !st.ok()) {
        spdlog::warn("workers' store: a connection closed for its {}: {}", StoreOpName((*next)->op),
                     std::string(st.message()));
        count(&StoreServerStats::dropped);
        dead.push_back(fd);
        break;
      }
      for (auto& r : replies) {
        auto to = conns.find(r.connection);
        if (to == conns.end()) continue;
        to->second->out += r.bytes;
        if (!flush(*to->second)) {
          dead.push_back(r.connection);
        } else if (r.connection != fd) {
          rewatch(*to->second);
        }
      }
    }
    const size_t now = c.reader.buffered();
    buffered = buffered - c.counted + now;
    c.counted = now;
    rewatch(c);
  };
  auto accept_all = [&] {
    while (true) {
      sockaddr_storage ss{};
      socklen_t len = sizeof ss;
      UniqueFd fd(::accept4(listener_.get(), reinterpret_cast<sockaddr*>(&ss), &len, SOCK_NONBLOCK | SOCK_CLOEXEC));
      if (!fd.valid()) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) {
          spdlog::warn("workers' store: accept: {}", std::strerror(errno));
        }
        return;
      }
      const auto [ip, port] = AddressOf(ss);
      std::string why;
      if (conns.size() >= options_.max_connections) {
        why = absl::StrCat("the store has its ", options_.max_connections, " connections");
      } else if (IsLoopbackIp(ip) || local.count(ip)) {
        sockaddr_storage me{};
        socklen_t mlen = sizeof me;
        ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&me), &mlen);
        const auto [my_ip, my_port] = AddressOf(me);
        auto owner = LocalTcpPeerUid(ip, port, my_ip, my_port);
        if (!owner.ok()) {
          why = absl::StrCat("its user is unknown (", owner.status().message(), ")");
        } else if (*owner != uid) {
          why = absl::StrCat("it belongs to uid ", *owner, ", not the job's ", uid);
        }
      } else if (!peers_.remote.count(ip)) {
        why = "it is no node of the job";
      }
      if (!why.empty()) {
        count(&StoreServerStats::refused);
        if (warned.size() < 64 && warned.insert(ip).second) {
          spdlog::warn("workers' store: refused a connection from {}:{}: {}", ip, port, why);
        }
        continue;
      }
      int one = 1;
      ::setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      const int id = fd.get();
      auto c = std::make_unique<Connection>(std::move(fd), options_.limits);
      c->events = EPOLLIN | EPOLLRDHUP;
      watch(id, c->events, EPOLL_CTL_ADD);
      conns[id] = std::move(c);
      count(&StoreServerStats::accepted);
    }
  };

  std::vector<epoll_event> events(256);
  char chunk[kReadChunk];
  bool running = true;
  while (running) {
    int n = ::epoll_wait(ep.get(), events.data(), static_cast<int>(events.size()), -1);
    if (n < 0) {
      if (errno == EINTR) continue;
      spdlog::error("the workers' store stopped: {}", std::string(Errno("epoll_wait").message()));
      break;
    }
    for (int i = 0; i < n; ++i) {
      const int fd = events[i].data.fd;
      const uint32_t ev = events[i].events;
      if (fd == wake_.get()) {
        running = false;
        continue;
      }
      if (fd == listener_.get()) {
        accept_all();
        continue;
      }
      auto it = conns.find(fd);
      if (it == conns.end()) continue;
      Connection& c = *it->second;
      if (ev & EPOLLOUT) {
        if (!flush(c)) {
          dead.push_back(fd);
          continue;
        }
        process(fd);  // replies drained: its waiting requests go on
      }
      if (ev & (EPOLLIN | EPOLLHUP | EPOLLERR | EPOLLRDHUP)) {
        bool closed = false;
        // One chunk at a time, then the others' turn; the bound on buffered bytes checked as it grows.
        ssize_t r = ::recv(fd, chunk, sizeof chunk, 0);
        if (r > 0) {
          if (buffered + static_cast<size_t>(r) > options_.max_buffered) {
            spdlog::warn("workers' store: a connection closed: every connection's unread requests would pass {} bytes",
                         options_.max_buffered);
            count(&StoreServerStats::dropped);
            dead.push_back(fd);
            continue;
          }
          c.reader.Append(absl::string_view(chunk, static_cast<size_t>(r)));
          process(fd);
        } else if (r == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
          closed = true;
        }
        if (closed) dead.push_back(fd);
      }
    }
    for (int fd : dead) close_conn(fd);
    dead.clear();
    std::lock_guard<std::mutex> lock(mu_);
    stats_.store = state.Stats();
  }
  // Every connection closes with the serving (the next attempt's workers connect anew).
  std::lock_guard<std::mutex> lock(mu_);
  stats_.connections = 0;
}

}  // namespace launch
