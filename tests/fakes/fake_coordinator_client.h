// The one fake CoordinatorClient of the tests: answers scripted by the test, every call recorded.
// A call past its script fails as an unreachable coordinator would, unless the test asks for a
// coordinator that answers (answer_unscripted): then Join forms a one-node round numbered by the
// call and ReportExit answers "carry on".
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "rendezvous/coordinator_client.h"

namespace launch::testing {

// A Watch stream that never answers: the coordinator has nothing to say until cancelled.
// `sent` (when given) counts the heartbeats sent on it.
class SilentWatchStream : public WatchStream {
 public:
  explicit SilentWatchStream(std::atomic<int>* sent = nullptr) : sent_(sent) {}
  bool Send(const v1::HeartbeatRequest&) override {
    if (sent_) ++*sent_;
    return true;
  }
  bool Receive(v1::HeartbeatResponse*) override {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return cancelled_; });
    return false;
  }
  absl::Status Finish() override { return absl::CancelledError("cancelled"); }
  void Cancel() override {
    std::lock_guard<std::mutex> lock(mu_);
    cancelled_ = true;
    cv_.notify_all();
  }

 private:
  std::atomic<int>* sent_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool cancelled_ = false;
};

// A Watch stream to a coordinator that cannot be reached: it ends at once, Unavailable.
class UnreachableWatchStream : public WatchStream {
 public:
  bool Send(const v1::HeartbeatRequest&) override { return false; }
  bool Receive(v1::HeartbeatResponse*) override { return false; }
  absl::Status Finish() override { return absl::UnavailableError("connection refused"); }
  void Cancel() override {}
};

// A Watch stream that answers at once.
class AnsweringWatchStream : public WatchStream {
 public:
  explicit AnsweringWatchStream(v1::HeartbeatResponse answer) : answer_(std::move(answer)) {}
  bool Send(const v1::HeartbeatRequest&) override { return true; }
  bool Receive(v1::HeartbeatResponse* resp) override {
    *resp = answer_;
    return true;
  }
  absl::Status Finish() override { return absl::OkStatus(); }
  void Cancel() override {}

 private:
  v1::HeartbeatResponse answer_;
};

class FakeCoordinatorClient : public CoordinatorClient {
 public:
  // ---- The script; set before the code under test runs ----
  // Join's answers, in order.
  std::deque<absl::StatusOr<v1::Assignment>> joins;
  // ReportExit's answers, in order; past them, on_report answers when set.
  std::deque<absl::StatusOr<v1::ReportExitResponse>> reports;
  std::function<v1::ReportExitResponse(const v1::ReportExitRequest&)> on_report;
  // The n-th Watch stream (from 1) answers this; nullopt (or no function): it stays silent.
  std::function<std::optional<v1::HeartbeatResponse>(int n)> on_watch;
  // The first this many Watch streams find the coordinator unreachable.
  int unreachable_watches = 0;
  // Sample's answer (a coordinator's straggler events).
  v1::SampleResponse sample_answer;
  // Past the script: false, Join and ReportExit fail as an unreachable coordinator would; true,
  // Join forms round n of one node (restart count n - 1, this max_restarts, the proposed master
  // port) and ReportExit answers an empty verdict.
  bool answer_unscripted = false;
  int max_restarts = 3;
  std::string target_name = "fake";

  // ---- CoordinatorClient ----
  std::unique_ptr<WatchStream> Watch() override {
    const int n = ++watches_;
    if (n <= unreachable_watches) return std::make_unique<UnreachableWatchStream>();
    std::optional<v1::HeartbeatResponse> answer = on_watch ? on_watch(n) : std::nullopt;
    if (answer) return std::make_unique<AnsweringWatchStream>(*answer);
    return std::make_unique<SilentWatchStream>(&stream_heartbeats_);
  }
  absl::StatusOr<v1::Assignment> Join(const v1::JoinRequest& req, CallCanceller*) override {
    std::lock_guard<std::mutex> lock(mu_);
    const int n = ++joins_;
    if (!joins.empty()) {
      auto r = std::move(joins.front());
      joins.pop_front();
      return r;
    }
    if (!answer_unscripted) return absl::UnavailableError("connection refused");
    v1::Assignment a;
    a.set_round(n);
    a.set_restart_count(n - 1);
    a.set_max_restarts(max_restarts);
    a.set_group_world_size(1);
    a.set_world_size(req.node().local_world_size());
    a.set_master_addr("127.0.0.1");
    a.set_master_port(req.proposed_master_port());
    return a;
  }
  absl::StatusOr<v1::HeartbeatResponse> Heartbeat(const v1::HeartbeatRequest& req) override {
    std::lock_guard<std::mutex> lock(mu_);
    heartbeats_.push_back(req);
    return v1::HeartbeatResponse();
  }
  absl::StatusOr<v1::ReportExitResponse> ReportExit(const v1::ReportExitRequest& req,
                                                    std::chrono::milliseconds) override {
    std::function<v1::ReportExitResponse(const v1::ReportExitRequest&)> answer;
    {
      // The agent's early report comes from a thread of its own.
      std::lock_guard<std::mutex> lock(mu_);
      reports_.push_back(req);
      if (!reports.empty()) {
        auto r = std::move(reports.front());
        reports.pop_front();
        return r;
      }
      answer = on_report;
    }
    // Outside the lock: a test's answer may wait for what another report does.
    if (answer) return answer(req);
    if (answer_unscripted) return v1::ReportExitResponse();
    return absl::UnavailableError("connection refused");
  }
  absl::StatusOr<v1::SampleResponse> Sample(const v1::SampleRequest& req, std::chrono::milliseconds) override {
    std::lock_guard<std::mutex> lock(mu_);
    samples_.push_back(req);
    return sample_answer;
  }
  std::string target() const override { return target_name; }

  // ---- What was asked ----
  int join_calls() const { return joins_; }
  int watch_calls() const { return watches_; }
  // Heartbeats sent on the silent Watch streams.
  int stream_heartbeats() const { return stream_heartbeats_; }
  int report_calls() {
    std::lock_guard<std::mutex> lock(mu_);
    return static_cast<int>(reports_.size());
  }
  std::vector<v1::ReportExitRequest> reported() {
    std::lock_guard<std::mutex> lock(mu_);
    return reports_;
  }
  std::vector<v1::HeartbeatRequest> heartbeats() {
    std::lock_guard<std::mutex> lock(mu_);
    return heartbeats_;
  }
  std::vector<v1::SampleRequest> samples() {
    std::lock_guard<std::mutex> lock(mu_);
    return samples_;
  }

 private:
  std::mutex mu_;
  std::atomic<int> joins_{0}, watches_{0}, stream_heartbeats_{0};
  std::vector<v1::ReportExitRequest> reports_;
  std::vector<v1::HeartbeatRequest> heartbeats_;
  std::vector<v1::SampleRequest> samples_;
};

}  // namespace launch::testing
