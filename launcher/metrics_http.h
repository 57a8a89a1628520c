// The half of the metrics endpoint that needs cpp-httplib, built as a module of its own
// (liblaunch_metrics.so) that launch loads only for --metrics-port: linked into launch, cpp-httplib
// brought libssl, libcrypto and brotli with it, whose loading and OpenSSL's initialisation were
// half of every launch's start-up (`launch --version` included). Only the C++ standard library
// crosses this boundary.
#pragma once

#include <functional>
#include <string>

namespace launch {

struct MetricsHttpOptions {
  std::string host;
  int port = 0;  // 0: a free one
  std::string token;
  std::string tls_cert_file, tls_key_file;  // both set: HTTPS
  std::function<std::string()> render;
  // Connections served at once (one more closes the oldest), and how long one may take from its
  // accept to its answer written: a slow or idle client holds a slot only that long.
  int max_connections = 16;
  int connection_deadline_ms = 10000;
};

// Serving on its own threads from the start; stops serving and joins them when destroyed.
class MetricsHttp {
 public:
  virtual ~MetricsHttp() = default;
  virtual int port() const = 0;
};

// The module's one entry point: a server listening on its port, or nullptr with *error set
// (*invalid: the options are at fault, not the host).
using StartMetricsHttpFn = MetricsHttp* (*)(const MetricsHttpOptions& opts, std::string* error, bool* invalid);
constexpr const char* kStartMetricsHttpSymbol = "launch_start_metrics_http";

}  // namespace launch
