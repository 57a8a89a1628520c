// agent/worker_memory: the files a worker's Checkpointer keeps its snapshots in, and the node's
// all-reduce segment, opened through the agent's /proc entry, are one file each whatever opens
// them, and outlive their openers.
#include "agent/worker_memory.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace launch {
namespace {

TEST(WorkerMemory, EachLocalRankHasTwoFilesAndTheNodeOneThatOutliveWhoeverOpensThem) {
  auto m = WorkerMemory::Create(2);
  ASSERT_TRUE(m.ok()) << m.status();
  std::vector<std::string> paths;
  for (int rank : {0, 1}) {
    std::vector<std::string> two = absl::StrSplit((*m)->CheckpointEnvValue(rank), ',');
    ASSERT_EQ(two.size(), 2u);
    for (const std::string& p : two) {
      EXPECT_THAT(p, ::testing::StartsWith("/proc/" + std::to_string(::getpid()) + "/fd/"));
      paths.push_back(p);
    }
  }
  const std::string allreduce = (*m)->ShmAllreduceEnvValue();
  EXPECT_THAT(allreduce, ::testing::StartsWith("/proc/" + std::to_string(::getpid()) + "/fd/"));
  EXPECT_EQ(allreduce.find(','), std::string::npos);
  paths.push_back(allreduce);
  EXPECT_EQ(static_cast<int>(paths.size()), WorkerMemory::FileCount(2));
  // Five different files, empty until written; what one opener writes the next one reads, after the first is closed.
  for (size_t i = 0; i < paths.size(); ++i) {
    const int fd = ::open(paths[i].c_str(), O_RDWR | O_CLOEXEC);
    ASSERT_GE(fd, 0) << paths[i];
    struct stat st {};
    ASSERT_EQ(::fstat(fd, &st), 0);
    EXPECT_EQ(st.st_size, 0) << paths[i];
    const std::string text = "slot " + std::to_string(i);
    ASSERT_EQ(::pwrite(fd, text.data(), text.size(), 4096), static_cast<ssize_t>(text.size()));
    ::close(fd);
  }
  for (size_t i = 0; i < paths.size(); ++i) {
    const int fd = ::open(paths[i].c_str(), O_RDONLY | O_CLOEXEC);
    ASSERT_GE(fd, 0);
    struct stat st {};
    ASSERT_EQ(::fstat(fd, &st), 0);
    EXPECT_TRUE(S_ISREG(st.st_mode));
    char buf[16] = {};
    const std::string text = "slot " + std::to_string(i);
    EXPECT_EQ(::pread(fd, buf, text.size(), 4096), static_cast<ssize_t>(text.size()));
    EXPECT_EQ(std::string(buf, text.size()), text);
    ::close(fd);
  }
}

}  // namespace
}  // namespace launch
