// LAUNCH_PROFILE_STEPS=a-b: LibTorch's profiler records steps a..b and writes a Chrome trace
// (chrome://tracing, Perfetto) per rank into the log directory. LibTorch 2.x records with kineto
// (CPU operators, and with CUDA the GPU's kernels and copies); 1.x, or a 2.x built without
// kineto, with the legacy profiler (CPU operators).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

namespace launch_sdk {

class StepProfiler {
 public:
  // spec "a-b" (inclusive, 1-based steps); empty: never records. Throws on a malformed spec.
  StepProfiler(const std::string& spec, std::string trace_path);
  // From LAUNCH_PROFILE_STEPS, writing <LAUNCH_LOG_DIR or cwd>/trace_rank<rank>.json.
  static StepProfiler FromEnv(int rank);
  ~StepProfiler();
  StepProfiler(StepProfiler&&) noexcept;

  // Call at the start of every step.
  void BeginStep(int64_t step);
  // Stops early (writes the trace) if recording.
  void Stop();
  const std::string& trace_path() const { return path_; }
  bool recording() const;
  // Whether the last recording used kineto (else the legacy profiler).
  bool kineto() const { return kineto_; }
  int64_t first() const { return first_; }
  int64_t last() const { return last_; }

 private:
  struct Impl;
  void Start();
  int64_t first_ = -1, last_ = -1;
  bool kineto_ = false;
  std::string path_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace launch_sdk
