// Moving a step's batch from host memory to the training device: on CUDA through pinned
// (page-locked) memory with a copy that does not block the host, as DataLoader(pin_memory=True)
// and .to(device, non_blocking=True) do in Python.
#pragma once

#include <ATen/Tensor.h>
#include <c10/core/Device.h>

namespace launch_sdk {

// Rows `index` (int64, on the host) of the host tensor `rows`, on `device`. For CUDA the rows are
// gathered into pinned memory (LibTorch's caching host allocator: the block is not reused until
// the copy is done) and copied asynchronously on the current stream; on the CPU it is index_select.
at::Tensor GatherRows(const at::Tensor& rows, const at::Tensor& index, c10::Device device);

}  // namespace launch_sdk
