// worker_sdk unit tests: scaling, sampler, device choice, GradScaler, autocast, profiler,
// checkpoints, error JSON. Built and run against LibTorch 1.13 and 2.x (scripts/test.sh).
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <torch/nn/functional/loss.h>
#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <set>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "launch_sdk/amp.h"
#include "launch_sdk/checkpoint.h"
#include "launch_sdk/data.h"
#include "launch_sdk/env.h"
#include "launch_sdk/errors.h"
#include "launch_sdk/profiler.h"
#include "launch_sdk/sampler.h"
#include "launch_sdk/scaling.h"
#include "tests/test_util.h"
#include "tests/workers/sdk_model.h"
#include "worker_sdk/src/torch_compat.h"

namespace launch_sdk {
namespace {

using ::launch::testing::TempDir;
using ::testing::HasSubstr;

struct ScaleRow {
  LrScaling mode;
  int world, accum, warmup;
  long step;
  double lr;
  int global;
};

TEST(Scaling, Table) {
  const ScaleRow rows[] = {
      {LrScaling::kLinear, 4, 1, 0, 0, 0.4, 128}, {LrScaling::kSqrt, 4, 1, 0, 0, 0.2, 128},
      {LrScaling::kNone, 4, 1, 0, 0, 0.1, 128},   {LrScaling::kLinear, 2, 2, 0, 0, 0.4, 128},
      {LrScaling::kLinear, 4, 1, 4, 0, 0.175, 128}, {LrScaling::kLinear, 4, 1, 4, 3, 0.4, 128},
      {LrScaling::kLinear, 4, 1, 4, 100, 0.4, 128}, {LrScaling::kLinear, 1, 1, 0, 0, 0.1, 32},
  };
  for (const auto& r : rows) {
    ScalingConfig c;
    c.base_lr = 0.1;
    c.per_worker_batch = 32;
    c.mode = r.mode;
    c.grad_accum_steps = r.accum;
    c.warmup_steps = r.warmup;
    EXPECT_NEAR(LrAtStep(c, r.world, r.step), r.lr, 1e-12) << r.world << " " << r.step;
    EXPECT_EQ(ScaleForWorld(c, r.world).global_batch, r.global);
  }
}

TEST(Scaling, RecomputedForANewWorldSize) {
  ScalingConfig c;
  c.base_lr = 0.1;
  c.per_worker_batch = 16;
  EXPECT_NEAR(ScaleForWorld(c, 8).peak_lr, 0.8, 1e-12);
  EXPECT_NEAR(ScaleForWorld(c, 6).peak_lr, 0.6, 1e-12);  // after losing two workers
}

TEST(Sampler, EveryIndexExactlyOncePerEpochAcrossRanks) {
  for (int64_t n : {10, 11, 12, 13}) {
    for (int replicas : {1, 2, 3, 4}) {
      for (bool drop_last : {false, true}) {
        std::multiset<int64_t> seen;
        int64_t per_rank = -1;
        for (int r = 0; r < replicas; ++r) {
          DistributedSampler s(n, replicas, r, true, 5, drop_last);
          s.SetEpoch(3);
          auto idx = s.Indices();
          if (per_rank >= 0) {
            EXPECT_EQ(static_cast<int64_t>(idx.size()), per_rank);
          }
          per_rank = static_cast<int64_t>(idx.size());
          EXPECT_EQ(per_rank, s.num_samples());
          seen.insert(idx.begin(), idx.end());
        }
        std::set<int64_t> distinct(seen.begin(), seen.end());
        if (drop_last) {
          EXPECT_EQ(seen.size(), distinct.size()) << "no index twice with drop_last";
          EXPECT_EQ(static_cast<int64_t>(seen.size()), (n / replicas) * replicas);
        } else {
          EXPECT_EQ(static_cast<int64_t>(distinct.size()), n) << "every index is used";
          EXPECT_EQ(static_cast<int64_t>(seen.size()), ((n + replicas - 1) / replicas) * replicas);
        }
        for (int64_t i : seen) EXPECT_TRUE(i >= 0 && i < n);
      }
    }
  }
}

TEST(Sampler, ShuffleIsSeededByEpoch) {
  DistributedSampler a(100, 2, 0, true, 1), b(100, 2, 0, true, 1);
  a.SetEpoch(4);
  b.SetEpoch(4);
  EXPECT_EQ(a.Indices(), b.Indices());
  b.SetEpoch(5);
  EXPECT_NE(a.Indices(), b.Indices());
  DistributedSampler plain(10, 2, 1, false);
  EXPECT_EQ(plain.Indices(), (std::vector<int64_t>{1, 3, 5, 7, 9}));
}

TEST(Sampler, MatchesPyTorchsDistributedSampler) {
  LAUNCH_NEED_PYTHON_TORCH();
  const char* script =
      "import torch.utils.data as d\n"
      "for n, r, drop in ((23, 4, False), (23, 4, True), (7, 3, False)):\n"
      "  for rank in range(r):\n"
      "    s = d.DistributedSampler(range(n), num_replicas=r, rank=rank, shuffle=True, seed=9, drop_last=drop)\n"
      "    s.set_epoch(2)\n"
      "    print(','.join(map(str, s)))\n";
  auto py = launch::testing::RunCmd({"/usr/bin/python3", "-c", script});
  ASSERT_EQ(py.exit_code, 0) << py.err;
  std::string ours;
  for (auto [n, r, drop] : {std::tuple{23, 4, false}, std::tuple{23, 4, true}, std::tuple{7, 3, false}}) {
    for (int rank = 0; rank < r; ++rank) {
      DistributedSampler s(n, r, rank, true, 9, drop);
      s.SetEpoch(2);
      auto idx = s.Indices();
      for (size_t i = 0; i < idx.size(); ++i) ours += (i ? "," : "") + std::to_string(idx[i]);
      ours += "\n";
    }
  }
  EXPECT_EQ(ours, py.out);
}

TEST(GradScaler, SkipsStepsWithInfAndLowersTheScale) {
  auto model = testing::MakeMlp(4, 8, 2, 0);
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1));
  GradScalerOptions o;
  o.init_scale = 1024;
  o.growth_interval = 3;
  GradScaler scaler(o);
  auto step = [&](bool inject_inf) {
    opt.zero_grad();
    at::Tensor loss = model->forward(at::ones({2, 4})).sum();
    scaler.Scale(loss).backward();
    if (inject_inf) model->parameters()[0].mutable_grad()[0][0] = std::numeric_limits<float>::infinity();
    at::Tensor before = model->parameters()[2].detach().clone();
    bool stepped = scaler.Step(opt);
    scaler.Update();
    return std::make_pair(stepped, !at::equal(before, model->parameters()[2].detach()));
  };
  auto [stepped, changed] = step(true);
  EXPECT_FALSE(stepped);
  EXPECT_FALSE(changed) << "a step with inf gradients must not touch the weights";
  EXPECT_DOUBLE_EQ(scaler.scale(), 512);
  for (int i = 0; i < 2; ++i) {
    std::tie(stepped, changed) = step(false);
    EXPECT_TRUE(stepped && changed);
    EXPECT_DOUBLE_EQ(scaler.scale(), 512);
  }
  step(false);  // the third good step in a row
  EXPECT_DOUBLE_EQ(scaler.scale(), 1024);
  step(true);
  EXPECT_DOUBLE_EQ(scaler.scale(), 512);
  EXPECT_EQ(scaler.growth_tracker(), 0);
}

TEST(GradScaler, UnscaleRestoresTrueGradients) {
  auto a = testing::MakeMlp(4, 8, 2, 3), b = testing::MakeMlp(4, 8, 2, 3);
  torch::optim::SGD oa(a->parameters(), torch::optim::SGDOptions(0.1)), ob(b->parameters(), torch::optim::SGDOptions(0.1));
  GradScaler scaler;
  a->forward(at::ones({2, 4})).sum().backward();
  scaler.Scale(b->forward(at::ones({2, 4})).sum()).backward();
  scaler.Unscale(ob);
  for (size_t i = 0; i < a->parameters().size(); ++i) {
    EXPECT_TRUE(at::allclose(a->parameters()[i].grad(), b->parameters()[i].grad(), 1e-5, 1e-6));
  }
  EXPECT_FALSE(scaler.found_inf());
}

TEST(GradScaler, NoGradientsIsNotAnOverflow) {
  auto m = testing::MakeMlp(4, 8, 2, 0);
  torch::optim::SGD opt(m->parameters(), torch::optim::SGDOptions(0.1));
  GradScaler scaler;
  EXPECT_TRUE(scaler.Step(opt));
  EXPECT_FALSE(scaler.found_inf());
}

TEST(GradScaler, NanInAnyTensorIsFound) {
  auto m = testing::MakeMlp(4, 8, 2, 0);
  torch::optim::SGD opt(m->parameters(), torch::optim::SGDOptions(0.1));
  GradScaler scaler;
  scaler.Scale(m->forward(at::ones({2, 4})).sum()).backward();
  m->parameters().back().mutable_grad()[0] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_FALSE(scaler.Step(opt));
  EXPECT_TRUE(scaler.found_inf());
}

TEST(Autocast, Bf16OnCpu) {
  auto m = testing::MakeMlp(4, 8, 2, 0);
  {
    Autocast ac(c10::kCPU, at::kBFloat16);
    EXPECT_EQ(m->forward(at::ones({2, 4})).scalar_type(), at::kBFloat16);
    {
      Autocast off(c10::kCPU, at::kBFloat16, /*enabled=*/false);  // a disabled scope changes nothing
      EXPECT_EQ(m->forward(at::ones({2, 4})).scalar_type(), at::kBFloat16);
    }
  }
  EXPECT_EQ(m->forward(at::ones({2, 4})).scalar_type(), at::kFloat);
}

TEST(Autocast, Fp16OnCpuWhereThisLibTorchHasIt) {
  auto m = testing::MakeMlp(4, 8, 2, 0);
#if LAUNCH_SDK_AUTOCAST_BY_DEVICE
  {
    Autocast ac(c10::kCPU, at::kHalf);
    EXPECT_EQ(m->forward(at::ones({2, 4})).scalar_type(), at::kHalf);
  }
  EXPECT_EQ(m->forward(at::ones({2, 4})).scalar_type(), at::kFloat);
#else
  try {
    Autocast ac(c10::kCPU, at::kHalf);
    ADD_FAILURE() << "fp16 autocast on cpu must be refused by LibTorch " << TORCH_VERSION;
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), HasSubstr("Half on cpu: expected BFloat16"));
  }
#endif
}

TEST(Autocast, BadDtypeOrDeviceIsRefusedByName) {
  try {
    Autocast ac(c10::kCPU, at::kDouble);
    ADD_FAILURE() << "Double autocast accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), HasSubstr("Double"));
  }
  try {
    Autocast ac(c10::kMeta, at::kBFloat16);
    ADD_FAILURE() << "meta autocast accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), HasSubstr("expected cpu or cuda"));
  }
}

struct DeviceRow {
  const char* binding;
  int local_rank, visible, index;  // index -1: an error naming the values
  const char* error;
};

TEST(CudaDeviceIndex, Table) {
  const DeviceRow rows[] = {
      {"shared", 0, 8, 0, ""},  {"shared", 7, 8, 7, ""},
      {"shared", 2, 2, -1, "LOCAL_RANK=2 with 2 CUDA device(s) visible"},
      {"isolate", 5, 1, 0, ""}, {"isolate", 0, 0, -1, "no CUDA device visible"},
      {"shared", 0, 0, -1, "no CUDA device visible"},
  };
  for (const auto& r : rows) {
    WorkerEnv env;
    env.gpu_binding = r.binding;
    env.local_rank = r.local_rank;
    SCOPED_TRACE(std::string(r.binding) + " local_rank " + std::to_string(r.local_rank) + " visible " +
                 std::to_string(r.visible));
    if (r.index >= 0) {
      EXPECT_EQ(CudaDeviceIndex(env, r.visible), r.index);
    } else {
      try {
        CudaDeviceIndex(env, r.visible);
        ADD_FAILURE() << "no error";
      } catch (const std::invalid_argument& e) {
        EXPECT_THAT(e.what(), HasSubstr(r.error));
      }
    }
  }
}

TEST(WorkerEnvTest, BadGpuBindingIsNamed) {
  ::setenv("LAUNCH_GPU_BINDING", "pinned", 1);
  try {
    ReadWorkerEnv();
    ADD_FAILURE() << "LAUNCH_GPU_BINDING=pinned accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), HasSubstr("LAUNCH_GPU_BINDING=pinned: expected shared or isolate"));
  }
  ::unsetenv("LAUNCH_GPU_BINDING");
}

// MASTER_PORT was cast to 16 bits unchecked (70000 became port 4464) and ints wrapped.
TEST(WorkerEnvTest, NumbersAreBounded) {
  struct Row {
    const char* name;
    const char* value;
    const char* error;
  } rows[] = {{"MASTER_PORT", "70000", "MASTER_PORT=70000: expected an integer in 1..65535"},
              {"MASTER_PORT", "0", "MASTER_PORT=0: expected"},
              {"RANK", "99999999999", "RANK=99999999999: expected an integer in 0.."},
              {"LOCAL_RANK", "-1", "LOCAL_RANK=-1: expected"},
              {"OMP_NUM_THREADS", "0", "OMP_NUM_THREADS=0: expected"},
              {"LAUNCH_PER_WORKER_BATCH", "12x", "LAUNCH_PER_WORKER_BATCH=12x: expected"}};
  for (const auto& r : rows) {
    ::setenv(r.name, r.value, 1);
    try {
      ReadWorkerEnv();
      ADD_FAILURE() << r.name << "=" << r.value << " accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_THAT(e.what(), HasSubstr(r.error));
    }
    ::unsetenv(r.name);
  }
  ::setenv("MASTER_PORT", "65535", 1);
  EXPECT_EQ(ReadWorkerEnv().master_port, 65535);
  ::unsetenv("MASTER_PORT");
}

TEST(GatherRows, OnTheCpuIsIndexSelect) {
  at::Tensor rows = at::arange(12, at::kFloat).reshape({4, 3});
  at::Tensor idx = at::tensor(std::vector<int64_t>{3, 0, 3}, at::kLong);
  EXPECT_TRUE(at::equal(GatherRows(rows, idx, c10::kCPU), rows.index_select(0, idx)));
}

TEST(StepProfiler, RecordsTheGivenStepsIntoAChromeTrace) {
  TempDir dir;
  const std::string path = dir / "trace.json";
  {
    StepProfiler p("2-3", path);
    auto m = testing::MakeMlp(4, 8, 2, 0);
    for (int64_t step = 1; step <= 5; ++step) {
      p.BeginStep(step);
      EXPECT_EQ(p.recording(), step == 2 || step == 3) << "step " << step;
      m->forward(at::ones({2, 4})).sum().backward();
    }
#if LAUNCH_SDK_KINETO_API
    // Debian's LibTorch 2.x and PyTorch's own builds have kineto; 1.13 (Debian) records the legacy way.
    EXPECT_TRUE(p.kineto()) << "LibTorch " << TORCH_VERSION << " should record with kineto";
#else
    EXPECT_FALSE(p.kineto());
#endif
  }
  const std::string trace = launch::testing::ReadFile(path);
  const auto has = [&](const char* s) { return trace.find(s) != std::string::npos; };
  // kineto writes {"traceEvents": [...]}, the legacy profiler a bare array of the same events.
  EXPECT_TRUE(has("\"ph\": \"X\"")) << "no complete events in " << path;
  EXPECT_TRUE(has("aten::addmm")) << "the linear layers' matmuls are missing from " << path;
#if LAUNCH_SDK_KINETO_API
  EXPECT_TRUE(has("traceEvents")) << path;
#endif
}

class CheckpointTest : public ::testing::Test {
 protected:
  TempDir dir_;
};

TEST_F(CheckpointTest, RoundTripsModelOptimizerStateAndRng) {
  auto m = testing::MakeMlp(4, 8, 2, 1);
  torch::optim::SGD opt(m->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  m->forward(at::ones({2, 4})).sum().backward();
  opt.step();  // momentum buffers exist now
  Checkpointer ck(dir_.path());
  TrainState st{7, 2, 96, 0, 0};
  ck.Save(st, *m, opt, 0);
  at::Tensor expected_next = at::rand({3});

  auto m2 = testing::MakeMlp(4, 8, 2, 99);
  torch::optim::SGD opt2(m2->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  auto loaded = ck.LoadLatest(*m2, opt2);
  ASSERT_TRUE(loaded.has_value());
  EXPECT_EQ(loaded->step, 7);
  EXPECT_EQ(loaded->epoch, 2);
  EXPECT_EQ(loaded->sampler_position, 96);
  for (size_t i = 0; i < m->parameters().size(); ++i) {
    EXPECT_TRUE(at::equal(m->parameters()[i], m2->parameters()[i]));
  }
  EXPECT_TRUE(at::equal(at::rand({3}), expected_next)) << "the RNG resumes where it was saved";
  // Same momentum: the next step moves both models identically.
  opt.zero_grad();
  opt2.zero_grad();
  m->forward(at::ones({2, 4})).sum().backward();
  m2->forward(at::ones({2, 4})).sum().backward();
  opt.step();
  opt2.step();
  EXPECT_TRUE(at::equal(m->parameters()[0], m2->parameters()[0]));
}

// Each optimizer whose state a snapshot holds tensor by tensor resumes as it was: the parameters,
// the learning rate and each parameter's state (the next step moves both models alike).
TEST_F(CheckpointTest, EachOptimizerKindResumesItsStateAndLearningRate) {
  using Make = std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<at::Tensor>, double)>;
  const std::vector<std::pair<std::string, Make>> cases = {
      {"SGD", [](std::vector<at::Tensor> p, double lr) -> std::unique_ptr<torch::optim::Optimizer> {
         return std::make_unique<torch::optim::SGD>(p, torch::optim::SGDOptions(lr).momentum(0.9));
       }},
      {"Adam", [](std::vector<at::Tensor> p, double lr) -> std::unique_ptr<torch::optim::Optimizer> {
         return std::make_unique<torch::optim::Adam>(p, torch::optim::AdamOptions(lr).amsgrad(true));
       }},
      {"AdamW", [](std::vector<at::Tensor> p, double lr) -> std::unique_ptr<torch::optim::Optimizer> {
         return std::make_unique<torch::optim::AdamW>(p, torch::optim::AdamWOptions(lr));
       }},
      {"Adagrad", [](std::vector<at::Tensor> p, double lr) -> std::unique_ptr<torch::optim::Optimizer> {
         return std::make_unique<torch::optim::Adagrad>(p, torch::optim::AdagradOptions(lr));
       }},
      {"RMSprop", [](std::vector<at::Tensor> p, double lr) -> std::unique_ptr<torch::optim::Optimizer> {
         return std::make_unique<torch::optim::RMSprop>(p, torch::optim::RMSpropOptions(lr).momentum(0.5).centered(true));
       }},
  };
  auto step = [](auto& model, torch::optim::Optimizer& opt) {
    opt.zero_grad();
    model->forward(at::ones({2, 4})).sum().backward();
    opt.step();
  };
  for (const auto& [name, make] : cases) {
    SCOPED_TRACE(name);
    TempDir dir;
    auto m = testing::MakeMlp(4, 8, 2, 1);
    auto opt = make(m->parameters(), 0.01);
    step(m, *opt);
    step(m, *opt);
    Checkpointer ck(dir.path());
    ck.Save({5}, *m, *opt, 0);
    auto m2 = testing::MakeMlp(4, 8, 2, 99);
    auto opt2 = make(m2->parameters(), 0.5);
    auto loaded = ck.LoadLatest(*m2, *opt2);
    ASSERT_TRUE(loaded.has_value());
    EXPECT_EQ(loaded->step, 5);
    EXPECT_EQ(opt2->param_groups()[0].options().get_lr(), 0.01);
    step(m, *opt);
    step(m2, *opt2);
    for (size_t i = 0; i < m->parameters().size(); ++i) {
      EXPECT_TRUE(at::equal(m->parameters()[i], m2->parameters()[i])) << "parameter " << i;
    }
  }
}

// A snapshot of another model is checked before anything live changes: nothing loads and the
// model keeps its own values.
TEST_F(CheckpointTest, ASnapshotOfAnotherShapeLeavesTheModelAsItWas) {
  auto m = testing::MakeMlp(4, 8, 2, 1);
  torch::optim::SGD opt(m->parameters(), torch::optim::SGDOptions(0.1));
  Checkpointer ck(dir_.path());
  ck.Save({3}, *m, opt, 0);
  auto other = testing::MakeMlp(4, 16, 2, 7);
  torch::optim::SGD other_opt(other->parameters(), torch::optim::SGDOptions(0.2));
  const at::Tensor before = other->parameters()[0].clone();
  ::testing::internal::CaptureStderr();
  auto loaded = ck.LoadLatest(*other, other_opt);
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_FALSE(loaded.has_value());
  EXPECT_THAT(err, HasSubstr("has a different shape or dtype"));
  EXPECT_TRUE(at::equal(other->parameters()[0], before));
  EXPECT_EQ(other_opt.param_groups()[0].options().get_lr(), 0.2);
}

TEST_F(CheckpointTest, NonZeroRanksDoNotWriteAndOnlyLastKAreKept) {
  auto m = testing::MakeMlp(4, 8, 2, 1);
  torch::optim::SGD opt(m->parameters(), torch::optim::SGDOptions(0.1));
  Checkpointer ck(dir_.path(), 2);
  ck.Save({1}, *m, opt, 1);
  EXPECT_TRUE(ck.List().empty());
  for (int64_t s : {1, 2, 3, 4}) ck.Save({s}, *m, opt, 0);
  auto files = ck.List();
  ASSERT_EQ(files.size(), 2u);
  EXPECT_THAT(files[0], HasSubstr("ckpt-0000000003.lck"));
}

TEST_F(CheckpointTest, TruncatedAndCorruptFilesAreSkipped) {
  auto m = testing::MakeMlp(4, 8, 2, 1);
  torch::optim::SGD opt(m->parameters(), torch::optim::SGDOptions(0.1));
  Checkpointer ck(dir_.path(), 5);
  for (int64_t s : {1, 2, 3}) ck.Save({s}, *m, opt, 0);
  auto files = ck.List();
  std::filesystem::resize_file(files[2], std::filesystem::file_size(files[2]) / 2);  // step 3: truncated
  {
    std::fstream f(files[1], std::ios::in | std::ios::out | std::ios::binary);  // step 2: one byte flipped
    f.seekp(200);
    char c = 0;
    f.read(&c, 1);
    f.seekp(200);
    c ^= 0x5a;
    f.write(&c, 1);
  }
  ::testing::internal::CaptureStderr();
  auto loaded = ck.LoadLatest(*m, opt);
  std::string err = ::testing::internal::GetCapturedStderr();
  ASSERT_TRUE(loaded.has_value());
  EXPECT_EQ(loaded->step, 1);
  EXPECT_THAT(err, HasSubstr("ckpt-0000000003.lck: truncated"));
  EXPECT_THAT(err, HasSubstr("ckpt-0000000002.lck: checksum mismatch"));
}

TEST_F(CheckpointTest, WriterKilledMidSaveLeavesThePreviousLoadable) {
  launch::testing::Child writer({SDK_WORKER_BIN, "ckpt-writer", dir_.path()});
  // Wait until the big checkpoint is being written, then kill the writer.
  ASSERT_TRUE(launch::testing::WaitUntil([&] {
    writer.Pump(1);
    if (writer.out().find("saved 1") == std::string::npos) return false;
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(dir_.path(), ec)) {
      if (e.path().extension() == ".tmp" && std::filesystem::file_size(e.path(), ec) > 0) return true;
    }
    return false;
  }, std::chrono::seconds(60)));
  ::kill(writer.pid(), SIGKILL);
  writer.Wait();
  auto m = testing::MakeMlp(16, 32, 4, 5);
  torch::optim::SGD opt(m->parameters(), torch::optim::SGDOptions(0.1));
  Checkpointer ck(dir_.path());
  auto loaded = ck.LoadLatest(*m, opt);
  ASSERT_TRUE(loaded.has_value()) << "the checkpoint saved before the kill must load";
  EXPECT_EQ(loaded->step, 1);
  auto expected = testing::MakeMlp(16, 32, 4, 1);
  EXPECT_TRUE(at::equal(m->parameters()[0], expected->parameters()[0]));
}

TEST(ErrorJson, TorchelasticShapeWithEscapes) {
  std::string j = ErrorJson("RuntimeError: bad \"x\"\nline2", "std::runtime_error", "a\tb", 1700000000);
  EXPECT_THAT(j, HasSubstr("{\"message\": {\"message\": \"RuntimeError: bad \\\"x\\\"\\nline2\""));
  EXPECT_THAT(j, HasSubstr("\"timestamp\": \"1700000000\""));
  EXPECT_THAT(j, HasSubstr("\"py_callstack\": \"a\\tb\""));
}

}  // namespace
}  // namespace launch_sdk
