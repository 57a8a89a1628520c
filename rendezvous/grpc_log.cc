#include "rendezvous/grpc_log.h"

#include <grpc/support/log.h>

#include <cstring>
#include <map>
#include <mutex>
#include <string_view>

#include "absl/strings/match.h"
#include "spdlog/spdlog.h"

namespace launch {
namespace {

struct Subscribers {
  std::mutex mu;
  std::map<int, std::function<void()>> callbacks;
  int next_id = 1;
};

Subscribers& TheSubscribers() {
  static Subscribers* s = new Subscribers();  // never destroyed: gRPC threads may log at exit
  return *s;
}

void BridgeLog(gpr_log_func_args* args) {
  HandleGrpcLogLine(args->file, args->line, static_cast<int>(args->severity), args->message);
}

}  // namespace

void HandleGrpcLogLine(const char* file, int line, int severity, const char* message) {
  std::string_view base = file ? file : "";
  if (auto slash = base.rfind('/'); slash != std::string_view::npos) base.remove_prefix(slash + 1);
  const char* text = message ? message : "";
  switch (severity) {
    case GPR_LOG_SEVERITY_ERROR:
      spdlog::error("grpc {}:{}: {}", base, line, text);
      break;
    case GPR_LOG_SEVERITY_INFO:
      spdlog::info("grpc {}:{}: {}", base, line, text);
      break;
    default:
      spdlog::debug("grpc {}:{}: {}", base, line, text);
      break;
  }
  // tcp_server_posix.cc's on_read gives up on its listener after this line.
  if (base == "tcp_server_posix.cc" && absl::StartsWith(text, "Failed accept")) {
    Subscribers& s = TheSubscribers();
    std::lock_guard<std::mutex> lock(s.mu);
    for (auto& [id, callback] : s.callbacks) callback();
  }
}

void InstallGrpcLogBridge() {
  static std::once_flag once;
  std::call_once(once, [] { gpr_set_log_function(&BridgeLog); });
}

int SubscribeListenerFailures(std::function<void()> on_failure) {
  InstallGrpcLogBridge();
  Subscribers& s = TheSubscribers();
  std::lock_guard<std::mutex> lock(s.mu);
  const int id = s.next_id++;
  s.callbacks[id] = std::move(on_failure);
  return id;
}

void UnsubscribeListenerFailures(int id) {
  Subscribers& s = TheSubscribers();
  std::lock_guard<std::mutex> lock(s.mu);
  s.callbacks.erase(id);
}

}  // namespace launch
