#include "launcher/metrics_http.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <httplib.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

namespace launch {
namespace {

using SteadyClock = std::chrono::steady_clock;

// Compares in time that does not depend on where the strings differ.
bool SameSecret(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

// The connections being served, oldest first. cpp-httplib reads a request with a timeout per
// read only, so a client sending a byte every few seconds held one of its threads for as long as
// it liked (4 such clients starved every scrape for 80 s), and idle connections took the
// coordinator's descriptors. Here each connection has a deadline for its whole request and
// answer, and at the cap a new one closes the oldest (a slow client's, not a scrape's: a scrape
// takes milliseconds).
class Connections {
 public:
  explicit Connections(size_t max) : max_(max) {}
  // A connection is taken on; at the cap the oldest is shut down (its thread sees it at once).
  uint64_t Enter(int fd) {
    std::lock_guard<std::mutex> lock(mu_);
    if (open_.size() >= max_) {
      ::shutdown(open_.front().fd, SHUT_RDWR);
      open_.pop_front();
    }
    open_.push_back({fd, ++last_id_});
    return last_id_;
  }
  // Before the descriptor is closed, so that a shutdown never reaches a descriptor reused since.
  void Leave(uint64_t id) {
    std::lock_guard<std::mutex> lock(mu_);
    open_.remove_if([id](const Open& o) { return o.id == id; });
  }
  // Stops every connection (the server is stopping).
  void ShutdownAll() {
    std::lock_guard<std::mutex> lock(mu_);
    for (const Open& o : open_) ::shutdown(o.fd, SHUT_RDWR);
    open_.clear();
  }

 private:
  struct Open {
    int fd;
    uint64_t id;
  };
  const size_t max_;
  std::mutex mu_;
  std::list<Open> open_;  // oldest first
  uint64_t last_id_ = 0;
};

// One connection's stream with a deadline for all of it: every read and write waits at most
// until then (the socket is non-blocking), over TLS when `ssl` is set.
class DeadlineStream final : public httplib::Stream {
 public:
  DeadlineStream(int fd, SSL* ssl, SteadyClock::time_point deadline) : fd_(fd), ssl_(ssl), deadline_(deadline) {}
  bool is_readable() const override { return (ssl_ && SSL_pending(ssl_) > 0) || Wait(POLLIN); }
  bool is_writable() const override { return Wait(POLLOUT); }
  ssize_t read(char* ptr, size_t size) override {
    for (;;) {
      if (ssl_) {
        const int n = SSL_read(ssl_, ptr, static_cast<int>(size));
        if (n > 0) return n;
        if (!WaitFor(SSL_get_error(ssl_, n))) return -1;
        continue;
      }
      const ssize_t n = ::recv(fd_, ptr, size, 0);
      if (n >= 0) return n;
      if ((errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) || !Wait(POLLIN)) return -1;
    }
  }
  ssize_t write(const char* ptr, size_t size) override {
    for (;;) {
      if (ssl_) {
        const int n = SSL_write(ssl_, ptr, static_cast<int>(size));
        if (n > 0) return n;
        if (!WaitFor(SSL_get_error(ssl_, n))) return -1;
        continue;
      }
      const ssize_t n = ::send(fd_, ptr, size, MSG_NOSIGNAL);
      if (n >= 0) return n;
      if ((errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) || !Wait(POLLOUT)) return -1;
    }
  }
  void get_remote_ip_and_port(std::string& ip, int& port) const override { Address(::getpeername, &ip, &port); }
  void get_local_ip_and_port(std::string& ip, int& port) const override { Address(::getsockname, &ip, &port); }
  socket_t socket() const override { return fd_; }

  // The TLS handshake, within the same deadline.
  bool Accept() {
    for (;;) {
      const int r = SSL_accept(ssl_);
      if (r == 1) return true;
      if (!WaitFor(SSL_get_error(ssl_, r))) return false;
    }
  }

 private:
  bool Wait(short events) const {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline_ - SteadyClock::now());
    if (left.count() <= 0) return false;
    pollfd p{fd_, events, 0};
    return ::poll(&p, 1, static_cast<int>(left.count())) > 0 && (p.revents & (events | POLLHUP)) != 0;
  }
  bool WaitFor(int ssl_error) const {
    if (ssl_error == SSL_ERROR_WANT_READ) return Wait(POLLIN);
    if (ssl_error == SSL_ERROR_WANT_WRITE) return Wait(POLLOUT);
    return false;
  }
  template <typename Get>
  void Address(Get get, std::string* ip, int* port) const {
    sockaddr_storage ss{};
    socklen_t len = sizeof ss;
    if (get(fd_, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return;
    char buf[INET6_ADDRSTRLEN] = {};
    if (ss.ss_family == AF_INET) {
      auto* a = reinterpret_cast<sockaddr_in*>(&ss);
      ::inet_ntop(AF_INET, &a->sin_addr, buf, sizeof buf);
      *port = ntohs(a->sin_port);
    } else if (ss.ss_family == AF_INET6) {
      auto* a = reinterpret_cast<sockaddr_in6*>(&ss);
      ::inet_ntop(AF_INET6, &a->sin6_addr, buf, sizeof buf);
      *port = ntohs(a->sin6_port);
    }
    *ip = buf;
  }

  int fd_;
  SSL* ssl_;
  SteadyClock::time_point deadline_;
};

// cpp-httplib's server with each connection served as above: one request per connection, read and
// answered within the deadline, at most max_connections at once. (process_and_close_socket is the
// one hook it has on an accepted connection; process_request, which it calls, is protected.)
template <typename Base>
class GuardedServer final : public Base {
 public:
  template <typename... Args>
  GuardedServer(const MetricsHttpOptions& opts, Args&&... args)
      : Base(std::forward<Args>(args)...),
        connections_(static_cast<size_t>(opts.max_connections)),
        deadline_(std::chrono::milliseconds(opts.connection_deadline_ms)) {}
  void StopConnections() { connections_.ShutdownAll(); }

 private:
  bool process_and_close_socket(socket_t sock) override {
    const auto deadline = SteadyClock::now() + deadline_;
    ::fcntl(sock, F_SETFL, ::fcntl(sock, F_GETFL) | O_NONBLOCK);
    const uint64_t id = connections_.Enter(sock);
    bool ok = false;
    SSL* ssl = nullptr;
    if constexpr (std::is_same_v<Base, httplib::SSLServer>) {
      ssl = SSL_new(this->ssl_context());
      if (ssl) SSL_set_fd(ssl, sock);
    }
    DeadlineStream stream(sock, ssl, deadline);
    if (!std::is_same_v<Base, httplib::SSLServer> || (ssl && stream.Accept())) {
      bool closed = false;
      ok = Serve(stream, closed, 0);
    }
    if (ssl) {
      SSL_shutdown(ssl);
      SSL_free(ssl);
    }
    connections_.Leave(id);
    ::shutdown(sock, SHUT_RDWR);
    ::close(sock);
    return ok;
  }

  // process_request as this cpp-httplib has it: 0.11 (Debian 12) takes the stream alone, 0.18
  // (Debian 13) the peer's and its own address and port too. The int overload is tried first.
  template <typename S = GuardedServer>
  auto Serve(httplib::Stream& stream, bool& closed, int)
      -> decltype(static_cast<S*>(this)->process_request(stream, true, closed, nullptr)) {
    return this->process_request(stream, /*close_connection=*/true, closed, nullptr);
  }
  template <typename S = GuardedServer>
  auto Serve(httplib::Stream& stream, bool& closed, long)
      -> decltype(static_cast<S*>(this)->process_request(stream, std::string(), 0, std::string(), 0, true, closed,
                                                         nullptr)) {
    std::string remote, local;
    int remote_port = 0, local_port = 0;
    stream.get_remote_ip_and_port(remote, remote_port);
    stream.get_local_ip_and_port(local, local_port);
    return this->process_request(stream, remote, remote_port, local, local_port, /*close_connection=*/true, closed,
                                 nullptr);
  }

  Connections connections_;
  const std::chrono::milliseconds deadline_;
};

class HttplibMetrics final : public MetricsHttp {
 public:
  ~HttplibMetrics() override {
    if (server_) server_->stop();
    if (stop_connections_) stop_connections_();
    if (thread_.joinable()) thread_.join();
  }
  int port() const override { return port_; }

  static HttplibMetrics* Start(const MetricsHttpOptions& opts, std::string* error, bool* invalid) {
    std::unique_ptr<HttplibMetrics> m(new HttplibMetrics());
    const bool tls = !opts.tls_cert_file.empty() && !opts.tls_key_file.empty();
    if (opts.max_connections < 1 || opts.connection_deadline_ms < 1) {
      *invalid = true;
      *error = "--metrics-port: expected at least 1 connection and a deadline of at least 1 ms";
      return nullptr;
    }
    if (tls) {
      auto s = std::make_unique<GuardedServer<httplib::SSLServer>>(opts, opts.tls_cert_file.c_str(),
                                                                   opts.tls_key_file.c_str());
      m->stop_connections_ = [raw = s.get()] { raw->StopConnections(); };
      m->server_ = std::move(s);
    } else {
      auto s = std::make_unique<GuardedServer<httplib::Server>>(opts);
      m->stop_connections_ = [raw = s.get()] { raw->StopConnections(); };
      m->server_ = std::move(s);
    }
    if (!m->server_->is_valid()) {
      *invalid = true;
      *error = "--metrics-port: cannot serve TLS with " + opts.tls_cert_file + " and " + opts.tls_key_file;
      return nullptr;
    }
    httplib::Server& s = *m->server_;
    // A thread per connection it holds, and two more that take a new one on at the cap (closing
    // the oldest); no request bodies.
    const int threads = opts.max_connections + 2;
    s.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
    s.set_payload_max_length(1024);
    // cpp-httplib listens with a backlog of 5: a burst of connections (a flood, or a few slow
    // clients and a scrape) overflowed it and a scrape's handshake waited for the kernel's 1 s
    // retransmission. Its listening socket, as it is made, gets the system's backlog instead.
    int listener = -1;
    s.set_socket_options([&listener](socket_t sock) {
      httplib::default_socket_options(sock);
      listener = sock;
    });
    const std::string expected = "Bearer " + opts.token;
    auto render = opts.render;
    s.Get("/metrics", [expected, render](const httplib::Request& req, httplib::Response& res) {
      if (!SameSecret(req.get_header_value("Authorization"), expected)) {
        res.status = 401;
        res.set_header("WWW-Authenticate", "Bearer");
        res.set_content("a bearer token is required: the job's rendezvous token\n", "text/plain");
        return;
      }
      res.set_content(render(), "text/plain; version=0.0.4; charset=utf-8");
    });
    if (opts.port == 0) {
      m->port_ = s.bind_to_any_port(opts.host);
      if (m->port_ <= 0) {
        *error = "--metrics-port: cannot listen on " + opts.host;
        return nullptr;
      }
    } else {
      if (!s.bind_to_port(opts.host, opts.port)) {
        const std::string port = std::to_string(opts.port);
        *error = "--metrics-port=" + port + ": cannot listen on " + opts.host + ":" + port + " (in use?)";
        return nullptr;
      }
      m->port_ = opts.port;
    }
    if (listener >= 0) ::listen(listener, SOMAXCONN);  // Linux takes a new backlog for a listening socket
    HttplibMetrics* self = m.get();
    m->thread_ = std::thread([self] { self->server_->listen_after_bind(); });
    return m.release();
  }

 private:
  HttplibMetrics() = default;
  std::unique_ptr<httplib::Server> server_;
  std::function<void()> stop_connections_;
  std::thread thread_;
  int port_ = 0;
};

}  // namespace
}  // namespace launch

extern "C" __attribute__((visibility("default"))) launch::MetricsHttp* launch_start_metrics_http(
    const launch::MetricsHttpOptions& opts, std::string* error, bool* invalid) {
  return launch::HttplibMetrics::Start(opts, error, invalid);
}

// The entry point's type is the one launch calls it through.
static_assert(std::is_same_v<decltype(&launch_start_metrics_http), launch::StartMetricsHttpFn>);
