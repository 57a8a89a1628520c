// What differs between the LibTorch releases worker_sdk builds against (1.13 to 2.x), in one
// place: the sources test these macros instead of spelling out version numbers.
#pragma once

#include <torch/version.h>

#define LAUNCH_SDK_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) || (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

// 2.4 made autocast per device type (is_autocast_enabled(device), get/set_autocast_dtype(device))
// and deprecated the CPU/GPU pairs.
#define LAUNCH_SDK_AUTOCAST_BY_DEVICE LAUNCH_SDK_TORCH_AT_LEAST(2, 4)
// 2.x: Gloo and NCCL are c10d::Backend subclasses; 1.x: c10d::ProcessGroup subclasses. Their
// collectives return c10d::Work on both (1.13 moved ProcessGroup::Work there), so nothing else
// differs for DDP and GradScaler.
#define LAUNCH_SDK_C10D_BACKEND LAUNCH_SDK_TORCH_AT_LEAST(2, 0)
// 2.4 made libuv the default TCPStore server (TCPStoreOptions::useLibUV), which some builds
// (Debian's) lack.
#define LAUNCH_SDK_TCPSTORE_LIBUV LAUNCH_SDK_TORCH_AT_LEAST(2, 3)
// The kineto profiler API (prepareProfiler/enableProfiler/disableProfiler()->save) as used here;
// whether the library was built with kineto is found out at run time.
#define LAUNCH_SDK_KINETO_API LAUNCH_SDK_TORCH_AT_LEAST(2, 0)
// 2.3 made c10::Allocator::allocate non-const and added the pure virtual copy_data.
#define LAUNCH_SDK_ALLOCATOR_NON_CONST LAUNCH_SDK_TORCH_AT_LEAST(2, 3)
#define LAUNCH_SDK_ALLOCATOR_COPY_DATA LAUNCH_SDK_TORCH_AT_LEAST(2, 3)
