#include "common/net.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>

#include <set>

#include "common/unique_fd.h"
#include "gtest/gtest.h"

namespace launch {
namespace {

TEST(HostPort, Forms) {
  auto hp = ParseHostPort("node1:29400", "e");
  ASSERT_TRUE(hp.ok());
  EXPECT_EQ(hp->host, "node1");
  EXPECT_EQ(*hp->port, 29400);
  hp = ParseHostPort("[::1]:5", "e");
  ASSERT_TRUE(hp.ok());
  EXPECT_EQ(hp->host, "::1");
  EXPECT_EQ(*hp->port, 5);
  hp = ParseHostPort("fe80::1", "e");
  ASSERT_TRUE(hp.ok());
  EXPECT_FALSE(hp->port.has_value());
  hp = ParseHostPort("10.1.2.3", "e");
  ASSERT_TRUE(hp.ok());
  EXPECT_FALSE(hp->port.has_value());
  for (const char* bad : {"", ":1", "h:", "h:x", "h:70000", "[::1", "[::1]x", "a b:1", "1:2:3:zz"}) {
    EXPECT_FALSE(ParseHostPort(bad, "--rdzv-endpoint").ok()) << bad;
  }
  EXPECT_EQ(JoinHostPort("::1", 7), "[::1]:7");
  EXPECT_EQ(JoinHostPort("h", 7), "h:7");
}

// The name promised "a listened port is in use", but nothing ever listened on the port.
TEST(Ports, FreePortIsFreeAndListenedPortIsInUse) {
  auto port = PickFreePort("127.0.0.1");
  ASSERT_TRUE(port.ok());
  EXPECT_GT(*port, 0);
  auto busy = PortInUse("127.0.0.1", *port);
  ASSERT_TRUE(busy.ok());
  EXPECT_FALSE(*busy);
  UniqueFd s(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  ASSERT_TRUE(s.valid());
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(*port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(s.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0) << std::strerror(errno);
  ASSERT_EQ(::listen(s.get(), 1), 0);
  busy = PortInUse("127.0.0.1", *port);
  ASSERT_TRUE(busy.ok());
  EXPECT_TRUE(*busy);
}

// Two launches starting together got the same MASTER_PORT from port 0 (the kernel hands the port
// it just freed out again): ports now come at random from below the ephemeral range.
TEST(Ports, PicksComeFromBelowTheEphemeralRangeAndDiffer) {
  const auto [lo, hi] = FreePortRange();
  ASSERT_LT(lo, hi);
  std::set<int> seen;
  for (int i = 0; i < 20; ++i) {
    auto port = PickFreePort("127.0.0.1");
    ASSERT_TRUE(port.ok());
    EXPECT_GE(*port, lo);
    EXPECT_LE(*port, hi);
    seen.insert(*port);
  }
  EXPECT_GE(seen.size(), 15u) << "20 picks from thousands of ports should rarely repeat";
}

}  // namespace
}  // namespace launch
