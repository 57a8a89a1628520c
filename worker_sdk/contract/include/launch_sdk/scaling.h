// Learning-rate and batch scaling by world size, with optional linear warmup. Re-computed
// whenever the world size changes (an elastic round).
#pragma once

namespace launch_sdk {

enum class LrScaling { kLinear, kSqrt, kNone };

struct ScalingConfig {
  double base_lr = 0.1;  // tuned for a global batch of base_batch
  int per_worker_batch = 32;
  int base_batch = 0;  // 0: per_worker_batch (one worker's batch)
  int grad_accum_steps = 1;
  LrScaling mode = LrScaling::kLinear;
  int warmup_steps = 0;  // linear ramp from base_lr to the scaled lr
};

struct Scaled {
  double lr_scale = 1;
  double peak_lr = 0;
  int global_batch = 0;
};

Scaled ScaleForWorld(const ScalingConfig& c, int world_size);
// The lr at `step` (0-based): ramps from base_lr to peak_lr over warmup_steps, then peak_lr.
double LrAtStep(const ScalingConfig& c, int world_size, long step);

}  // namespace launch_sdk
