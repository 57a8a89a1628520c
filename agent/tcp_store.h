// torch's c10d TCPStore, the pure part: the wire protocol of torch 1.13 and 2.x read from a byte
// stream per connection, and the key-value state with its waiters. No I/O, no clock, no threads:
// agent/store_server.h drives it from its sockets, the tests and the fuzzer feed it bytes.
//
// The protocol (torch/csrc/distributed/c10d/TCPStore*.cpp, 1.13.1 and 2.6.0): a request is one
// opcode byte and its arguments, strings and values as a u64 length and the bytes, counts as
// u64, numbers as 8 bytes, all in host byte order (little-endian: the only order torch runs in).
// 1.13 and 2.x number the operations differently; every 2.x connection opens with VALIDATE
// (00 CE F7 85 3C), which no 1.13 request under the key limit can begin with, so each
// connection's dialect is told from its first five bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace launch {

// What one store accepts; every length and count from the wire is checked against these before
// it sizes anything. Defaults: libuv's key and key-count limits (torch 2.x's default server),
// values 8x libuv's.
struct StoreLimits {
  size_t max_key = 8 * 1024;
  size_t max_value = 64 << 20;
  size_t max_keys_per_request = 128 * 1024;
  size_t max_request = (64 << 20) + (1 << 20);  // one request's bytes on the wire
  size_t max_stored = size_t{1} << 30;          // keys and values held, with queues
};

// The operations of both dialects, by meaning (not by wire number).
enum class StoreOp {
  kValidate,    // 2.x handshake: the magic, no reply
  kSet,         // key, value; no reply
  kCompareSet,  // key, expected, desired; replies the value after
  kGet,         // key; replies the value
  kAdd,         // key, delta; replies the sum
  kCheck,       // keys; replies READY (0) or NOT_READY (1)
  kWait,        // keys; replies STOP_WAITING (0) once all exist
  kNumKeys,     // replies the count
  kWatchKey,    // 1.13: key; replies KEY_CALLBACK_REGISTERED (3), then every change of the key
  kDeleteKey,   // key; replies 1 or 0
  kAppend,      // key, value; no reply
  kMultiGet,    // keys; replies each value
  kMultiSet,    // keys and values; no reply
  kCancelWait,  // replies WAIT_CANCELED (1)
  kPing,        // nonce; replies it
  kQueuePush,   // 2.8+: key, value; no reply
  kQueuePop,    // key; replies the length before, then the front value if there was one
  kQueueLen,    // key; replies the length
};
const char* StoreOpName(StoreOp op);

enum class StoreDialect { kUnknown, kTorch1, kTorch2 };

struct StoreRequest {
  StoreOp op = StoreOp::kSet;
  std::vector<std::string> keys;
  std::vector<std::string> values;  // kSet/kAppend/kQueuePush: 1; kCompareSet: expected, desired; kMultiSet: per key
  int64_t delta = 0;                // kAdd
  uint32_t nonce = 0;               // kPing
};

// Where a scan of a request's many keys stopped: the offset after its last whole key and how
// many keys that was.
struct StoreScanResume {
  size_t pos = 0, done = 0;
};

// One connection's bytes in, its requests out. A request split over reads waits for the rest;
// several in one read come out one by one.
class StoreRequestReader {
 public:
  explicit StoreRequestReader(const StoreLimits& limits) : limits_(limits) {}

  void Append(absl::string_view bytes) { buffer_.append(bytes.data(), bytes.size()); }
  // The next whole request; nullopt until more bytes come. An error (an unknown opcode, a length
  // over the limits, a 2.x connection without the handshake, a wrong magic) says what was wrong:
  // the connection is to be closed.
  absl::StatusOr<std::optional<StoreRequest>> Next();
  StoreDialect dialect() const { return dialect_; }
  size_t buffered() const { return buffer_.size() - consumed_; }

 private:
  const StoreLimits& limits_;
  std::string buffer_;
  size_t consumed_ = 0;  // bytes of buffer_ already taken as requests
  size_t need_ = 1;      // no request can be whole with fewer unconsumed bytes than this
  // How far the scan of a request still coming got in its keys (agent/tcp_store.cc's Cursor).
  StoreScanResume resume_;
  StoreDialect dialect_ = StoreDialect::kUnknown;
};

// Bytes for a client, in the order it must read them.
struct StoreReply {
  int connection = 0;
  std::string bytes;
};

struct StoreStats {
  size_t keys = 0;
  size_t stored_bytes = 0;  // keys, values, queued values, waits and watches, each entry with its cost
  size_t waiting_connections = 0;
};

// The keys, values, queues and waiters of one store, shared by every connection. Connections are
// ids the caller chooses; Apply answers into `replies`, which may hold bytes for connections other
// than the caller's (a SET that ends another's WAIT).
class StoreState {
 public:
  explicit StoreState(const StoreLimits& limits) : limits_(limits) {}

  // An error: the request cannot be served (a value that would pass the store's size limit, ADD
  // to a value that is no number): the connection is to be closed, as torch's server does.
  absl::Status Apply(int connection, const StoreRequest& request, std::vector<StoreReply>* replies);
  // The connection is gone: its waits and watches go with it.
  void Disconnect(int connection);
  // Everything forgotten: keys, queues, waiters.
  void Clear();
  StoreStats Stats() const;

 private:
  bool Exists(const std::string& key) const;
  // The connection's WAIT is over (cancelled, replaced, or the connection gone).
  void DropWaits(int connection);
  // The key changed: waiters whose last key it was are answered; 1.13 watchers told.
  void Changed(const std::string& key, const std::optional<std::string>& old_value,
               const std::optional<std::string>& new_value, std::vector<StoreReply>* replies);
  // Charges `add` bytes (having freed `remove`) to max_stored; an error if that passes it.
  absl::Status Reserve(size_t add, size_t remove);
  void Release(size_t bytes);
  absl::Status Put(const std::string& key, std::string value, std::vector<StoreReply>* replies);
  // One handler per operation: the caller's answer into `out` (empty: none), what the request
  // tells other connections into `replies`.
  absl::Status Handle(int conn, const StoreRequest& r, std::string* out, std::vector<StoreReply>* replies);
  absl::Status OnAppend(const StoreRequest& r, std::vector<StoreReply>* replies);
  absl::Status OnCompareSet(const StoreRequest& r, std::string* out, std::vector<StoreReply>* replies);
  absl::Status OnGet(const StoreRequest& r, std::string* out);
  absl::Status OnAdd(const StoreRequest& r, std::string* out, std::vector<StoreReply>* replies);
  absl::Status OnCheck(const StoreRequest& r, std::string* out);
  absl::Status OnWait(int conn, const StoreRequest& r, std::string* out);
  absl::Status OnNumKeys(std::string* out);
  absl::Status OnWatchKey(int conn, const StoreRequest& r, std::string* out);
  absl::Status OnDeleteKey(const StoreRequest& r, std::string* out, std::vector<StoreReply>* replies);
  absl::Status OnMultiGet(const StoreRequest& r, std::string* out);
  absl::Status OnMultiSet(const StoreRequest& r, std::vector<StoreReply>* replies);
  absl::Status OnCancelWait(int conn, std::string* out);
  absl::Status OnPing(const StoreRequest& r, std::string* out);
  absl::Status OnQueuePush(const StoreRequest& r, std::vector<StoreReply>* replies);
  absl::Status OnQueuePop(const StoreRequest& r, std::string* out);
  absl::Status OnQueueLen(const StoreRequest& r, std::string* out);
  // A value came to queue `key`: the first waiter whose wait it completes is answered.
  void WakeOneWaiter(const std::string& key, std::vector<StoreReply>* replies);

  const StoreLimits& limits_;
  std::map<std::string, std::string> kv_;
  std::map<std::string, std::deque<std::string>> queues_;
  size_t stored_ = 0;
  // A waiting connection: how many of its keys are still missing; per key, who waits for it
  // (once per mention, as torch counts a key named twice twice).
  std::map<int, size_t> awaited_;
  std::map<std::string, std::vector<int>> waiters_;
  std::map<std::string, std::set<int>> watchers_;  // 1.13 watchKey
};

}  // namespace launch
