#include "agent/tcp_store.h"

#include <algorithm>
#include <cstring>
#include <iterator>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace launch {
namespace {

static_assert(sizeof(uint64_t) == 8 && sizeof(int64_t) == 8, "torch sends 8-byte lengths and numbers");

constexpr uint32_t kValidationMagic = 0x3C85F7CE;
// What an entry (a key's value, a queued value, a wait or a watch on a key) costs beyond its bytes:
// charged to max_stored, so that many tiny entries are bounded as a few big ones are.
constexpr size_t kEntryCost = 64;
// The reply bytes (CheckResponseType, WaitResponseType, WatchResponseType).
constexpr char kReady = 0, kNotReady = 1;
constexpr char kStopWaiting = 0, kWaitCanceled = 1;
constexpr char kKeyUpdated = 0, kKeyCreated = 1, kKeyDeleted = 2, kKeyCallbackRegistered = 3;

// Wire number -> operation, per dialect (TCPStore.cpp's QueryType in 1.13.1; TCPStoreBackend.hpp's
// in 2.6.0, with the queue operations of 2.8).
constexpr StoreOp kTorch1Ops[] = {StoreOp::kSet,     StoreOp::kCompareSet, StoreOp::kGet,
                                  StoreOp::kAdd,     StoreOp::kCheck,      StoreOp::kWait,
                                  StoreOp::kNumKeys, StoreOp::kWatchKey,   StoreOp::kDeleteKey};
constexpr StoreOp kTorch2Ops[] = {StoreOp::kValidate,   StoreOp::kSet,    StoreOp::kCompareSet, StoreOp::kGet,
                                  StoreOp::kAdd,        StoreOp::kCheck,  StoreOp::kWait,       StoreOp::kNumKeys,
                                  StoreOp::kDeleteKey,  StoreOp::kAppend, StoreOp::kMultiGet,   StoreOp::kMultiSet,
                                  StoreOp::kCancelWait, StoreOp::kPing,   StoreOp::kQueuePush,  StoreOp::kQueuePop,
                                  StoreOp::kQueueLen};

// Reads fields off the unconsumed bytes. Each read either succeeds, or says the request is not
// whole yet (need() bytes at least), or fails (status()).
class Cursor {
 public:
  // `dry`: strings are measured, not copied, and a scan of many keys resumes at `resume` (the
  // offset and count of the repetitions a former scan of this request got through) so that a
  // request trickling in is scanned once in all, not once per read.
  using Resume = StoreScanResume;
  Cursor(const char* data, size_t size, const StoreLimits& limits, bool dry = false, Resume resume = {})
      : data_(data), size_(size), limits_(limits), dry_(dry), resume_(resume) {}

  bool Bytes(size_t n, const char** out) {
    if (!ok()) return false;
    if (n > limits_.max_request || pos_ + n > limits_.max_request) {
      status_ = absl::InvalidArgumentError(
          absl::StrCat("a request of over ", limits_.max_request, " bytes (expected at most that)"));
      return false;
    }
    if (pos_ + n > size_) {
      need_ = pos_ + n;
      return false;
    }
    *out = data_ + pos_;
    pos_ += n;
    return true;
  }
  template <typename T>
  bool Value(T* out) {
    const char* p = nullptr;
    if (!Bytes(sizeof(T), &p)) return false;
    std::memcpy(out, p, sizeof(T));
    return true;
  }
  // A length-prefixed string of at most `max` bytes; `what` names it in the error.
  bool String(size_t max, const char* what, std::string* out) {
    uint64_t n = 0;
    if (!Value(&n)) return false;
    if (n > max) {
      status_ = absl::InvalidArgumentError(absl::StrCat("a ", what, " of ", n, " bytes (expected at most ", max, ")"));
      return false;
    }
    const char* p = nullptr;
    if (!Bytes(n, &p)) return false;
    if (!dry_) out->assign(p, n);
    return true;
  }
  bool Count(uint64_t* n) {
    if (!Value(n)) return false;
    if (*n > limits_.max_keys_per_request) {
      status_ = absl::InvalidArgumentError(absl::StrCat("a request for ", static_cast<int64_t>(*n),
                                                        " keys (expected at most ", limits_.max_keys_per_request, ")"));
      return false;
    }
    return true;
  }
  // `n` repetitions of `group` strings (a key, or a key and a value), after their count.
  bool Repeated(int group, std::vector<std::string>* keys, std::vector<std::string>* values) {
    uint64_t n = 0;
    if (!Count(&n)) return false;
    uint64_t i = 0;
    std::string scratch;
    if (dry_) {
      if (resume_.done > 0) {
        pos_ = resume_.pos;
        i = resume_.done;
      }
    } else {
      keys->resize(n);
      if (group == 2) values->resize(n);
    }
    for (; i < n; ++i) {
      if (!String(limits_.max_key, "key", dry_ ? &scratch : &(*keys)[i])) return false;
      if (group == 2 && !String(limits_.max_value, "value", dry_ ? &scratch : &(*values)[i])) return false;
      reached_ = {pos_, static_cast<size_t>(i + 1)};
    }
    return true;
  }
  // Where a dry scan got to in the repetitions.
  Resume reached() const { return reached_; }

  bool ok() const { return status_.ok() && need_ == 0; }
  size_t pos() const { return pos_; }
  size_t need() const { return need_; }
  const absl::Status& status() const { return status_; }

 private:
  const char* data_;
  size_t size_;
  const StoreLimits& limits_;
  bool dry_;
  Resume resume_;
  Resume reached_;
  size_t pos_ = 0;
  size_t need_ = 0;
  absl::Status status_;
};

void PutU64(std::string* out, uint64_t v) { out->append(reinterpret_cast<const char*>(&v), sizeof v); }
void PutI64(std::string* out, int64_t v) { out->append(reinterpret_cast<const char*>(&v), sizeof v); }
void PutBytes(std::string* out, absl::string_view b) {
  PutU64(out, b.size());
  out->append(b.data(), b.size());
}

// The arguments of `op`, after its opcode byte.
void ReadArgs(StoreOp op, Cursor* c, StoreRequest* r, const StoreLimits& limits) {
  auto key = [&] {
    r->keys.resize(1);
    return c->String(limits.max_key, "key", &r->keys[0]);
  };
  auto value = [&] {
    r->values.emplace_back();
    return c->String(limits.max_value, "value", &r->values.back());
  };
  switch (op) {
    case StoreOp::kValidate: {
      c->Value(&r->nonce);  // the magic
      return;
    }
    case StoreOp::kSet:
    case StoreOp::kAppend:
    case StoreOp::kQueuePush:
      if (key()) value();
      return;
    case StoreOp::kCompareSet:
      if (key() && value()) value();
      return;
    case StoreOp::kGet:
    case StoreOp::kWatchKey:
    case StoreOp::kDeleteKey:
    case StoreOp::kQueuePop:
    case StoreOp::kQueueLen:
      key();
      return;
    case StoreOp::kAdd:
      if (key()) c->Value(&r->delta);
      return;
    case StoreOp::kCheck:
    case StoreOp::kWait:
    case StoreOp::kMultiGet:
      c->Repeated(1, &r->keys, &r->values);
      return;
    case StoreOp::kMultiSet:
      c->Repeated(2, &r->keys, &r->values);
      return;
    case StoreOp::kPing:
      c->Value(&r->nonce);
      return;
    case StoreOp::kNumKeys:
    case StoreOp::kCancelWait:
      return;
  }
}

}  // namespace

const char* StoreOpName(StoreOp op) {
  switch (op) {
    case StoreOp::kValidate:
      return "VALIDATE";
    case StoreOp::kSet:
      return "SET";
    case StoreOp::kCompareSet:
      return "COMPARE_SET";
    case StoreOp::kGet:
      return "GET";
    case StoreOp::kAdd:
      return "ADD";
    case StoreOp::kCheck:
      return "CHECK";
    case StoreOp::kWait:
      return "WAIT";
    case StoreOp::kNumKeys:
      return "GETNUMKEYS";
    case StoreOp::kWatchKey:
      return "WATCH_KEY";
    case StoreOp::kDeleteKey:
      return "DELETE_KEY";
    case StoreOp::kAppend:
      return "APPEND";
    case StoreOp::kMultiGet:
      return "MULTI_GET";
    case StoreOp::kMultiSet:
      return "MULTI_SET";
    case StoreOp::kCancelWait:
      return "CANCEL_WAIT";
    case StoreOp::kPing:
      return "PING";
    case StoreOp::kQueuePush:
      return "QUEUE_PUSH";
    case StoreOp::kQueuePop:
      return "QUEUE_POP";
    case StoreOp::kQueueLen:
      return "QUEUE_LEN";
  }
  return "?";
}

absl::StatusOr<std::optional<StoreRequest>> StoreRequestReader::Next() {
  const size_t avail = buffer_.size() - consumed_;
  if (avail < need_) return std::nullopt;
  const char* data = buffer_.data() + consumed_;
  if (dialect_ == StoreDialect::kUnknown) {
    // Every 2.x connection opens with VALIDATE: 00 and the magic. A 1.13 SET (00) would need a
    // key length whose low four bytes are the magic: a key of about 1 GB, over any limit.
    if (data[0] != 0) {
      dialect_ = StoreDialect::kTorch1;
    } else if (avail < 5) {
      need_ = 5;
      return std::nullopt;
    } else {
      uint32_t magic = 0;
      std::memcpy(&magic, data + 1, sizeof magic);
      dialect_ = magic == kValidationMagic ? StoreDialect::kTorch2 : StoreDialect::kTorch1;
    }
  }
  const uint8_t code = static_cast<uint8_t>(data[0]);
  StoreRequest r;
  if (dialect_ == StoreDialect::kTorch1) {
    if (code >= std::size(kTorch1Ops)) {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown torch 1.x store operation ", code, " (expected 0-", std::size(kTorch1Ops) - 1, ")"));
    }
    r.op = kTorch1Ops[code];
  } else {
    if (code >= std::size(kTorch2Ops)) {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown torch 2.x store operation ", code, " (expected 0-", std::size(kTorch2Ops) - 1, ")"));
    }
    r.op = kTorch2Ops[code];
  }
  // First a scan that copies nothing and resumes where the last one stopped; the request is read
  // (copied) once it is whole.
  Cursor scan(data + 1, avail - 1, limits_, /*dry=*/true, resume_);
  StoreRequest measured;
  measured.op = r.op;
  ReadArgs(r.op, &scan, &measured, limits_);
  if (!scan.status().ok()) return scan.status();
  if (scan.need()) {
    need_ = 1 + scan.need();
    resume_ = scan.reached();
    return std::nullopt;
  }
  resume_ = {};
  Cursor c(data + 1, avail - 1, limits_);
  ReadArgs(r.op, &c, &r, limits_);
  if (!c.status().ok() || c.need()) return absl::InternalError("a whole request did not read as one");
  if (r.op == StoreOp::kValidate) {
    // The first one is known good (it decided the dialect); a later one is checked.
    if (r.nonce != kValidationMagic) {
      return absl::InvalidArgumentError(
          absl::StrCat("a VALIDATE with magic ", r.nonce, " (expected ", kValidationMagic, ")"));
    }
  }
  consumed_ += 1 + c.pos();
  need_ = 1;
  if (consumed_ == buffer_.size()) {
    buffer_.clear();
    if (buffer_.capacity() > (1 << 20)) std::string().swap(buffer_);  // a big request's room goes
    consumed_ = 0;
  } else if (consumed_ > (64 << 10) && consumed_ > buffer_.size() / 2) {
    buffer_.erase(0, consumed_);
    consumed_ = 0;
  }
  return std::optional<StoreRequest>(std::move(r));
}

bool StoreState::Exists(const std::string& key) const {
  if (kv_.count(key)) return true;
  auto q = queues_.find(key);
  return q != queues_.end() && !q->second.empty();
}

void StoreState::Release(size_t bytes) { stored_ -= std::min(stored_, bytes); }

absl::Status StoreState::Reserve(size_t add, size_t remove) {
  const size_t after = stored_ - std::min(remove, stored_) + add;
  if (after > limits_.max_stored) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the store would hold ", after, " bytes (expected at most ", limits_.max_stored, ")"));
  }
  stored_ = after;
  return absl::OkStatus();
}

void StoreState::Changed(const std::string& key, const std::optional<std::string>& old_value,
                         const std::optional<std::string>& new_value, std::vector<StoreReply>* replies) {
  if (new_value) {
    auto w = waiters_.find(key);
    if (w != waiters_.end()) {
      Release(w->second.size() * (key.size() + kEntryCost));
      for (int conn : w->second) {
        auto a = awaited_.find(conn);
        if (a != awaited_.end() && --a->second == 0) {
          awaited_.erase(a);
          replies->push_back({conn, std::string(1, kStopWaiting)});
        }
      }
      waiters_.erase(w);
    }
  }
  auto watch = watchers_.find(key);
  if (watch == watchers_.end()) return;
  std::string note(1, !new_value ? kKeyDeleted : old_value ? kKeyUpdated : kKeyCreated);
  PutBytes(&note, key);
  PutBytes(&note, old_value.value_or(""));
  PutBytes(&note, new_value.value_or(""));
  for (int conn : watch->second) replies->push_back({conn, note});
}

absl::Status StoreState::Put(const std::string& key, std::string value, std::vector<StoreReply>* replies) {
  auto it = kv_.find(key);
  std::optional<std::string> old;
  if (it != kv_.end()) old = it->second;
  if (auto st = Reserve(key.size() + value.size() + kEntryCost, old ? key.size() + old->size() + kEntryCost : 0);
      !st.ok()) {
    return st;
  }
  kv_[key] = value;
  Changed(key, old, value, replies);
  return absl::OkStatus();
}

absl::Status StoreState::Apply(int conn, const StoreRequest& r, std::vector<StoreReply>* replies) {
  // A client has one request out at a time: one that asks anything waits no more (a 1.13 WAIT
  // that timed out on the client is never cancelled), so no late STOP_WAITING reaches it.
  DropWaits(conn);
  // The caller's own answer goes after what the request told others (a SET's waiters and watchers).
  std::string out;
  absl::Status st = Handle(conn, r, &out, replies);
  if (st.ok() && !out.empty()) replies->push_back({conn, std::move(out)});  // MULTI_GET of no keys: nothing
  return st;
}

absl::Status StoreState::Handle(int conn, const StoreRequest& r, std::string* out, std::vector<StoreReply>* replies) {
  switch (r.op) {
    case StoreOp::kValidate:
      return absl::OkStatus();
    case StoreOp::kSet:
      return Put(r.keys[0], r.values[0], replies);
    case StoreOp::kAppend:
      return OnAppend(r, replies);
    case StoreOp::kCompareSet:
      return OnCompareSet(r, out, replies);
    case StoreOp::kGet:
      return OnGet(r, out);
    case StoreOp::kAdd:
      return OnAdd(r, out, replies);
    case StoreOp::kCheck:
      return OnCheck(r, out);
    case StoreOp::kWait:
      return OnWait(conn, r, out);
    case StoreOp::kNumKeys:
      return OnNumKeys(out);
    case StoreOp::kWatchKey:
      return OnWatchKey(conn, r, out);
    case StoreOp::kDeleteKey:
      return OnDeleteKey(r, out, replies);
    case StoreOp::kMultiGet:
      return OnMultiGet(r, out);
    case StoreOp::kMultiSet:
      return OnMultiSet(r, replies);
    case StoreOp::kCancelWait:
      return OnCancelWait(conn, out);
    case StoreOp::kPing:
      return OnPing(r, out);
    case StoreOp::kQueuePush:
      return OnQueuePush(r, replies);
    case StoreOp::kQueuePop:
      return OnQueuePop(r, out);
    case StoreOp::kQueueLen:
      return OnQueueLen(r, out);
  }
  return absl::InternalError("unhandled store operation");
}

absl::Status StoreState::OnAppend(const StoreRequest& r, std::vector<StoreReply>* replies) {
  auto it = kv_.find(r.keys[0]);
  std::string joined = it == kv_.end() ? r.values[0] : it->second + r.values[0];
  if (joined.size() > limits_.max_value) {
    return absl::InvalidArgumentError(
        absl::StrCat("APPEND makes a value of ", joined.size(), " bytes (expected at most ", limits_.max_value, ")"));
  }
  return Put(r.keys[0], std::move(joined), replies);
}

absl::Status StoreState::OnCompareSet(const StoreRequest& r, std::string* out, std::vector<StoreReply>* replies) {
  const std::string& key = r.keys[0];
  const std::string& expected = r.values[0];
  const std::string& desired = r.values[1];
  auto it = kv_.find(key);
  // torch: a missing key is created only when nothing was expected; else the expected value comes
  // back and nothing is written.
  const bool write = it == kv_.end() ? expected.empty() : it->second == expected;
  if (!write) {
    PutBytes(out, it == kv_.end() ? expected : it->second);
    return absl::OkStatus();
  }
  if (auto st = Put(key, desired, replies); !st.ok()) return st;
  PutBytes(out, desired);
  return absl::OkStatus();
}

absl::Status StoreState::OnGet(const StoreRequest& r, std::string* out) {
  // Clients WAIT before a GET; a missing key reads as empty (torch's libuv server) rather than
  // dropping the connection (its classic one).
  auto it = kv_.find(r.keys[0]);
  PutBytes(out, it == kv_.end() ? absl::string_view() : absl::string_view(it->second));
  return absl::OkStatus();
}

absl::Status StoreState::OnAdd(const StoreRequest& r, std::string* out, std::vector<StoreReply>* replies) {
  auto it = kv_.find(r.keys[0]);
  int64_t value = 0;
  if (it != kv_.end() && !absl::SimpleAtoi(it->second, &value)) {
    return absl::InvalidArgumentError(
        absl::StrCat("ADD to key '", absl::CEscape(r.keys[0].substr(0, 64)), "' whose value is no number"));
  }
  int64_t sum = 0;
  if (__builtin_add_overflow(value, r.delta, &sum)) {
    return absl::InvalidArgumentError(absl::StrCat("ADD of ", r.delta, " to ", value, " overflows 64 bits"));
  }
  if (auto st = Put(r.keys[0], std::to_string(sum), replies); !st.ok()) return st;
  PutI64(out, sum);
  return absl::OkStatus();
}

absl::Status StoreState::OnCheck(const StoreRequest& r, std::string* out) {
  bool all = std::all_of(r.keys.begin(), r.keys.end(), [&](const std::string& k) { return Exists(k); });
  out->push_back(all ? kReady : kNotReady);
  return absl::OkStatus();
}

absl::Status StoreState::OnWait(int conn, const StoreRequest& r, std::string* out) {
  size_t missing = 0, cost = 0;
  for (const auto& k : r.keys) {
    if (!Exists(k)) {
      ++missing;
      cost += k.size() + kEntryCost;
    }
  }
  if (auto st = Reserve(cost, 0); !st.ok()) return st;
  for (const auto& k : r.keys) {
    if (!Exists(k)) waiters_[k].push_back(conn);
  }
  if (missing == 0) {
    out->push_back(kStopWaiting);
  } else {
    awaited_[conn] = missing;
  }
  return absl::OkStatus();
}

absl::Status StoreState::OnNumKeys(std::string* out) {
  PutI64(out, static_cast<int64_t>(kv_.size()));
  return absl::OkStatus();
}

absl::Status StoreState::OnWatchKey(int conn, const StoreRequest& r, std::string* out) {
  if (!watchers_[r.keys[0]].count(conn)) {
    if (auto st = Reserve(r.keys[0].size() + kEntryCost, 0); !st.ok()) return st;
    watchers_[r.keys[0]].insert(conn);
  }
  out->push_back(kKeyCallbackRegistered);
  return absl::OkStatus();
}

absl::Status StoreState::OnDeleteKey(const StoreRequest& r, std::string* out, std::vector<StoreReply>* replies) {
  auto it = kv_.find(r.keys[0]);
  int64_t n = 0;
  if (it != kv_.end()) {
    std::optional<std::string> old = std::move(it->second);
    Release(it->first.size() + old->size() + kEntryCost);
    kv_.erase(it);
    n = 1;
    Changed(r.keys[0], old, std::nullopt, replies);
  }
  PutI64(out, n);
  return absl::OkStatus();
}

absl::Status StoreState::OnMultiGet(const StoreRequest& r, std::string* out) {
  // One reply is bounded as one request is: 128K keys of 64 MiB would be 8 TiB.
  size_t total = 0;
  for (const auto& k : r.keys) {
    auto it = kv_.find(k);
    total += 8 + (it == kv_.end() ? 0 : it->second.size());
  }
  if (total > limits_.max_request) {
    return absl::InvalidArgumentError(
        absl::StrCat("MULTI_GET of ", total, " bytes (expected at most ", limits_.max_request, ")"));
  }
  for (const auto& k : r.keys) {
    auto it = kv_.find(k);
    PutBytes(out, it == kv_.end() ? absl::string_view() : absl::string_view(it->second));
  }
  return absl::OkStatus();
}

absl::Status StoreState::OnMultiSet(const StoreRequest& r, std::vector<StoreReply>* replies) {
  for (size_t i = 0; i < r.keys.size(); ++i) {
    if (auto st = Put(r.keys[i], r.values[i], replies); !st.ok()) return st;
  }
  return absl::OkStatus();
}

absl::Status StoreState::OnCancelWait(int conn, std::string* out) {
  DropWaits(conn);
  out->push_back(kWaitCanceled);
  return absl::OkStatus();
}

absl::Status StoreState::OnPing(const StoreRequest& r, std::string* out) {
  out->append(reinterpret_cast<const char*>(&r.nonce), sizeof r.nonce);
  return absl::OkStatus();
}

absl::Status StoreState::OnQueuePush(const StoreRequest& r, std::vector<StoreReply>* replies) {
  const std::string& key = r.keys[0];
  const bool new_queue = !queues_.count(key);
  if (auto st = Reserve(r.values[0].size() + kEntryCost + (new_queue ? key.size() + kEntryCost : 0), 0); !st.ok()) {
    return st;
  }
  queues_[key].push_back(r.values[0]);
  WakeOneWaiter(key, replies);
  return absl::OkStatus();
}

void StoreState::WakeOneWaiter(const std::string& key, std::vector<StoreReply>* replies) {
  // One value wakes one waiter (torch's wakeupOneWaitingClient).
  auto w = waiters_.find(key);
  if (w == waiters_.end()) return;
  auto& list = w->second;
  while (!list.empty()) {
    const int waiter = list.front();
    list.erase(list.begin());
    Release(key.size() + kEntryCost);
    auto a = awaited_.find(waiter);
    if (a != awaited_.end() && --a->second == 0) {
      awaited_.erase(a);
      replies->push_back({waiter, std::string(1, kStopWaiting)});
      break;
    }
  }
  if (list.empty()) waiters_.erase(w);
}

absl::Status StoreState::OnQueuePop(const StoreRequest& r, std::string* out) {
  auto q = queues_.find(r.keys[0]);
  const size_t n = q == queues_.end() ? 0 : q->second.size();
  PutI64(out, static_cast<int64_t>(n));
  if (n > 0) {
    PutBytes(out, q->second.front());
    Release(q->second.front().size() + kEntryCost);
    q->second.pop_front();
  }
  return absl::OkStatus();
}

absl::Status StoreState::OnQueueLen(const StoreRequest& r, std::string* out) {
  auto q = queues_.find(r.keys[0]);
  PutI64(out, q == queues_.end() ? 0 : static_cast<int64_t>(q->second.size()));
  return absl::OkStatus();
}

void StoreState::DropWaits(int conn) {
  if (!awaited_.erase(conn)) return;
  for (auto it = waiters_.begin(); it != waiters_.end();) {
    auto& list = it->second;
    const size_t before = list.size();
    list.erase(std::remove(list.begin(), list.end(), conn), list.end());
    Release((before - list.size()) * (it->first.size() + kEntryCost));
    it = list.empty() ? waiters_.erase(it) : std::next(it);
  }
}

void StoreState::Disconnect(int conn) {
  DropWaits(conn);
  for (auto it = watchers_.begin(); it != watchers_.end();) {
    if (it->second.erase(conn)) Release(it->first.size() + kEntryCost);
    it = it->second.empty() ? watchers_.erase(it) : std::next(it);
  }
}

void StoreState::Clear() {
  kv_.clear();
  queues_.clear();
  stored_ = 0;
  awaited_.clear();
  waiters_.clear();
  watchers_.clear();
}

StoreStats StoreState::Stats() const { return StoreStats{kv_.size(), stored_, awaited_.size()}; }

}  // namespace launch
