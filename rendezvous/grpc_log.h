// gRPC's own log lines go through launch's log (spdlog: one format, one console), and the one
// gRPC failure that needs action is turned into an event: in gRPC 1.51 a listening socket whose
// accept() fails with anything but EAGAIN (EMFILE when descriptors run out) is never polled again,
// so the server stops accepting connections for good. A CoordinatorServer subscribes and restarts
// its listener. gRPC's logger is process-wide, so this is too.
#pragma once

#include <functional>

namespace launch {

// Routes gRPC's logging through spdlog (idempotent; thread-safe).
void InstallGrpcLogBridge();

// Calls `on_failure` (on a gRPC thread, possibly under gRPC's locks: it must only record the
// event) each time a gRPC listener of this process stops accepting. Returns an id for
// UnsubscribeListenerFailures, which returns once no call of `on_failure` runs any more.
int SubscribeListenerFailures(std::function<void()> on_failure);
void UnsubscribeListenerFailures(int id);

// What the bridge does with one gRPC log line (for tests): logs it, and reports a listener
// failure when the line says one happened.
void HandleGrpcLogLine(const char* file, int line, int severity, const char* message);

}  // namespace launch
