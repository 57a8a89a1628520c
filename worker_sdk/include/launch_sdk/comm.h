// The collective-communication object the SDK works with. LibTorch 1.x exposes Gloo and NCCL as
// c10d::ProcessGroup subclasses; 2.x as c10d::Backend subclasses with the same collectives.
#pragma once

#include <torch/version.h>

#if TORCH_VERSION_MAJOR >= 2
#include <torch/csrc/distributed/c10d/Backend.hpp>
namespace launch_sdk {
using Comm = c10d::Backend;
}
#else
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
namespace launch_sdk {
using Comm = c10d::ProcessGroup;
}
#endif
