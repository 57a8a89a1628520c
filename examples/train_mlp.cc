// train_mlp: the reference workload. A data-parallel MLP (default 784,1024,1024,10, ReLU) trained
// with cross-entropy and SGD (momentum 0.9) on a synthetic, seeded data set, sharded by
// DistributedSampler, checkpointed and resumed by worker_sdk. Run it under launch:
//   launch --nproc-per-node=2 build/bin/train_mlp --steps 200 --checkpoint-dir /tmp/ckpt
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

#include <cerrno>
#include <chrono>
#include <climits>
#include <csignal>
#include <cstdlib>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <sys/resource.h>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "launch_sdk/amp.h"
#include "launch_sdk/checkpoint.h"
#include "launch_sdk/context.h"
#include "launch_sdk/data.h"
#include "launch_sdk/ddp.h"
#include "launch_sdk/errors.h"
#include "launch_sdk/memory.h"
#include "launch_sdk/profiler.h"
#include "launch_sdk/progress.h"
#include "launch_sdk/sampler.h"
#include "launch_sdk/scaling.h"
#include "launch_sdk/warm_start.h"

// Nothing before Context::Init depends on the rank's attempt (the arguments, the first weights
// and the data set): launch may start this program ahead of it (--warm-start), so that a restart
// skips loading LibTorch and making the data.
LAUNCH_SDK_WARM_START();

namespace {

// --hang-at-step: what a rank stuck outside any collective looks like (its peers then wait in
// the next allreduce). A frame of its own, so that its stack names it.
[[noreturn]] __attribute__((noinline)) void HangForever(int rank, long step) {
  std::printf("fault injection: rank %d hangs at step %ld\n", rank, step);
  std::fflush(stdout);
  for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
}

// --step-budget-file: the number in the file is the last step the job may take. A rank past it
// waits, reading the file again, until the budget grows: a test that disrupts the job holds it
// open until its disruptions are done, instead of racing the job's end. `*budget` is the budget
// read last (it only grows).
void WaitForStepBudget(const std::string& path, long step, long* budget) {
  while (step > *budget) {
    std::ifstream f(path);
    long read = 0;
    if (f >> read && read > *budget) {
      *budget = read;
      continue;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

struct Args {
  std::string dims = "784,1024,1024,10";
  int batch = 64;  // per worker
  long steps = 100;
  int warmup = 10;  // steps before steps_per_s is measured (and of lr warmup)
  double lr = 0.01;
  std::string lr_scaling = "none";
  int dataset_size = 8192;
  uint64_t seed = 0;
  std::string checkpoint_dir;
  int checkpoint_every = 0;
  bool checkpoint_memory = true;  // snapshots in the agent's memory, files written in the background
  std::string stamp_file;         // timestamped events, for bench/bench_checkpoint.py
  int keep = 3;
  double bucket_mb = 25;
  int accum = 1;
  int print_every = 10;
  std::string amp;  // "", "bf16" or "fp16"
  double init_scale = 65536;  // GradScaler's first loss scale (fp16)
  std::string save_params;
  long fail_at_step = -1;  // fault injection: SIGKILL itself at this step on the first attempt
  long hang_at_step = -1;  // fault injection: sleep for ever at this step on the first attempt
  int fail_rank = 1;
  int slow_rank = -1;  // fault injection: this rank sleeps slow_ms at every step (a straggler)
  int slow_ms = 0;
  std::string step_budget_file;  // test seam: the job takes no step past the number in this file
};

std::vector<int64_t> ParseDims(const std::string& s) {
  std::vector<int64_t> dims;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    size_t used = 0;
    long v = std::stol(item, &used);
    if (used != item.size() || v < 1) throw std::invalid_argument("--dims=" + s + ": expected positive integers");
    dims.push_back(v);
  }
  if (dims.size() < 2) throw std::invalid_argument("--dims=" + s + ": expected at least input,output");
  return dims;
}

double Seconds(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// --stamp-file: one line per event, "<event> <rank> <restart> <values...> <unix time>", appended
// with one write so that ranks' lines do not mix.
class Stamps {
 public:
  explicit Stamps(const std::string& path) {
    if (!path.empty()) f_ = std::fopen(path.c_str(), "a");
  }
  ~Stamps() {
    if (f_) std::fclose(f_);
  }
  void Add(const char* event, int rank, int restart, const std::string& values) {
    if (!f_) return;
    const double now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
    struct rusage ru {};
    ::getrusage(RUSAGE_SELF, &ru);
    std::fprintf(f_, "%s %d %d %s %ld %.6f\n", event, rank, restart, values.c_str(), ru.ru_minflt, now);
    std::fflush(f_);
  }

 private:
  std::FILE* f_ = nullptr;
};

int Train(Args a) {
  Stamps stamps(a.stamp_file);
  const std::vector<int64_t> dims = ParseDims(a.dims);
  // The model's first weights and the data set depend on the seed alone, not on the rank or the
  // attempt: made before Context::Init, they are made once by a standby (--warm-start), whose
  // workers start with them.
  torch::manual_seed(a.seed);  // same initial weights everywhere (DDP broadcasts rank 0's anyway)
  auto model = std::make_shared<torch::nn::SequentialImpl>();
  for (size_t i = 0; i + 1 < dims.size(); ++i) {
    model->push_back(torch::nn::Linear(dims[i], dims[i + 1]));
    if (i + 2 < dims.size()) model->push_back(torch::nn::ReLU());
  }
  // A synthetic data set from its own seeded generator: identical on every rank and attempt.
  at::Generator data_gen = at::make_generator<at::CPUGeneratorImpl>(a.seed + 1000003);
  at::Tensor inputs = at::randn({a.dataset_size, dims.front()}, data_gen);
  // Labels from a random linear teacher, so there is something to learn.
  at::Tensor teacher = at::randn({dims.front(), dims.back()}, data_gen);
  at::Tensor labels = inputs.matmul(teacher).argmax(1);

  launch_sdk::DdpOptions dopts;
  dopts.bucket_bytes = static_cast<size_t>(a.bucket_mb * 1024 * 1024);
  launch_sdk::InitOptions init;
  init.seed = a.seed;
  // In a standby: a resume and a step rehearsed on a copy of the model (its gradients, SGD's
  // momentum, DDP's buckets, all held at once as in training), whose memory the prefaulting
  // allocator keeps for the worker this standby becomes. Zeros for data: no generator is drawn.
  init.standby_warm_up = [&] {
    auto shadow = std::dynamic_pointer_cast<torch::nn::SequentialImpl>(model->clone());
    torch::optim::SGD shadow_optim(shadow->parameters(), torch::optim::SGDOptions(a.lr).momentum(0.9));
    at::Tensor x = at::zeros({a.batch, dims.front()});
    at::Tensor y = at::zeros({a.batch}, at::kLong);
    torch::nn::functional::cross_entropy(shadow->forward(x), y).backward();
    shadow_optim.step();
    launch_sdk::DistributedDataParallel::ReserveBuckets(*shadow, dopts);
  };
  auto ctx = launch_sdk::Context::Init(init);  // a standby waits here for its attempt
  const int restart = ctx->env().restart_count;
  // With the bytes the prefaulting allocator holds for reuse: what a standby's warm-up left.
  stamps.Add("init", ctx->rank(), restart, std::to_string(launch_sdk::PrefaultingCpuAllocatorCachedBytes()));
  const int rank = ctx->rank(), world = ctx->world_size();
  if (ctx->env().per_worker_batch) a.batch = *ctx->env().per_worker_batch;  // launch's train: section
  model->to(ctx->device());
  launch_sdk::DistributedSampler sampler(a.dataset_size, world, rank, /*shuffle=*/true, a.seed);

  launch_sdk::ScalingConfig scaling;
  scaling.base_lr = a.lr;
  scaling.per_worker_batch = a.batch;
  scaling.grad_accum_steps = a.accum;
  scaling.warmup_steps = a.warmup;
  scaling.mode = a.lr_scaling == "linear" ? launch_sdk::LrScaling::kLinear
                 : a.lr_scaling == "sqrt" ? launch_sdk::LrScaling::kSqrt
                                          : launch_sdk::LrScaling::kNone;
  if (ctx->env().lr) {  // the launcher scaled it already (config train: section)
    scaling.base_lr = *ctx->env().lr;
    scaling.mode = launch_sdk::LrScaling::kNone;
  }
  torch::optim::SGD optim(model->parameters(), torch::optim::SGDOptions(scaling.base_lr).momentum(0.9));

  // fp16 needs a loss scale (its range underflows small gradients); bf16 does not.
  const bool amp = !a.amp.empty();
  const at::ScalarType amp_dtype = a.amp == "fp16" ? at::kHalf : at::kBFloat16;
  launch_sdk::GradScalerOptions scaler_opts;
  scaler_opts.enabled = a.amp == "fp16";
  scaler_opts.init_scale = a.init_scale;
  launch_sdk::GradScaler scaler(scaler_opts, ctx->process_group());

  launch_sdk::TrainState state;
  bool resumed_everywhere = false;  // LoadLatest resumes every rank from one step, or none
  std::optional<launch_sdk::Checkpointer> ckpt;
  if (!a.checkpoint_dir.empty()) {
    launch_sdk::CheckpointOptions copts;
    copts.keep_last = a.keep;
    copts.in_memory = a.checkpoint_memory;
    ckpt.emplace(a.checkpoint_dir, *ctx, copts);
    if (auto resumed = ckpt->LoadLatest(*model, optim)) {
      state = *resumed;
      resumed_everywhere = true;
      if (scaler_opts.enabled && state.loss_scale > 0) scaler.set_state(state.loss_scale, state.scaler_growth_tracker);
      if (rank == 0) {
        std::printf("resumed from step %ld (epoch %ld) from %s\n", static_cast<long>(state.step),
                    static_cast<long>(state.epoch), ckpt->loaded_from() == "memory" ? "memory" : "disk");
      }
    }
  }
  stamps.Add("resumed", rank, restart, std::to_string(state.step));
  // Made after the resume: when every rank resumed one checkpoint, they hold the same weights and
  // rank 0's need not be broadcast.
  dopts.init_sync = !resumed_everywhere;
  launch_sdk::DistributedDataParallel ddp(model, *ctx, dopts);
  stamps.Add("built", rank, restart, "-");
  launch_sdk::ProgressReporter progress = launch_sdk::ProgressReporter::FromEnv();
  launch_sdk::StepProfiler profiler = launch_sdk::StepProfiler::FromEnv(rank);
  const auto scaled = launch_sdk::ScaleForWorld(scaling, world);
  if (rank == 0) {
    std::printf("train_mlp: world %d, %s on %s, per-worker batch %d, global batch %d, peak lr %g, %zu bucket(s) "
                "all-reduced through %s, amp %s%s\n",
                world, ctx->backend(), ctx->device().str().c_str(), a.batch, scaled.global_batch, scaled.peak_lr,
                ddp.num_buckets(), ddp.uses_shared_memory() ? "shared memory" : ctx->backend(),
                amp ? a.amp.c_str() : "off", scaler_opts.enabled ? " with GradScaler" : "");
    std::fflush(stdout);  // a worker stopped by a signal still shows where it resumed from
  }

  sampler.SetEpoch(state.epoch);
  std::vector<int64_t> order = sampler.Indices();
  const int64_t micro = a.batch / a.accum;
  if (micro < 1 || a.batch % a.accum != 0) throw std::invalid_argument("--batch must be a multiple of --accum");

  auto measure_start = std::chrono::steady_clock::now();
  long measured_from = -1;
  const long first_step = state.step + 1;
  long step_budget = a.step_budget_file.empty() ? a.steps : 0;
  double last_loss = 0;
  long skipped = 0;
  for (long step = state.step + 1; step <= a.steps; ++step) {
    WaitForStepBudget(a.step_budget_file, step, &step_budget);
    if (step == first_step + a.warmup || (measured_from < 0 && step == a.steps)) {
      ctx->Barrier();
      measure_start = std::chrono::steady_clock::now();
      measured_from = step;
    }
    profiler.BeginStep(step);
    const auto t0 = std::chrono::steady_clock::now();
    if (step == a.hang_at_step && rank == a.fail_rank && ctx->env().restart_count == 0) HangForever(rank, step);
    if (rank == a.slow_rank) std::this_thread::sleep_for(std::chrono::milliseconds(a.slow_ms));
    if (state.sampler_position + a.batch > static_cast<int64_t>(order.size())) {
      sampler.SetEpoch(++state.epoch);
      order = sampler.Indices();
      state.sampler_position = 0;
    }
    for (auto& g : optim.param_groups()) {
      static_cast<torch::optim::SGDOptions&>(g.options()).lr(launch_sdk::LrAtStep(scaling, world, step - 1));
    }
    optim.zero_grad();
    double loss_sum = 0;
    for (int m = 0; m < a.accum; ++m) {
      auto first = order.begin() + state.sampler_position + m * micro;
      at::Tensor idx = at::tensor(std::vector<int64_t>(first, first + micro), at::kLong);
      at::Tensor x = launch_sdk::GatherRows(inputs, idx, ctx->device());
      at::Tensor y = launch_sdk::GatherRows(labels, idx, ctx->device());
      auto backward = [&] {
        at::Tensor out;
        {
          launch_sdk::Autocast autocast(ctx->device().type(), amp_dtype, amp);
          out = model->forward(x);
        }
        at::Tensor loss = torch::nn::functional::cross_entropy(out.to(at::kFloat), y) / a.accum;
        scaler.Scale(loss).backward();
        loss_sum += loss.item<double>();
      };
      if (m + 1 < a.accum) {
        auto no_sync = ddp.no_sync();
        backward();
      } else {
        backward();
      }
    }
    if (!scaler.Step(optim)) ++skipped;  // on every rank alike, when fp16 gradients overflowed
    scaler.Update();
    state.sampler_position += a.batch;
    state.step = step;
    if (scaler_opts.enabled) {
      state.loss_scale = scaler.scale();
      state.scaler_growth_tracker = scaler.growth_tracker();
    }
    last_loss = loss_sum;
    progress.Report(step, loss_sum, Seconds(t0, std::chrono::steady_clock::now()), ddp.TakeWaitSeconds());
    if (a.print_every > 0 && (step % a.print_every == 0 || step == a.steps) && rank == 0) {
      std::printf("step %ld loss %.6f\n", step, loss_sum);
      std::fflush(stdout);
    }
    stamps.Add("step", rank, restart, std::to_string(step));
    if (ckpt && a.checkpoint_every > 0 && step % a.checkpoint_every == 0) {
      ckpt->Save(state, *model, optim, rank);
      stamps.Add("save", rank, restart, std::to_string(step) + " " + std::to_string(ckpt->last_stall_seconds()));
    }
    if (step == a.fail_at_step && rank == a.fail_rank && restart == 0) {
      std::printf("fault injection: rank %d kills itself at step %ld\n", rank, step);
      std::fflush(stdout);
      stamps.Add("death", rank, restart, std::to_string(step));
      std::raise(SIGKILL);
    }
  }
  profiler.Stop();
  if (ckpt) ckpt->Flush();  // the last checkpoint is on disk before the job says it is done
  ctx->Barrier();
  const auto end = std::chrono::steady_clock::now();
  if (rank == 0) {
    long measured = measured_from < 0 ? 0 : a.steps - measured_from + 1;
    double secs = Seconds(measure_start, end);
    std::printf("done: steps=%ld loss=%.6f measured_steps=%ld steps_per_s=%.3f", a.steps, last_loss, measured,
                measured > 0 && secs > 0 ? measured / secs : 0.0);
    if (scaler_opts.enabled) std::printf(" skipped_steps=%ld loss_scale=%g", skipped, scaler.scale());
    std::printf("\n");
  }
  if (!a.save_params.empty() && rank == 0) {
    std::ofstream f(a.save_params, std::ios::binary | std::ios::trunc);
    for (const auto& p : model->parameters()) {
      at::Tensor c = p.detach().to(at::kCPU).to(at::kFloat).contiguous();
      f.write(static_cast<const char*>(c.data_ptr()), c.numel() * sizeof(float));
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  CLI::App app{"train_mlp: data-parallel MLP on synthetic data (run under launch)"};
  app.add_option("--dims", a.dims, "layer sizes, input first");
  app.add_option("--batch", a.batch, "per-worker batch")->check(CLI::PositiveNumber);
  app.add_option("--steps", a.steps, "optimizer steps")->check(CLI::PositiveNumber);
  app.add_option("--warmup", a.warmup, "warm-up steps (lr warmup; not timed)")->check(CLI::NonNegativeNumber);
  app.add_option("--lr", a.lr, "base learning rate")->check(CLI::PositiveNumber);
  app.add_option("--lr-scaling", a.lr_scaling, "linear, sqrt or none")->check(CLI::IsMember({"linear", "sqrt", "none"}));
  app.add_option("--dataset-size", a.dataset_size, "synthetic samples")->check(CLI::PositiveNumber);
  app.add_option("--seed", a.seed, "seed of weights, data and shuffling");
  app.add_option("--checkpoint-dir", a.checkpoint_dir, "resume from and save to this directory");
  app.add_option("--checkpoint-every", a.checkpoint_every, "steps between checkpoints (0: never)");
  app.add_option("--checkpoint-memory", a.checkpoint_memory,
                 "keep checkpoints in launch's memory and write files in the background (default true)");
  app.add_option("--stamp-file", a.stamp_file, "append timestamped step, save and death events to this file");
  app.add_option("--keep", a.keep, "checkpoints kept")->check(CLI::PositiveNumber);
  app.add_option("--bucket-mb", a.bucket_mb, "DDP gradient bucket size in MiB")->check(CLI::PositiveNumber);
  app.add_option("--accum", a.accum, "gradient accumulation micro-batches")->check(CLI::PositiveNumber);
  app.add_option("--print-every", a.print_every, "steps between loss lines (0: never)");
  app.add_flag("--amp{bf16}", a.amp, "autocast: --amp or --amp=bf16; --amp=fp16 (with GradScaler)")
      ->check(CLI::IsMember({"bf16", "fp16"}));
  app.add_option("--init-scale", a.init_scale, "GradScaler's first loss scale (--amp=fp16)")->check(CLI::PositiveNumber);
  app.add_option("--save-params", a.save_params, "rank 0 writes the final parameters (float32) here");
  app.add_option("--fail-at-step", a.fail_at_step, "fault injection: SIGKILL at this step, first attempt only");
  app.add_option("--hang-at-step", a.hang_at_step,
                 "fault injection: sleep for ever at the start of this step, first attempt only");
  app.add_option("--fail-rank", a.fail_rank, "the rank that --fail-at-step kills or --hang-at-step stops");
  app.add_option("--slow-rank", a.slow_rank, "fault injection: this rank is a straggler (see --slow-ms)");
  app.add_option("--slow-ms", a.slow_ms, "how long --slow-rank sleeps at every step")->check(CLI::Range(0, 60000));
  app.add_option("--step-budget-file", a.step_budget_file,
                 "tests: take no step past the number in this file; wait for it to grow");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  return launch_sdk::RunWithErrorFile([&] { return Train(a); });
}
