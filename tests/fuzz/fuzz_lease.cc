// libFuzzer target: the lease datagram codec. Any bytes decode to nothing or to a beat that, re-
// encoded under the same key, is exactly the input (no two readings of one datagram).
#include <cstdint>
#include <cstdlib>
#include <string>

#include "rendezvous/lease.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string key(launch::kLeaseKeyBytes, 'k');
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  auto key_for = [](const std::string&, const std::string&) { return &key; };
  auto beat = launch::DecodeLeaseBeat(in, key_for);
  if (beat) {
    auto again = launch::EncodeLeaseBeat(*beat, key);
    if (!again.ok() || *again != in) std::abort();
  }
  // Well-formed datagrams from fuzzed fields: encode, decode, compare.
  if (size >= 2) {
    const size_t run_len = data[0] % 160, node_len = data[1] % 300;
    if (2 + run_len + node_len <= size) {
      launch::LeaseBeat b;
      b.run_id.assign(reinterpret_cast<const char*>(data) + 2, run_len);
      b.node_id.assign(reinterpret_cast<const char*>(data) + 2 + run_len, node_len);
      b.round = static_cast<int64_t>(size);
      b.seq = run_len * 1000 + node_len;
      auto d = launch::EncodeLeaseBeat(b, key);
      if (d.ok()) {
        if (d->size() > launch::kMaxLeaseDatagram) std::abort();
        auto back = launch::DecodeLeaseBeat(*d, key_for);
        if (!back || back->run_id != b.run_id || back->node_id != b.node_id || back->round != b.round ||
            back->seq != b.seq) {
          std::abort();
        }
      } else if (run_len <= launch::kMaxRunIdLength && node_len <= launch::kMaxNodeIdLength) {
        std::abort();  // ids within the limits must always encode
      }
    }
  }
  return 0;
}
