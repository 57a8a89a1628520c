#include "launcher/metrics_server.h"

#include <dlfcn.h>

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "common/launch_env.h"
#include "spdlog/spdlog.h"

namespace launch {

namespace {

// The module beside this binary as installed, or as the build tree lays it out:
// <bin>/../<libdir>/launch/liblaunch_metrics.so. Loaded once and kept for the process's life.
absl::StatusOr<StartMetricsHttpFn> LoadMetricsModule() {
  std::error_code ec;
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return absl::InternalError(absl::StrCat("--metrics-port: cannot find launch's own path: ", ec.message()));
  const std::string path = (exe.parent_path().parent_path() / LAUNCH_METRICS_MODULE).lexically_normal().string();
  void* module = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!module) return absl::FailedPreconditionError(absl::StrCat("--metrics-port: cannot load ", ::dlerror()));
  void* entry = ::dlsym(module, kStartMetricsHttpSymbol);
  if (!entry) return absl::FailedPreconditionError(absl::StrCat("--metrics-port: ", path, ": ", ::dlerror()));
  return reinterpret_cast<StartMetricsHttpFn>(entry);
}

}  // namespace

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(Options opts) {
  if (opts.token.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("--metrics-port needs a token for its scrapers: set --rdzv-token-file or ", kRdzvTokenEnv,
                     " (Prometheus sends it with authorization: {credentials_file: ...})"));
  }
  static const absl::StatusOr<StartMetricsHttpFn> start = LoadMetricsModule();
  if (!start.ok()) return start.status();
  MetricsHttpOptions ho;
  ho.host = opts.host;
  ho.port = opts.port;
  ho.token = opts.token;
  ho.tls_cert_file = opts.tls_cert_file;
  ho.tls_key_file = opts.tls_key_file;
  ho.render = opts.render;
  ho.max_connections = opts.max_connections;
  ho.connection_deadline_ms = static_cast<int>(opts.connection_deadline.count());
  std::string error;
  bool invalid = false;
  std::unique_ptr<MetricsHttp> http((*start)(ho, &error, &invalid));
  if (!http) return invalid ? absl::InvalidArgumentError(error) : absl::UnavailableError(error);
  std::unique_ptr<MetricsServer> m(new MetricsServer());
  m->port_ = http->port();
  m->http_ = std::move(http);
  const bool tls = !opts.tls_cert_file.empty() && !opts.tls_key_file.empty();
  spdlog::info("Prometheus metrics at {}://{}:{}/metrics (bearer token: the rendezvous token)", tls ? "https" : "http",
               opts.host, m->port_);
  return m;
}

MetricsServer::~MetricsServer() = default;

}  // namespace launch
