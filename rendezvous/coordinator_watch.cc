#include "rendezvous/coordinator_watch.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <optional>

#include "absl/strings/str_cat.h"
#include "rendezvous/heartbeat_order.h"
#include "rendezvous/lease.h"
#include "common/net.h"
#include "common/status_macros.h"
#include "spdlog/spdlog.h"
#include "common/thread_name.h"

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
  unreachable_ = false;
  // A coordinator in this process answers the watch itself: no stream, no thread.
  in_process_ = client_->WatchInProcess(session_->Registration(a),
                                        [this](const v1::HeartbeatResponse& resp) { Deliver(resp); });
  if (in_process_) return absl::OkStatus();
  thread_ = std::thread([this, a] {
    NameThisThread("launch-watch");
    Loop(a);
  });
  return absl::OkStatus();
}

void CoordinatorWatch::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    if (stream_) stream_->Cancel();
    cv_.notify_all();
  }
  if (thread_.joinable()) thread_.join();
  // Outside mu_: the coordinator's lock is taken before ours when it answers.
  in_process_.reset();
}

v1::HeartbeatResponse CoordinatorWatch::answer() const {
  std::lock_guard<std::mutex> lock(mu_);
  return answer_;
}

void CoordinatorWatch::Backoff(std::chrono::milliseconds d) {
  std::unique_lock<std::mutex> lock(mu_);
  session_->clock()->WaitFor(lock, cv_, d, [&] { return stop_; });
}

WatchAnswer ClassifyWatchAnswer(const v1::HeartbeatResponse& resp) {
  switch (OrderOf(resp)) {
    case HeartbeatOrder::kReregister:
      return WatchAnswer::kReregister;
    case HeartbeatOrder::kLeaseByStream:
      return WatchAnswer::kHeartbeatOnStream;
    default:
      return WatchAnswer::kDeliver;  // a stop, the job's end, or nothing to act on here
  }
}

namespace {
// Lease datagrams when the coordinator takes them: whether they are sent. A coordinator takes
// them on its own port number, over UDP, so after a failover to another replica they go to that
// replica's port.
bool StartLeaseDatagrams(const std::string& target, const v1::Assignment& a, LeaseSender* lease) {
  if (a.lease_port() <= 0 || a.lease_key().size() != kLeaseKeyBytes) return false;
  auto hp = ParseHostPort(target, "coordinator");
  absl::Status st = hp.ok() ? lease->Connect(hp->host, hp->port.value_or(a.lease_port())) : hp.status();
  if (!st.ok()) spdlog::warn("no lease datagrams ({}); heartbeating on the stream", std::string(st.message()));
  return st.ok();
}
}  // namespace

void CoordinatorWatch::Loop(v1::Assignment a) {
  const CoordinatorSession::Options& opts = session_->options();
  RetryPacer pacer(opts.retry, session_->clock());
  // Lease datagrams when the coordinator takes them (else, or once it says they do not arrive,
  // heartbeats on the stream).
  LeaseSender lease;
  std::string lease_target = client_->target();
  bool by_udp = StartLeaseDatagrams(lease_target, a, &lease);
  LeaseBeat beat;
  beat.run_id = opts.run_id;
  beat.node_id = opts.node.node_id();
  beat.round = a.round();
  for (;;) {
    if (by_udp && client_->target() != lease_target) {  // another replica leads now
      lease_target = client_->target();
      by_udp = StartLeaseDatagrams(lease_target, a, &lease);
    }
    std::optional<StreamEnd> end = WatchOnce(a, by_udp, &beat, &lease);
    if (!end) return;  // stopped
    if (!end->got) {
      if (!RideOut(a, end->status, &pacer)) return;
      continue;
    }
    pacer.Reached();
    if (unreachable_.exchange(false)) spdlog::info("coordinator at {} is back", client_->target());
    switch (ClassifyWatchAnswer(end->resp)) {
      case WatchAnswer::kReregister:
        spdlog::warn("the coordinator does not know this node (it restarted): re-registering");
        Backoff(opts.retry.first);
        break;
      case WatchAnswer::kHeartbeatOnStream:
        spdlog::warn("lease datagrams to UDP port {} of the coordinator do not arrive; heartbeating on the stream",
                     a.lease_port());
        by_udp = false;
        break;
      case WatchAnswer::kDeliver:
        Deliver(end->resp);
        return;
    }
  }
}

std::optional<CoordinatorWatch::StreamEnd> CoordinatorWatch::WatchOnce(const v1::Assignment& a, bool by_udp,
                                                                       LeaseBeat* beat, LeaseSender* lease) {
  std::unique_ptr<WatchStream> stream = client_->Watch();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_) return std::nullopt;
    stream_ = stream.get();
  }
  // The reader waits for the coordinator's one answer; this thread renews the lease.
  StreamEnd end;
  bool ended = false;
  std::thread reader([&] {
    NameThisThread("launch-watchrd");
    end.got = stream->Receive(&end.resp);
    std::lock_guard<std::mutex> lock(mu_);
    ended = true;
    cv_.notify_all();
  });
  if (Renew(stream.get(), a, by_udp, beat, lease, &ended)) stream->Cancel();
  reader.join();
  {
    std::lock_guard<std::mutex> lock(mu_);
    stream_ = nullptr;
    if (stop_) return std::nullopt;
  }
  if (!end.got) end.status = stream->Finish();
  return end;
}

bool CoordinatorWatch::Renew(WatchStream* stream, const v1::Assignment& a, bool by_udp, LeaseBeat* beat,
                             LeaseSender* lease, const bool* ended) {
  // The first message carries what a restarted coordinator needs to rebuild the run.
  v1::HeartbeatRequest hb = session_->Registration(a);
  hb.set_lease_by_udp(by_udp);
  for (int sent = 0;; ++sent) {
    // With datagrams, the stream carries the first three heartbeats only: by the third the
    // coordinator knows whether the datagrams arrive.
    if (!by_udp || sent < 3) {
      if (!stream->Send(hb)) return false;  // broken: the reader ends too
      hb.clear_node();
      hb.clear_assignment();
      hb.clear_spec();
    }
    if (by_udp) {
      // A sequence number that only grows: the steady clock, in nanoseconds.
      beat->seq = static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
      auto datagram = EncodeLeaseBeat(*beat, a.lease_key());
      if (datagram.ok()) lease->Send(*datagram);
    }
    std::unique_lock<std::mutex> lock(mu_);
    session_->clock()->WaitFor(lock, cv_, interval_, [&] { return stop_ || *ended; });
    if (stop_ || *ended) return stop_;
  }
}

bool CoordinatorWatch::RideOut(const v1::Assignment& a, const absl::Status& ended_with, RetryPacer* pacer) {
  const CoordinatorSession::Options& opts = session_->options();
  if (!CoordinatorUnreachable(ended_with)) {
    // The coordinator refuses us (wrong token, run closed): nothing to wait for.
    spdlog::error("{}", std::string(ended_with.message()));
    v1::HeartbeatResponse refused;
    refused.set_stop_workers(true);
    refused.set_reason(std::string(ended_with.message()));
    Deliver(refused);
    return false;
  }
  if (!unreachable_.exchange(true)) {
    // The message names the coordinator (or replica) that was asked.
    spdlog::warn("coordinator unreachable ({}); the workers keep running, retrying", std::string(ended_with.message()));
  }
  const std::chrono::milliseconds delay = pacer->Unreachable();
  if (!a.coordinator_host().empty() && pacer->unreachable_for() >= opts.patience) {
    v1::HeartbeatResponse gone;
    gone.set_stop_workers(true);
    gone.set_job_failed(true);
    gone.set_reason(HostedCoordinatorGone(client_->target(), a.coordinator_host(), opts.patience));
    Deliver(gone);
    return false;
  }
  Backoff(delay);
  return true;
}

void CoordinatorWatch::Deliver(const v1::HeartbeatResponse& resp) {
  std::lock_guard<std::mutex> lock(mu_);
  answer_ = resp;
  Signal(event_.get());
}

}  // namespace launch
