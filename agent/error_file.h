// Reads torchelastic error files (TORCHELASTIC_ERROR_FILE), as written by Python's @record and by
// worker_sdk, so the failure summary shows a worker's real error.
#pragma once

#include <cstddef>
#include <string>

#include "absl/status/statusor.h"

namespace launch {

struct ErrorFileInfo {
  std::string message;    // e.g. "RuntimeError: boom"
  std::string timestamp;  // seconds since the epoch, as written
  std::string stack;      // py_callstack or the SDK's stack
};

// A worker's error file is read up to this size; a longer one is not read (InvalidArgument).
inline constexpr size_t kMaxErrorFileBytes = 4 << 20;

// NotFound when the file does not exist; InvalidArgument when it is not torchelastic's JSON.
absl::StatusOr<ErrorFileInfo> ReadErrorFile(const std::string& path);
absl::StatusOr<ErrorFileInfo> ParseErrorJson(const std::string& json);

// What torchrun does with its own TORCHELASTIC_ERROR_FILE when the job fails (schedulers read
// it): the root-cause worker's error file is copied to `path` when it wrote one in torchelastic's
// format, else a torchelastic JSON whose message is `what_happened`. As torchrun, a non-zero
// `error_code` (the exit code, or minus the signal) is set as the message's "errorCode". Written
// whole (a temporary file renamed over `path`).
absl::Status WriteLauncherErrorFile(const std::string& path, const std::string& worker_error_file,
                                    const std::string& what_happened, int error_code, long timestamp);

}  // namespace launch
