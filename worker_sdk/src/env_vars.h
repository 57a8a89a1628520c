// The SDK's reading of environment variables that more than one of its sources reads (a standby
// before its go, the worker after); internal, no LibTorch.
#pragma once

namespace launch_sdk::internal {

// LAUNCH_STANDBY_KEEP_WARM_MS (launch_sdk/warm_start.h).
inline constexpr int kDefaultStandbyKeepWarmMs = 50;
inline constexpr int kMaxStandbyKeepWarmMs = 60000;

// `name`'s value when it is set and not empty; else null.
const char* EnvValue(const char* name);

// The integer `v` (the value of `name`) when it lies in [min, max]; else throws
// std::invalid_argument "NAME=V: expected an integer in MIN..MAX".
long ParseEnvLong(const char* name, const char* v, long min, long max);

}  // namespace launch_sdk::internal
