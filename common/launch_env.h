// The environment variables launch reads for itself, declared once. A worker never reads them (the
// names launch and its workers share are launch_sdk/contract.h's); the token is taken out of every
// worker's environment.
#pragma once

namespace launch {

inline constexpr char kLogLevelEnv[] = "LAUNCH_LOG_LEVEL";        // spdlog's level: trace .. off
inline constexpr char kRdzvTokenEnv[] = "LAUNCH_RDZV_TOKEN";      // the rendezvous token, without --rdzv-token-file
inline constexpr char kSysfsRootEnv[] = "LAUNCH_SYSFS_ROOT";      // where the NUMA probes read /sys (tests)
inline constexpr char kNvmlLibraryEnv[] = "LAUNCH_NVML_LIBRARY";  // the NVML library to load (a path)

}  // namespace launch
