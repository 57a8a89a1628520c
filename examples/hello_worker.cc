// The smallest worker: prints what launch told it and exits 0. The README's first command runs
// it under `launch --nproc-per-node=2` until the DDP example lands.
#include <cstdio>
#include <cstdlib>

int main() {
  auto get = [](const char* k) {
    const char* v = std::getenv(k);
    return v ? v : "(unset)";
  };
  std::printf("rank %s of %s (local rank %s), master %s:%s, restart %s, OMP_NUM_THREADS=%s\n",
              get("RANK"), get("WORLD_SIZE"), get("LOCAL_RANK"), get("MASTER_ADDR"),
              get("MASTER_PORT"), get("TORCHELASTIC_RESTART_COUNT"), get("OMP_NUM_THREADS"));
  return 0;
}
