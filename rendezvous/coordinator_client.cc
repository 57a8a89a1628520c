#include "rendezvous/coordinator_client.h"

namespace launch {

bool CoordinatorUnreachable(const absl::Status& s) {
  return absl::IsUnavailable(s) || absl::IsDeadlineExceeded(s) || absl::IsCancelled(s);
}

void CallCanceller::Cancel() {
  std::lock_guard<std::mutex> lock(mu_);
  if (cancelled_) return;
  cancelled_ = true;
  if (cut_short_) cut_short_();
}

bool CallCanceller::cancelled() const {
  std::lock_guard<std::mutex> lock(mu_);
  return cancelled_;
}

void CallCanceller::Reset() {
  std::lock_guard<std::mutex> lock(mu_);
  cancelled_ = false;
  cut_short_ = nullptr;
}

bool CallCanceller::Attach(std::function<void()> cut_short) {
  std::lock_guard<std::mutex> lock(mu_);
  if (cancelled_) return false;
  cut_short_ = std::move(cut_short);
  return true;
}

void CallCanceller::Detach() {
  std::lock_guard<std::mutex> lock(mu_);
  cut_short_ = nullptr;
}

}  // namespace launch
