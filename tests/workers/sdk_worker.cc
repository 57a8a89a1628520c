// A worker for the SDK's integration tests. Modes:
//   ddp OUT BUCKET_BYTES ACCUM     under launch: DDP on this rank's half of each batch
//   single OUT ACCUM               alone: the same training on whole batches
//   throw MESSAGE                  an uncaught exception (error file)
//   segv                           a fatal signal (error file)
//   ckpt-writer DIR                saves a small checkpoint, then big ones forever
#include <torch/nn/functional/loss.h>
#include <torch/optim/sgd.h>
#include <torch/utils.h>

#include <csignal>
#include <cstdio>
#include <fstream>
#include <stdexcept>
#include <string>

#include "launch_sdk/checkpoint.h"
#include "launch_sdk/context.h"
#include "launch_sdk/ddp.h"
#include "launch_sdk/errors.h"
#include "tests/workers/sdk_model.h"

namespace {

constexpr int kSteps = 20;
constexpr int64_t kBatch = 32, kIn = 16, kHidden = 32, kOut = 4;

// Step s's whole batch: the same on every rank.
std::pair<at::Tensor, at::Tensor> Batch(int step) {
  at::Generator g = at::make_generator<at::CPUGeneratorImpl>(1234 + step);
  return {at::randn({kBatch, kIn}, g), at::randint(kOut, {kBatch}, g, at::kLong)};
}

void SaveParams(torch::nn::Module& m, const std::string& path) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  for (const auto& p : m.parameters()) {
    at::Tensor c = p.detach().to(at::kFloat).contiguous();
    f.write(static_cast<const char*>(c.data_ptr()), c.numel() * sizeof(float));
  }
}

// One step's backward over `rows` of the batch, split into `accum` micro-batches.
template <typename NoSyncFn>
void Backward(torch::nn::SequentialImpl& model, const at::Tensor& x, const at::Tensor& y, int accum,
              NoSyncFn&& no_sync) {
  const int64_t micro = x.size(0) / accum;
  for (int m = 0; m < accum; ++m) {
    auto run = [&] {
      at::Tensor out = model.forward(x.narrow(0, m * micro, micro));
      at::Tensor loss = torch::nn::functional::cross_entropy(out, y.narrow(0, m * micro, micro)) / accum;
      loss.backward();
    };
    if (m + 1 < accum) no_sync(run);
    else run();
  }
}

int Ddp(const std::string& out, size_t bucket_bytes, int accum) {
  auto ctx = launch_sdk::Context::Init();
  auto model = launch_sdk::testing::MakeMlp(kIn, kHidden, kOut, 7 + ctx->rank());  // rank 0's wins
  launch_sdk::DdpOptions o;
  o.bucket_bytes = bucket_bytes;
  launch_sdk::DistributedDataParallel ddp(model, *ctx, o);
  std::printf("buckets=%zu shm=%d\n", ddp.num_buckets(), ddp.uses_shared_memory() ? 1 : 0);
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  const int64_t half = kBatch / ctx->world_size();
  for (int s = 0; s < kSteps; ++s) {
    auto [x, y] = Batch(s);
    opt.zero_grad();
    Backward(*model, x.narrow(0, ctx->rank() * half, half), y.narrow(0, ctx->rank() * half, half), accum,
             [&](auto&& run) {
               auto guard = ddp.no_sync();
               run();
             });
    opt.step();
  }
  if (ctx->rank() == 0) SaveParams(*model, out);
  ctx->Barrier();
  return 0;
}

int Single(const std::string& out, int accum) {
  auto model = launch_sdk::testing::MakeMlp(kIn, kHidden, kOut, 7);
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  for (int s = 0; s < kSteps; ++s) {
    auto [x, y] = Batch(s);
    opt.zero_grad();
    // Two ranks' halves, each in `accum` micro-batches: the same micro-batch sizes as DDP.
    const int64_t half = kBatch / 2;
    for (int r = 0; r < 2; ++r) {
      Backward(*model, x.narrow(0, r * half, half), y.narrow(0, r * half, half), accum, [](auto&& run) { run(); });
    }
    for (auto& p : model->parameters()) p.mutable_grad().div_(2);
    opt.step();
  }
  SaveParams(*model, out);
  return 0;
}

int CkptWriter(const std::string& dir) {
  launch_sdk::Checkpointer ck(dir, 10);
  auto small = launch_sdk::testing::MakeMlp(kIn, kHidden, kOut, 1);
  torch::optim::SGD opt_small(small->parameters(), torch::optim::SGDOptions(0.1));
  launch_sdk::TrainState st;
  st.step = 1;
  ck.Save(st, *small, opt_small, 0);
  std::printf("saved 1\n");
  std::fflush(stdout);
  // Big enough (~200 MB) that a kill lands mid-write.
  auto big = launch_sdk::testing::MakeMlp(kIn, 7000, kOut, 2);
  torch::optim::SGD opt_big(big->parameters(), torch::optim::SGDOptions(0.1));
  for (st.step = 2;; ++st.step) ck.Save(st, *big, opt_big, 0);
}

}  // namespace

int main(int argc, char** argv) {
  std::string mode = argc > 1 ? argv[1] : "";
  return launch_sdk::RunWithErrorFile([&]() -> int {
    if (mode == "ddp" && argc == 5) return Ddp(argv[2], std::stoul(argv[3]), std::stoi(argv[4]));
    if (mode == "single" && argc == 4) return Single(argv[2], std::stoi(argv[3]));
    if (mode == "throw" && argc == 3) throw std::runtime_error(argv[2]);
    if (mode == "segv") {
      std::raise(SIGSEGV);
      return 0;
    }
    if (mode == "ckpt-writer" && argc == 3) return CkptWriter(argv[2]);
    std::fprintf(stderr, "usage: sdk_worker ddp OUT BUCKET_BYTES ACCUM | single OUT ACCUM | throw MSG | segv | ckpt-writer DIR\n");
    return 2;
  });
}
