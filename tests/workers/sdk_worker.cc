// A worker for the SDK's integration tests. Modes:
//   ddp OUT BUCKET_BYTES ACCUM     under launch: DDP on this rank's half of each batch
//   single OUT ACCUM               alone: the same training on whole batches
//   throw MESSAGE                  an uncaught exception (error file)
//   segv                           a fatal signal (error file)
//   ckpt-writer DIR                saves a small checkpoint, then big ones forever
//   ckpt-memory DIR OPTIM CASE     checkpoints kept in launch's memory (see CkptMemory)
#include <torch/nn/functional/loss.h>
#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>
#include <torch/utils.h>

#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <fstream>
#include <stdexcept>
#include <string>

#include "launch_sdk/checkpoint.h"
#include "launch_sdk/context.h"
#include "launch_sdk/ddp.h"
#include "launch_sdk/errors.h"
#include "launch_sdk/exit_notice.h"
#include "launch_sdk/shm_allreduce.h"
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
  // shm_file: through launch's file for the segment (LAUNCH_SHM_ALLREDUCE_MEMORY), not one of its own.
  // exit_notice: Init holds this rank's exit notice for launch (LAUNCH_EXIT_NOTICE).
  std::printf("buckets=%zu shm=%d shm_file=%d exit_notice=%d\n", ddp.num_buckets(), ddp.uses_shared_memory() ? 1 : 0,
              ddp.uses_shared_memory() && ctx->shm_allreduce()->in_file() ? 1 : 0, launch_sdk::HoldsExitNotice() ? 1 : 0);
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

// Each rank makes its model from a seed of its own; prints its first weight after DDP's
// construction: rank 0's on every rank when init_sync broadcast it.
int InitSync(bool init_sync) {
  auto ctx = launch_sdk::Context::Init();
  auto model = launch_sdk::testing::MakeMlp(kIn, kHidden, kOut, 7 + ctx->rank());
  launch_sdk::DdpOptions o;
  o.init_sync = init_sync;
  launch_sdk::DistributedDataParallel ddp(model, *ctx, o);
  std::printf("first weight %.6f\n", model->parameters()[0].flatten()[0].item<double>());
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

// An optimizer launch_sdk does not know (momentum on the sign of nothing: plain momentum, its state
// kept outside Optimizer::state()), saved through its own save/load: the Checkpointer keeps it as a
// torch archive inside the snapshot.
class OwnMomentum : public torch::optim::Optimizer {
 public:
  explicit OwnMomentum(std::vector<at::Tensor> params)
      : Optimizer(std::move(params), std::make_unique<torch::optim::SGDOptions>(0.05)) {}
  at::Tensor step(LossClosure closure = nullptr) override {
    at::Tensor loss;
    if (closure) {
      at::AutoGradMode grad(true);
      loss = closure();
    }
    at::NoGradGuard no_grad;
    const double lr = param_groups()[0].options().get_lr();
    auto& ps = param_groups()[0].params();
    if (bufs_.empty())
      for (auto& p : ps) bufs_.push_back(at::zeros_like(p));
    for (size_t i = 0; i < ps.size(); ++i) {
      if (!ps[i].grad().defined()) continue;
      bufs_[i].mul_(0.9).add_(ps[i].grad());
      ps[i].add_(bufs_[i], -lr);
    }
    return loss;
  }
  void save(torch::serialize::OutputArchive& a) const override {
    a.write("count", at::tensor({static_cast<int64_t>(bufs_.size())}, at::kLong));
    for (size_t i = 0; i < bufs_.size(); ++i) a.write("buf" + std::to_string(i), bufs_[i]);
  }
  void load(torch::serialize::InputArchive& a) override {
    at::Tensor n;
    a.read("count", n);
    bufs_.clear();
    for (int64_t i = 0; i < n.item<int64_t>(); ++i) {
      at::Tensor t;
      a.read("buf" + std::to_string(i), t);
      bufs_.push_back(t);
    }
  }

 private:
  std::vector<at::Tensor> bufs_;
};

std::unique_ptr<torch::optim::Optimizer> MakeOptimizer(const std::string& name, torch::nn::Module& m) {
  if (name == "own") return std::make_unique<OwnMomentum>(m.parameters());
  if (name == "sgd") return std::make_unique<torch::optim::SGD>(m.parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  if (name == "adam")
    return std::make_unique<torch::optim::Adam>(m.parameters(), torch::optim::AdamOptions(0.01).amsgrad(true));
  if (name == "adagrad") {
    return std::make_unique<torch::optim::Adagrad>(
        m.parameters(), torch::optim::AdagradOptions(0.05).lr_decay(0.01).initial_accumulator_value(0.1));
  }
  if (name == "rmsprop") {
    return std::make_unique<torch::optim::RMSprop>(m.parameters(),
                                                   torch::optim::RMSpropOptions(0.01).momentum(0.5).centered(true));
  }
  throw std::invalid_argument("unknown optimizer " + name);
}

void Step(torch::nn::SequentialImpl& model, torch::optim::Optimizer& opt, int s) {
  auto [x, y] = Batch(s);
  auto loss = [&] {
    opt.zero_grad();
    at::Tensor l = torch::nn::functional::cross_entropy(model.forward(x), y);
    l.backward();
    return l;
  };
  opt.step(loss);
}

// Attempt 0 trains 3 steps, saving after each (the Checkpointer of the Context: in launch's memory),
// writes the parameters one more step would give to DIR/<case>.next.<rank>, and then rank 1 dies
// (SIGKILL) once rank 0 has flushed its files (and, for "memory", deleted the last one, so that only
// memory holds step 3). Attempt 1 resumes, prints where from, takes that step and writes
// DIR/<case>.resumed.<rank>: the same bytes when the optimizer's state came back whole.
// CASE: "memory" (step 3 from memory, rewritten to disk), "corrupt" (each rank flips a byte of its
// memory copy first: step 3 from disk), "disk-newer" (a disk-only save of step 4 after the memory
// one: step 4 from disk).
int CkptMemory(const std::string& dir, const std::string& optim, const std::string& which) {
  auto ctx = launch_sdk::Context::Init();
  const int rank = ctx->rank();
  auto model = launch_sdk::testing::MakeMlp(kIn, kHidden, kOut, 7);
  auto opt = MakeOptimizer(optim, *model);
  launch_sdk::Checkpointer ck(dir + "/ckpt", *ctx);
  std::printf("[%d] in memory: %d\n", rank, ck.in_memory() ? 1 : 0);
  {
    launch_sdk::Checkpointer second(dir + "/ckpt2", *ctx);  // the memory is the first one's
    std::printf("[%d] a second one in memory: %d\n", rank, second.in_memory() ? 1 : 0);
  }
  const std::string tag = dir + "/" + which;
  if (ctx->env().restart_count == 0) {
    launch_sdk::TrainState st;
    for (int s = 1; s <= 3; ++s) {
      Step(*model, *opt, s);
      st.step = s;
      ck.Save(st, *model, *opt, rank);
    }
    ck.Flush();
    if (which == "disk-newer") {
      launch_sdk::Checkpointer disk_only(dir + "/ckpt", 3);
      st.step = 4;
      Step(*model, *opt, 4);
      disk_only.Save(st, *model, *opt, rank);
    }
    if (which == "memory" && rank == 0) std::remove((dir + "/ckpt/ckpt-0000000003.lck").c_str());
    ctx->Barrier();
    Step(*model, *opt, 100);
    SaveParams(*model, tag + ".next." + std::to_string(rank));
    ctx->Barrier();
    if (rank == 1) std::raise(SIGKILL);
    for (;;) pause();  // stopped by the agent
  }
  if (which == "corrupt") {
    // The newest memory copy, a byte of its payload flipped (past the 4 KiB header).
    const std::string list = std::getenv("LAUNCH_CHECKPOINT_MEMORY");
    for (const std::string& path : {list.substr(0, list.find(',')), list.substr(list.find(',') + 1)}) {
      std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
      int64_t step = 0;
      f.seekg(16);
      f.read(reinterpret_cast<char*>(&step), sizeof step);
      if (step != 3) continue;
      char c = 0;
      f.seekg(4096 + 100);
      f.read(&c, 1);
      c ^= 0x5a;
      f.seekp(4096 + 100);
      f.write(&c, 1);
    }
  }
  auto st = ck.LoadLatest(*model, *opt);
  std::printf("[%d] resumed from step %lld from %s\n", rank, st ? static_cast<long long>(st->step) : -1LL,
              ck.loaded_from() == "memory" ? "memory" : "disk");
  Step(*model, *opt, 100);
  SaveParams(*model, tag + ".resumed." + std::to_string(rank));
  ck.Flush();
  ctx->Barrier();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string mode = argc > 1 ? argv[1] : "";
  return launch_sdk::RunWithErrorFile([&]() -> int {
    if (mode == "ddp" && argc == 5) return Ddp(argv[2], std::stoul(argv[3]), std::stoi(argv[4]));
    if (mode == "init-sync" && argc == 3) return InitSync(std::string(argv[2]) == "true");
    if (mode == "single" && argc == 4) return Single(argv[2], std::stoi(argv[3]));
    if (mode == "throw" && argc == 3) throw std::runtime_error(argv[2]);
    if (mode == "segv") {
      std::raise(SIGSEGV);
      return 0;
    }
    if (mode == "ckpt-writer" && argc == 3) return CkptWriter(argv[2]);
    if (mode == "ckpt-memory" && argc == 5) return CkptMemory(argv[2], argv[3], argv[4]);
    std::fprintf(stderr, "usage: sdk_worker ddp OUT BUCKET_BYTES ACCUM | single OUT ACCUM | throw MSG | segv | ckpt-writer DIR\n");
    return 2;
  });
}
