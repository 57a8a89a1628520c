// torch.utils.data.DistributedSampler's semantics in C++: the same permutation (randperm seeded
// with seed + epoch), padding or drop_last, and rank r taking indices r, r+W, r+2W, ...
#pragma once

#include <cstdint>
#include <vector>

namespace launch_sdk {

class DistributedSampler {
 public:
  DistributedSampler(int64_t dataset_size, int num_replicas, int rank, bool shuffle = true, uint64_t seed = 0,
                     bool drop_last = false);
  void SetEpoch(int64_t epoch) { epoch_ = epoch; }
  int64_t epoch() const { return epoch_; }
  // This rank's indices for the current epoch, in order.
  std::vector<int64_t> Indices() const;
  int64_t num_samples() const { return num_samples_; }
  int64_t total_size() const { return num_samples_ * num_replicas_; }

 private:
  int64_t size_;
  int num_replicas_;
  int rank_;
  bool shuffle_;
  uint64_t seed_;
  bool drop_last_;
  int64_t epoch_ = 0;
  int64_t num_samples_;
};

}  // namespace launch_sdk
