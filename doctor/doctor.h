// `launch doctor` and `launch --preflight`: what stands between this machine and a training run,
// one row per check with its fix in one line. Diagnose() is a pure function of the gathered facts.
#pragma once

#include <cstdio>
#include <string>
#include <vector>

#include "launch.pb.h"
#include "doctor/doctor_facts.h"

namespace launch {

// Worst last: the verdict is the largest status of any row (n-a counts as ok).
enum class CheckStatus { kOk, kNotApplicable, kWarn, kFail };
const char* CheckStatusName(CheckStatus status);  // "ok", "n-a", "warn", "fail"

struct DoctorRow {
  std::string id;  // stable, for --json readers: "driver", "gpu.1.kernels", "shm", ...
  CheckStatus status = CheckStatus::kOk;
  std::string found;  // what is true here
  std::string fix;    // one line; empty when there is nothing to do
};

std::vector<DoctorRow> Diagnose(const DoctorFacts& facts);

// 0 when every row is ok or n-a, 1 when the worst is a warning, 2 when any row fails.
int DoctorExitCode(const std::vector<DoctorRow>& rows);
// An aligned table (the fix under its row), then one line counting the statuses.
std::string RenderDoctorTable(const std::vector<DoctorRow>& rows);
v1::DoctorReport DoctorReportOf(const std::vector<DoctorRow>& rows);
std::string RenderDoctorJson(const std::vector<DoctorRow>& rows);

// `launch doctor`: gathers, diagnoses and prints the table (or JSON) on `out`; returns the exit
// code.
int DoctorCommand(const DoctorRequest& request, bool json, DoctorProbe* probe, std::FILE* out);
// `launch --preflight`: the same checks for the run's plan, the table on `out`; returns the exit
// code (2: the run must not start).
int Preflight(const DoctorRequest& request, DoctorProbe* probe, std::FILE* out);

// ---- Pure helpers, tested on their own. ----

std::string CudaVersionText(int version);   // 12040 -> "12.4"
std::string NcclVersionText(int version);   // 22809 -> "2.28.9"; 2708 -> "2.7.8"
std::string CudnnVersionText(int version);  // 91900 -> "9.19.0"; 8902 -> "8.9.2"
// "12.1" -> 12010, "12" -> 12000; 0 when it is not a version.
int ParseCudaVersionText(const std::string& text);
// Whether a torch whose arch list is `archs` ("sm_80", "sm_90a", "compute_90") has code a GPU of
// compute capability major.minor runs: a kernel image of the same major and no newer minor (an
// arch-specific "a" image only on its own capability), or PTX no newer than the GPU (JIT-compiled).
bool ArchListRuns(const std::vector<std::string>& archs, int major, int minor);

enum class BlasKind { kUnknown, kReference, kOpenBlas, kMkl, kBlis, kAtlas, kFlexiBlas };
// From the real path of the BLAS library a process loads.
BlasKind ClassifyBlas(const std::string& path);

}  // namespace launch
