// The agent's memory files (launch's worker memory: checkpoint slots, the all-reduce segment) that
// a standby maps before its go, by path, for the worker it becomes to take. Internal, no LibTorch.
#pragma once

#include <cstddef>
#include <optional>
#include <string>

namespace launch_sdk::internal {

struct Premapped {
  int fd = -1;  // open read-write; the taker closes it
  void* base = nullptr;
  size_t size = 0;  // the file's whole size when it was mapped
};

// In a standby: maps the regular file at `path` shared and read-write, whole, when it is larger than
// `min_size` bytes, and reads a byte of each page: where the first access of a page through a new
// mapping is dear (this VM: 20-35 ms for 15 MB, against 1-2 ms for the next pass), it is paid here.
// Nothing when the file cannot be opened or mapped, or is not larger; a path mapped already keeps
// its first mapping.
void Premap(const std::string& path, size_t min_size);
// The mapping Premap made of `path`, taken once, while the file still has the size it was mapped
// with; else none (a mapping of a file whose size changed is dropped).
std::optional<Premapped> TakePremapped(const std::string& path);
// Reads a byte of each page of the mappings not taken yet (a standby's keep-warm).
void TouchPremapped();
// Unmaps Premap's mapping of `path` when nothing took it (a worker that does not use it).
void DropPremapped(const std::string& path);

}  // namespace launch_sdk::internal
