#include "rendezvous/local_token.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/net.h"
#include "common/unique_fd.h"

namespace launch {

namespace {

// The directory or file is this user's and no one else may read or write it.
bool OwnedAndPrivate(const struct stat& st, mode_t type) {
  return (st.st_mode & S_IFMT) == type && st.st_uid == ::geteuid() && (st.st_mode & 077) == 0;
}

absl::Status EnsureDir(const std::string& dir) {
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return absl::UnavailableError(absl::StrCat("cannot create ", dir, ": ", std::strerror(errno)));
  }
  struct stat st {};
  if (::lstat(dir.c_str(), &st) != 0 || !OwnedAndPrivate(st, S_IFDIR)) {
    return absl::FailedPreconditionError(
        absl::StrCat(dir,
                     " is not a directory of this user's alone (mode 0700): a coordinator without a token "
                     "cannot publish its token there; remove it, or give --rdzv-token-file"));
  }
  return absl::OkStatus();
}

std::string ReadAll(int fd) {
  std::string out;
  char buf[256];
  for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) > 0 && out.size() < 4096;) out.append(buf, n);
  return std::string(absl::StripAsciiWhitespace(out));
}

}  // namespace

std::string LocalTokenDir() {
  const char* xdg = std::getenv("XDG_RUNTIME_DIR");
  if (xdg && *xdg == '/') return absl::StrCat(xdg, "/launch");
  return absl::StrCat("/tmp/launch-", ::geteuid());
}

std::string LocalTokenPath(int port) { return absl::StrCat(LocalTokenDir(), "/coordinator-", port, ".token"); }

absl::StatusOr<std::unique_ptr<LocalTokenFile>> LocalTokenFile::Publish(int port, const std::string& token) {
  const std::string dir = LocalTokenDir();
  if (absl::Status st = EnsureDir(dir); !st.ok()) return st;
  const std::string path = LocalTokenPath(port);
  const std::string tmp = absl::StrCat(path, ".", ::getpid());
  ::unlink(tmp.c_str());
  UniqueFd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
  if (!fd.valid()) return absl::UnavailableError(absl::StrCat("cannot write ", tmp, ": ", std::strerror(errno)));
  const std::string line = token + "\n";
  if (::write(fd.get(), line.data(), line.size()) != static_cast<ssize_t>(line.size()) ||
      ::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    return absl::UnavailableError(absl::StrCat("cannot write ", path, ": ", std::strerror(err)));
  }
  return std::unique_ptr<LocalTokenFile>(new LocalTokenFile(path, token));
}

LocalTokenFile::~LocalTokenFile() {
  // Another coordinator on this port since (this one was stopped and a new one took it) keeps its file.
  UniqueFd fd(::open(path_.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
  if (fd.valid() && ReadAll(fd.get()) == token_) ::unlink(path_.c_str());
}

std::string ReadLocalToken(int port) {
  struct stat st {};
  if (::lstat(LocalTokenDir().c_str(), &st) != 0 || !OwnedAndPrivate(st, S_IFDIR)) return "";
  UniqueFd fd(::open(LocalTokenPath(port).c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
  if (!fd.valid() || ::fstat(fd.get(), &st) != 0 || !OwnedAndPrivate(st, S_IFREG)) return "";
  return ReadAll(fd.get());
}

bool TakesLocalToken(const std::string& listen_host, const std::string& token, bool tls, bool insecure) {
  if (!token.empty() || tls || insecure) return false;
  auto loopback = IsLoopbackHost(listen_host);
  return loopback.ok() && *loopback;
}

}  // namespace launch
