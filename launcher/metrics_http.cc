#include "launcher/metrics_http.h"

#include <httplib.h>

#include <memory>
#include <thread>

namespace launch {
namespace {

// Compares in time that does not depend on where the strings differ.
bool SameSecret(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

class HttplibMetrics final : public MetricsHttp {
 public:
  ~HttplibMetrics() override {
    if (server_) server_->stop();
    if (thread_.joinable()) thread_.join();
  }
  int port() const override { return port_; }

  static HttplibMetrics* Start(const MetricsHttpOptions& opts, std::string* error, bool* invalid) {
    std::unique_ptr<HttplibMetrics> m(new HttplibMetrics());
    const bool tls = !opts.tls_cert_file.empty() && !opts.tls_key_file.empty();
    if (tls) {
      m->server_ = std::make_unique<httplib::SSLServer>(opts.tls_cert_file.c_str(), opts.tls_key_file.c_str());
    } else {
      m->server_ = std::make_unique<httplib::Server>();
    }
    if (!m->server_->is_valid()) {
      *invalid = true;
      *error = "--metrics-port: cannot serve TLS with " + opts.tls_cert_file + " and " + opts.tls_key_file;
      return nullptr;
    }
    httplib::Server& s = *m->server_;
    // Scrapes are small and rare: two threads, short timeouts, no request bodies.
    s.new_task_queue = [] { return new httplib::ThreadPool(2); };
    s.set_read_timeout(5);
    s.set_write_timeout(5);
    s.set_keep_alive_max_count(100);
    s.set_payload_max_length(1024);
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
    HttplibMetrics* self = m.get();
    m->thread_ = std::thread([self] { self->server_->listen_after_bind(); });
    return m.release();
  }

 private:
  HttplibMetrics() = default;
  std::unique_ptr<httplib::Server> server_;
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
