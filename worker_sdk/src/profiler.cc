#include "launch_sdk/profiler.h"

#include <torch/csrc/autograd/profiler_legacy.h>

#include <cstdlib>
#include <stdexcept>

namespace launch_sdk {

struct StepProfiler::Impl {
  std::unique_ptr<torch::autograd::profiler::RecordProfile> recording;
};

StepProfiler::StepProfiler(const std::string& spec, std::string trace_path)
    : path_(std::move(trace_path)), impl_(std::make_unique<Impl>()) {
  if (spec.empty()) return;
  auto dash = spec.find('-');
  try {
    if (dash == std::string::npos) {
      first_ = last_ = std::stoll(spec);
    } else {
      first_ = std::stoll(spec.substr(0, dash));
      last_ = std::stoll(spec.substr(dash + 1));
    }
  } catch (const std::exception&) {
    first_ = -2;
  }
  if (first_ < 1 || last_ < first_) {
    throw std::invalid_argument("LAUNCH_PROFILE_STEPS=" + spec + ": expected a-b with 1 <= a <= b");
  }
}

StepProfiler StepProfiler::FromEnv(int rank) {
  const char* spec = std::getenv("LAUNCH_PROFILE_STEPS");
  const char* dir = std::getenv("LAUNCH_LOG_DIR");
  std::string base = dir && *dir ? std::string(dir) + "/" : std::string();
  return StepProfiler(spec ? spec : "", base + "trace_rank" + std::to_string(rank) + ".json");
}

StepProfiler::StepProfiler(StepProfiler&&) noexcept = default;

StepProfiler::~StepProfiler() { Stop(); }

void StepProfiler::BeginStep(int64_t step) {
  if (first_ < 0) return;
  if (step == first_ && !impl_->recording) {
    impl_->recording = std::make_unique<torch::autograd::profiler::RecordProfile>(path_);
  } else if (step == last_ + 1) {
    Stop();
  }
}

void StepProfiler::Stop() {
  if (impl_ && impl_->recording) impl_->recording.reset();  // the destructor writes the trace
}

}  // namespace launch_sdk
