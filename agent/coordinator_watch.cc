#include "agent/coordinator_watch.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>

#include "common/status_macros.h"
#include "spdlog/spdlog.h"

namespace launch {

namespace {
void Signal(int fd) {
  uint64_t one = 1;
  ssize_t n = ::write(fd, &one, sizeof one);
  (void)n;
}
}  // namespace

absl::Status CoordinatorWatch::Start(const v1::Assignment& a) {
  Stop();
  event_ = UniqueFd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!event_.valid()) return ErrnoStatus("eventfd");
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = false;
    answer_.Clear();
  }
  cancel_.Reset();
  unreachable_ = false;
  thread_ = std::thread([this, a] { Loop(a); });
  return absl::OkStatus();
}

void CoordinatorWatch::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    cv_.notify_all();
  }
  cancel_.Cancel();
  if (thread_.joinable()) thread_.join();
}

v1::HeartbeatResponse CoordinatorWatch::answer() const {
  std::lock_guard<std::mutex> lock(mu_);
  return answer_;
}

void CoordinatorWatch::Backoff(std::chrono::milliseconds d) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, d, [&] { return stop_; });
}

void CoordinatorWatch::Loop(v1::Assignment a) {
  bool reattach = false;
  std::chrono::milliseconds delay = opts_.retry_min;
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stop_) return;
    }
    v1::HeartbeatRequest hb;
    hb.set_run_id(opts_.run_id);
    hb.set_node_id(opts_.node.node_id());
    hb.set_round(a.round());
    hb.set_wait_ms(static_cast<int>(opts_.hold.count()));
    if (reattach) {
      *hb.mutable_node() = opts_.node;
      *hb.mutable_assignment() = a;
      *hb.mutable_spec() = opts_.spec;
    }
    auto resp = client_->Heartbeat(hb, &cancel_);
    if (!resp.ok()) {
      if (cancel_.cancelled()) return;
      if (!CoordinatorUnreachable(resp.status())) {
        // The coordinator refuses us (wrong token, run closed): nothing to wait for.
        spdlog::error("{}", std::string(resp.status().message()));
        std::lock_guard<std::mutex> lock(mu_);
        answer_.set_stop_workers(true);
        answer_.set_reason(std::string(resp.status().message()));
        Signal(event_.get());
        return;
      }
      if (!unreachable_.exchange(true)) {
        spdlog::warn("coordinator at {} unreachable ({}); the workers keep running, retrying",
                     client_->target(), std::string(resp.status().message()));
      }
      Backoff(delay);
      delay = std::min(delay * 2, opts_.retry_max);
      continue;
    }
    delay = opts_.retry_min;
    if (unreachable_.exchange(false)) spdlog::info("coordinator at {} is back", client_->target());
    if (resp->unknown_node()) {
      if (!reattach) spdlog::warn("the coordinator does not know this node (it restarted): re-registering");
      reattach = true;
      continue;
    }
    if (reattach) {
      reattach = false;
      if (!resp->stop_workers()) spdlog::info("re-registered with the coordinator in round {}", a.round());
    }
    if (resp->stop_workers() || resp->job_succeeded() || resp->job_failed()) {
      std::lock_guard<std::mutex> lock(mu_);
      answer_ = *resp;
      Signal(event_.get());
      return;
    }
  }
}

absl::Status BackgroundCall::Start(std::function<void(CallCanceller*)> fn) {
  Wait();
  cancel_.Reset();
  event_ = UniqueFd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!event_.valid()) return ErrnoStatus("eventfd");
  int fd = event_.get();
  thread_ = std::thread([this, fn = std::move(fn), fd] {
    fn(&cancel_);
    Signal(fd);
  });
  return absl::OkStatus();
}

void BackgroundCall::Wait() {
  if (thread_.joinable()) thread_.join();
}

}  // namespace launch
