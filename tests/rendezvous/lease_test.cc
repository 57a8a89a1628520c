#include "rendezvous/lease.h"

#include "gtest/gtest.h"
#include "rendezvous/rendezvous.h"

namespace launch {
namespace {

TEST(LeaseDatagram, RoundTripsUnderItsKeyOnly) {
  const std::string key = NewLeaseKey();
  ASSERT_EQ(key.size(), kLeaseKeyBytes);
  EXPECT_NE(key, NewLeaseKey());
  LeaseBeat beat{"job7", "host1:123:abcd", 4, 99};
  auto d = EncodeLeaseBeat(beat, key);
  ASSERT_TRUE(d.ok());
  EXPECT_LE(d->size(), kMaxLeaseDatagram);
  auto key_for = [&](const std::string& run, const std::string&) -> const std::string* {
    return run == "job7" ? &key : nullptr;
  };
  auto back = DecodeLeaseBeat(*d, key_for);
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(back->run_id, "job7");
  EXPECT_EQ(back->node_id, "host1:123:abcd");
  EXPECT_EQ(back->round, 4);
  EXPECT_EQ(back->seq, 99u);
  // Another key, a flipped bit anywhere, a cut datagram, an unknown run: nothing.
  const std::string other = NewLeaseKey();
  EXPECT_FALSE(DecodeLeaseBeat(*d, [&](const std::string&, const std::string&) { return &other; }).has_value());
  for (size_t i = 0; i < d->size(); ++i) {
    std::string bad = *d;
    bad[i] ^= 0x01;
    EXPECT_FALSE(DecodeLeaseBeat(bad, key_for).has_value()) << "bit flipped at byte " << i;
  }
  for (size_t n = 0; n < d->size(); ++n) EXPECT_FALSE(DecodeLeaseBeat(d->substr(0, n), key_for).has_value()) << n;
  auto unknown = EncodeLeaseBeat({"job8", "n", 1, 1}, key);
  EXPECT_FALSE(DecodeLeaseBeat(*unknown, key_for).has_value());
  EXPECT_FALSE(EncodeLeaseBeat({std::string(256, 'r'), "n", 1, 1}, key).ok());
}

// The codec allowed 255-byte ids, whose 563-byte datagram broke its own 512-byte maximum, and
// the coordinator accepted 256-byte node ids the codec refused (the agent then silently fell
// back to stream heartbeats). One limit each now: the longest ids fit, one byte more does not.
TEST(LeaseDatagram, TheLongestIdsTheRendezvousAcceptsFitOneDatagram) {
  const std::string key = NewLeaseKey();
  auto longest = EncodeLeaseBeat({std::string(kMaxRunIdLength, 'r'), std::string(kMaxNodeIdLength, 'n'), 1, 1}, key);
  ASSERT_TRUE(longest.ok());
  EXPECT_LE(longest->size(), kMaxLeaseDatagram);
  auto key_for = [&](const std::string&, const std::string&) { return &key; };
  EXPECT_TRUE(DecodeLeaseBeat(*longest, key_for).has_value());
  EXPECT_FALSE(EncodeLeaseBeat({std::string(kMaxRunIdLength + 1, 'r'), "n", 1, 1}, key).ok());
  EXPECT_FALSE(EncodeLeaseBeat({"r", std::string(kMaxNodeIdLength + 1, 'n'), 1, 1}, key).ok());
}

// Per-node keys: one node's key signs nothing for another node.
TEST(LeaseDatagram, ANodesKeySignsOnlyItsOwnDatagrams) {
  const std::string run_key = NewLeaseKey();
  const std::string a = NodeLeaseKey(run_key, "a"), b = NodeLeaseKey(run_key, "b");
  EXPECT_EQ(a.size(), kLeaseKeyBytes);
  EXPECT_NE(a, b);
  EXPECT_EQ(a, NodeLeaseKey(run_key, "a"));
  EXPECT_NE(a, NodeLeaseKey(NewLeaseKey(), "a"));
  std::string scratch;
  auto key_for = [&](const std::string&, const std::string& node) {
    scratch = NodeLeaseKey(run_key, node);
    return &scratch;
  };
  EXPECT_TRUE(DecodeLeaseBeat(*EncodeLeaseBeat({"job", "a", 1, 7}, a), key_for).has_value());
  EXPECT_FALSE(DecodeLeaseBeat(*EncodeLeaseBeat({"job", "b", 1, 7}, a), key_for).has_value());
}

TEST(LeaseDatagram, RenewsOnlyAMemberOfTheRoundWithANewerSequence) {
  FakeClock clock;
  RendezvousConfig cfg;
  cfg.heartbeat_timeout = std::chrono::seconds(3);
  Rendezvous r("job", cfg, &clock);
  v1::JoinRequest j;
  j.set_run_id("job");
  j.mutable_node()->set_node_id("a");
  j.mutable_node()->set_local_world_size(1);
  ASSERT_TRUE(r.Join(j).ok());
  ASSERT_EQ(r.round(), 1);
  clock.Advance(std::chrono::seconds(2));
  EXPECT_TRUE(r.RenewLease("a", 1, 10));
  EXPECT_FALSE(r.RenewLease("a", 1, 10));  // a replay
  EXPECT_FALSE(r.RenewLease("a", 1, 9));
  EXPECT_FALSE(r.RenewLease("a", 2, 11));  // another round
  EXPECT_FALSE(r.RenewLease("b", 1, 11));  // not a member
  clock.Advance(std::chrono::seconds(2));  // 2 s since the renewal, 4 s since the round formed
  r.Tick();
  EXPECT_EQ(r.phase(), Rendezvous::Phase::kRunning);
  clock.Advance(std::chrono::milliseconds(1100));
  r.Tick();
  EXPECT_EQ(r.phase(), Rendezvous::Phase::kWaiting);  // lost: no renewal for 3.1 s
}

}  // namespace
}  // namespace launch
