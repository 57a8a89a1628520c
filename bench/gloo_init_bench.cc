// gloo_init_bench: how long 2 ranks (threads of this process, on loopback) take to connect a Gloo
// full mesh over the TCP transport, as each ProcessGroupGloo does when it is made (and each
// worker_sdk Context::Init), with launch_sdk's GlooLoopWaker around it against without (the
// anchor), alternating, in one run. Prints the medians and their ratio.
//   build/bin/gloo_init_bench [--reps N]   (default 20)
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/hash_store.h>
#include <gloo/transport/tcp/device.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <thread>
#include <vector>

#include "gloo_waker.h"

namespace {

// Seconds until both ranks are connected.
double Connect(bool wake) {
  ::gloo::rendezvous::HashStore store;
  std::vector<std::shared_ptr<::gloo::transport::Device>> devices;
  for (int i = 0; i < 2; ++i) {
    ::gloo::transport::tcp::attr attr;
    attr.hostname = "127.0.0.1";
    devices.push_back(::gloo::transport::tcp::CreateDevice(attr));
  }
  std::vector<std::shared_ptr<::gloo::rendezvous::Context>> contexts(2);
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> ranks;
  std::vector<std::exception_ptr> errors(2);
  for (int rank = 0; rank < 2; ++rank) {
    ranks.emplace_back([&, rank] {
      try {
        contexts[rank] = std::make_shared<::gloo::rendezvous::Context>(rank, 2);
        if (wake) {
          launch_sdk::internal::GlooLoopWaker waker({devices[rank]});
          contexts[rank]->connectFullMesh(store, devices[rank]);
        } else {
          contexts[rank]->connectFullMesh(store, devices[rank]);
        }
      } catch (...) {
        errors[rank] = std::current_exception();
      }
    });
  }
  for (auto& t : ranks) t.join();
  for (const auto& e : errors)
    if (e) std::rethrow_exception(e);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 20;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--reps") == 0 && i + 1 < argc) {
      char* end = nullptr;
      const long n = std::strtol(argv[++i], &end, 10);
      if (*end != '\0' || n < 1 || n > 10000) {
        std::fprintf(stderr, "gloo_init_bench: --reps %s: expected a count in 1..10000\n", argv[i]);
        return 2;
      }
      reps = static_cast<int>(n);
    } else {
      std::fprintf(stderr, "gloo_init_bench: unknown argument '%s' (usage: gloo_init_bench [--reps N])\n", argv[i]);
      return 2;
    }
  }
  std::vector<double> plain, woken;
  try {
    for (int r = 0; r < reps; ++r) {
      plain.push_back(Connect(false));
      woken.push_back(Connect(true));
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gloo_init_bench: %s\n", e.what());
    return 1;
  }
  const double p = Median(plain), w = Median(woken);
  std::printf("gloo full mesh, 2 ranks on loopback, median of %d: without waker %.2f ms, with GlooLoopWaker %.2f ms, "
              "%.1fx faster\n", reps, p * 1e3, w * 1e3, p / w);
  return 0;
}
