#include "launch_sdk/ddp.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/engine.h>

#include <stdexcept>

namespace launch_sdk {

DistributedDataParallel::DistributedDataParallel(std::shared_ptr<torch::nn::Module> module,
                                                 c10::intrusive_ptr<Comm> pg,
                                                 DdpOptions opts)
    : module_(std::move(module)), pg_(std::move(pg)), opts_(opts) {
  for (auto& p : module_->parameters())
    if (p.requires_grad()) params_.push_back(p);
  if (params_.empty()) throw std::invalid_argument("DistributedDataParallel: the module has no trainable parameters");

  // Every rank starts from rank 0's weights.
  {
    at::NoGradGuard no_grad;
    std::vector<at::Tensor> all = module_->parameters();
    for (auto& b : module_->buffers()) all.push_back(b);
    c10d::BroadcastOptions bo;
    bo.rootRank = 0;
    for (auto& t : all) {
      std::vector<at::Tensor> one = {t};
      pg_->broadcast(one, bo)->wait();
    }
  }

  // Buckets in reverse parameter order: roughly the order backward produces gradients.
  bucket_of_.assign(params_.size(), 0);
  seen_.assign(params_.size(), false);
  size_t bytes = 0;
  for (size_t k = params_.size(); k-- > 0;) {
    const at::Tensor& p = params_[k];
    const size_t pbytes = static_cast<size_t>(p.numel()) * p.element_size();
    bool fresh = buckets_.empty() || bytes + pbytes > opts_.bucket_bytes ||
                 params_[buckets_.back().params.front()].scalar_type() != p.scalar_type() ||
                 params_[buckets_.back().params.front()].device() != p.device();
    if (fresh) {
      buckets_.emplace_back();
      bytes = 0;
    }
    Bucket& b = buckets_.back();
    b.offsets.push_back(b.params.empty() ? 0 : b.offsets.back() + params_[b.params.back()].numel());
    b.params.push_back(k);
    bucket_of_[k] = buckets_.size() - 1;
    bytes += pbytes;
  }
  for (auto& b : buckets_) {
    int64_t numel = b.offsets.back() + params_[b.params.back()].numel();
    b.flat = at::zeros({numel}, params_[b.params.front()].options());
    b.pending = b.params.size();
  }
  for (size_t k = 0; k < params_.size(); ++k) {
    hooks_.push_back(params_[k].register_hook([this, k](const at::Tensor& grad) { OnGrad(k, grad); }));
  }
}

DistributedDataParallel::~DistributedDataParallel() {
  for (size_t k = 0; k < params_.size() && k < hooks_.size(); ++k) params_[k].remove_hook(hooks_[k]);
}

at::Tensor DistributedDataParallel::View(size_t param) {
  Bucket& b = buckets_[bucket_of_[param]];
  size_t pos = 0;
  while (b.params[pos] != param) ++pos;
  return b.flat.narrow(0, b.offsets[pos], params_[param].numel()).view(params_[param].sizes());
}

void DistributedDataParallel::OnGrad(size_t param, const at::Tensor& grad) {
  if (!sync_) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (!finish_queued_) {
    finish_queued_ = true;
    torch::autograd::Engine::get_default_engine().queue_callback([this] { Finish(); });
  }
  if (seen_[param]) return;  // a second gradient for the same parameter in one backward
  at::NoGradGuard no_grad;
  at::Tensor view = View(param);
  view.copy_(grad);
  // Gradients accumulated under NoSync are averaged together with this one.
  const at::Tensor& acc = params_[param].grad();
  if (acc.defined()) view.add_(acc);
  seen_[param] = true;
  Bucket& b = buckets_[bucket_of_[param]];
  if (--b.pending == 0) {
    b.ready = true;
    LaunchReadyBuckets();
  }
}

void DistributedDataParallel::LaunchReadyBuckets() {
  // Every rank launches buckets in the same order, whatever order their gradients came in.
  const int world = pg_->getSize();
  while (next_bucket_ < buckets_.size() && buckets_[next_bucket_].ready) {
    Bucket& b = buckets_[next_bucket_++];
    b.flat.div_(world);
    std::vector<at::Tensor> one = {b.flat};
    b.work = pg_->allreduce(one);
  }
}

void DistributedDataParallel::Finish() {
  std::lock_guard<std::mutex> lock(mu_);
  at::NoGradGuard no_grad;
  // Parameters that took no part in this forward contribute what they hold (or zeros).
  for (auto& b : buckets_) {
    if (b.ready) continue;
    for (size_t k : b.params) {
      if (seen_[k]) continue;
      at::Tensor view = View(k);
      const at::Tensor& acc = params_[k].grad();
      if (acc.defined()) view.copy_(acc);
      else view.zero_();
      seen_[k] = true;
    }
    b.pending = 0;
    b.ready = true;
  }
  LaunchReadyBuckets();
  for (auto& b : buckets_) {
    b.work->wait();
    b.work.reset();
    for (size_t k : b.params) {
      at::Tensor view = View(k);
      at::Tensor& g = params_[k].mutable_grad();
      if (g.defined()) g.copy_(view);
      else g = view.clone();
    }
    b.pending = b.params.size();
    b.ready = false;
  }
  std::fill(seen_.begin(), seen_.end(), false);
  next_bucket_ = 0;
  finish_queued_ = false;
}

void DistributedDataParallel::SyncBuffers() {
  if (!opts_.broadcast_buffers) return;
  at::NoGradGuard no_grad;
  c10d::BroadcastOptions bo;
  bo.rootRank = 0;
  for (auto& t : module_->buffers()) {
    std::vector<at::Tensor> one = {t};
    pg_->broadcast(one, bo)->wait();
  }
}

}  // namespace launch_sdk
