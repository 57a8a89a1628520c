// The environment variables launch reads for itself, declared once. A worker never reads them (the
// names launch and its workers share are launch_sdk/contract.h's); the token is taken out of every
// worker's environment.
#pragma once

namespace launch {

// spdlog's level: trace, debug, info, warn, error or off.
inline constexpr char kLogLevelEnv[] = "LAUNCH_LOG_LEVEL";
// The rendezvous token, when --rdzv-token-file is not given.
inline constexpr char kRdzvTokenEnv[] = "LAUNCH_RDZV_TOKEN";
// Where the NUMA probes read /sys from (tests).
inline constexpr char kSysfsRootEnv[] = "LAUNCH_SYSFS_ROOT";
// The NVML library to load (a path).
inline constexpr char kNvmlLibraryEnv[] = "LAUNCH_NVML_LIBRARY";

}  // namespace launch
