// launch_sdk::internal::GlooLoopWaker (worker_sdk/src/gloo_waker.h) on Gloo's own TCP transport,
// without LibTorch: the rendezvous ProcessGroupGloo does (connectFullMesh) and a collective.
#include "gloo_waker.h"

#include <dirent.h>
#include <fcntl.h>
#include <gloo/allreduce.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/hash_store.h>
#include <gloo/transport/tcp/device.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cerrno>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace launch_sdk::internal {
namespace {

std::shared_ptr<::gloo::transport::Device> LoopbackDevice() {
  ::gloo::transport::tcp::attr attr;
  attr.hostname = "127.0.0.1";
  return ::gloo::transport::tcp::CreateDevice(attr);
}

// How many of this process's epoll descriptors watch `fd` (their fdinfo's "tfd:" lines).
int EpollsWatching(int fd) {
  int n = 0;
  DIR* d = ::opendir("/proc/self/fd");
  if (!d) return -1;
  while (dirent* e = ::readdir(d)) {
    if (e->d_name[0] == '.') continue;
    char target[64] = {};
    const std::string link = std::string("/proc/self/fd/") + e->d_name;
    if (::readlink(link.c_str(), target, sizeof target - 1) <= 0 || std::string(target) != "anon_inode:[eventpoll]")
      continue;
    std::ifstream info(std::string("/proc/self/fdinfo/") + e->d_name);
    for (std::string line; std::getline(info, line);) {
      std::istringstream words(line);
      std::string tag;
      int watched = -1;
      if (words >> tag >> watched && tag == "tfd:" && watched == fd) ++n;
    }
  }
  ::closedir(d);
  return n;
}

TEST(GlooLoopWaker, IsOnTheLoopOfEachTcpDeviceWhileItLives) {
  std::vector<std::shared_ptr<::gloo::transport::Device>> devices = {LoopbackDevice(), LoopbackDevice()};
  int fd = -1;
  {
    GlooLoopWaker waker(devices);
    fd = waker.fd();
    ASSERT_GE(fd, 0);
    EXPECT_EQ(EpollsWatching(fd), 2);
  }
  errno = 0;
  EXPECT_EQ(::fcntl(fd, F_GETFD), -1);  // closed, and so off both loops
  EXPECT_EQ(errno, EBADF);
  EXPECT_EQ(EpollsWatching(fd), 0);
}

TEST(GlooLoopWaker, WithoutADeviceItWakesNothing) {
  GlooLoopWaker waker({});
  EXPECT_EQ(waker.fd(), -1);
}

// Two ranks (threads) connect their full mesh as ProcessGroupGloo does, each with a waker on its
// device, then all-reduce through the pairs: the loops' extra events leave the transport intact.
TEST(GlooLoopWaker, TwoRanksConnectAndAllReduceWithIt) {
  ::gloo::rendezvous::HashStore store;
  std::vector<std::vector<float>> data = {{1, 2, 3}, {10, 20, 30}};
  std::vector<std::string> errors(2);
  std::vector<std::thread> ranks;
  for (int rank = 0; rank < 2; ++rank) {
    ranks.emplace_back([&, rank] {
      try {
        auto device = LoopbackDevice();
        auto context = std::make_shared<::gloo::rendezvous::Context>(rank, 2);
        {
          GlooLoopWaker waker({device});
          context->connectFullMesh(store, device);
        }
        ::gloo::AllreduceOptions opts(context);
        opts.setOutput(data[rank].data(), data[rank].size());
        opts.setAlgorithm(::gloo::AllreduceOptions::Algorithm::RING);
        void (*sum)(void*, const void*, const void*, size_t) = &::gloo::sum<float>;
        opts.setReduceFunction(sum);
        ::gloo::allreduce(opts);
      } catch (const std::exception& e) {
        errors[rank] = e.what();
      }
    });
  }
  for (auto& t : ranks) t.join();
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_EQ(errors[rank], "") << rank;
    EXPECT_EQ(data[rank], (std::vector<float>{11, 22, 33})) << rank;
  }
}

}  // namespace
}  // namespace launch_sdk::internal
