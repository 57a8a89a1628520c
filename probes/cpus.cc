#include "probes/cpus.h"

#include <sched.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace launch {
namespace {

std::optional<int> CeilRatio(double quota, double period) {
  if (quota <= 0 || period <= 0) return std::nullopt;
  return std::max(1, static_cast<int>(std::ceil(quota / period)));
}

std::string ReadSmallFile(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// This process's cgroup v2 directory, from /proc/self/cgroup ("0::/path").
std::string CgroupV2Dir() {
  std::ifstream f("/proc/self/cgroup");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("0::", 0) == 0) return "/sys/fs/cgroup" + line.substr(3);
  }
  return "/sys/fs/cgroup";
}

}  // namespace

int AffinityCpuCount() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0) return 1;
  return std::max(1, CPU_COUNT(&set));
}

std::optional<int> ParseCgroupV2CpuMax(const std::string& contents) {
  std::vector<std::string> parts = absl::StrSplit(absl::StripAsciiWhitespace(contents), ' ', absl::SkipEmpty());
  if (parts.size() != 2 || parts[0] == "max") return std::nullopt;
  double quota, period;
  if (!absl::SimpleAtod(parts[0], &quota) || !absl::SimpleAtod(parts[1], &period)) return std::nullopt;
  return CeilRatio(quota, period);
}

std::optional<int> ParseCgroupV1Quota(const std::string& quota_us, const std::string& period_us) {
  double quota, period;
  if (!absl::SimpleAtod(absl::StripAsciiWhitespace(quota_us), &quota) ||
      !absl::SimpleAtod(absl::StripAsciiWhitespace(period_us), &period)) {
    return std::nullopt;
  }
  return CeilRatio(quota, period);
}

int UsableCpuCount() {
  int cpus = AffinityCpuCount();
  // Walk up the cgroup v2 hierarchy: any ancestor's quota caps this process.
  for (std::string dir = CgroupV2Dir(); dir.size() >= std::string("/sys/fs/cgroup").size();) {
    if (auto q = ParseCgroupV2CpuMax(ReadSmallFile(dir + "/cpu.max"))) cpus = std::min(cpus, *q);
    auto slash = dir.rfind('/');
    if (slash == std::string::npos || dir == "/sys/fs/cgroup") break;
    dir = dir.substr(0, slash);
  }
  if (auto q = ParseCgroupV1Quota(ReadSmallFile("/sys/fs/cgroup/cpu/cpu.cfs_quota_us"),
                                  ReadSmallFile("/sys/fs/cgroup/cpu/cpu.cfs_period_us"))) {
    cpus = std::min(cpus, *q);
  }
  return std::max(1, cpus);
}

}  // namespace launch
