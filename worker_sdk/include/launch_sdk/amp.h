// Mixed precision: an autocast scope (bf16 on CPU; fp16 or bf16 on CUDA) and a GradScaler with
// a dynamic loss scale: a step with inf/nan gradients is skipped and the scale lowered; after
// growth_interval good steps the scale grows.
#pragma once

#include <cstdint>
#include <vector>

#include <ATen/ATen.h>
#include <c10/core/Device.h>
#include "launch_sdk/comm.h"
#include <torch/optim/optimizer.h>

namespace launch_sdk {

class Autocast {
 public:
  // dtype: at::kBFloat16 on CPU; at::kHalf or at::kBFloat16 on CUDA.
  Autocast(c10::DeviceType device, at::ScalarType dtype, bool enabled = true);
  ~Autocast();
  Autocast(const Autocast&) = delete;
  Autocast& operator=(const Autocast&) = delete;

 private:
  c10::DeviceType device_;
  bool enabled_;
  bool prev_enabled_;
  at::ScalarType prev_dtype_;
};

struct GradScalerOptions {
  double init_scale = 65536.0;
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;
  bool enabled = true;
};

class GradScaler {
 public:
  // pg (may be null): found-inf is agreed across ranks so every rank skips the same steps.
  explicit GradScaler(GradScalerOptions opts = {}, c10::intrusive_ptr<Comm> pg = {});

  at::Tensor Scale(const at::Tensor& loss) const;
  // Unscales the gradients in place and checks them; idempotent until the next Update.
  void Unscale(torch::optim::Optimizer& optim);
  // Steps unless the gradients had inf/nan; returns whether it stepped.
  bool Step(torch::optim::Optimizer& optim);
  void Update();

  double scale() const { return scale_; }
  int64_t growth_tracker() const { return growth_tracker_; }
  void set_state(double scale, int64_t growth_tracker) {
    scale_ = scale;
    growth_tracker_ = growth_tracker;
  }
  bool found_inf() const { return found_inf_; }

 private:
  GradScalerOptions opts_;
  c10::intrusive_ptr<Comm> pg_;
  double scale_;
  int64_t growth_tracker_ = 0;
  bool unscaled_ = false;
  bool found_inf_ = false;
};

}  // namespace launch_sdk
