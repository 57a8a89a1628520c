// `launch status`: one screen of a running job as its coordinator sees it (the job, its round and
// restarts, each node, each rank's step, step time, CPU, memory and GPU), like `nvidia-smi -l 1`
// for the whole job. Rendering is pure; the query is in run.cc.
#pragma once

#include <string>

#include "launch.pb.h"

namespace launch {

// The screen for one Status answer (lines end with '\n').
std::string RenderStatus(const v1::StatusResponse& s);

// Bytes as "1.5 GiB" / "170 MiB" / "12 KiB" / "0 B".
std::string HumanBytes(int64_t bytes);

}  // namespace launch
