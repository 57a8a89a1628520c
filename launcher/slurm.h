// Slurm's description of a job step, read from the variables srun gives every task, so that
// `srun -N4 --ntasks-per-node=1 launch ...` needs no topology flags. Pure functions of the
// environment; options.cc fills only what flags, PET_ variables and --config left unset.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace launch {

// A node list as Slurm writes it (SLURM_JOB_NODELIST): "node[01-04,07],gpu-[1-2],login"; ranges
// keep the lower bound's zero padding, several bracket groups in one name multiply out. At most
// `max_hosts` names (an error beyond, before anything that large is built); an error names the
// list and what is wrong with it.
absl::StatusOr<std::vector<std::string>> ExpandHostlist(absl::string_view list, size_t max_hosts);

// What launch takes from Slurm, each value with the variable it came from.
struct SlurmValue {
  std::string value;
  std::string origin;  // "SLURM_NODEID", "SLURM_JOB_NODELIST (first host)", ...
};
struct SlurmTopology {
  SlurmValue nnodes, node_rank, rdzv_endpoint, rdzv_id, master_addr;
  std::optional<SlurmValue> nproc_per_node;  // SLURM_GPUS_ON_NODE, when the step has GPUs
  std::optional<int> cpus_on_node;           // SLURM_CPUS_ON_NODE
  int tasks = 1;                             // tasks of the step (one per node is expected)
};

// Inside a job step (srun: SLURM_JOB_ID and a numeric SLURM_STEP_ID), the step's topology; nullopt
// outside one (no Slurm, or a batch script's own shell, which runs on the first node only). The
// rendezvous endpoint is the node list's first host at kDefaultRendezvousPort + (job id + step id)
// % 1000, so that two jobs or steps sharing a first node do not collide; the run id is
// "<job>.<step>", with ".requeue<N>" after a requeue (SLURM_RESTART_COUNT). A malformed or
// out-of-range variable is an error naming it.
absl::StatusOr<std::optional<SlurmTopology>> SlurmFromEnv(const std::map<std::string, std::string>& env);

// The port SlurmFromEnv's endpoint uses.
int SlurmRendezvousPort(long long job_id, long long step_id);

}  // namespace launch
