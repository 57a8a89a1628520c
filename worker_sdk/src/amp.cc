#include "launch_sdk/amp.h"

#include <ATen/autocast_mode.h>

namespace launch_sdk {

Autocast::Autocast(c10::DeviceType device, at::ScalarType dtype, bool enabled)
    : device_(device), enabled_(enabled) {
  if (device_ == c10::kCPU) {
    prev_enabled_ = at::autocast::is_cpu_enabled();
    prev_dtype_ = at::autocast::get_autocast_cpu_dtype();
    if (enabled_) {
      at::autocast::set_cpu_enabled(true);
      at::autocast::set_autocast_cpu_dtype(dtype);
    }
  } else {
    prev_enabled_ = at::autocast::is_enabled();
    prev_dtype_ = at::autocast::get_autocast_gpu_dtype();
    if (enabled_) {
      at::autocast::set_enabled(true);
      at::autocast::set_autocast_gpu_dtype(dtype);
    }
  }
  if (enabled_) at::autocast::increment_nesting();
}

Autocast::~Autocast() {
  if (!enabled_) return;
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  if (device_ == c10::kCPU) {
    at::autocast::set_cpu_enabled(prev_enabled_);
    at::autocast::set_autocast_cpu_dtype(prev_dtype_);
  } else {
    at::autocast::set_enabled(prev_enabled_);
    at::autocast::set_autocast_gpu_dtype(prev_dtype_);
  }
}

GradScaler::GradScaler(GradScalerOptions opts, c10::intrusive_ptr<Comm> pg)
    : opts_(opts), pg_(std::move(pg)), scale_(opts.init_scale) {}

at::Tensor GradScaler::Scale(const at::Tensor& loss) const {
  return opts_.enabled ? loss * scale_ : loss;
}

void GradScaler::Unscale(torch::optim::Optimizer& optim) {
  if (!opts_.enabled || unscaled_) return;
  at::NoGradGuard no_grad;
  const double inv = 1.0 / scale_;
  bool inf = false;
  for (auto& group : optim.param_groups()) {
    for (auto& p : group.params()) {
      at::Tensor& g = p.mutable_grad();
      if (!g.defined()) continue;
      g.mul_(inv);
      if (!inf && !g.isfinite().all().item<bool>()) inf = true;
    }
  }
  if (pg_ && pg_->getSize() > 1) {
    std::vector<at::Tensor> flag = {at::tensor({inf ? 1.0f : 0.0f})};
    c10d::AllreduceOptions o;
    o.reduceOp = c10d::ReduceOp::MAX;
    pg_->allreduce(flag, o)->wait();
    inf = flag[0].item<float>() > 0;
  }
  found_inf_ = inf;
  unscaled_ = true;
}

bool GradScaler::Step(torch::optim::Optimizer& optim) {
  if (!opts_.enabled) {
    optim.step();
    return true;
  }
  Unscale(optim);
  if (found_inf_) return false;
  optim.step();
  return true;
}

void GradScaler::Update() {
  if (!opts_.enabled) return;
  if (found_inf_) {
    scale_ *= opts_.backoff_factor;
    growth_tracker_ = 0;
  } else if (++growth_tracker_ >= opts_.growth_interval) {
    scale_ *= opts_.growth_factor;
    growth_tracker_ = 0;
  }
  unscaled_ = false;
  found_inf_ = false;
}

}  // namespace launch_sdk
