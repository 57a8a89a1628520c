#include "common/unique_fd.h"

#include <fcntl.h>
#include <unistd.h>

namespace launch {

void UniqueFd::Reset(int fd) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

bool MakePipe(Pipe* out) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return false;
  out->read.Reset(fds[0]);
  out->write.Reset(fds[1]);
  return true;
}

}  // namespace launch
