// libFuzzer target: the agent's TCPStore (agent/tcp_store.h) fed hostile bytes on three
// connections at once, interleaved as the input says. Nothing may crash or grow past the limits:
// what the store holds stays under max_stored, no reply goes to a connection that is not there,
// and a connection whose request is refused is forgotten (its waits too).
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "agent/tcp_store.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const launch::StoreLimits limits = [] {
    launch::StoreLimits l;
    l.max_key = 64;
    l.max_value = 256;
    l.max_keys_per_request = 16;
    l.max_request = 4096;
    l.max_stored = 8192;
    return l;
  }();
  constexpr int kConns = 3;
  launch::StoreState state(limits);
  std::vector<std::unique_ptr<launch::StoreRequestReader>> readers;
  for (int i = 0; i < kConns; ++i) readers.push_back(std::make_unique<launch::StoreRequestReader>(limits));
  std::vector<launch::StoreReply> replies;
  // Chunks: [connection, length, bytes...]; connection 3 (mod 4) closes connection length % 3.
  size_t pos = 0;
  while (pos + 2 <= size) {
    const int conn = data[pos] % (kConns + 1);
    const size_t len = data[pos + 1];
    pos += 2;
    if (conn == kConns) {  // closes connection len % kConns
      const int which = static_cast<int>(len % kConns);
      state.Disconnect(which);
      readers[which] = std::make_unique<launch::StoreRequestReader>(limits);
      continue;
    }
    const size_t n = std::min(len, size - pos);
    readers[conn]->Append(absl::string_view(reinterpret_cast<const char*>(data) + pos, n));
    pos += n;
    while (true) {
      auto next = readers[conn]->Next();
      if (!next.ok() || !*next) {
        if (!next.ok()) {
          state.Disconnect(conn);
          readers[conn] = std::make_unique<launch::StoreRequestReader>(limits);
        }
        break;
      }
      replies.clear();
      if (!state.Apply(conn, **next, &replies).ok()) {
        state.Disconnect(conn);
        readers[conn] = std::make_unique<launch::StoreRequestReader>(limits);
        break;
      }
      for (const auto& r : replies) {
        if (r.connection < 0 || r.connection >= kConns) std::abort();
        if (r.bytes.empty() || r.bytes.size() > limits.max_request + 16) std::abort();
      }
      if (readers[conn]->buffered() > limits.max_request + 256) std::abort();
    }
    if (state.Stats().stored_bytes > limits.max_stored) std::abort();
    if (state.Stats().waiting_connections > static_cast<size_t>(kConns)) std::abort();
  }
  return 0;
}
