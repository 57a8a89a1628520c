#include "agent/coordinator_watch.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <optional>

#include "absl/strings/str_cat.h"
#include "agent/heartbeat_order.h"
#include "common/lease.h"
#include "common/net.h"
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
  unreachable_ = false;
  thread_ = std::thread([this, a] { Loop(a); });
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
}

v1::HeartbeatResponse CoordinatorWatch::answer() const {
  std::lock_guard<std::mutex> lock(mu_);
  return answer_;
}

void CoordinatorWatch::Backoff(std::chrono::milliseconds d) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, d, [&] { return stop_; });
}

std::string HostedCoordinatorGone(const std::string& target, const std::string& host,
                                  std::chrono::milliseconds patience) {
  return absl::StrCat("the coordinator at ", target, ", hosted by the agent of ", host, ", has been unreachable for ",
                      patience.count() / 1000.0,
                      " s: that node is gone and the job cannot go on without it (a standalone `launch "
                      "coordinator` survives the loss of any node)");
}

void CoordinatorWatch::Loop(v1::Assignment a) {
  const CoordinatorSession::Options& opts = session_->options();
  RetryPacer pacer(opts.retry, session_->clock());
  // Lease datagrams when the coordinator takes them (else, or once it says they do not arrive,
  // heartbeats on the stream).
  LeaseSender lease;
  bool by_udp = false;
  if (a.lease_port() > 0 && a.lease_key().size() == kLeaseKeyBytes) {
    auto hp = ParseHostPort(client_->target(), "coordinator");
    absl::Status st = hp.ok() ? lease.Connect(hp->host, a.lease_port()) : hp.status();
    by_udp = st.ok();
    if (!st.ok()) spdlog::warn("no lease datagrams ({}); heartbeating on the stream", std::string(st.message()));
  }
  LeaseBeat beat;
  beat.run_id = opts.run_id;
  beat.node_id = opts.node.node_id();
  beat.round = a.round();
  for (;;) {
    std::unique_ptr<WatchStream> stream = client_->Watch();
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stop_) return;
      stream_ = stream.get();
    }
    // The reader waits for the coordinator's one answer; this thread renews the lease.
    v1::HeartbeatResponse resp;
    bool got = false, ended = false;
    std::thread reader([&] {
      got = stream->Receive(&resp);
      std::lock_guard<std::mutex> lock(mu_);
      ended = true;
      cv_.notify_all();
    });
    // The first message carries what a restarted coordinator needs to rebuild the run.
    v1::HeartbeatRequest hb = session_->Registration(a);
    hb.set_lease_by_udp(by_udp);
    bool stopped = false;
    for (int sent = 0;; ++sent) {
      // With datagrams, the stream carries the first three heartbeats only: by the third the
      // coordinator knows whether the datagrams arrive.
      if (!by_udp || sent < 3) {
        if (!stream->Send(hb)) break;  // broken: the reader ends too
        hb.clear_node();
        hb.clear_assignment();
        hb.clear_spec();
      }
      if (by_udp) {
        // A sequence number that only grows: the steady clock, in nanoseconds.
        beat.seq = static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
        auto datagram = EncodeLeaseBeat(beat, a.lease_key());
        if (datagram.ok()) lease.Send(*datagram);
      }
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_for(lock, interval_, [&] { return stop_ || ended; });
      if (stop_ || ended) {
        stopped = stop_;
        break;
      }
    }
    if (stopped) stream->Cancel();
    reader.join();
    {
      std::lock_guard<std::mutex> lock(mu_);
      stream_ = nullptr;
      if (stop_) return;
    }
    absl::Status ended_with = got ? absl::OkStatus() : stream->Finish();
    stream.reset();
    if (got) {
      pacer.Reached();
      if (unreachable_.exchange(false)) spdlog::info("coordinator at {} is back", client_->target());
      const HeartbeatOrder order = OrderOf(resp);
      if (order == HeartbeatOrder::kReregister) {
        spdlog::warn("the coordinator does not know this node (it restarted): re-registering");
        Backoff(opts.retry.first);
        continue;
      }
      if (order == HeartbeatOrder::kLeaseByStream) {
        spdlog::warn("lease datagrams to UDP port {} of the coordinator do not arrive; heartbeating on the stream",
                     a.lease_port());
        by_udp = false;
        continue;
      }
      std::lock_guard<std::mutex> lock(mu_);
      answer_ = resp;
      Signal(event_.get());
      return;
    }
    if (!CoordinatorUnreachable(ended_with)) {
      // The coordinator refuses us (wrong token, run closed): nothing to wait for.
      spdlog::error("{}", std::string(ended_with.message()));
      std::lock_guard<std::mutex> lock(mu_);
      answer_.set_stop_workers(true);
      answer_.set_reason(std::string(ended_with.message()));
      Signal(event_.get());
      return;
    }
    if (!unreachable_.exchange(true)) {
      spdlog::warn("coordinator at {} unreachable ({}); the workers keep running, retrying", client_->target(),
                   std::string(ended_with.message()));
    }
    const std::chrono::milliseconds delay = pacer.Unreachable();
    if (!a.coordinator_host().empty() && pacer.unreachable_for() >= opts.patience) {
      std::lock_guard<std::mutex> lock(mu_);
      answer_.set_stop_workers(true);
      answer_.set_job_failed(true);
      answer_.set_reason(HostedCoordinatorGone(client_->target(), a.coordinator_host(), opts.patience));
      Signal(event_.get());
      return;
    }
    Backoff(delay);
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
