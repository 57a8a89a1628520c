// The chaos soak: random disruptions of a 2-node x 2-worker train_mlp job (every fourth an agent
// killed with its workers and replaced, the others a worker killed; with a replicated control
// plane, every fourth from the second its leader killed too, just before a worker). The job must
// end with the exact step count, parameters identical to an undisturbed run, and no process
// left. LAUNCH_SOAK_KILLS sets the number of disruptions (default 6; the soak is 50) and
// LAUNCH_SOAK_SEED replays a run (the seed is printed).
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace launch::testing {

struct ChaosPlane {
  std::string endpoint;               // the agents' --rdzv-endpoint
  std::function<std::string()> logs;  // the control plane's, for failure messages
  std::function<void()> pump;         // reads the control plane's output (so no pipe fills)
  // Kills the control plane's leader and brings a replacement up (none: a single coordinator).
  std::function<void()> kill_leader;
};

// The soak, in a test body (it uses gtest's assertions).
void RunChaos(const ChaosPlane& plane);

// train_mlp as the soak runs it: a small MLP, `steps` steps of at least 10 ms (rank 0 sleeps that
// long in each), a checkpoint every 5 steps in `ckpt_dir`, its final parameters in `params`.
std::vector<std::string> TrainMlpArgv(const std::string& steps, const std::string& ckpt_dir, const std::string& params);

}  // namespace launch::testing
