// The contract between launch and its workers, in one place: every LAUNCH_* variable a worker or a
// standby reads or launch sets for them, the descriptor numbers, the standby's control protocol
// (the go message), the exit-notice file's slot layout, and the version of all of it. launch, the
// SDK (launch-sdk-dev, built into the user's program) and launch's Python modules ship apart, so
// each side names the version it speaks and a standby refuses a go of another one, with one line
// that names both, instead of misreading it. No LibTorch, no dependencies.
//
// The Python modules (worker_sdk/python) spell the same values; tests/contract_check.py compares
// them with what tests/contract_dump.cc prints from this header, and fails on any difference.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace launch_sdk {

// Bumped with any change to this file that a worker of the previous version would misread.
// 1: the go began "LGO1" and carried no version. 2: it carries the version (kGoMagic).
inline constexpr uint32_t kContractVersion = 2;

// --- Environment: launch sets these for every worker -----------------------------------------
inline constexpr char kProgressFdEnv[] = "LAUNCH_PROGRESS_FD";  // kProgressFd, as text
inline constexpr char kRoundEnv[] = "LAUNCH_ROUND";             // the rendezvous round
inline constexpr char kLogDirEnv[] = "LAUNCH_LOG_DIR";          // the rank's log directory
// Where a hung Python rank's stacks go.
inline constexpr char kStackFileEnv[] = "LAUNCH_STACK_FILE";
// "1" where --hang-timeout was given: a Python worker whose optimizer steps launch counts offers
// its stacks (faulthandler on SIGUSR1) as one using launch_progress does.
inline constexpr char kCountedStacksEnv[] = "LAUNCH_COUNTED_STACKS";
inline constexpr char kGpuBindingEnv[] = "LAUNCH_GPU_BINDING";  // "shared" or "isolate"
// Scaled training (train.base_lr and its batch in the config).
inline constexpr char kLrEnv[] = "LAUNCH_LR";
inline constexpr char kLrScaleEnv[] = "LAUNCH_LR_SCALE";
inline constexpr char kPerWorkerBatchEnv[] = "LAUNCH_PER_WORKER_BATCH";
inline constexpr char kGlobalBatchEnv[] = "LAUNCH_GLOBAL_BATCH";
// Files the agent keeps for its workers (agent/worker_memory.h): "PATH,PATH" per local rank, and
// "PATH" for the node's shared-memory all-reduce.
inline constexpr char kCheckpointMemoryEnv[] = "LAUNCH_CHECKPOINT_MEMORY";
inline constexpr char kShmAllreduceMemoryEnv[] = "LAUNCH_SHM_ALLREDUCE_MEMORY";
inline constexpr char kExitNoticeEnv[] = "LAUNCH_EXIT_NOTICE";  // "/proc/<agent pid>/fd/<n>"

// --- Environment: launch sets these for a standby only (never a worker's) ---------------------
inline constexpr char kStandbyFdEnv[] = "LAUNCH_STANDBY_FD";      // kStandbyControlFd, as text
inline constexpr char kStandbyForkEnv[] = "LAUNCH_STANDBY_FORK";  // "1": it may fork workers
// The Python modules a standby imports, comma separated.
inline constexpr char kStandbyImportsEnv[] = "LAUNCH_STANDBY_IMPORTS";

// --- Environment: the user's, read by workers (launch passes them on) -------------------------
inline constexpr char kShmAllreduceEnv[] = "LAUNCH_SHM_ALLREDUCE";  // "0": Gloo's TCP all-reduce
inline constexpr char kPrefaultEnv[] = "LAUNCH_PREFAULT";           // "0": no prefaulting allocator
inline constexpr char kProfileStepsEnv[] = "LAUNCH_PROFILE_STEPS";  // "a-b"
inline constexpr char kStandbyKeepWarmMsEnv[] = "LAUNCH_STANDBY_KEEP_WARM_MS";

// Every name above, with its constant's name (for tests/contract_dump.cc and the checks of the
// Python side).
struct ContractName {
  const char* constant;
  const char* value;
};
inline constexpr ContractName kContractEnvNames[] = {
    {"kProgressFdEnv", kProgressFdEnv},
    {"kRoundEnv", kRoundEnv},
    {"kLogDirEnv", kLogDirEnv},
    {"kStackFileEnv", kStackFileEnv},
    {"kCountedStacksEnv", kCountedStacksEnv},
    {"kGpuBindingEnv", kGpuBindingEnv},
    {"kLrEnv", kLrEnv},
    {"kLrScaleEnv", kLrScaleEnv},
    {"kPerWorkerBatchEnv", kPerWorkerBatchEnv},
    {"kGlobalBatchEnv", kGlobalBatchEnv},
    {"kCheckpointMemoryEnv", kCheckpointMemoryEnv},
    {"kShmAllreduceMemoryEnv", kShmAllreduceMemoryEnv},
    {"kExitNoticeEnv", kExitNoticeEnv},
    {"kStandbyFdEnv", kStandbyFdEnv},
    {"kStandbyForkEnv", kStandbyForkEnv},
    {"kStandbyImportsEnv", kStandbyImportsEnv},
    {"kShmAllreduceEnv", kShmAllreduceEnv},
    {"kPrefaultEnv", kPrefaultEnv},
    {"kProfileStepsEnv", kProfileStepsEnv},
    {"kStandbyKeepWarmMsEnv", kStandbyKeepWarmMsEnv},
};

// --- Descriptors ------------------------------------------------------------------------------
// Where a worker finds the agent's progress socket (launch_sdk/progress.h's datagrams).
inline constexpr int kProgressFd = 3;
// Where a standby finds its control socket; after its go the progress socket takes its place.
inline constexpr int kStandbyControlFd = 3;

// --- The standby's control protocol -----------------------------------------------------------
// Standby -> agent: kStandbyReady once it is ready; or kStandbyFailed, a line saying why, "\n",
// and it exits (the worker starts cold). At each go: kStandbyPid, the worker's pid, "\n" (its own
// when it becomes the worker); after a fork kStandbyForked "\n" once the worker is the agent's
// child. A go it cannot serve (another version's, a malformed one) it answers with kStandbyFailed
// and a line, and exits.
inline constexpr char kStandbyReady = 'R';
inline constexpr char kStandbyFailed = 'F';
inline constexpr char kStandbyPid = 'P';
inline constexpr char kStandbyForked = 'D';
//
// Agent -> standby, per go: kGoMagic (4 bytes), the contract version (u32, little endian), the
// body's length N (u32, little endian), then N bytes of NUL-separated KEY=VALUE: the worker's whole
// environment. The first byte carries the worker's descriptors (SCM_RIGHTS): its progress socket,
// stdin, stdout, stderr and, when there is one, the orphan guard's pipe. The first 8 bytes (magic
// and version) stay as they are in every later version, so that a standby can always tell which
// version a go is of; version 1's go began with kGoMagicV1 and its length instead.
inline constexpr char kGoMagic[] = "LGOV";
inline constexpr char kGoMagicV1[] = "LGO1";
inline constexpr size_t kGoMagicBytes = 4;
inline constexpr size_t kGoVersionBytes = 8;       // magic and version: what says which version a go is
inline constexpr size_t kGoHeaderBytes = 12;       // then the body's length
inline constexpr uint32_t kMaxGoBody = 64u << 20;  // as the agent's bound on a worker's environment
inline constexpr size_t kGoMinFds = 4;
inline constexpr size_t kGoMaxFds = 5;

// The go for a worker whose environment is `env` ("KEY=VALUE" strings), of `version`.
std::string EncodeGo(const std::vector<std::string>& env, uint32_t version = kContractVersion);

// What a go's first kGoVersionBytes say: the version of the launch that sent it (1 for "LGO1"), or
// 0 when they are not a go's.
uint32_t GoVersion(const char* first_bytes);
// The body's length in a go of this version (its header's last 4 bytes, little endian).
uint32_t GoBodyLength(const char* header);
// The body's KEY=VALUE entries (empty entries skipped).
std::vector<std::string> DecodeGoBody(const std::string& body);

// The line a standby of `standby_version` (`standby`: "launch_sdk", "launch's Python module")
// says when launch sent a go of `launch_version`: names both and what to do.
std::string VersionSkew(uint32_t launch_version, uint32_t standby_version, const std::string& standby);

// --- The exit-notice file (launch_sdk/exit_notice.h) ------------------------------------------
// One slot per local rank: seq (u32), pid (i32), tid (i32), 4 bytes reserved, then the robust,
// process-shared mutex; 64 bytes.
inline constexpr size_t kExitNoticeSlotBytes = 64;
inline constexpr size_t kExitNoticeSeqOffset = 0;
inline constexpr size_t kExitNoticePidOffset = 4;
inline constexpr size_t kExitNoticeTidOffset = 8;
inline constexpr size_t kExitNoticeMutexOffset = 16;
// The agent's bound on the workers of a node: a slot index is below it.
inline constexpr int kMaxLocalRanks = 4096;

}  // namespace launch_sdk
