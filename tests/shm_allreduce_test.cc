// ShmAllreduce with threads as ranks: each thread maps the segment on its own, as processes do.
#include "launch_sdk/shm_allreduce.h"

#include <ATen/ATen.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker_sdk/src/premap.h"

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

// A file that outlives the groups it serves, as launch's (LAUNCH_SHM_ALLREDUCE_MEMORY): an empty
// regular file, removed at the end.
class SegmentFile {
 public:
  explicit SegmentFile(const char* what)
      : path_("/dev/shm/launch_sdk_test." + std::to_string(getpid()) + "." + what + ".file") {
    const int fd = ::open(path_.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    EXPECT_GE(fd, 0) << path_;
    ::close(fd);
  }
  ~SegmentFile() { std::filesystem::remove(path_); }
  const std::string& path() const { return path_; }
  size_t size() const { return std::filesystem::file_size(path_); }

 private:
  std::string path_;
};

// Rank 0 resets the file for the group, then the others open it.
std::vector<std::unique_ptr<ShmAllreduce>> FileGroup(const std::string& path, int size, size_t slot_bytes,
                                                     std::chrono::milliseconds timeout = 10s) {
  std::vector<std::unique_ptr<ShmAllreduce>> g;
  for (int r = 0; r < size; ++r) g.push_back(ShmAllreduce::InFile(path, r == 0, r, size, timeout, slot_bytes));
  return g;
}

void ExpectSums(std::vector<std::unique_ptr<ShmAllreduce>>& g) {
  const int size = static_cast<int>(g.size());
  std::vector<std::vector<at::Tensor>> in(size);
  at::Tensor expected = at::zeros({777});
  for (int r = 0; r < size; ++r) {
    in[r].push_back(at::randn({777}) * (r + 1));
    expected += in[r][0];
  }
  auto out = RunRanks(g, in);
  for (int r = 0; r < size; ++r) {
    EXPECT_TRUE(at::equal(out[r][0], out[0][0])) << "rank " << r;
    EXPECT_TRUE(at::allclose(out[r][0], expected, 1e-6, 1e-6)) << "rank " << r;
  }
}

// A restarted group of another size, after a group whose rank gave up (its segment poisoned,
// its arrival count stale): rank 0's reset makes the file whole again; it is never shrunk.
TEST(ShmAllreduceInFile, TheFirstGroupSizesTheFileAndEachLaterOneResetsIt) {
  SegmentFile file("groups");
  {
    auto g = FileGroup(file.path(), 3, 1024, 200ms);
    EXPECT_TRUE(g[0]->in_file());
    ExpectSums(g);
    EXPECT_THAT(ErrorOf(g[0]->Allreduce(at::ones({4}))), HasSubstr("rank 0 waited 200 ms"));
  }
  const size_t three = file.size();
  EXPECT_GE(three, 4u * 1024);  // 3 slots and the result
  auto g = FileGroup(file.path(), 2, 1024);
  ExpectSums(g);
  EXPECT_EQ(file.size(), three);
}

TEST(ShmAllreduceInFile, ARankThatOpensItBeforeItWasSetUpIsToldWhatIsWrong) {
  SegmentFile file("errors");
  try {
    ShmAllreduce::InFile(file.path(), false, 1, 2, 1s, 4096);
    FAIL() << "opened an empty file";
  } catch (const std::runtime_error& e) {
    EXPECT_THAT(e.what(), HasSubstr(file.path() + " is too small for 2 ranks"));
  }
  {
    auto rank0 = ShmAllreduce::InFile(file.path(), true, 0, 3, 1s, 4096);
    try {
      ShmAllreduce::InFile(file.path(), false, 1, 2, 1s, 4096);
      FAIL() << "a segment for 3 ranks opened as one for 2";
    } catch (const std::runtime_error& e) {
      EXPECT_THAT(e.what(), HasSubstr(file.path() + " is not a segment for 2 ranks"));
    }
    try {
      ShmAllreduce::InFile(file.path(), false, 1, 3, 1s, 2048);
      FAIL() << "a segment of 4096-byte slots opened as one of 2048";
    } catch (const std::runtime_error& e) {
      EXPECT_THAT(e.what(), HasSubstr(file.path() + " is not a segment for 3 ranks"));
    }
  }
  const std::string missing = file.path() + ".missing";
  try {
    ShmAllreduce::InFile(missing, true, 0, 2, 1s, 4096);
    FAIL() << "opened a file that is not there";
  } catch (const std::runtime_error& e) {
    EXPECT_THAT(e.what(), HasSubstr("cannot open " + missing + ": No such file or directory"));
  }
  EXPECT_FALSE(std::filesystem::exists(missing));
}

// What a standby maps before its go (internal::Premap) is taken once, and only while the file has
// the size it was mapped with.
TEST(Premap, AMappingIsTakenOnceWhileTheFileKeepsItsSize) {
  SegmentFile file("premap");
  internal::Premap(file.path(), 0);
  EXPECT_FALSE(internal::TakePremapped(file.path())) << "an empty file is left to its first user";

  std::filesystem::resize_file(file.path(), 8192);
  const int fd = ::open(file.path().c_str(), O_RDWR | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::pwrite(fd, "first", 5, 4096), 5);
  internal::Premap(file.path(), 8192);
  EXPECT_FALSE(internal::TakePremapped(file.path())) << "not larger than min_size";
  internal::Premap(file.path(), 0);
  internal::Premap(file.path(), 0);  // mapped already: the first mapping stays
  internal::TouchPremapped();
  auto m = internal::TakePremapped(file.path());
  ASSERT_TRUE(m);
  EXPECT_EQ(m->size, 8192u);
  EXPECT_EQ(std::memcmp(static_cast<char*>(m->base) + 4096, "first", 5), 0);
  ASSERT_EQ(::pwrite(fd, "later", 5, 4096), 5);  // shared: a write to the file shows
  EXPECT_EQ(std::memcmp(static_cast<char*>(m->base) + 4096, "later", 5), 0);
  EXPECT_FALSE(internal::TakePremapped(file.path())) << "taken twice";
  ::munmap(m->base, m->size);
  ::close(m->fd);

  internal::Premap(file.path(), 0);
  internal::DropPremapped(file.path());  // a worker that does not use it
  EXPECT_FALSE(internal::TakePremapped(file.path())) << "dropped";

  internal::Premap(file.path(), 0);
  std::filesystem::resize_file(file.path(), 16384);
  EXPECT_FALSE(internal::TakePremapped(file.path())) << "the file grew after it was mapped";
  ::close(fd);
}

// A standby's mapping of launch's file serves the rank it becomes.
TEST(ShmAllreduceInFile, ARankTakesTheMappingItsStandbyMade) {
  SegmentFile file("standby");
  auto first = FileGroup(file.path(), 2, 4096);  // sizes the file
  first.clear();
  internal::Premap(file.path(), 0);
  auto g = FileGroup(file.path(), 2, 4096);
  EXPECT_FALSE(internal::TakePremapped(file.path())) << "the group did not take the standby's mapping";
  ExpectSums(g);
}

}  // namespace
}  // namespace launch_sdk
