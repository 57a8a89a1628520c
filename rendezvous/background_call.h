// One blocking call to the coordinator (a Join) on a thread of its own, so that the agent's poll
// loop goes on watching its signals and can cancel the call.
#pragma once

#include <functional>
#include <thread>

#include "absl/status/status.h"
#include "rendezvous/coordinator_client.h"
#include "common/unique_fd.h"

namespace launch {

class BackgroundCall {
 public:
  ~BackgroundCall() { Wait(); }
  // Runs `fn` on a thread; fd() becomes readable when it returns.
  absl::Status Start(std::function<void(CallCanceller*)> fn);
  int fd() const { return event_.get(); }
  void Cancel() { cancel_.Cancel(); }
  void Wait();

 private:
  UniqueFd event_;
  std::thread thread_;
  CallCanceller cancel_;
};

}  // namespace launch
