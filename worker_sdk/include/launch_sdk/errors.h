// Torchelastic error files from C++ workers: an uncaught exception or a fatal signal writes
// TORCHELASTIC_ERROR_FILE (message, type, stack, timestamp) so `launch` shows the real cause.
#pragma once

#include <functional>
#include <string>

namespace launch_sdk {

// Writes the error file now (no-op when TORCHELASTIC_ERROR_FILE is unset). Never throws.
void WriteErrorFile(const std::string& message, const std::string& type, const std::string& stack);

// Installs std::terminate and fatal-signal handlers (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT)
// that write the error file before the process dies. Idempotent.
void InstallErrorHandlers();

// Runs `main_fn`; an exception escaping it is written to the error file and returns 1.
int RunWithErrorFile(const std::function<int()>& main_fn);

// torchelastic's JSON for one error (exposed for tests).
std::string ErrorJson(const std::string& message, const std::string& type, const std::string& stack, long timestamp);

}  // namespace launch_sdk
