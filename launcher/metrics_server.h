// The coordinator's Prometheus endpoint (--metrics-port): GET /metrics answers the text of every
// run it knows (launcher/metrics_text.h), to scrapers that present the rendezvous token as a
// bearer token, over TLS when the coordinator has a certificate. Served by cpp-httplib on a small
// thread pool of its own; nothing else is served. cpp-httplib lives in a module that only
// --metrics-port loads (launcher/metrics_http.h).
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/tunables.h"
#include "launcher/metrics_http.h"

namespace launch {

class MetricsServer {
 public:
  struct Options {
    std::string host = "127.0.0.1";
    int port = 0;                             // 0: a free one (tests)
    std::string token;                        // required: scrapers send "Authorization: Bearer <token>"
    std::string tls_cert_file, tls_key_file;  // both set: HTTPS
    std::function<std::string()> render;      // the page
    int max_connections = kMetricsMaxConnections;
    std::chrono::milliseconds connection_deadline = kMetricsConnectionDeadline;
  };
  // Listening when it returns; the port in use is port().
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(Options opts);
  ~MetricsServer();  // stops serving and joins its threads
  int port() const { return port_; }

 private:
  MetricsServer() = default;
  std::unique_ptr<MetricsHttp> http_;
  int port_ = 0;
};

}  // namespace launch
