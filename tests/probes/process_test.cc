// PosixProcessLauncher against real processes: what a worker is given before its code runs.
#include "probes/process.h"

#include <sys/wait.h>
#include <unistd.h>

#include <functional>
#include <string>
#include <vector>

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

// Spawns argv with a pipe as the orphan guard's; returns Spawn's answer and, in *lines, what the
// child (and Spawn) wrote on the pipe by the time Spawn returned.
absl::StatusOr<pid_t> SpawnWithGuardPipe(const std::string& program, std::string* lines) {
  Pipe guard;
  if (!MakePipe(&guard)) return absl::InternalError("pipe");
  PosixProcessLauncher launcher;
  SpawnOptions so;
  so.argv = {program};
  so.guard_fd = guard.write.get();
  auto pid = launcher.Spawn(so);
  guard.write.Reset();  // only what was written by now can be read
  *lines = ReadAvailable(guard.read.get());
  return pid;
}

// The group was registered with the orphan guard by launch after Spawn returned: a launch killed
// in between left that worker's children running. The child registers itself before exec now.
TEST(Spawn, TheChildRegistersItsGroupWithTheGuardBeforeExec) {
  std::string lines;
  auto pid = SpawnWithGuardPipe("/bin/true", &lines);
  ASSERT_TRUE(pid.ok()) << pid.status();
  EXPECT_EQ(lines, absl::StrCat("+", *pid, "\n"));
  int status = 0;
  ASSERT_EQ(::waitpid(*pid, &status, 0), *pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

// A child that registered and then could not exec is unregistered: no stale group id is left for
// the guard to SIGKILL later, when the id may belong to another process group.
TEST(Spawn, AFailedStartUnregistersTheGroup) {
  std::string lines;
  ASSERT_FALSE(SpawnWithGuardPipe("/nonexistent/program", &lines).ok());
  ASSERT_EQ(lines.size() % 2, 0u) << lines;
  const std::string plus = lines.substr(0, lines.size() / 2), minus = lines.substr(lines.size() / 2);
  EXPECT_EQ(plus[0], '+') << lines;
  EXPECT_EQ(minus, "-" + plus.substr(1)) << lines;
}

// What Spawn refuses it refuses while planning the child, before it forks: each bad option is an
// InvalidArgument that names what was wrong.
TEST(Spawn, BadOptionsAreRefusedBeforeAChildIsMade) {
  struct Case {
    std::function<void(SpawnOptions*)> set;
    std::string error;
  };
  const std::vector<Case> cases = {
      {[](SpawnOptions* o) { o->argv.clear(); }, "empty argv"},
      {[](SpawnOptions* o) {
         o->extra_fd = 0;
         o->extra_fd_target = 2;
       },
       "the extra descriptor's target must be above 2"},
      {[](SpawnOptions* o) { o->cpus = {-1, 0}; }, "CPU id out of range"},
      {[](SpawnOptions* o) { o->cpus = {0, 1 << 16}; }, "CPU id out of range"},
      {[](SpawnOptions* o) { o->preferred_memory_node = 1 << 12; }, "NUMA node out of range"},
  };
  PosixProcessLauncher launcher;
  for (const Case& c : cases) {
    SpawnOptions so;
    so.argv = {"/bin/true"};
    c.set(&so);
    auto pid = launcher.Spawn(so);
    ASSERT_FALSE(pid.ok()) << c.error;
    EXPECT_EQ(pid.status().code(), absl::StatusCode::kInvalidArgument) << pid.status();
    EXPECT_EQ(pid.status().message(), c.error);
  }
}

}  // namespace
}  // namespace launch
