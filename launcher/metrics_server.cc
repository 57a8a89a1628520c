#include "launcher/metrics_server.h"

#include <httplib.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/launch_env.h"
#include "spdlog/spdlog.h"

namespace launch {

namespace {

// Compares in time that does not depend on where the strings differ.
bool SameSecret(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

}  // namespace

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(Options opts) {
  if (opts.token.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("--metrics-port needs a token for its scrapers: set --rdzv-token-file or ", kRdzvTokenEnv,
                     " (Prometheus sends it with authorization: {credentials_file: ...})"));
  }
  std::unique_ptr<MetricsServer> m(new MetricsServer());
  const bool tls = !opts.tls_cert_file.empty() && !opts.tls_key_file.empty();
  if (tls) {
    m->server_ = std::make_unique<httplib::SSLServer>(opts.tls_cert_file.c_str(), opts.tls_key_file.c_str());
  } else {
    m->server_ = std::make_unique<httplib::Server>();
  }
  if (!m->server_->is_valid()) {
    return absl::InvalidArgumentError(absl::StrCat("--metrics-port: cannot serve TLS with ", opts.tls_cert_file,
                                                   " and ", opts.tls_key_file));
  }
  httplib::Server& s = *m->server_;
  // Scrapes are small and rare: two threads, short timeouts, no request bodies.
  s.new_task_queue = [] { return new httplib::ThreadPool(2); };
  s.set_read_timeout(5);
  s.set_write_timeout(5);
  s.set_keep_alive_max_count(100);
  s.set_payload_max_length(1024);
  const std::string expected = absl::StrCat("Bearer ", opts.token);
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
    if (m->port_ <= 0) return absl::UnavailableError(absl::StrCat("--metrics-port: cannot listen on ", opts.host));
  } else {
    if (!s.bind_to_port(opts.host, opts.port)) {
      return absl::UnavailableError(absl::StrCat("--metrics-port=", opts.port, ": cannot listen on ", opts.host, ":",
                                                 opts.port, " (in use?)"));
    }
    m->port_ = opts.port;
  }
  MetricsServer* self = m.get();
  m->thread_ = std::thread([self] { self->server_->listen_after_bind(); });
  spdlog::info("Prometheus metrics at {}://{}:{}/metrics (bearer token: the rendezvous token)", tls ? "https" : "http",
               opts.host, m->port_);
  return m;
}

MetricsServer::~MetricsServer() {
  if (server_) server_->stop();
  if (thread_.joinable()) thread_.join();
}

}  // namespace launch
