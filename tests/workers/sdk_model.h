// The small model the SDK tests train, shared by sdk_worker and the SDK unit tests.
#pragma once

#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>

#include <memory>

namespace launch_sdk::testing {

inline std::shared_ptr<torch::nn::SequentialImpl> MakeMlp(int64_t in, int64_t hidden, int64_t out,
                                                          uint64_t seed) {
  torch::manual_seed(seed);
  auto m = std::make_shared<torch::nn::SequentialImpl>();
  m->push_back(torch::nn::Linear(in, hidden));
  m->push_back(torch::nn::ReLU());
  m->push_back(torch::nn::Linear(hidden, hidden));
  m->push_back(torch::nn::ReLU());
  m->push_back(torch::nn::Linear(hidden, out));
  return m;
}

}  // namespace launch_sdk::testing
