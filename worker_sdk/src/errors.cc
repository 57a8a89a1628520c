#include "launch_sdk/errors.h"

#include <execinfo.h>
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <exception>
#include <fstream>
#include <typeinfo>

#include <cxxabi.h>

namespace launch_sdk {
namespace {

std::string JsonEscape(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\r':
        out += "\\r";
        break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out;
}

std::string Backtrace() {
  void* frames[64];
  int n = backtrace(frames, 64);
  char** names = backtrace_symbols(frames, n);
  std::string out;
  for (int i = 0; i < n && names; ++i) {
    out += names[i];
    out += "\n";
  }
  std::free(names);
  return out;
}

// Written when the handlers are installed (again at each later call) so that the signal handler
// needs no allocation.
char g_error_path[4096];
bool g_installed = false;

void WriteRaw(int fd, const char* s) {
  size_t n = std::strlen(s);
  while (n > 0) {
    ssize_t w = write(fd, s, n);
    if (w <= 0) return;
    s += w;
    n -= static_cast<size_t>(w);
  }
}

void FatalSignal(int sig) {
  // Async-signal-safe only: open, write, close, then die of the same signal.
  if (g_error_path[0]) {
    int fd = open(g_error_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd >= 0) {
      char num[16];
      int len = 0;
      for (int v = sig; v > 0 && len < 15; v /= 10) num[len++] = static_cast<char>('0' + v % 10);
      char digits[16];
      for (int i = 0; i < len; ++i) digits[i] = num[len - 1 - i];
      digits[len] = '\0';
      char ts[24];
      int tlen = 0;
      long t = static_cast<long>(time(nullptr));
      char tmp[24];
      for (; t > 0 && tlen < 23; t /= 10) tmp[tlen++] = static_cast<char>('0' + t % 10);
      for (int i = 0; i < tlen; ++i) ts[i] = tmp[tlen - 1 - i];
      ts[tlen] = '\0';
      WriteRaw(fd, "{\"message\": {\"message\": \"Fatal signal ");
      WriteRaw(fd, digits);
      WriteRaw(fd, " (");
      const char* name = sigabbrev_np(sig);
      WriteRaw(fd, "SIG");
      WriteRaw(fd, name ? name : "?");
      WriteRaw(fd, ")\", \"extraInfo\": {\"py_callstack\": \"\", \"timestamp\": \"");
      WriteRaw(fd, ts);
      WriteRaw(fd, "\"}}}");
      close(fd);
    }
  }
  signal(sig, SIG_DFL);
  raise(sig);
}

void OnTerminate() {
  std::string type = "std::terminate", message = "terminate called without an active exception";
  if (auto eptr = std::current_exception()) {
    try {
      std::rethrow_exception(eptr);
    } catch (const std::exception& e) {
      int status = 0;
      char* demangled = abi::__cxa_demangle(typeid(e).name(), nullptr, nullptr, &status);
      type = status == 0 && demangled ? demangled : typeid(e).name();
      std::free(demangled);
      message = type + ": " + e.what();
    } catch (...) {
      type = "unknown";
      message = "an exception of unknown type";
    }
  }
  WriteErrorFile(message, type, Backtrace());
  std::fprintf(stderr, "%s\n", message.c_str());
  signal(SIGABRT, SIG_DFL);
  std::abort();
}

}  // namespace

std::string ErrorJson(const std::string& message, const std::string& type, const std::string& stack, long timestamp) {
  return "{\"message\": {\"message\": \"" + JsonEscape(message) + "\", \"extraInfo\": {\"py_callstack\": \"" +
         JsonEscape(stack) + "\", \"timestamp\": \"" + std::to_string(timestamp) + "\", \"type\": \"" +
         JsonEscape(type) + "\"}}}";
}

void WriteErrorFile(const std::string& message, const std::string& type, const std::string& stack) {
  const char* path = std::getenv("TORCHELASTIC_ERROR_FILE");
  if (!path || !*path) return;
  std::string tmp = std::string(path) + ".tmp";
  {
    std::ofstream f(tmp, std::ios::trunc);
    if (!f) return;
    f << ErrorJson(message, type, stack, static_cast<long>(std::time(nullptr)));
  }
  std::rename(tmp.c_str(), path);
}

void InstallErrorHandlers() {
  // Read at every call: a standby (launch_sdk/warm_start.h) learns its error file at its go, after
  // RunWithErrorFile installed the handlers, and Context::Init calls this again then.
  const char* path = std::getenv("TORCHELASTIC_ERROR_FILE");
  std::snprintf(g_error_path, sizeof g_error_path, "%s", path ? path : "");
  if (g_installed) return;
  g_installed = true;
  std::set_terminate(OnTerminate);
  for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL}) signal(sig, FatalSignal);
}

int RunWithErrorFile(const std::function<int()>& main_fn) {
  InstallErrorHandlers();
  try {
    return main_fn();
  } catch (const std::exception& e) {
    int status = 0;
    char* demangled = abi::__cxa_demangle(typeid(e).name(), nullptr, nullptr, &status);
    std::string type = status == 0 && demangled ? demangled : typeid(e).name();
    std::free(demangled);
    std::string message = type + ": " + e.what();
    WriteErrorFile(message, type, Backtrace());
    std::fprintf(stderr, "%s\n", message.c_str());
    return 1;
  }
}

}  // namespace launch_sdk
