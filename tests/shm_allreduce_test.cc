// ShmAllreduce with threads as ranks: each thread maps the segment on its own, as processes do.
#include "launch_sdk/shm_allreduce.h"

#include <ATen/ATen.h>
#include <unistd.h>

#include <filesystem>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace launch_sdk {
namespace {

using ::testing::HasSubstr;
using namespace std::chrono_literals;

std::string SegmentName(const char* what) { return "/launch_sdk_test." + std::to_string(getpid()) + "." + what; }

// One ShmAllreduce per rank; rank 0 creates the segment, then the others open it.
std::vector<std::unique_ptr<ShmAllreduce>> Group(const std::string& name, int size, size_t slot_bytes,
                                                 std::chrono::milliseconds timeout = 10s) {
  std::vector<std::unique_ptr<ShmAllreduce>> g;
  for (int r = 0; r < size; ++r) g.push_back(std::make_unique<ShmAllreduce>(name, r == 0, r, size, timeout, slot_bytes));
  g[0]->Unlink();
  return g;
}

// Every rank submits its tensors from a thread of its own; returns them after the sums.
std::vector<std::vector<at::Tensor>> RunRanks(std::vector<std::unique_ptr<ShmAllreduce>>& g,
                                              std::vector<std::vector<at::Tensor>> inputs) {
  std::vector<std::thread> threads;
  for (size_t r = 0; r < g.size(); ++r) {
    threads.emplace_back([&, r] {
      std::vector<std::shared_ptr<ShmWork>> works;
      for (auto& t : inputs[r]) works.push_back(g[r]->Allreduce(t));
      for (auto& w : works) w->wait();
    });
  }
  for (auto& t : threads) t.join();
  return inputs;
}

TEST(ShmAllreduce, SumsInChunksWithUnevenSlicesAndEveryRankGetsTheSameBits) {
  const int size = 3;
  auto g = Group(SegmentName("chunks"), size, /*slot_bytes=*/256);  // 64 floats a chunk
  std::vector<std::vector<at::Tensor>> in(size);
  at::Tensor expected = at::zeros({1001});
  for (int r = 0; r < size; ++r) {
    in[r].push_back(at::randn({1001}) + r);
    expected += in[r][0];  // rank order, as the owners of the slices sum
  }
  auto out = RunRanks(g, in);
  for (int r = 0; r < size; ++r) {
    EXPECT_TRUE(at::equal(out[r][0], out[0][0])) << "rank " << r;
    EXPECT_TRUE(at::allclose(out[r][0], expected, 1e-6, 1e-6)) << "rank " << r;
  }
}

TEST(ShmAllreduce, QueuedCollectivesOfSeveralTypesRunInOrder) {
  const int size = 2;
  auto g = Group(SegmentName("types"), size, 4096);
  std::vector<std::vector<at::Tensor>> in(size);
  for (int r = 0; r < size; ++r) {
    in[r].push_back(at::full({3000}, r + 1.0, at::kDouble));
    in[r].push_back(at::full({7}, 0.5 * (r + 1), at::kBFloat16));
    in[r].push_back(at::arange(10, at::kLong) * (r + 1));
  }
  auto out = RunRanks(g, in);
  for (int r = 0; r < size; ++r) {
    EXPECT_TRUE(at::equal(out[r][0], at::full({3000}, 3.0, at::kDouble)));
    EXPECT_TRUE(at::equal(out[r][1], at::full({7}, 1.5, at::kBFloat16)));
    EXPECT_TRUE(at::equal(out[r][2], at::arange(10, at::kLong) * 3));
  }
}

TEST(ShmAllreduce, APeerThatNeverArrivesIsATimeoutNotAHang) {
  auto g = Group(SegmentName("timeout"), 2, 4096, 200ms);
  auto work = g[0]->Allreduce(at::ones({4}));
  try {
    work->wait();
    FAIL() << "expected a timeout";
  } catch (const std::runtime_error& e) {
    EXPECT_THAT(e.what(), HasSubstr("rank 0 waited 200 ms for the other local ranks"));
  }
}

std::string ErrorOf(const std::shared_ptr<ShmWork>& work) {
  try {
    work->wait();
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "";
}

// After a barrier timeout the arrival count was stale and the object stayed usable: a later
// collective waited out its timeout again, or matched the wrong arrivals.
TEST(ShmAllreduce, AFailedCollectiveFailsEveryLaterOneAtOnce) {
  auto g = Group(SegmentName("poison"), 2, 4096, 200ms);
  EXPECT_THAT(ErrorOf(g[0]->Allreduce(at::ones({4}))), HasSubstr("waited 200 ms"));
  const auto start = std::chrono::steady_clock::now();
  EXPECT_THAT(ErrorOf(g[0]->Allreduce(at::ones({4}))), HasSubstr("unusable after an earlier failure (shm allreduce: rank 0 waited"));
  EXPECT_LT(std::chrono::steady_clock::now() - start, 150ms);
}

// Rank 2 never comes: rank 0 gives up after 200 ms, and rank 1, whose own timeout is 60 s, learns
// it from the segment at once instead of waiting a minute.
TEST(ShmAllreduce, ARankThatGivesUpReleasesItsPeers) {
  const std::string name = SegmentName("release");
  ShmAllreduce r0(name, true, 0, 3, 200ms, 4096);
  ShmAllreduce r1(name, false, 1, 3, 60s, 4096);
  r0.Unlink();
  const auto start = std::chrono::steady_clock::now();
  auto w1 = r1.Allreduce(at::ones({4}));
  EXPECT_THAT(ErrorOf(r0.Allreduce(at::ones({4}))), HasSubstr("rank 0 waited 200 ms"));
  EXPECT_THAT(ErrorOf(w1), HasSubstr("rank 1: another local rank gave up on a collective"));
  EXPECT_LT(std::chrono::steady_clock::now() - start, 10s);
}

TEST(ShmAllreduce, OpenErrorsNameTheSegmentAndNothingIsLeftInDevShm) {
  const std::string name = SegmentName("errors");
  EXPECT_THROW(
      {
        try {
          ShmAllreduce(name, false, 1, 2, 1s);
        } catch (const std::runtime_error& e) {
          EXPECT_THAT(e.what(), HasSubstr("cannot open " + name + ": No such file or directory"));
          throw;
        }
      },
      std::runtime_error);
  {
    ShmAllreduce owner(name, true, 0, 2, 1s, 4096);
    EXPECT_TRUE(std::filesystem::exists("/dev/shm" + name));
    try {
      ShmAllreduce(name, false, 1, 3, 1s, 4096);
      FAIL() << "a segment for 2 ranks opened as one for 3";
    } catch (const std::runtime_error& e) {
      EXPECT_THAT(e.what(), HasSubstr("wrong size for 3 ranks"));
    }
    owner.Unlink();
    EXPECT_FALSE(std::filesystem::exists("/dev/shm" + name));
  }
  EXPECT_THROW(ShmAllreduce(name, false, 0, 1, 1s), std::runtime_error);
}

}  // namespace
}  // namespace launch_sdk
