// Reading the small files launch is given or looks at (tokens, certificates, config, error files,
// /proc): never more than a bound, never blocked by a FIFO, never a device.
#pragma once

#include <cstddef>
#include <string>

#include "absl/status/statusor.h"

namespace launch {

// The first `max` bytes of `path` (a /proc file, which stat calls empty): "" when it cannot be
// opened or read.
std::string ReadFileUpTo(const std::string& path, size_t max);

// The whole of `path`, which must be a regular file of at most `max` bytes. Opened without
// blocking (a FIFO is refused, not waited on). Errors are one line: "<path>: <what is wrong>;
// expected <expected>" (NotFound when it cannot be opened, InvalidArgument otherwise).
absl::StatusOr<std::string> ReadRegularFile(const std::string& path, size_t max, const std::string& expected);

}  // namespace launch
