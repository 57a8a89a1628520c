// The metrics port under slow and idle clients: a scrape is answered at once while they hold
// connections, past the cap the oldest connection is closed, and a connection that does not
// finish its request within the deadline is closed (as the gRPC port's handshake timeout).
#include "launcher/metrics_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <vector>

#include "common/unique_fd.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace launch {
namespace {

using Steady = std::chrono::steady_clock;

UniqueFd Connect(int port) {
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) fd.Reset();
  return fd;
}

// Whether the server closed the connection within `within` (EOF or a reset).
bool ClosedWithin(int fd, std::chrono::milliseconds within) {
  pollfd p{fd, POLLIN, 0};
  if (::poll(&p, 1, static_cast<int>(within.count())) <= 0) return false;
  char c;
  return ::recv(fd, &c, 1, MSG_DONTWAIT) <= 0;
}

// The whole answer to one scrape (the server closes after it), or "" past `within`.
std::string Scrape(int port, const std::string& token, std::chrono::milliseconds within) {
  UniqueFd fd = Connect(port);
  const std::string req = "GET /metrics HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + token + "\r\n\r\n";
  if (!fd.valid() || ::send(fd.get(), req.data(), req.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(req.size())) {
    return "";
  }
  const auto deadline = Steady::now() + within;
  std::string out;
  char buf[4096];
  while (Steady::now() < deadline) {
    pollfd p{fd.get(), POLLIN, 0};
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Steady::now());
    if (::poll(&p, 1, static_cast<int>(std::max<long>(left.count(), 1))) <= 0) break;
    const ssize_t n = ::recv(fd.get(), buf, sizeof buf, 0);
    if (n <= 0) return out;
    out.append(buf, n);
  }
  return "";
}

class MetricsServerTest : public ::testing::Test {
 protected:
  void Start(int max_connections, std::chrono::milliseconds deadline) {
    MetricsServer::Options o;
    o.token = "the-token";
    o.render = [] { return std::string("launch_up 1\n"); };
    o.max_connections = max_connections;
    o.connection_deadline = deadline;
    auto s = MetricsServer::Start(std::move(o));
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = std::move(*s);
  }
  std::unique_ptr<MetricsServer> server_;
};

// 4 clients without the token, sending a header byte now and then, starved every scrape for 80 s.
TEST_F(MetricsServerTest, SlowClientsDoNotStarveAScrape) {
  Start(8, std::chrono::seconds(30));
  std::vector<UniqueFd> slow;
  for (int i = 0; i < 6; ++i) {
    slow.push_back(Connect(server_->port()));
    ASSERT_TRUE(slow.back().valid());
    ASSERT_EQ(::send(slow.back().get(), "G", 1, MSG_NOSIGNAL), 1);
  }
  const auto start = Steady::now();
  const std::string answer = Scrape(server_->port(), "the-token", std::chrono::seconds(3));
  EXPECT_THAT(answer, ::testing::HasSubstr("200 OK"));
  EXPECT_THAT(answer, ::testing::HasSubstr("launch_up 1"));
  EXPECT_LT(Steady::now() - start, std::chrono::seconds(1));
  EXPECT_THAT(Scrape(server_->port(), "wrong", std::chrono::seconds(3)), ::testing::HasSubstr("401"));
}

// 1,000 idle connections took the coordinator's descriptors: past the cap the oldest is closed,
// and so is one that has not sent its request by the deadline.
TEST_F(MetricsServerTest, ConnectionsPastTheCapAndTheDeadlineAreClosed) {
  Start(4, std::chrono::milliseconds(500));
  std::vector<UniqueFd> idle;
  for (int i = 0; i < 4; ++i) idle.push_back(Connect(server_->port()));
  UniqueFd fifth = Connect(server_->port());
  ASSERT_TRUE(fifth.valid());
  // The fifth closes the oldest at once, not at its deadline.
  const auto start = Steady::now();
  EXPECT_TRUE(ClosedWithin(idle[0].get(), std::chrono::seconds(5)));
  EXPECT_LT(Steady::now() - start, std::chrono::milliseconds(400));
  // A scrape still gets in (it closes the oldest idle one), and is answered.
  EXPECT_THAT(Scrape(server_->port(), "the-token", std::chrono::seconds(3)), ::testing::HasSubstr("launch_up 1"));
  // The rest are closed by their deadline.
  EXPECT_TRUE(ClosedWithin(fifth.get(), std::chrono::seconds(5)));
  EXPECT_GE(Steady::now() - start, std::chrono::milliseconds(400));
  for (size_t i = 1; i < idle.size(); ++i) EXPECT_TRUE(ClosedWithin(idle[i].get(), std::chrono::seconds(5))) << i;
}

}  // namespace
}  // namespace launch
