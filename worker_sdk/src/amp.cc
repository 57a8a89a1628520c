#include "launch_sdk/amp.h"

#include <ATen/autocast_mode.h>

#include <stdexcept>
#include <string>

#include "torch_compat.h"

namespace launch_sdk {

namespace {

#if LAUNCH_SDK_AUTOCAST_BY_DEVICE
bool IsEnabled(c10::DeviceType d) { return at::autocast::is_autocast_enabled(d); }
at::ScalarType GetDtype(c10::DeviceType d) { return at::autocast::get_autocast_dtype(d); }
void Set(c10::DeviceType d, bool enabled, at::ScalarType dtype) {
  at::autocast::set_autocast_enabled(d, enabled);
  at::autocast::set_autocast_dtype(d, dtype);
}
#else
bool IsEnabled(c10::DeviceType d) {
  return d == c10::kCPU ? at::autocast::is_cpu_enabled() : at::autocast::is_enabled();
}
at::ScalarType GetDtype(c10::DeviceType d) {
  return d == c10::kCPU ? at::autocast::get_autocast_cpu_dtype() : at::autocast::get_autocast_gpu_dtype();
}
void Set(c10::DeviceType d, bool enabled, at::ScalarType dtype) {
  if (d == c10::kCPU) {
    at::autocast::set_cpu_enabled(enabled);
    at::autocast::set_autocast_cpu_dtype(dtype);
  } else {
    at::autocast::set_enabled(enabled);
    at::autocast::set_autocast_gpu_dtype(dtype);
  }
}
#endif

}  // namespace

Autocast::Autocast(c10::DeviceType device, at::ScalarType dtype, bool enabled) : device_(device), enabled_(enabled) {
  if (enabled_ && device_ != c10::kCPU && device_ != c10::kCUDA)
    throw std::invalid_argument(std::string("Autocast: device type ") + c10::DeviceTypeName(device_) +
                                ": expected cpu or cuda");
#if !LAUNCH_SDK_AUTOCAST_BY_DEVICE
  if (enabled_ && device_ == c10::kCPU && dtype != at::kBFloat16)
    throw std::invalid_argument(std::string("Autocast: ") + c10::toString(dtype) +
                                " on cpu: expected BFloat16 (this LibTorch autocasts only bf16 on cpu)");
#endif
  if (enabled_ && dtype != at::kBFloat16 && dtype != at::kHalf)
    throw std::invalid_argument(std::string("Autocast: dtype ") + c10::toString(dtype) + ": expected Half or BFloat16");
  prev_enabled_ = IsEnabled(device_);
  prev_dtype_ = GetDtype(device_);
  if (!enabled_) return;
  Set(device_, true, dtype);
  at::autocast::increment_nesting();
}

Autocast::~Autocast() {
  if (!enabled_) return;
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  Set(device_, prev_enabled_, prev_dtype_);
}

GradScaler::GradScaler(GradScalerOptions opts, c10::intrusive_ptr<Comm> pg)
    : opts_(opts), pg_(std::move(pg)), scale_(opts.init_scale) {}

at::Tensor GradScaler::Scale(const at::Tensor& loss) const { return opts_.enabled ? loss * scale_ : loss; }

void GradScaler::Unscale(torch::optim::Optimizer& optim) {
  if (!opts_.enabled || unscaled_) return;
  at::NoGradGuard no_grad;
  const double inv = 1.0 / scale_;
  // Counted where the gradients live, so a CUDA step waits on the device once, not per tensor.
  at::Tensor non_finite;
  c10::Device device = c10::kCPU;
  for (auto& group : optim.param_groups()) {
    for (auto& p : group.params()) {
      device = p.device();
      at::Tensor& g = p.mutable_grad();
      if (!g.defined()) continue;
      g.mul_(inv);
      at::Tensor bad = g.isfinite().all().logical_not().to(at::kFloat).reshape({1});
      non_finite = non_finite.defined() ? non_finite.add_(bad.to(non_finite.device())) : bad;
    }
  }
  if (!non_finite.defined()) non_finite = at::zeros({1}, at::TensorOptions(at::kFloat).device(device));
  if (pg_ && pg_->getSize() > 1) {
    // The flag lives with the gradients: on the GPU for NCCL, on the host for Gloo.
    std::vector<at::Tensor> flag = {non_finite};
    c10d::AllreduceOptions o;
    o.reduceOp = c10d::ReduceOp::MAX;
    pg_->allreduce(flag, o)->wait();
    non_finite = flag[0];
  }
  found_inf_ = non_finite.item<float>() > 0;
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
