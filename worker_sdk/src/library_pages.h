// A standby's mappings of its shared libraries' pages. Internal, no LibTorch.
#pragma once

#include <cstddef>
#include <string>

namespace launch_sdk::internal {

// Whether the mapping that /proc/self/smaps heads with `header` ("ADDR-ADDR PERMS OFFSET DEV
// INODE PATH") is a read-only private mapping of a shared library (PATH ends in .so or has .so.
// in its name; not deleted): one whose pages the kernel may drop and read again from the file.
bool IsLibraryMapping(const std::string& header);

// Drops (MADV_DONTNEED) the pages of this process's read-only private mappings of shared libraries
// that hold no page of their own, resident or swapped out (a relocated page, a breakpoint), under
// the dynamic loader's lock:
// they stay in the page cache and come back when next used. Loading LibTorch touches some 100 MB
// of libraries that training never uses again (Debian's links OpenCV, FFmpeg, Qt and GDAL); each
// mapped page is one more for the kernel to unmap when the process exits, and a restart waits for
// the exits of the dead rank and of every other. A standby calls it before its warm-up, which
// brings back what a step uses: here a worker's exit took 2-4 ms less. Returns the bytes dropped.
size_t DropLibraryPages();

}  // namespace launch_sdk::internal
