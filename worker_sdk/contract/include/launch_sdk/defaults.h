// Defaults that launch and its workers both assume, declared once for both: the SDK reads them
// without LibTorch or launch's headers, and launch's tunables table (common/tunables.h) takes them.
#pragma once

namespace launch_sdk {

// MASTER_PORT where nothing sets it (torchrun's default): a worker run alone, and launch's static
// rendezvous without --master-port.
inline constexpr int kDefaultMasterPort = 29500;

}  // namespace launch_sdk
