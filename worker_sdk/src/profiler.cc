#include "launch_sdk/profiler.h"

#include <torch/csrc/autograd/profiler_legacy.h>
#include <torch/cuda.h>

#include "torch_compat.h"
#if LAUNCH_SDK_KINETO_API
#include <torch/csrc/autograd/profiler_kineto.h>
#endif

#include <cstdio>
#include <cstdlib>
#include <set>
#include <stdexcept>

#include "launch_sdk/contract.h"

namespace launch_sdk {

struct StepProfiler::Impl {
  std::unique_ptr<torch::autograd::profiler::RecordProfile> legacy;
  bool kineto = false;
};

namespace {
std::string FirstLine(const std::string& s) { return s.substr(0, s.find('\n')); }
}  // namespace

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
    throw std::invalid_argument(std::string(kProfileStepsEnv) + "=" + spec + ": expected a-b with 1 <= a <= b");
  }
}

StepProfiler StepProfiler::FromEnv(int rank) {
  const char* spec = std::getenv(kProfileStepsEnv);
  const char* dir = std::getenv(kLogDirEnv);
  std::string base = dir && *dir ? std::string(dir) + "/" : std::string();
  return StepProfiler(spec ? spec : "", base + "trace_rank" + std::to_string(rank) + ".json");
}

StepProfiler::StepProfiler(StepProfiler&&) noexcept = default;

StepProfiler::~StepProfiler() { Stop(); }

void StepProfiler::BeginStep(int64_t step) {
  if (first_ < 0) return;
  if (step == first_ && !recording()) {
    Start();
  } else if (step == last_ + 1) {
    Stop();
  }
}

bool StepProfiler::recording() const { return impl_ && (impl_->kineto || impl_->legacy); }

void StepProfiler::Start() {
#if LAUNCH_SDK_KINETO_API
  // Kineto records CPU operators and, with CUDA, the kernels and copies on the GPU.
  namespace prof = torch::profiler::impl;
  std::set<prof::ActivityType> activities = {prof::ActivityType::CPU};
  if (torch::cuda::is_available()) activities.insert(prof::ActivityType::CUDA);
  try {
    const prof::ProfilerConfig config(prof::ProfilerState::KINETO);
    torch::autograd::profiler::prepareProfiler(config, activities);
    torch::autograd::profiler::enableProfiler(config, activities);
    impl_->kineto = true;
    kineto_ = true;
    return;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "launch_sdk: the kineto profiler is not available (%s); recording CPU operators only\n",
                 FirstLine(e.what()).c_str());
  }
#endif
  impl_->legacy = std::make_unique<torch::autograd::profiler::RecordProfile>(path_);
}

void StepProfiler::Stop() {
  if (!impl_) return;
  impl_->legacy.reset();  // its destructor writes the trace
#if LAUNCH_SDK_KINETO_API
  if (impl_->kineto) {
    impl_->kineto = false;
    try {
      torch::autograd::profiler::disableProfiler()->save(path_);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "launch_sdk: could not write the profiler trace %s: %s\n", path_.c_str(),
                   FirstLine(e.what()).c_str());
    }
  }
#endif
}

}  // namespace launch_sdk
