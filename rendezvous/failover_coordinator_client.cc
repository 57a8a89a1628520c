#include "rendezvous/failover_coordinator_client.h"

#include "absl/strings/str_cat.h"

namespace launch {

FailoverCoordinatorClient::FailoverCoordinatorClient(std::vector<std::unique_ptr<CoordinatorClient>> replicas)
    : replicas_(std::move(replicas)) {}

std::string FailoverCoordinatorClient::target() const {
  std::lock_guard<std::mutex> lock(mu_);
  return replicas_[current_]->target();
}

std::string FailoverCoordinatorClient::targets() const {
  std::string out;
  for (const auto& r : replicas_) absl::StrAppend(&out, out.empty() ? "" : ",", r->target());
  return out;
}

void FailoverCoordinatorClient::SetNodeKey(const std::string& key) {
  for (auto& r : replicas_) r->SetNodeKey(key);
}

void FailoverCoordinatorClient::Next(size_t from) {
  std::lock_guard<std::mutex> lock(mu_);
  if (current_ == from) current_ = (from + 1) % replicas_.size();
}

template <typename T, typename F>
absl::StatusOr<T> FailoverCoordinatorClient::OnSomeReplica(F&& call) {
  size_t first;
  {
    std::lock_guard<std::mutex> lock(mu_);
    first = current_;
  }
  absl::StatusOr<T> result = absl::UnavailableError("no coordinator replica");
  for (size_t i = 0; i < replicas_.size(); ++i) {
    const size_t at = (first + i) % replicas_.size();
    result = call(replicas_[at].get());
    if (absl::IsCancelled(result.status())) return result;  // cut short here, not unreachable
    if (result.ok() || !CoordinatorUnreachable(result.status())) {
      std::lock_guard<std::mutex> lock(mu_);
      current_ = at;
      return result;
    }
  }
  Next(first);  // every replica was tried: the next try starts after the one tried first
  return result;
}

absl::StatusOr<v1::Assignment> FailoverCoordinatorClient::Join(const v1::JoinRequest& req, CallCanceller* cancel) {
  return OnSomeReplica<v1::Assignment>([&](CoordinatorClient* c) { return c->Join(req, cancel); });
}

absl::StatusOr<v1::HeartbeatResponse> FailoverCoordinatorClient::Heartbeat(const v1::HeartbeatRequest& req) {
  return OnSomeReplica<v1::HeartbeatResponse>([&](CoordinatorClient* c) { return c->Heartbeat(req); });
}

absl::StatusOr<v1::ReportExitResponse> FailoverCoordinatorClient::ReportExit(const v1::ReportExitRequest& req,
                                                                             std::chrono::milliseconds timeout) {
  return OnSomeReplica<v1::ReportExitResponse>([&](CoordinatorClient* c) { return c->ReportExit(req, timeout); });
}

absl::StatusOr<v1::SampleResponse> FailoverCoordinatorClient::Sample(const v1::SampleRequest& req,
                                                                     std::chrono::milliseconds timeout) {
  return OnSomeReplica<v1::SampleResponse>([&](CoordinatorClient* c) { return c->Sample(req, timeout); });
}

namespace {
// A Watch stream on one replica: when it ends unreachable, the next stream goes to the next one.
class FailoverWatchStream final : public WatchStream {
 public:
  FailoverWatchStream(std::unique_ptr<WatchStream> inner, FailoverCoordinatorClient* client, size_t at)
      : inner_(std::move(inner)), client_(client), at_(at) {}
  bool Send(const v1::HeartbeatRequest& hb) override { return inner_->Send(hb); }
  bool Receive(v1::HeartbeatResponse* resp) override { return inner_->Receive(resp); }
  absl::Status Finish() override {
    absl::Status st = inner_->Finish();
    if (!st.ok() && CoordinatorUnreachable(st) && !absl::IsCancelled(st)) client_->Next(at_);
    return st;
  }
  void Cancel() override { inner_->Cancel(); }

 private:
  std::unique_ptr<WatchStream> inner_;
  FailoverCoordinatorClient* client_;
  size_t at_;
};
}  // namespace

std::unique_ptr<WatchStream> FailoverCoordinatorClient::Watch() {
  size_t at;
  {
    std::lock_guard<std::mutex> lock(mu_);
    at = current_;
  }
  return std::make_unique<FailoverWatchStream>(replicas_[at]->Watch(), this, at);
}

}  // namespace launch
