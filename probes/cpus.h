// How many CPUs this process may really use: its affinity mask, capped by a cgroup CPU quota.
#pragma once

#include <optional>
#include <string>

namespace launch {

// CPUs in sched_getaffinity's mask.
int AffinityCpuCount();
// ceil(quota/period) from cgroup v2 "cpu.max" contents ("max 100000" → nullopt).
std::optional<int> ParseCgroupV2CpuMax(const std::string& contents);
// ceil(quota/period) from cgroup v1 cfs_quota_us and cfs_period_us (quota -1 → nullopt).
std::optional<int> ParseCgroupV1Quota(const std::string& quota_us, const std::string& period_us);
// min(affinity, cgroup quota), at least 1.
int UsableCpuCount();

}  // namespace launch
