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
#include "common/event_loop.h"
#include "common/net.h"
#include "common/status_macros.h"
#include "spdlog/spdlog.h"
#include "common/thread_name.h"

namespace launch {
namespace {

absl::Status Errno(const std::string& what) {
  return absl::UnavailableError(absl::StrCat(what, ": ", std::strerror(errno)));
}

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
enum class Side { kLoopback4, kLoopback6, kEverywhere };

absl::StatusOr<UniqueFd> BindOne(Side side, int port, bool reuse) {
  const bool loopback = side != Side::kEverywhere;
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
      a.sin6_addr = loopback ? in6addr_loopback : in6addr_any;
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
  if (side == Side::kLoopback4) return attempt(AF_INET);
  if (side == Side::kLoopback6) return attempt(AF_INET6);
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
      const auto* m = static_cast<const inet_diag_msg*>(NLMSG_DATA(h));
      // A socket in TIME_WAIT or one its process closed (orphaned) has no inode, and the kernel
      // reports uid 0 for the former: only a live socket's owner counts.
      if (m->idiag_inode == 0) {
        return absl::NotFoundError(absl::StrCat("the socket at ", peer_ip, ":", peer_port, " is closed"));
      }
      return static_cast<uid_t>(m->idiag_uid);
    }
  }
  return absl::NotFoundError(absl::StrCat("no local socket at ", peer_ip, ":", peer_port));
}

StoreServer::StoreServer(UniqueFd listener, int port, Options options)
    : listener_(std::move(listener)), port_(port), options_(std::move(options)) {}

StoreServer::~StoreServer() { Stop(); }

absl::StatusOr<std::unique_ptr<StoreServer>> StoreServer::Bind(const std::string& host, int port, int avoid,
                                                               Options options) {
  // MASTER_ADDR on loopback: the workers are all here, so only loopback listens.
  const Side loopback = host == "::1"                               ? Side::kLoopback6
                        : IsLoopbackIp(host) || host == "localhost" ? Side::kLoopback4
                                                                    : Side::kEverywhere;
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
  ASSIGN_OR_RETURN(loop_, EventLoop::Create(&clock_));
  peers_ = std::move(peers);
  thread_ = std::thread([this] {
    NameThisThread("launch-store");
    Loop();
  });
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
  uint32_t events = 0;     // what the loop watches for it now
  size_t counted_in = 0;   // its unparsed bytes as counted in the total
  size_t counted_out = 0;  // its unsent replies as counted in the total
  bool closing = false;    // closed at the end of this turn: nothing more is done for it
  size_t pending() const { return out.size() - out_sent; }
};

}  // namespace

// One serving, on the server's thread: the store's state, its connections and the bounds on what
// they hold together, each descriptor handled by its own handler in an event loop.
class StoreServer::Serving {
 public:
  Serving(StoreServer* server, std::unique_ptr<EventLoop> loop)
      : server_(*server), loop_(std::move(loop)), state_(server->options_.limits), uid_(server->peers_.uid) {
    const std::vector<std::string> local = LocalInterfaceAddresses();
    local_.insert(local.begin(), local.end());
  }
  void Run();

 private:
  void Accept();
  std::string Refusal(const UniqueFd& fd, const std::string& ip, int port);
  void OnConnection(int fd, uint32_t events);
  void Process(int fd);
  void Deliver(int from, const StoreReply& r);
  bool Flush(Connection& c);
  void Drop(Connection& c, const std::string& why);
  void DropLargest(size_t Connection::*field, const char* what);
  void Rewatch(Connection& c);
  void EndTurn();
  void Count(int64_t StoreServerStats::*field);

  StoreServer& server_;
  std::unique_ptr<EventLoop> loop_;
  StoreState state_;
  std::map<int, std::unique_ptr<Connection>> conns_;  // by fd, which is also the store's connection id
  std::set<std::string> local_;                       // this host's addresses: connections from them are local
  const uid_t uid_;
  size_t buffered_ = 0, unsent_ = 0;  // every connection's unparsed requests and unsent replies
  std::set<std::string> warned_;      // peers already told of, so a scan does not flood the log
  std::vector<int> dead_;             // closed at the end of the turn
  std::set<int> again_;               // connections whose replies drained while requests of theirs wait
  bool running_ = true;
  char chunk_[kReadChunk];
};

void StoreServer::Loop() {
  Serving serving(this, std::move(loop_));
  serving.Run();
}

void StoreServer::Serving::Run() {
  {
    std::lock_guard<std::mutex> lock(server_.mu_);
    server_.stats_ = StoreServerStats();
  }
  loop_->Watch(server_.wake_.get(), EPOLLIN, [this](uint32_t) { running_ = false; });
  loop_->Watch(server_.listener_.get(), EPOLLIN, [this](uint32_t) { Accept(); });
  while (running_) {
    if (absl::Status st = loop_->RunOnce(); !st.ok()) {
      spdlog::error("the workers' store stopped: {}", std::string(st.message()));
      break;
    }
    EndTurn();
  }
  // Every connection closes with the serving (the next attempt's workers connect anew).
  std::lock_guard<std::mutex> lock(server_.mu_);
  server_.stats_.connections = 0;
}

// Counted as it happens (before the connection closes), so a client that saw it sees the count.
void StoreServer::Serving::Count(int64_t StoreServerStats::*field) {
  std::lock_guard<std::mutex> lock(server_.mu_);
  ++(server_.stats_.*field);
  server_.stats_.connections = conns_.size();
}

void StoreServer::Serving::Accept() {
  const Options& opts = server_.options_;
  while (true) {
    sockaddr_storage ss{};
    socklen_t len = sizeof ss;
    UniqueFd fd(
        ::accept4(server_.listener_.get(), reinterpret_cast<sockaddr*>(&ss), &len, SOCK_NONBLOCK | SOCK_CLOEXEC));
    if (!fd.valid()) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) spdlog::warn("workers' store: accept: {}", std::strerror(errno));
      return;
    }
    const auto [ip, port] = AddressOf(ss);
    const std::string why = conns_.size() >= opts.max_connections
                                ? absl::StrCat("the store has its ", opts.max_connections, " connections")
                                : Refusal(fd, ip, port);
    if (!why.empty()) {
      Count(&StoreServerStats::refused);
      if (warned_.size() < 64 && warned_.insert(ip).second) {
        spdlog::warn("workers' store: refused a connection from {}:{}: {}", ip, port, why);
      }
      continue;
    }
    int one = 1;
    ::setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    const int id = fd.get();
    auto c = std::make_unique<Connection>(std::move(fd), opts.limits);
    c->events = EPOLLIN | EPOLLRDHUP;
    loop_->Watch(id, c->events, [this, id](uint32_t events) { OnConnection(id, events); });
    conns_[id] = std::move(c);
    Count(&StoreServerStats::accepted);
  }
}

// Why a connection from `ip`:`port` is refused (empty: it is not): a local one must come from a
// socket of the job's user, a remote one from a node of the job.
std::string StoreServer::Serving::Refusal(const UniqueFd& fd, const std::string& ip, int port) {
  if (IsLoopbackIp(ip) || local_.count(ip)) {
    sockaddr_storage me{};
    socklen_t mlen = sizeof me;
    ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&me), &mlen);
    const auto [my_ip, my_port] = AddressOf(me);
    auto owner = LocalTcpPeerUid(ip, port, my_ip, my_port);
    if (!owner.ok()) return absl::StrCat("its user is unknown (", owner.status().message(), ")");
    if (*owner != uid_) return absl::StrCat("it belongs to uid ", *owner, ", not the job's ", uid_);
    return "";
  }
  return server_.peers_.remote.count(ip) ? "" : "it is no node of the job";
}

void StoreServer::Serving::OnConnection(int fd, uint32_t events) {
  auto it = conns_.find(fd);
  if (it == conns_.end() || it->second->closing) return;
  Connection& c = *it->second;
  if (events & EPOLLOUT) {
    if (!Flush(c)) {
      Drop(c, "");
      return;
    }
    Process(fd);  // replies drained: its waiting requests go on
  }
  if (c.closing || !(events & (EPOLLIN | EPOLLHUP | EPOLLERR | EPOLLRDHUP))) return;
  // One chunk at a time, then the others' turn.
  ssize_t r = ::recv(fd, chunk_, sizeof chunk_, 0);
  if (r > 0) {
    c.reader.Append(absl::string_view(chunk_, static_cast<size_t>(r)));
    buffered_ += static_cast<size_t>(r);
    c.counted_in += static_cast<size_t>(r);
    Process(fd);
    if (buffered_ > server_.options_.max_buffered) DropLargest(&Connection::counted_in, "unread requests");
  } else if (r == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
    Drop(c, "");
  }
}

// Serves the connection's whole requests while its replies are under the bound.
void StoreServer::Serving::Process(int fd) {
  Connection& c = *conns_.at(fd);
  if (c.closing) return;
  std::vector<StoreReply> replies;
  while (c.pending() < kMaxPendingReplies) {
    auto next = c.reader.Next();
    if (!next.ok()) {
      Drop(c, absl::StrCat("its request: ", next.status().message()));
      break;
    }
    if (!*next) break;
    replies.clear();
    if (auto st = state_.Apply(fd, **next, &replies); !st.ok()) {
      Drop(c, absl::StrCat("its ", StoreOpName((*next)->op), ": ", st.message()));
      break;
    }
    for (const StoreReply& r : replies) Deliver(fd, r);
    if (unsent_ > server_.options_.max_buffered) DropLargest(&Connection::counted_out, "unsent replies");
  }
  const size_t now = c.reader.buffered();
  buffered_ = buffered_ - c.counted_in + now;
  c.counted_in = now;
  if (!c.closing) Rewatch(c);
}

// A reply of connection `from`'s request, to whichever connection it is for.
void StoreServer::Serving::Deliver(int from, const StoreReply& r) {
  auto to = conns_.find(r.connection);
  if (to == conns_.end() || to->second->closing) return;
  Connection& t = *to->second;
  t.out += r.bytes;
  if (!Flush(t)) {
    Drop(t, "");
    return;
  }
  if (r.connection == from) return;
  if (t.pending() > server_.options_.limits.max_request + kMaxPendingReplies) {
    // A 1.13 watcher (or a waiter) that never reads what it is sent.
    Drop(t, absl::StrCat("it does not read its replies (", t.pending(), " bytes wait)"));
    return;
  }
  if (t.pending() < kMaxPendingReplies && t.reader.buffered() > 0) again_.insert(r.connection);
  Rewatch(t);
}

// Sends what it can; false: the connection is gone.
bool StoreServer::Serving::Flush(Connection& c) {
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
    if (c.out.capacity() > (1 << 20)) std::string().swap(c.out);  // a big reply's room goes
    c.out_sent = 0;
  } else if (c.out_sent > (1 << 20)) {
    c.out.erase(0, c.out_sent);
    c.out_sent = 0;
  }
  unsent_ = unsent_ - c.counted_out + c.pending();
  c.counted_out = c.pending();
  return true;
}

void StoreServer::Serving::Drop(Connection& c, const std::string& why) {
  if (c.closing) return;
  if (!why.empty()) {
    spdlog::warn("workers' store: a connection closed: {}", why);
    Count(&StoreServerStats::dropped);
  }
  c.closing = true;
  dead_.push_back(c.fd.get());
}

// Over a bound on every connection together, the connection holding most goes (not the one that
// happened to cross it: one peer's hoard must not cost the others their connections).
void StoreServer::Serving::DropLargest(size_t Connection::*field, const char* what) {
  Connection* largest = nullptr;
  for (auto& [fd, c] : conns_) {
    if (!c->closing && (!largest || (*c).*field > (*largest).*field)) largest = c.get();
  }
  if (largest) {
    Drop(*largest, absl::StrCat("the connections' ", what, " passed ", server_.options_.max_buffered,
                                " bytes; this one held the most (", (*largest).*field, ")"));
  }
}

void StoreServer::Serving::Rewatch(Connection& c) {
  const uint32_t want = (c.pending() < kMaxPendingReplies ? EPOLLIN : 0) | (c.pending() ? EPOLLOUT : 0) | EPOLLRDHUP;
  if (want == c.events) return;
  c.events = want;
  loop_->Modify(c.fd.get(), want);
}

// After each turn: connections whose replies another's request drained, with requests of their
// own waiting, go on; the dropped ones close.
void StoreServer::Serving::EndTurn() {
  while (!again_.empty()) {
    const int fd = *again_.begin();
    again_.erase(again_.begin());
    if (conns_.count(fd)) Process(fd);
  }
  for (int fd : dead_) {
    auto it = conns_.find(fd);
    if (it == conns_.end()) continue;
    buffered_ -= it->second->counted_in;
    unsent_ -= it->second->counted_out;
    state_.Disconnect(fd);
    loop_->Unwatch(fd);
    conns_.erase(it);
  }
  dead_.clear();
  std::lock_guard<std::mutex> lock(server_.mu_);
  server_.stats_.connections = conns_.size();
  server_.stats_.store = state_.Stats();
}

}  // namespace launch
