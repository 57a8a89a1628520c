#include "launch_sdk/sampler.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <numeric>
#include <stdexcept>

namespace launch_sdk {

DistributedSampler::DistributedSampler(int64_t dataset_size, int num_replicas, int rank, bool shuffle, uint64_t seed,
                                       bool drop_last)
    : size_(dataset_size),
      num_replicas_(num_replicas),
      rank_(rank),
      shuffle_(shuffle),
      seed_(seed),
      drop_last_(drop_last) {
  if (num_replicas < 1 || rank < 0 || rank >= num_replicas) {
    throw std::invalid_argument("DistributedSampler: rank " + std::to_string(rank) + " out of 0.." +
                                std::to_string(num_replicas - 1));
  }
  if (dataset_size < 1) throw std::invalid_argument("DistributedSampler: empty dataset");
  // Python: ceil((n - R) / R) with drop_last and n % R != 0, else ceil(n / R).
  if (drop_last_ && size_ % num_replicas_ != 0) {
    num_samples_ = (size_ - num_replicas_ + num_replicas_ - 1) / num_replicas_;
  } else {
    num_samples_ = (size_ + num_replicas_ - 1) / num_replicas_;
  }
}

std::vector<int64_t> DistributedSampler::Indices() const {
  std::vector<int64_t> idx(static_cast<size_t>(size_));
  if (shuffle_) {
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed_ + static_cast<uint64_t>(epoch_));
    at::Tensor perm = at::randperm(size_, gen, at::kLong);
    const int64_t* p = perm.data_ptr<int64_t>();
    std::copy(p, p + size_, idx.begin());
  } else {
    std::iota(idx.begin(), idx.end(), 0);
  }
  const size_t total = static_cast<size_t>(total_size());
  if (!drop_last_) {
    // Pad by repeating the start of the list (whole copies first when it is short).
    const size_t n = idx.size();
    for (size_t i = 0; idx.size() < total; ++i) idx.push_back(idx[i % n]);
  } else {
    idx.resize(total);
  }
  std::vector<int64_t> mine;
  mine.reserve(static_cast<size_t>(num_samples_));
  for (size_t i = static_cast<size_t>(rank_); i < total; i += static_cast<size_t>(num_replicas_)) {
    mine.push_back(idx[i]);
  }
  return mine;
}

}  // namespace launch_sdk
