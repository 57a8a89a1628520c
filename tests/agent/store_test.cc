// The agent's TCPStore: the protocol reader and the state as tables, then the server over real
// sockets with a client that writes torch's bytes (1.13's and 2.x's) by hand, hostile ones too.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "agent/store_server.h"
#include "agent/tcp_store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace launch {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string U64(uint64_t v) { return std::string(reinterpret_cast<const char*>(&v), 8); }
std::string I64(int64_t v) { return std::string(reinterpret_cast<const char*>(&v), 8); }
std::string U32(uint32_t v) { return std::string(reinterpret_cast<const char*>(&v), 4); }
std::string Str(const std::string& s) { return U64(s.size()) + s; }
std::string Op(int code) { return std::string(1, static_cast<char>(code)); }
std::string Keys(const std::vector<std::string>& keys) {
  std::string out = U64(keys.size());
  for (const auto& k : keys) out += Str(k);
  return out;
}
const std::string kValidate = std::string("\x00\xCE\xF7\x85\x3C", 5);

// torch 2.x's numbers.
enum V2 { kSet = 1, kCas = 2, kGet = 3, kAdd = 4, kCheck = 5, kWait = 6, kNumKeys = 7, kDelete = 8, kAppend = 9,
          kMultiGet = 10, kMultiSet = 11, kCancel = 12, kPing = 13, kQPush = 14, kQPop = 15, kQLen = 16 };

std::vector<StoreRequest> ReadAll(StoreRequestReader* r) {
  std::vector<StoreRequest> out;
  while (true) {
    auto next = r->Next();
    EXPECT_TRUE(next.ok()) << next.status();
    if (!next.ok() || !*next) return out;
    out.push_back(**next);
  }
}

TEST(StoreRequestReader, ATorch2StreamReadsTheSameByteByByteAsWhole) {
  const std::string stream = kValidate + Op(kPing) + U32(1234) + Op(kAdd) + Str("init/") + I64(1) + Op(kSet) +
                             Str("/k") + Str(std::string("v\0v", 3)) + Op(kMultiSet) + I64(2) + Str("a") + Str("1") +
                             Str("b") + Str("2") + Op(kWait) + Keys({"a", "b"}) + Op(kCancel);
  StoreLimits limits;
  StoreRequestReader whole(limits), bytewise(limits);
  whole.Append(stream);
  auto a = ReadAll(&whole);
  std::vector<StoreRequest> b;
  for (char ch : stream) {
    bytewise.Append(std::string(1, ch));
    auto more = ReadAll(&bytewise);
    b.insert(b.end(), more.begin(), more.end());
  }
  ASSERT_EQ(a.size(), 7u);
  ASSERT_EQ(b.size(), 7u);
  EXPECT_EQ(whole.dialect(), StoreDialect::kTorch2);
  const std::vector<StoreOp> ops = {StoreOp::kValidate, StoreOp::kPing,     StoreOp::kAdd,       StoreOp::kSet,
                                    StoreOp::kMultiSet, StoreOp::kWait,     StoreOp::kCancelWait};
  for (size_t i = 0; i < ops.size(); ++i) {
    EXPECT_EQ(a[i].op, ops[i]) << i;
    EXPECT_EQ(b[i].op, ops[i]) << i;
    EXPECT_EQ(a[i].keys, b[i].keys);
    EXPECT_EQ(a[i].values, b[i].values);
  }
  EXPECT_EQ(a[1].nonce, 1234u);
  EXPECT_EQ(a[2].delta, 1);
  EXPECT_EQ(a[3].values[0], std::string("v\0v", 3));
  EXPECT_THAT(a[4].keys, ElementsAre("a", "b"));
  EXPECT_THAT(a[4].values, ElementsAre("1", "2"));
  EXPECT_EQ(whole.buffered(), 0u);
}

// A WAIT for 3000 keys arriving 7 bytes at a time reads as the same request (its scan resumes
// where the last read's stopped).
TEST(StoreRequestReader, ARequestOfManyKeysTricklingInReadsWhole) {
  std::vector<std::string> keys;
  for (int i = 0; i < 3000; ++i) keys.push_back("/rank" + std::to_string(i));
  const std::string stream = kValidate + Op(kWait) + Keys(keys) + Op(kMultiSet) + I64(2) + Str("a") + Str("1") +
                             Str("bb") + Str("22");
  StoreLimits limits;
  StoreRequestReader r(limits);
  std::vector<StoreRequest> got;
  for (size_t i = 0; i < stream.size(); i += 7) {
    r.Append(stream.substr(i, 7));
    auto more = ReadAll(&r);
    got.insert(got.end(), more.begin(), more.end());
  }
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[1].op, StoreOp::kWait);
  EXPECT_EQ(got[1].keys, keys);
  EXPECT_THAT(got[2].keys, ElementsAre("a", "bb"));
  EXPECT_THAT(got[2].values, ElementsAre("1", "22"));
}

// 1.13 numbers the operations from SET = 0 and has no handshake: 2 is GET there, COMPARE_SET in 2.x.
TEST(StoreRequestReader, ATorch1StreamIsToldByItsFirstBytes) {
  StoreLimits limits;
  StoreRequestReader add_first(limits);
  add_first.Append(Op(3) + Str("init/") + I64(1) + Op(2) + Str("/k") + Op(7) + Str("/w"));
  auto a = ReadAll(&add_first);
  EXPECT_EQ(add_first.dialect(), StoreDialect::kTorch1);
  ASSERT_EQ(a.size(), 3u);
  EXPECT_EQ(a[0].op, StoreOp::kAdd);
  EXPECT_EQ(a[1].op, StoreOp::kGet);
  EXPECT_EQ(a[2].op, StoreOp::kWatchKey);

  // A 1.13 SET opens with 00 too: five bytes decide.
  StoreRequestReader set_first(limits);
  set_first.Append(Op(0) + U64(2).substr(0, 3));
  EXPECT_EQ(ReadAll(&set_first).size(), 0u);
  EXPECT_EQ(set_first.dialect(), StoreDialect::kUnknown);
  set_first.Append(U64(2).substr(3) + "/k" + Str("v"));
  a = ReadAll(&set_first);
  EXPECT_EQ(set_first.dialect(), StoreDialect::kTorch1);
  ASSERT_EQ(a.size(), 1u);
  EXPECT_EQ(a[0].op, StoreOp::kSet);
  EXPECT_THAT(a[0].keys, ElementsAre("/k"));
}

TEST(StoreRequestReader, BadRequestsSayWhatIsWrong) {
  StoreLimits limits;
  limits.max_key = 16;
  limits.max_value = 64;
  limits.max_keys_per_request = 4;
  struct Case {
    std::string bytes, error;
  } cases[] = {
      {kValidate + Op(17), "unknown torch 2.x store operation 17 (expected 0-16)"},
      {Op(9), "unknown torch 1.x store operation 9 (expected 0-8)"},
      {kValidate + Op(kGet) + U64(17), "a key of 17 bytes (expected at most 16)"},
      {kValidate + Op(kSet) + Str("k") + U64(~0ull), "a value of 18446744073709551615 bytes (expected at most 64)"},
      {kValidate + Op(kWait) + U64(5), "a request for 5 keys (expected at most 4)"},
      {kValidate + Op(kMultiSet) + I64(-1), "a request for -1 keys (expected at most 4)"},
      {kValidate + Op(0) + U32(7), "a VALIDATE with magic 7 (expected 1015412686)"},
  };
  for (const auto& c : cases) {
    StoreRequestReader r(limits);
    r.Append(c.bytes);
    absl::Status last;
    for (int i = 0; i < 4 && last.ok(); ++i) {
      auto next = r.Next();
      if (!next.ok()) last = next.status();
    }
    EXPECT_THAT(std::string(last.message()), HasSubstr(c.error)) << c.error;
  }
}

// A state driven by requests from several connections, with the replies each gets.
class StateTest : public ::testing::Test {
 protected:
  std::vector<StoreReply> Do(int conn, StoreRequest r) {
    std::vector<StoreReply> out;
    last_ = state_.Apply(conn, r, &out);
    return out;
  }
  static StoreRequest R(StoreOp op, std::vector<std::string> keys = {}, std::vector<std::string> values = {}) {
    StoreRequest r;
    r.op = op;
    r.keys = std::move(keys);
    r.values = std::move(values);
    return r;
  }
  StoreLimits limits_;
  StoreState state_{limits_};
  absl::Status last_;
};

MATCHER_P2(ReplyTo, conn, bytes, "") { return arg.connection == conn && arg.bytes == bytes; }

TEST_F(StateTest, SetGetAddCompareSetAndDelete) {
  EXPECT_TRUE(Do(1, R(StoreOp::kSet, {"k"}, {"v"})).empty());
  EXPECT_THAT(Do(1, R(StoreOp::kGet, {"k"})), ElementsAre(ReplyTo(1, Str("v"))));
  EXPECT_THAT(Do(1, R(StoreOp::kGet, {"missing"})), ElementsAre(ReplyTo(1, Str(""))));
  StoreRequest add = R(StoreOp::kAdd, {"n"});
  add.delta = 5;
  EXPECT_THAT(Do(1, add), ElementsAre(ReplyTo(1, I64(5))));
  add.delta = -7;
  EXPECT_THAT(Do(1, add), ElementsAre(ReplyTo(1, I64(-2))));
  EXPECT_THAT(Do(1, R(StoreOp::kGet, {"n"})), ElementsAre(ReplyTo(1, Str("-2"))));
  add.keys = {"k"};
  Do(1, add);
  EXPECT_THAT(std::string(last_.message()), HasSubstr("ADD to key 'k' whose value is no number"));
  Do(1, R(StoreOp::kSet, {"big"}, {"9223372036854775807"}));
  add.keys = {"big"};
  add.delta = 1;
  Do(1, add);
  EXPECT_THAT(std::string(last_.message()), HasSubstr("overflows"));
  // torch's compare-set: created only when nothing was expected; else the value after.
  EXPECT_THAT(Do(1, R(StoreOp::kCompareSet, {"c"}, {"", "one"})), ElementsAre(ReplyTo(1, Str("one"))));
  EXPECT_THAT(Do(1, R(StoreOp::kCompareSet, {"c"}, {"one", "two"})), ElementsAre(ReplyTo(1, Str("two"))));
  EXPECT_THAT(Do(1, R(StoreOp::kCompareSet, {"c"}, {"zzz", "three"})), ElementsAre(ReplyTo(1, Str("two"))));
  EXPECT_THAT(Do(1, R(StoreOp::kCompareSet, {"none"}, {"e", "d"})), ElementsAre(ReplyTo(1, Str("e"))));
  EXPECT_THAT(Do(1, R(StoreOp::kCheck, {"none"})), ElementsAre(ReplyTo(1, std::string(1, '\1'))));
  EXPECT_THAT(Do(1, R(StoreOp::kNumKeys)), ElementsAre(ReplyTo(1, I64(4))));  // k n big c
  EXPECT_THAT(Do(1, R(StoreOp::kDeleteKey, {"c"})), ElementsAre(ReplyTo(1, I64(1))));
  EXPECT_THAT(Do(1, R(StoreOp::kDeleteKey, {"c"})), ElementsAre(ReplyTo(1, I64(0))));
  Do(1, R(StoreOp::kAppend, {"log"}, {"a"}));
  Do(1, R(StoreOp::kAppend, {"log"}, {"b"}));
  Do(1, R(StoreOp::kMultiSet, {"m1", "m2"}, {"1", "2"}));
  EXPECT_THAT(Do(1, R(StoreOp::kMultiGet, {"log", "m2", "absent", "m1"})),
              ElementsAre(ReplyTo(1, Str("ab") + Str("2") + Str("") + Str("1"))));
  StoreRequest ping = R(StoreOp::kPing);
  ping.nonce = 0xdeadbeef;
  EXPECT_THAT(Do(1, ping), ElementsAre(ReplyTo(1, U32(0xdeadbeef))));
}

TEST_F(StateTest, AWaitEndsWhenItsLastKeyAppearsAndACancelOrDisconnectForgetsIt) {
  EXPECT_TRUE(Do(2, R(StoreOp::kWait, {"a", "b", "a"})).empty());
  EXPECT_EQ(state_.Stats().waiting_connections, 1u);
  EXPECT_TRUE(Do(1, R(StoreOp::kSet, {"a"}, {"x"})).empty());
  EXPECT_TRUE(Do(1, R(StoreOp::kDeleteKey, {"b"})).size() == 1);  // a delete wakes nobody
  StoreRequest add = R(StoreOp::kAdd, {"b"});
  add.delta = 1;
  EXPECT_THAT(Do(1, add), ElementsAre(ReplyTo(2, std::string(1, '\0')), ReplyTo(1, I64(1))));
  EXPECT_EQ(state_.Stats().waiting_connections, 0u);
  EXPECT_THAT(Do(2, R(StoreOp::kWait, {"a"})), ElementsAre(ReplyTo(2, std::string(1, '\0'))));
  // 2.x cancels a timed-out wait and must read WAIT_CANCELED, waiting or not.
  Do(3, R(StoreOp::kWait, {"later"}));
  EXPECT_THAT(Do(3, R(StoreOp::kCancelWait)), ElementsAre(ReplyTo(3, std::string(1, '\1'))));
  EXPECT_THAT(Do(3, R(StoreOp::kCancelWait)), ElementsAre(ReplyTo(3, std::string(1, '\1'))));
  Do(4, R(StoreOp::kWait, {"later"}));
  state_.Disconnect(4);
  // 1.13 sends no cancel: a new WAIT replaces the timed-out one, which gets no late answer.
  Do(5, R(StoreOp::kWait, {"later"}));
  Do(5, R(StoreOp::kWait, {"other"}));
  EXPECT_TRUE(Do(1, R(StoreOp::kSet, {"later"}, {"1"})).empty());
  EXPECT_THAT(Do(1, R(StoreOp::kSet, {"other"}, {"1"})), ElementsAre(ReplyTo(5, std::string(1, '\0'))));
}

TEST_F(StateTest, QueuesWakeOneWaiterAndPopInOrder) {
  Do(2, R(StoreOp::kWait, {"q"}));
  Do(3, R(StoreOp::kWait, {"q"}));
  EXPECT_THAT(Do(1, R(StoreOp::kQueuePush, {"q"}, {"first"})), ElementsAre(ReplyTo(2, std::string(1, '\0'))));
  Do(1, R(StoreOp::kQueuePush, {"q"}, {"second"}));
  EXPECT_THAT(Do(1, R(StoreOp::kQueueLen, {"q"})), ElementsAre(ReplyTo(1, I64(2))));
  EXPECT_THAT(Do(1, R(StoreOp::kCheck, {"q"})), ElementsAre(ReplyTo(1, std::string(1, '\0'))));
  EXPECT_THAT(Do(1, R(StoreOp::kQueuePop, {"q"})), ElementsAre(ReplyTo(1, I64(2) + Str("first"))));
  EXPECT_THAT(Do(1, R(StoreOp::kQueuePop, {"q"})), ElementsAre(ReplyTo(1, I64(1) + Str("second"))));
  EXPECT_THAT(Do(1, R(StoreOp::kQueuePop, {"q"})), ElementsAre(ReplyTo(1, I64(0))));
}

TEST_F(StateTest, Torch1WatchersHearOfEveryChange) {
  EXPECT_THAT(Do(7, R(StoreOp::kWatchKey, {"w"})), ElementsAre(ReplyTo(7, std::string(1, '\3'))));
  EXPECT_THAT(Do(1, R(StoreOp::kSet, {"w"}, {"1"})),
              ElementsAre(ReplyTo(7, std::string(1, '\1') + Str("w") + Str("") + Str("1"))));
  EXPECT_THAT(Do(1, R(StoreOp::kSet, {"w"}, {"2"})),
              ElementsAre(ReplyTo(7, std::string(1, '\0') + Str("w") + Str("1") + Str("2"))));
  EXPECT_THAT(Do(1, R(StoreOp::kDeleteKey, {"w"})),
              ElementsAre(ReplyTo(7, std::string(1, '\2') + Str("w") + Str("2") + Str("")), ReplyTo(1, I64(1))));
  state_.Disconnect(7);
  EXPECT_TRUE(Do(1, R(StoreOp::kSet, {"w"}, {"3"})).empty());
}

// Every operation's handler, each from the same store (k = "v", n = "41", queue q = ["a"]): the
// bytes its connection reads back (none for the operations torch answers nothing) and its status.
TEST(StoreState, EachOperationAnswersItsOwnBytes) {
  struct Case {
    StoreOp op;
    std::vector<std::string> keys, values;
    std::optional<std::string> reply;  // nullopt: no reply at all
    absl::StatusCode code = absl::StatusCode::kOk;
    int64_t delta = 0;
    uint32_t nonce = 0;
  };
  const std::vector<Case> cases = {
      {StoreOp::kValidate, {}, {}, std::nullopt},
      {StoreOp::kSet, {"k2"}, {"x"}, std::nullopt},
      {StoreOp::kAppend, {"k"}, {"w"}, std::nullopt},
      {StoreOp::kAppend, {"k"}, {std::string(64, 'w')}, std::nullopt, absl::StatusCode::kInvalidArgument},
      {StoreOp::kCompareSet, {"k"}, {"v", "v2"}, Str("v2")},
      {StoreOp::kCompareSet, {"k"}, {"other", "v2"}, Str("v")},
      {StoreOp::kCompareSet, {"new"}, {"", "d"}, Str("d")},
      {StoreOp::kCompareSet, {"new"}, {"e", "d"}, Str("e")},
      {StoreOp::kGet, {"k"}, {}, Str("v")},
      {StoreOp::kGet, {"missing"}, {}, Str("")},
      {StoreOp::kAdd, {"n"}, {}, I64(42), absl::StatusCode::kOk, 1},
      {StoreOp::kAdd, {"fresh"}, {}, I64(-3), absl::StatusCode::kOk, -3},
      {StoreOp::kAdd, {"k"}, {}, std::nullopt, absl::StatusCode::kInvalidArgument, 1},
      {StoreOp::kCheck, {"k", "q"}, {}, std::string(1, '\0')},
      {StoreOp::kCheck, {"k", "missing"}, {}, std::string(1, '\1')},
      {StoreOp::kWait, {"k", "q"}, {}, std::string(1, '\0')},
      {StoreOp::kWait, {"k", "missing"}, {}, std::nullopt},
      {StoreOp::kNumKeys, {}, {}, I64(2)},
      {StoreOp::kWatchKey, {"k"}, {}, std::string(1, '\3')},
      {StoreOp::kDeleteKey, {"k"}, {}, I64(1)},
      {StoreOp::kDeleteKey, {"missing"}, {}, I64(0)},
      {StoreOp::kMultiGet, {"k", "missing", "n"}, {}, Str("v") + Str("") + Str("41")},
      {StoreOp::kMultiGet, {}, {}, std::nullopt},
      {StoreOp::kMultiSet, {"a", "b"}, {"1", "2"}, std::nullopt},
      {StoreOp::kCancelWait, {}, {}, std::string(1, '\1')},
      {StoreOp::kPing, {}, {}, U32(0xfeed), absl::StatusCode::kOk, 0, 0xfeed},
      {StoreOp::kQueuePush, {"q"}, {"b"}, std::nullopt},
      {StoreOp::kQueuePop, {"q"}, {}, I64(1) + Str("a")},
      {StoreOp::kQueuePop, {"empty"}, {}, I64(0)},
      {StoreOp::kQueueLen, {"q"}, {}, I64(1)},
      {StoreOp::kQueueLen, {"empty"}, {}, I64(0)},
  };
  StoreLimits limits;
  limits.max_value = 64;
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message() << StoreOpName(c.op) << " " << ::testing::PrintToString(c.keys));
    StoreState s(limits);
    std::vector<StoreReply> out;
    ASSERT_TRUE(s.Apply(2, StoreRequest{StoreOp::kSet, {"k"}, {"v"}}, &out).ok());
    ASSERT_TRUE(s.Apply(2, StoreRequest{StoreOp::kSet, {"n"}, {"41"}}, &out).ok());
    ASSERT_TRUE(s.Apply(2, StoreRequest{StoreOp::kQueuePush, {"q"}, {"a"}}, &out).ok());
    ASSERT_TRUE(out.empty());
    StoreRequest r{c.op, c.keys, c.values, c.delta, c.nonce};
    const absl::Status st = s.Apply(1, r, &out);
    EXPECT_EQ(st.code(), c.code) << st;
    if (c.reply) {
      EXPECT_THAT(out, ElementsAre(ReplyTo(1, *c.reply)));
    } else {
      EXPECT_TRUE(out.empty());
    }
  }
}

TEST(StoreState, WhatItHoldsIsBounded) {
  StoreLimits limits;
  limits.max_stored = 200;  // each entry costs its bytes and 64
  limits.max_value = 60;
  StoreState s(limits);
  std::vector<StoreReply> out;
  StoreRequest set{StoreOp::kSet, {"a"}, {std::string(50, 'x')}};
  ASSERT_TRUE(s.Apply(1, set, &out).ok());
  set.keys = {"b"};
  auto st = s.Apply(1, set, &out);
  EXPECT_TRUE(absl::IsResourceExhausted(st)) << st;
  EXPECT_THAT(std::string(st.message()), HasSubstr("the store would hold 230 bytes (expected at most 200)"));
  set.keys = {"a"};  // replacing a value frees the old one first
  EXPECT_TRUE(s.Apply(1, set, &out).ok());
  EXPECT_EQ(s.Stats().stored_bytes, 115u);
  // Waits and watches are charged too: 2 waits of 64 + 1 is over what is left.
  StoreRequest wait{StoreOp::kWait, {"x", "y"}, {}};
  st = s.Apply(2, wait, &out);
  EXPECT_TRUE(absl::IsResourceExhausted(st)) << st;
  wait.keys = {"x"};
  ASSERT_TRUE(s.Apply(2, wait, &out).ok());
  EXPECT_EQ(s.Stats().stored_bytes, 180u);
  s.Disconnect(2);
  EXPECT_EQ(s.Stats().stored_bytes, 115u);
  StoreRequest append{StoreOp::kAppend, {"a"}, {std::string(20, 'y')}};
  st = s.Apply(1, append, &out);
  EXPECT_THAT(std::string(st.message()), HasSubstr("APPEND makes a value of 70 bytes (expected at most 60)"));
  s.Clear();
  EXPECT_EQ(s.Stats().stored_bytes, 0u);
  EXPECT_EQ(s.Stats().keys, 0u);
}

// A blocking client of the store at 127.0.0.1:port.
class Client {
 public:
  explicit Client(int port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    timeval tv{10, 0};
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = ::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  }
  ~Client() { ::close(fd_); }
  bool connected() const { return connected_; }
  bool Send(const std::string& b) { return ::send(fd_, b.data(), b.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(b.size()); }
  // Exactly n bytes, or what came before the connection closed or 10 s passed.
  std::string Recv(size_t n) {
    std::string out;
    char buf[65536];
    while (out.size() < n) {
      ssize_t r = ::recv(fd_, buf, std::min(sizeof buf, n - out.size()), 0);
      if (r <= 0) break;
      out.append(buf, static_cast<size_t>(r));
    }
    return out;
  }
  // The server closed the connection (EOF, or a reset) within 10 s.
  bool Closed() {
    char b;
    return ::recv(fd_, &b, 1, 0) <= 0 && errno != EAGAIN;
  }
  int fd() const { return fd_; }

 private:
  int fd_ = -1;
  bool connected_ = false;
};

std::unique_ptr<StoreServer> Serving(StoreServer::Options o = {}) {
  auto s = StoreServer::Bind("127.0.0.1", 0, 0, o);
  EXPECT_TRUE(s.ok()) << s.status();
  StorePeers peers;
  peers.uid = ::geteuid();
  EXPECT_TRUE((*s)->Serve(peers).ok());
  return std::move(*s);
}

TEST(StoreServer, EveryTorch2OperationOverASocket) {
  auto server = Serving();
  Client c(server->port()), w(server->port());
  ASSERT_TRUE(c.connected() && w.connected());
  ASSERT_TRUE(c.Send(kValidate + Op(kPing) + U32(77)));
  EXPECT_EQ(c.Recv(4), U32(77));
  ASSERT_TRUE(w.Send(kValidate + Op(kWait) + Keys({"/a", "/b"})));
  c.Send(Op(kAdd) + Str("init/") + I64(1));
  EXPECT_EQ(c.Recv(8), I64(1));
  c.Send(Op(kSet) + Str("/a") + Str("1") + Op(kMultiSet) + I64(1) + Str("/b") + Str("2"));
  EXPECT_EQ(w.Recv(1), std::string(1, '\0'));  // the other connection's wait ended
  c.Send(Op(kMultiGet) + Keys({"/a", "/b"}));
  EXPECT_EQ(c.Recv(18), Str("1") + Str("2"));
  c.Send(Op(kCas) + Str("/a") + Str("1") + Str("3"));
  EXPECT_EQ(c.Recv(9), Str("3"));
  c.Send(Op(kAppend) + Str("/a") + Str("4") + Op(kGet) + Str("/a"));
  EXPECT_EQ(c.Recv(10), Str("34"));
  c.Send(Op(kCheck) + Keys({"/a", "/nope"}));
  EXPECT_EQ(c.Recv(1), std::string(1, '\1'));
  c.Send(Op(kNumKeys));
  EXPECT_EQ(c.Recv(8), I64(3));
  c.Send(Op(kDelete) + Str("/b"));
  EXPECT_EQ(c.Recv(8), I64(1));
  w.Send(Op(kWait) + Keys({"/later"}) + Op(kCancel));
  EXPECT_EQ(w.Recv(1), std::string(1, '\1'));
  c.Send(Op(kQPush) + Str("/q") + Str("x") + Op(kQLen) + Str("/q") + Op(kQPop) + Str("/q"));
  EXPECT_EQ(c.Recv(8 + 8 + 9), I64(1) + I64(1) + Str("x"));
  // 2.x checks the handshake's magic on later VALIDATEs too.
  c.Send(Op(0) + U32(1));
  EXPECT_TRUE(c.Closed());
  Client d(server->port());
  d.Send(kValidate + Op(kGet) + Str("/a"));
  EXPECT_EQ(d.Recv(10), Str("34"));
}

TEST(StoreServer, Torch1ClientsAndTheirSilentCallbackSocket) {
  auto server = Serving();
  Client main(server->port()), callback(server->port()), watcher(server->port());
  // 1.13 opens a second connection that never speaks; it must stay open.
  main.Send(Op(3) + Str("init/") + I64(1));
  EXPECT_EQ(main.Recv(8), I64(1));
  watcher.Send(Op(7) + Str("/w"));
  EXPECT_EQ(watcher.Recv(1), std::string(1, '\3'));
  main.Send(Op(0) + Str("/w") + Str("v") + Op(5) + U64(1) + Str("/w") + Op(2) + Str("/w"));
  EXPECT_EQ(main.Recv(1 + 9), std::string(1, '\0') + Str("v"));
  EXPECT_EQ(watcher.Recv(1 + 10 + 8 + 9), std::string(1, '\1') + Str("/w") + Str("") + Str("v"));
  main.Send(Op(1) + Str("/w") + Str("v") + Str("u") + Op(4) + U64(1) + Str("/w") + Op(6) + Op(8) + Str("/w"));
  EXPECT_EQ(main.Recv(9 + 1 + 8 + 8), Str("u") + std::string(1, '\0') + I64(2) + I64(1));
  EXPECT_EQ(server->Stats().connections, 3u);
  EXPECT_EQ(server->Stats().dropped, 0);
}

TEST(StoreServer, HostileConnectionsAreClosedAndTheOthersServed) {
  StoreServer::Options o;
  o.max_connections = 4;
  auto server = Serving(o);
  Client good(server->port());
  good.Send(kValidate);
  {
    Client huge_key(server->port()), garbage(server->port()), half(server->port());
    huge_key.Send(kValidate + Op(kGet) + U64(1ull << 40));
    EXPECT_TRUE(huge_key.Closed());
    garbage.Send("\xff\xff\xff\xff\xff\xff");
    EXPECT_TRUE(garbage.Closed());
    half.Send(kValidate + Op(kSet) + U64(5) + "ab");  // and gone
  }
  // A client that sends GETs of a 4 MiB value and never reads is not read further; others go on.
  Client hog(server->port());
  hog.Send(kValidate + Op(kSet) + Str("/big") + Str(std::string(4 << 20, 'x')));
  std::string gets;
  for (int i = 0; i < 64; ++i) gets += Op(kGet) + Str("/big");
  ::fcntl(hog.fd(), F_SETFL, O_NONBLOCK);
  hog.Send(gets);
  good.Send(Op(kAdd) + Str("/n") + I64(2));
  EXPECT_EQ(good.Recv(8), I64(2));
  // The fifth connection is one too many.
  Client c3(server->port()), c4(server->port());
  c3.Send(kValidate + Op(kPing) + U32(3));
  EXPECT_EQ(c3.Recv(4), U32(3));
  Client c5(server->port());
  EXPECT_TRUE(c5.Closed());
  auto stats = server->Stats();
  EXPECT_EQ(stats.dropped, 2);
  EXPECT_EQ(stats.refused, 1);
}

TEST(StoreServer, ServingAgainStartsEmptyOnTheSamePort) {
  auto server = Serving();
  const int port = server->port();
  Client old(port);
  old.Send(kValidate + Op(kSet) + Str("/attempt0") + Str("x") + Op(kPing) + U32(1));
  EXPECT_EQ(old.Recv(4), U32(1));
  StorePeers peers;
  peers.uid = ::geteuid();
  ASSERT_TRUE(server->Serve(peers).ok());
  EXPECT_EQ(server->port(), port);
  EXPECT_TRUE(old.Closed());
  Client fresh(port);
  fresh.Send(kValidate + Op(kCheck) + Keys({"/attempt0"}) + Op(kNumKeys));
  EXPECT_EQ(fresh.Recv(9), std::string(1, '\1') + I64(0));
}

TEST(StoreServer, ABoundPortIsHeldBeforeServingAndAFixedPortInUseIsAClearError) {
  auto held = StoreServer::Bind("127.0.0.1", 0, 0, {});
  ASSERT_TRUE(held.ok());
  Client early((*held)->port());
  EXPECT_FALSE(early.connected());  // bound, not listening: refused, not queued
  auto again = StoreServer::Bind("127.0.0.1", (*held)->port(), 0, {});
  ASSERT_FALSE(again.ok());
  EXPECT_THAT(std::string(again.status().message()),
              HasSubstr(absl::StrCat("cannot host the workers' store on port ", (*held)->port())));
}

TEST(StoreServer, ALocalConnectionOfAnotherUserIsRefused) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to connect as another user";
  auto server = Serving();
  Client mine(server->port());
  mine.Send(kValidate + Op(kPing) + U32(5));
  EXPECT_EQ(mine.Recv(4), U32(5));
  auto uid = LocalTcpPeerUid("127.0.0.1", [&] {
    sockaddr_in a{};
    socklen_t len = sizeof a;
    ::getsockname(mine.fd(), reinterpret_cast<sockaddr*>(&a), &len);
    return ntohs(a.sin_port);
  }(), "127.0.0.1", server->port());
  ASSERT_TRUE(uid.ok()) << uid.status();
  EXPECT_EQ(*uid, ::geteuid());
  pid_t pid = ::fork();
  if (pid == 0) {
    if (::setuid(65534) != 0) ::_exit(10);
    Client other(server->port());
    if (!other.connected()) ::_exit(11);
    other.Send(kValidate + Op(kPing) + U32(6));
    ::_exit(other.Recv(4).empty() ? 0 : 12);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  EXPECT_EQ(server->Stats().refused, 1);
}

}  // namespace
}  // namespace launch
