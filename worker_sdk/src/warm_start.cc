#include "launch_sdk/warm_start.h"

// The standby's side of the protocol agent/warm_start.h speaks, as launch_sdk/contract.h declares
// it (the Python standby, _launch_standby.py, speaks the same). A C++ standby becomes the worker at
// its go and serves no more: it answers a go with its own pid (a Python standby may fork its
// workers instead; the agent allows that only to Python, kStandbyForkEnv). A go of another
// contract version it refuses with one line that names both versions.

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iostream>
#include <stdexcept>
#include <string>
#include <vector>

#include "env_vars.h"
#include "launch_sdk/contract.h"

namespace launch_sdk {
namespace {

constexpr size_t kMaxReplay = 1 << 20;  // of what the standby printed, replayed into each worker
constexpr int64_t kKeepWarmShare = 20;  // the keep-warm's runs: at most 5% of the standby's time

bool g_awaited = false;
bool g_warm = false;
char g_program_name[16] = {};  // comm before a standby renamed itself

// LAUNCH_STANDBY_FD, when launch started this process as a standby; else null.
const char* StandbyFdText() { return internal::EnvValue(kStandbyFdEnv); }

// `ps -o comm`, top and the like tell a standby from a worker (whose name is the program's again
// after its go): from this program's static initialization on, before its own code runs (the
// libraries it loads, LibTorch's about 0.4 s here, come before under the program's name).
const bool g_named = [] {
  ::prctl(PR_GET_NAME, g_program_name, 0, 0, 0);
  if (StandbyFdText()) ::prctl(PR_SET_NAME, "launch-standby", 0, 0, 0);
  return true;
}();
// AddStandbyKeepWarm's, in order; never destroyed (a function may outlive a static it uses).
std::vector<std::function<void()>>* g_keep_warm = nullptr;

bool SendAll(int fd, const char* data, size_t n) {
  while (n > 0) {
    const ssize_t w = ::send(fd, data, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    data += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

// To the agent; when it is gone (it let this standby go), the standby ends quietly.
void Say(int sock, const std::string& s) {
  if (!SendAll(sock, s.data(), s.size())) ::_exit(0);
}

void WriteAll(int fd, const char* data, size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(fd, data, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return;
    data += w;
    n -= static_cast<size_t>(w);
  }
}

// A go this standby cannot serve: it tells the agent why (the worker starts cold) and ends.
[[noreturn]] void Refuse(int sock, const std::string& why) {
  const std::string line = kStandbyFailed + why + "\n";
  WriteAll(2, line.data() + 1, line.size() - 1);
  SendAll(sock, line.data(), line.size());
  ::_exit(70);
}

[[noreturn]] void Malformed(int sock, const std::string& what) {
  Refuse(sock, "launch_sdk standby: the go is malformed (" + what + ")");
}

// Reads `n` bytes; exits when the agent closed the socket first.
void RecvAll(int sock, char* data, size_t n) {
  for (size_t off = 0; off < n;) {
    const ssize_t got = ::recv(sock, data + off, n - off, 0);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) ::_exit(0);
    off += static_cast<size_t>(got);
  }
}

// LAUNCH_STANDBY_KEEP_WARM_MS: how often a waiting standby runs AddStandbyKeepWarm's functions.
int KeepWarmMs() {
  const char* text = internal::EnvValue(kStandbyKeepWarmMsEnv);
  if (!text) return internal::kDefaultStandbyKeepWarmMs;
  try {
    return static_cast<int>(internal::ParseEnvLong(kStandbyKeepWarmMsEnv, text, 0, internal::kMaxStandbyKeepWarmMs));
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "launch_sdk: %s (0: never)\n", e.what());
    std::fflush(stderr);
    ::_exit(2);  // a warm-up may have started threads: no exit handlers or destructors
  }
}

// The next go: the worker's environment and descriptors. Exits when the agent closes the socket.
// Until it comes, the keep-warm function runs every `keep_warm_ms` (0: never), or less often
// where it takes long: its runs take at most 1/kKeepWarmShare of the time.
void ReadGo(int sock, int keep_warm_ms, std::vector<std::string>* env, std::vector<int>* fds) {
  char head[kGoHeaderBytes];
  size_t got = 0;
  int wait_ms = keep_warm_ms;
  // First the magic and the version, which every version's go begins with: with them the go's
  // descriptors.
  while (got < kGoVersionBytes) {
    if (got == 0 && keep_warm_ms > 0 && g_keep_warm && !g_keep_warm->empty()) {
      pollfd p{sock, POLLIN, 0};
      const int n = ::poll(&p, 1, wait_ms);
      if (n == 0) {
        const auto start = std::chrono::steady_clock::now();
        for (const auto& fn : *g_keep_warm) fn();
        const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() -
                                                                                start);
        wait_ms = static_cast<int>(
            std::clamp<int64_t>(took.count() * kKeepWarmShare, keep_warm_ms, internal::kMaxStandbyKeepWarmMs));
      }
      if (n == 0 || (n < 0 && errno == EINTR)) continue;
      if (n < 0) keep_warm_ms = 0;  // poll fails otherwise: the go is read without the keep-warm
    }
    alignas(cmsghdr) char control[CMSG_SPACE(kGoMaxFds * sizeof(int))];
    iovec iov{head + got, kGoVersionBytes - got};
    msghdr mh{};
    mh.msg_iov = &iov;
    mh.msg_iovlen = 1;
    mh.msg_control = control;
    mh.msg_controllen = sizeof control;
    const ssize_t n = ::recvmsg(sock, &mh, MSG_CMSG_CLOEXEC);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) ::_exit(0);  // closed without a go: this standby is not needed
    for (cmsghdr* cm = CMSG_FIRSTHDR(&mh); cm; cm = CMSG_NXTHDR(&mh, cm)) {
      if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS) continue;
      const size_t count = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < count; ++i) {
        int fd;
        std::memcpy(&fd, CMSG_DATA(cm) + i * sizeof(int), sizeof fd);
        fds->push_back(fd);
      }
    }
    if (mh.msg_flags & MSG_CTRUNC) Malformed(sock, "more descriptors than " + std::to_string(kGoMaxFds));
    got += static_cast<size_t>(n);
  }
  const uint32_t version = GoVersion(head);
  if (version == 0) Malformed(sock, "no go magic");
  if (version != kContractVersion)
    Refuse(sock, "launch_sdk standby: " + VersionSkew(version, kContractVersion, "launch_sdk"));
  RecvAll(sock, head + kGoVersionBytes, kGoHeaderBytes - kGoVersionBytes);
  const uint32_t size = GoBodyLength(head);
  if (size > kMaxGoBody) Malformed(sock, "a body of " + std::to_string(size) + " bytes");
  if (fds->size() < kGoMinFds || fds->size() > kGoMaxFds) Malformed(sock, std::to_string(fds->size()) + " descriptors");
  std::string body(size, '\0');
  RecvAll(sock, body.data(), size);
  *env = DecodeGoBody(body);
}

// The worker's threads get the program's name back: this one, and those made in the standby
// (a warm-up's thread pools), which took its name launch-standby when they were made.
void RenameThreads() {
  ::prctl(PR_SET_NAME, g_program_name, 0, 0, 0);
  DIR* d = ::opendir("/proc/self/task");
  if (!d) return;
  while (dirent* e = ::readdir(d)) {
    if (e->d_name[0] == '.') continue;
    const std::string comm = std::string("/proc/self/task/") + e->d_name + "/comm";
    char name[32] = {};
    const int in = ::open(comm.c_str(), O_RDONLY | O_CLOEXEC);
    if (in < 0) continue;
    const ssize_t n = ::read(in, name, sizeof name - 1);
    ::close(in);
    if (n <= 0 || std::strncmp(name, "launch-standby", 14) != 0 || (name[14] != '\n' && name[14] != '\0')) continue;
    const int out = ::open(comm.c_str(), O_WRONLY | O_CLOEXEC);
    if (out < 0) continue;
    (void)!::write(out, g_program_name, std::strlen(g_program_name));
    ::close(out);
  }
  ::closedir(d);
}

// What the standby wrote to `fd` (its stdout or stderr: files the agent made) before its go, at
// most kMaxReplay bytes. Sized by the file: a buffer of the whole bound, new memory written at
// every go, took 7-10 ms of the restart here.
std::string Captured(int fd) {
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size <= 0) return "";
  std::string out(std::min<size_t>(static_cast<size_t>(st.st_size), kMaxReplay), '\0');
  const ssize_t n = ::pread(fd, out.data(), out.size(), 0);
  out.resize(n > 0 ? static_cast<size_t>(n) : 0);
  return out;
}

void FlushOutput() {
  std::cout.flush();
  std::cerr.flush();
  std::fflush(nullptr);
}

}  // namespace

void AwaitWorkerStart() {
  if (g_awaited) return;
  g_awaited = true;
  const char* fd_text = StandbyFdText();
  if (!fd_text) return;
  char* end = nullptr;
  const long sock_fd = std::strtol(fd_text, &end, 10);
  if (*end != '\0' || sock_fd < 0 || sock_fd > 1024 * 1024) {
    std::fprintf(stderr, "launch_sdk: %s=%s: expected the descriptor launch gave a standby\n", kStandbyFdEnv, fd_text);
    std::exit(2);
  }
  const int sock = static_cast<int>(sock_fd);
  // Named at its static initialization (g_named) unless that ran without kStandbyFdEnv, or
  // not yet (a static initializer that came first called this).
  if (!g_program_name[0]) ::prctl(PR_GET_NAME, g_program_name, 0, 0, 0);
  ::prctl(PR_SET_NAME, "launch-standby", 0, 0, 0);

  FlushOutput();  // what main printed so far is replayed once into the worker, after its go
  const int keep_warm_ms = KeepWarmMs();
  Say(sock, std::string(1, kStandbyReady));

  std::vector<std::string> env;
  std::vector<int> fds;
  ReadGo(sock, keep_warm_ms, &env, &fds);
  Say(sock, kStandbyPid + std::to_string(::getpid()) + "\n");  // it is the worker

  RenameThreads();
  const int progress = fds[0], in = fds[1], out = fds[2], err = fds[3];
  if (fds.size() > 4) ::close(fds[4]);
  const std::string replay_out = Captured(1), replay_err = Captured(2);
  ::clearenv();
  for (const std::string& kv : env) {
    const size_t eq = kv.find('=');
    if (eq == std::string::npos || eq == 0) continue;
    ::setenv(kv.substr(0, eq).c_str(), kv.c_str() + eq + 1, 1);
  }
  // The control socket (at kProgressFd when launch made this standby) gives way to the progress one.
  if (sock != kProgressFd && sock != progress) ::close(sock);
  ::dup2(progress, kProgressFd);
  ::dup2(in, 0);
  ::dup2(out, 1);
  ::dup2(err, 2);
  for (int fd : {progress, in, out, err})
    if (fd > kProgressFd) ::close(fd);
  WriteAll(1, replay_out.data(), replay_out.size());
  WriteAll(2, replay_err.data(), replay_err.size());
  g_warm = true;
}

bool StartedWarm() { return g_warm; }

void AddStandbyKeepWarm(std::function<void()> keep_warm) {
  if (!keep_warm) return;
  if (!g_keep_warm) g_keep_warm = new std::vector<std::function<void()>>();
  g_keep_warm->push_back(std::move(keep_warm));
}

bool IsStandby() { return !g_awaited && StandbyFdText(); }

}  // namespace launch_sdk
