// Checkpoint/resume: rank 0 writes model, optimizer, step, epoch, sampler position, RNG state and
// the loss scale atomically (temp file, fsync, rename, checksum) and keeps the last K; every rank
// loads the newest valid one; a truncated or corrupt file is reported and skipped.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

namespace launch_sdk {

struct TrainState {
  int64_t step = 0;              // steps completed
  int64_t epoch = 0;
  int64_t sampler_position = 0;  // samples of this epoch already consumed (per rank)
  double loss_scale = 0;         // GradScaler's scale (0: no scaler)
  int64_t scaler_growth_tracker = 0;
};

class Checkpointer {
 public:
  Checkpointer(std::string dir, int keep_last = 3);

  // Writes ckpt-<step>.lck atomically; only rank 0 writes (others return). Throws on I/O errors.
  void Save(const TrainState& state, torch::nn::Module& model, torch::optim::Optimizer& optim,
            int rank);
  // Loads the newest checkpoint that verifies; corrupt ones are reported on stderr and skipped.
  std::optional<TrainState> LoadLatest(torch::nn::Module& model, torch::optim::Optimizer& optim);
  // Paths of the checkpoint files, oldest first.
  std::vector<std::string> List() const;
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
  int keep_last_;
};

// 64-bit FNV-1a, the checksum of the payload.
uint64_t Fnv1a64(const void* data, size_t n);

}  // namespace launch_sdk
