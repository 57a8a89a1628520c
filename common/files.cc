#include "common/files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/unique_fd.h"

namespace launch {
namespace {

// Reads up to `max` bytes from `fd` (EINTR retried); the bytes read so far on an error.
std::string ReadUpTo(int fd, size_t max) {
  std::string text(max, '\0');
  size_t got = 0;
  while (got < max) {
    const ssize_t n = ::read(fd, text.data() + got, max - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  text.resize(got);
  return text;
}

}  // namespace

std::string ReadFileUpTo(const std::string& path, size_t max) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY));
  return fd.valid() ? ReadUpTo(fd.get(), max) : std::string();
}

absl::StatusOr<std::string> ReadRegularFile(const std::string& path, size_t max, const std::string& expected) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY));
  if (!fd.valid()) {
    return absl::NotFoundError(
        absl::StrCat(path, ": cannot read the file (", std::strerror(errno), "); expected ", expected));
  }
  struct stat st;
  if (::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a regular file; expected ", expected));
  }
  if (static_cast<unsigned long long>(st.st_size) > max) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": ", st.st_size, " bytes; expected ", expected, " of at most ", max, " bytes"));
  }
  std::string text = ReadUpTo(fd.get(), max + 1);  // a file that grew since fstat
  if (text.size() > max) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": over ", max, " bytes; expected ", expected));
  }
  return text;
}

}  // namespace launch
