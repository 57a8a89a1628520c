// agent/checkpoint_memory: the files a worker's Checkpointer keeps its snapshots in, opened through
// the agent's /proc entry, are one file per slot whatever opens them, and outlive their openers.
#include "agent/checkpoint_memory.h"

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

TEST(CheckpointMemory, EachLocalRankHasTwoFilesThatOutliveWhoeverOpensThem) {
  auto m = CheckpointMemory::Create(2);
  ASSERT_TRUE(m.ok()) << m.status();
  std::vector<std::string> paths;
  for (int rank : {0, 1}) {
    std::vector<std::string> two = absl::StrSplit((*m)->EnvValue(rank), ',');
    ASSERT_EQ(two.size(), 2u);
    for (const std::string& p : two) {
      EXPECT_THAT(p, ::testing::StartsWith("/proc/" + std::to_string(::getpid()) + "/fd/"));
      paths.push_back(p);
    }
  }
  // Four different files; what one opener writes the next one reads, after the first is closed.
  for (size_t i = 0; i < paths.size(); ++i) {
    const int fd = ::open(paths[i].c_str(), O_RDWR | O_CLOEXEC);
    ASSERT_GE(fd, 0) << paths[i];
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
