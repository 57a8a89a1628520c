#include "launcher/slurm.h"

#include <cctype>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/limits.h"
#include "common/status_macros.h"
#include "common/tunables.h"

namespace launch {
namespace {

// The longest node list read; Slurm's own are far shorter (its compressed form).
constexpr size_t kMaxHostlistLength = 64 * 1024;
// The digits of one range bound: more cannot be a node number.
constexpr size_t kMaxRangeDigits = 9;

absl::Status BadList(absl::string_view list, const std::string& why) {
  return absl::InvalidArgumentError(
      absl::StrCat("node list '", list.substr(0, 128), list.size() > 128 ? "...'" : "'", ": ", why));
}

bool AllDigits(absl::string_view s) {
  if (s.empty()) return false;
  for (char c : s)
    if (!std::isdigit(static_cast<unsigned char>(c))) return false;
  return true;
}

// "01-04,07" -> {"01","02","03","04","07"}, at most `room` items.
absl::StatusOr<std::vector<std::string>> ExpandBracket(absl::string_view list, absl::string_view inner, size_t room,
                                                       size_t max_hosts) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= inner.size()) {
    size_t comma = inner.find(',', start);
    if (comma == absl::string_view::npos) comma = inner.size();
    absl::string_view item = inner.substr(start, comma - start);
    start = comma + 1;
    const size_t dash = item.find('-');
    absl::string_view lo = item.substr(0, dash);
    absl::string_view hi = dash == absl::string_view::npos ? lo : item.substr(dash + 1);
    if (!AllDigits(lo) || !AllDigits(hi) || lo.size() > kMaxRangeDigits || hi.size() > kMaxRangeDigits) {
      return BadList(list, absl::StrCat("'[", inner, "]': expected numbers or ranges like 01-04, separated by commas"));
    }
    long long a = 0, b = 0;
    if (!absl::SimpleAtoi(lo, &a) || !absl::SimpleAtoi(hi, &b) || b < a) {
      return BadList(list, absl::StrCat("'", item, "': expected a range LOW-HIGH with LOW <= HIGH"));
    }
    if (static_cast<unsigned long long>(b - a) >= room - out.size()) {
      return BadList(list, absl::StrCat("more than ", max_hosts, " host names"));
    }
    for (long long n = a; n <= b; ++n) {
      std::string digits = std::to_string(n);
      if (digits.size() < lo.size()) digits.insert(0, lo.size() - digits.size(), '0');
      out.push_back(std::move(digits));
    }
  }
  return out;
}

// One name of the list, with any number of bracket groups: "rack[1-2]-n[01-02]" gives four.
absl::Status ExpandName(absl::string_view list, absl::string_view name, size_t max_hosts,
                        std::vector<std::string>* out) {
  std::vector<std::string> partial = {""};
  size_t i = 0;
  while (i < name.size()) {
    const size_t open = name.find('[', i);
    const size_t close_before = name.find(']', i);
    if (close_before != absl::string_view::npos && (open == absl::string_view::npos || close_before < open)) {
      return BadList(list, "a ']' without its '['");
    }
    absl::string_view text = name.substr(i, open == absl::string_view::npos ? absl::string_view::npos : open - i);
    for (auto& p : partial) p.append(text.data(), text.size());
    if (open == absl::string_view::npos) break;
    const size_t close = name.find(']', open);
    if (close == absl::string_view::npos) return BadList(list, "a '[' without its ']'");
    const size_t room = max_hosts - out->size();
    ASSIGN_OR_RETURN(std::vector<std::string> items,
                     ExpandBracket(list, name.substr(open + 1, close - open - 1),
                                   std::max<size_t>(room / partial.size(), 1), max_hosts));
    if (partial.size() * items.size() > room) {
      return BadList(list, absl::StrCat("more than ", max_hosts, " host names"));
    }
    std::vector<std::string> next;
    next.reserve(partial.size() * items.size());
    for (const auto& p : partial)
      for (const auto& item : items) next.push_back(p + item);
    partial = std::move(next);
    i = close + 1;
  }
  if (partial.size() == 1 && partial[0].empty()) return BadList(list, "an empty host name");
  for (auto& p : partial) {
    if (p.size() > kMaxHostLength)
      return BadList(list, absl::StrCat("a host name longer than ", kMaxHostLength, " bytes"));
    if (out->size() >= max_hosts) return BadList(list, absl::StrCat("more than ", max_hosts, " host names"));
    out->push_back(std::move(p));
  }
  return absl::OkStatus();
}

const std::string* Get(const std::map<std::string, std::string>& env, std::initializer_list<const char*> names,
                       const char** which) {
  for (const char* n : names) {
    auto it = env.find(n);
    if (it != env.end() && !it->second.empty()) {
      *which = n;
      return &it->second;
    }
  }
  return nullptr;
}

absl::StatusOr<long long> Number(const char* name, const std::string& value, long long lo, long long hi) {
  long long n = 0;
  if (!absl::SimpleAtoi(value, &n) || n < lo || n > hi) {
    return absl::InvalidArgumentError(absl::StrCat(name, "=", value.substr(0, 64), ": expected an integer in ", lo,
                                                   "..", hi, " (set by Slurm's srun)"));
  }
  return n;
}

}  // namespace

absl::StatusOr<std::vector<std::string>> ExpandHostlist(absl::string_view list, size_t max_hosts) {
  if (list.size() > kMaxHostlistLength) {
    return BadList(list, absl::StrCat("longer than ", kMaxHostlistLength, " bytes"));
  }
  std::vector<std::string> out;
  size_t start = 0, depth = 0;
  for (size_t i = 0; i <= list.size(); ++i) {
    const char c = i < list.size() ? list[i] : ',';
    if (c == '[') {
      if (++depth > 1) return BadList(list, "a '[' inside brackets");
    } else if (c == ']') {
      if (depth == 0) return BadList(list, "a ']' without its '['");
      --depth;
    } else if (c == ',' && depth == 0) {
      absl::string_view name = list.substr(start, i - start);
      start = i + 1;
      if (name.empty()) {
        if (i == list.size() && !out.empty()) break;  // a trailing comma
        return BadList(list, "an empty host name");
      }
      for (char ch : name) {
        if (std::isspace(static_cast<unsigned char>(ch)) || !std::isprint(static_cast<unsigned char>(ch))) {
          return BadList(list, "a space or control character in a host name");
        }
      }
      RETURN_IF_ERROR(ExpandName(list, name, max_hosts, &out));
    }
  }
  if (depth != 0) return BadList(list, "a '[' without its ']'");
  return out;
}

int SlurmRendezvousPort(long long job_id, long long step_id) {
  return kDefaultRendezvousPort + static_cast<int>((job_id % 1000 + step_id % 1000) % 1000);
}

absl::StatusOr<std::optional<SlurmTopology>> SlurmFromEnv(const std::map<std::string, std::string>& env) {
  const char* job_var = nullptr;
  const char* step_var = nullptr;
  const std::string* job = Get(env, {"SLURM_JOB_ID", "SLURM_JOBID"}, &job_var);
  const std::string* step = Get(env, {"SLURM_STEP_ID", "SLURM_STEPID"}, &step_var);
  if (job == nullptr || step == nullptr) return std::nullopt;
  // The batch script's and the allocation's own steps are not srun's: they run on one node.
  long long step_id = 0;
  if (!absl::SimpleAtoi(*step, &step_id)) return std::nullopt;
  ASSIGN_OR_RETURN(long long job_id, Number(job_var, *job, 1, 1LL << 53));
  if (step_id < 0 || step_id >= (1LL << 32)) {
    return absl::InvalidArgumentError(absl::StrCat(step_var, "=", step->substr(0, 64),
                                                   ": expected an integer in 0..4294967295 (set by Slurm's srun)"));
  }

  // A variable srun always sets, missing: the environment is not a job step's after all.
  auto missing = [&](const char* vars, const char* verb, const char* flag) {
    return absl::InvalidArgumentError(absl::StrCat("inside Slurm job step ", *job, ".", step_id, " but ", vars, " ",
                                                   verb, " unset; expected srun to set ",
                                                   verb == std::string("is") ? "it" : "them", " (or give ", flag, ")"));
  };
  SlurmTopology t;
  const char* nodes_var = nullptr;
  const std::string* nodes = Get(env, {"SLURM_STEP_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES"}, &nodes_var);
  if (nodes == nullptr) return missing("SLURM_STEP_NUM_NODES and SLURM_NNODES", "are", "--nnodes");
  ASSIGN_OR_RETURN(long long nnodes, Number(nodes_var, *nodes, 1, kMaxNodes));
  t.nnodes = {std::to_string(nnodes), nodes_var};

  const char* id_var = nullptr;
  const std::string* node_id = Get(env, {"SLURM_NODEID"}, &id_var);
  if (node_id == nullptr) return missing("SLURM_NODEID", "is", "--node-rank");
  ASSIGN_OR_RETURN(long long rank, Number(id_var, *node_id, 0, nnodes - 1));
  t.node_rank = {std::to_string(rank), id_var};

  const char* list_var = nullptr;
  const std::string* list = Get(env, {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"}, &list_var);
  if (list == nullptr) return missing("SLURM_STEP_NODELIST and SLURM_JOB_NODELIST", "are", "--rdzv-endpoint");
  auto hosts = ExpandHostlist(*list, kMaxNodes);
  if (!hosts.ok()) return absl::InvalidArgumentError(absl::StrCat(list_var, ": ", hosts.status().message()));
  if (static_cast<long long>(hosts->size()) < nnodes) {
    return absl::InvalidArgumentError(absl::StrCat(list_var, "=", list->substr(0, 128), ": ", hosts->size(),
                                                   " host(s) for ", nodes_var, "=", nnodes,
                                                   "; expected at least as many hosts as nodes"));
  }
  const std::string& first = hosts->front();
  const std::string origin = absl::StrCat(list_var, " (first host)");
  t.rdzv_endpoint = {absl::StrCat(first, ":", SlurmRendezvousPort(job_id, step_id)), origin};
  t.master_addr = {first, origin};

  std::string run_id = absl::StrCat(job_id, ".", step_id);
  std::string id_origin = absl::StrCat(job_var, ".", step_var);
  const char* restart_var = nullptr;
  if (const std::string* restarts = Get(env, {"SLURM_RESTART_COUNT"}, &restart_var)) {
    ASSIGN_OR_RETURN(long long n, Number(restart_var, *restarts, 0, 1 << 30));
    if (n > 0) {
      absl::StrAppend(&run_id, ".requeue", n);
      absl::StrAppend(&id_origin, ", ", restart_var);
    }
  }
  t.rdzv_id = {run_id, id_origin};

  const char* gpus_var = nullptr;
  if (const std::string* gpus = Get(env, {"SLURM_GPUS_ON_NODE"}, &gpus_var)) {
    ASSIGN_OR_RETURN(long long n, Number(gpus_var, *gpus, 0, kMaxWorkersPerNode));
    if (n > 0) t.nproc_per_node = SlurmValue{std::to_string(n), gpus_var};
  }
  const char* cpus_var = nullptr;
  if (const std::string* cpus = Get(env, {"SLURM_CPUS_ON_NODE"}, &cpus_var)) {
    ASSIGN_OR_RETURN(long long n, Number(cpus_var, *cpus, 1, 1 << 20));
    t.cpus_on_node = static_cast<int>(n);
  }
  const char* tasks_var = nullptr;
  if (const std::string* tasks = Get(env, {"SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"}, &tasks_var)) {
    ASSIGN_OR_RETURN(long long n, Number(tasks_var, *tasks, 1, 1LL << 30));
    t.tasks = static_cast<int>(n);
  }
  return t;
}

}  // namespace launch
