// PosixProcessLauncher against real processes: what a worker is given before its code runs.
#include "agent/process.h"

#include <sys/wait.h>
#include <unistd.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "common/unique_fd.h"
#include "gtest/gtest.h"

namespace launch {
namespace {

std::string ReadAvailable(int fd) {
  std::string out;
  char buf[256];
  ssize_t n;
  while ((n = ::read(fd, buf, sizeof buf)) > 0) out.append(buf, static_cast<size_t>(n));
  return out;
}

// The group was registered with the orphan guard by launch after Spawn returned: a launch killed
// in between left that worker's children running. The child registers itself before exec now.
TEST(Spawn, TheChildRegistersItsGroupWithTheGuardBeforeExec) {
  Pipe guard;
  ASSERT_TRUE(MakePipe(&guard));
  PosixProcessLauncher launcher;
  SpawnOptions so;
  so.argv = {"/bin/true"};
  so.guard_fd = guard.write.get();
  auto pid = launcher.Spawn(so);
  ASSERT_TRUE(pid.ok()) << pid.status();
  guard.write.Reset();  // only the child's line can be in the pipe, and it is there already
  EXPECT_EQ(ReadAvailable(guard.read.get()), absl::StrCat("+", *pid, "\n"));
  int status = 0;
  ASSERT_EQ(::waitpid(*pid, &status, 0), *pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

// A child that registered and then could not exec is unregistered: no stale group id is left for
// the guard to SIGKILL later, when the id may belong to another process group.
TEST(Spawn, AFailedStartUnregistersTheGroup) {
  Pipe guard;
  ASSERT_TRUE(MakePipe(&guard));
  PosixProcessLauncher launcher;
  SpawnOptions so;
  so.argv = {"/nonexistent/program"};
  so.guard_fd = guard.write.get();
  auto pid = launcher.Spawn(so);
  ASSERT_FALSE(pid.ok());
  guard.write.Reset();
  const std::string lines = ReadAvailable(guard.read.get());
  ASSERT_EQ(lines.size() % 2, 0u) << lines;
  const std::string plus = lines.substr(0, lines.size() / 2), minus = lines.substr(lines.size() / 2);
  EXPECT_EQ(plus[0], '+') << lines;
  EXPECT_EQ(minus, "-" + plus.substr(1)) << lines;
}

}  // namespace
}  // namespace launch
