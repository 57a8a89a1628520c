#include "launch_sdk/scaling.h"

#include <cmath>

namespace launch_sdk {

Scaled ScaleForWorld(const ScalingConfig& c, int world_size) {
  Scaled s;
  s.global_batch = c.per_worker_batch * world_size * c.grad_accum_steps;
  const int base = c.base_batch > 0 ? c.base_batch : c.per_worker_batch;
  const double ratio = static_cast<double>(s.global_batch) / base;
  switch (c.mode) {
    case LrScaling::kLinear:
      s.lr_scale = ratio;
      break;
    case LrScaling::kSqrt:
      s.lr_scale = std::sqrt(ratio);
      break;
    case LrScaling::kNone:
      s.lr_scale = 1;
      break;
  }
  s.peak_lr = c.base_lr * s.lr_scale;
  return s;
}

double LrAtStep(const ScalingConfig& c, int world_size, long step) {
  const Scaled s = ScaleForWorld(c, world_size);
  if (c.warmup_steps <= 0 || step >= c.warmup_steps) return s.peak_lr;
  const double t = static_cast<double>(step + 1) / c.warmup_steps;
  return c.base_lr + (s.peak_lr - c.base_lr) * t;
}

}  // namespace launch_sdk
