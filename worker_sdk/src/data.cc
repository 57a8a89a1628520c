#include "launch_sdk/data.h"

#include <ATen/ATen.h>

#include <stdexcept>
#include <string>

namespace launch_sdk {

at::Tensor GatherRows(const at::Tensor& rows, const at::Tensor& index, c10::Device device) {
  if (!rows.device().is_cpu() || !index.device().is_cpu())
    throw std::invalid_argument("GatherRows: rows and index must be host tensors, got " + rows.device().str() +
                                " and " + index.device().str());
  if (device.is_cpu()) return rows.index_select(0, index);
  std::vector<int64_t> sizes = rows.sizes().vec();
  sizes.at(0) = index.numel();
  at::Tensor staging = at::empty(sizes, rows.options().pinned_memory(true));
  at::index_select_out(staging, rows, 0, index);
  return staging.to(device, /*non_blocking=*/true);
}

}  // namespace launch_sdk
