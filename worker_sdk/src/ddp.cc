#include "launch_sdk/ddp.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <chrono>
#include <stdexcept>
#include <utility>

#include "launch_sdk/context.h"

namespace launch_sdk {
namespace {

std::vector<at::Tensor> Trainable(const torch::nn::Module& module) {
  std::vector<at::Tensor> params;
  for (auto& p : module.parameters())
    if (p.requires_grad()) params.push_back(p);
  return params;
}

// The buckets, each the indices of its parameters in `params`: in reverse parameter order (roughly
// the order backward produces gradients), a new bucket where the next parameter would take one
// past `bucket_bytes` or differs in type or device.
std::vector<std::vector<size_t>> BucketLayout(const std::vector<at::Tensor>& params, size_t bucket_bytes) {
  std::vector<std::vector<size_t>> buckets;
  size_t bytes = 0;
  for (size_t k = params.size(); k-- > 0;) {
    const at::Tensor& p = params[k];
    const size_t pbytes = static_cast<size_t>(p.numel()) * p.element_size();
    const bool fresh = buckets.empty() || bytes + pbytes > bucket_bytes ||
                       params[buckets.back().front()].scalar_type() != p.scalar_type() ||
                       params[buckets.back().front()].device() != p.device();
    if (fresh) {
      buckets.emplace_back();
      bytes = 0;
    }
    buckets.back().push_back(k);
    bytes += pbytes;
  }
  return buckets;
}

}  // namespace

void DistributedDataParallel::ReserveBuckets(const torch::nn::Module& module, const DdpOptions& opts) {
  const std::vector<at::Tensor> params = Trainable(module);
  std::vector<at::Tensor> flats;  // all held at once, as the buckets are: one cached block each
  for (const std::vector<size_t>& members : BucketLayout(params, opts.bucket_bytes)) {
    int64_t numel = 0;
    for (size_t k : members) numel += params[k].numel();
    flats.push_back(at::empty({numel}, params[members.front()].options()));
  }
}

DistributedDataParallel::DistributedDataParallel(std::shared_ptr<torch::nn::Module> module, c10::intrusive_ptr<Comm> pg,
                                                 DdpOptions opts)
    : module_(std::move(module)), pg_(std::move(pg)), opts_(opts) {
  params_ = Trainable(*module_);
  if (params_.empty()) throw std::invalid_argument("DistributedDataParallel: the module has no trainable parameters");
  if (opts_.local_allreduce && opts_.local_allreduce->size() != pg_->getSize())
    throw std::invalid_argument("DistributedDataParallel: the shared-memory all-reduce has " +
                                std::to_string(opts_.local_allreduce->size()) + " ranks, the process group " +
                                std::to_string(pg_->getSize()));

  // Every rank starts from rank 0's weights.
  if (opts_.init_sync) {
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

  bucket_of_.assign(params_.size(), 0);
  seen_.assign(params_.size(), false);
  for (std::vector<size_t>& members : BucketLayout(params_, opts_.bucket_bytes)) {
    Bucket& b = buckets_.emplace_back();
    for (size_t k : members) {
      b.offsets.push_back(b.params.empty() ? 0 : b.offsets.back() + params_[b.params.back()].numel());
      b.params.push_back(k);
      bucket_of_[k] = buckets_.size() - 1;
    }
  }
  views_.resize(params_.size());
  for (auto& b : buckets_) {
    int64_t numel = b.offsets.back() + params_[b.params.back()].numel();
    b.flat = at::zeros({numel}, params_[b.params.front()].options());
    b.pending = b.params.size();
    for (size_t i = 0; i < b.params.size(); ++i) {
      const at::Tensor& p = params_[b.params[i]];
      // An alias of the bucket's storage, not an autograd view: optimizers may detach_() it.
      views_[b.params[i]] =
          at::empty({0}, p.options()).set_(b.flat.storage(), b.offsets[i], p.sizes(), p.contiguous().strides());
    }
  }
  // Post-hooks on the gradient accumulators run once a parameter's .grad holds this backward's
  // contribution (as c10d's Reducer does).
  for (size_t k = 0; k < params_.size(); ++k) {
    auto acc = torch::autograd::impl::grad_accumulator(params_[k]);
    hooks_.push_back(acc->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
        [this, k](const torch::autograd::variable_list& outputs, const torch::autograd::variable_list&) {
          OnGradReady(k);
          return outputs;
        })));
    accumulators_.push_back(std::move(acc));
  }
}

namespace {
DdpOptions WithContext(DdpOptions o, const Context& ctx) {
  if (!o.local_allreduce) o.local_allreduce = ctx.shm_allreduce();
  return o;
}
}  // namespace

DistributedDataParallel::DistributedDataParallel(std::shared_ptr<torch::nn::Module> module, const Context& ctx,
                                                 DdpOptions opts)
    : DistributedDataParallel(std::move(module), ctx.process_group(), WithContext(std::move(opts), ctx)) {}

DistributedDataParallel::~DistributedDataParallel() {
  for (size_t k = 0; k < accumulators_.size(); ++k) accumulators_[k]->del_post_hook(hooks_[k]);
}

void DistributedDataParallel::OnGradReady(size_t param) {
  if (!sync_) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (!finish_queued_) {
    finish_queued_ = true;
    torch::autograd::Engine::get_default_engine().queue_callback([this] { Finish(); });
  }
  if (seen_[param]) return;  // a second gradient for the same parameter in one backward
  at::NoGradGuard no_grad;
  const at::Tensor& grad = params_[param].grad();
  at::Tensor& view = View(param);
  // Usually .grad is the bucket view already; in the first step, or after an optimizer set it to
  // none, copy it in (it includes what NoSync steps accumulated).
  if (grad.defined() && !grad.is_same(view)) view.copy_(grad);
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
    if (opts_.local_allreduce) {
      b.local_work = opts_.local_allreduce->Allreduce(b.flat);
    } else {
      std::vector<at::Tensor> one = {b.flat};
      b.work = pg_->allreduce(one);
    }
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
      const at::Tensor& acc = params_[k].grad();
      if (!acc.defined()) View(k).zero_();
      else if (!acc.is_same(View(k))) View(k).copy_(acc);
      seen_[k] = true;
    }
    b.pending = 0;
    b.ready = true;
  }
  LaunchReadyBuckets();
  const auto wait_start = std::chrono::steady_clock::now();
  for (auto& b : buckets_) {
    if (b.local_work) {
      b.local_work->wait();
      b.local_work.reset();
    } else {
      b.work->wait();
      b.work.reset();
    }
    // The averaged gradients are in the bucket; .grad becomes (or stays) the view of it.
    for (size_t k : b.params) {
      at::Tensor& g = params_[k].mutable_grad();
      if (!g.defined() || !g.is_same(View(k))) g = View(k);
    }
    b.pending = b.params.size();
    b.ready = false;
  }
  wait_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - wait_start).count();
  std::fill(seen_.begin(), seen_.end(), false);
  next_bucket_ = 0;
  finish_queued_ = false;
}

double DistributedDataParallel::TakeWaitSeconds() {
  std::lock_guard<std::mutex> lock(mu_);
  return std::exchange(wait_seconds_, 0.0);
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
