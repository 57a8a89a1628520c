#include "launcher/options.h"

#include <sys/stat.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <iostream>
#include <map>

#include "CLI/CLI.hpp"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/files.h"
#include "common/limits.h"
#include "common/net.h"
#include "common/status_macros.h"
#include "common/strings.h"
#include "common/tunables.h"
#include "agent/log_relay.h"
#include "launcher/slurm.h"
#include "yaml-cpp/yaml.h"

namespace launch {
namespace {

// One setting, from the command line or the config file, before validation.
struct RawValue {
  std::string value;
  std::vector<std::string> list;  // `args` only
  bool set = false;
  std::string origin;  // "--nproc-per-node" or "job.yaml:3: nproc_per_node", for errors
};

enum class Kind { kValue, kFlag, kYamlOnly };

struct OptionDef {
  const char* key;    // canonical, underscores: the YAML key
  const char* names;  // CLI11 names
  Kind kind;
  std::string help;
};

// Every setting, once: the flags (torchrun's first, then launch's) and the YAML-only keys. Built
// on first use (its help texts print defaults from common/tunables.h), not at start-up.
// The workers, the rendezvous, their output and logs: torchrun's flags first, then launch's.
std::vector<OptionDef> WorkerAndRendezvousOptions() {
  return {
      {"nproc_per_node", "--nproc-per-node,--nproc_per_node", Kind::kValue,
       "Workers on this node: a number, cpu, gpu or auto (default 1)"},
      {"nnodes", "--nnodes", Kind::kValue, "Nodes: N or MIN:MAX (default 1)"},
      {"node_rank", "--node-rank,--node_rank", Kind::kValue, "This node's rank (static rendezvous)"},
      {"rdzv_backend", "--rdzv-backend,--rdzv_backend", Kind::kValue, "c10d (default) or static"},
      {"rdzv_endpoint", "--rdzv-endpoint,--rdzv_endpoint", Kind::kValue,
       absl::StrCat("Coordinator HOST[:PORT] (default port ", kDefaultRendezvousPort, ")")},
      {"rdzv_id", "--rdzv-id,--rdzv_id", Kind::kValue, "Job id shared by all nodes (default: fresh)"},
      {"rdzv_conf", "--rdzv-conf,--rdzv_conf", Kind::kValue,
       "Rendezvous settings k=v,... (join_timeout, last_call_timeout, close_timeout, "
       "heartbeat_interval, heartbeat_timeout, is_host)"},
      {"standalone", "--standalone", Kind::kFlag, "Single node, coordinator in-process (the default)"},
      {"max_restarts", "--max-restarts,--max_restarts", Kind::kValue,
       "Restarts of the worker group before failing (default 0)"},
      {"monitor_interval", "--monitor-interval,--monitor_interval", Kind::kValue,
       absl::StrCat("Seconds between samples of the workers (step times, CPU, memory, GPUs) to metrics.jsonl and the "
                    "coordinator (default ",
                    SecondsOf(kDefaultMonitorInterval), "; at least ", kMinMonitorInterval, "; 0: off)")},
      {"straggler_factor", "--straggler-factor,--straggler_factor", Kind::kValue,
       absl::StrCat("A rank whose own work per step is this many times the job's median is a straggler (default ",
                    kDefaultStragglerFactor, "; 0: off)")},
      {"metrics_port", "--metrics-port,--metrics_port", Kind::kValue,
       "Serve the coordinator's Prometheus metrics on this port (needs the rendezvous token as bearer token)"},
      {"role", "--role", Kind::kValue, "ROLE_NAME of the workers (default 'default')"},
      {"module", "-m,--module", Kind::kFlag, "Run PROGRAM as a Python module (python -m)"},
      {"no_python", "--no-python,--no_python", Kind::kFlag, "Run PROGRAM directly, even a .py file"},
      {"no_flight_recorder", "--no-flight-recorder,--no_flight_recorder", Kind::kFlag,
       "Do not turn on PyTorch's NCCL flight recorder for GPU workers"},
      {"run_path", "--run-path,--run_path", Kind::kFlag, "Not supported (workers are processes)"},
      {"warm_start", "--warm-start,--warm_start", Kind::kFlag,
       "Start each Python worker as a fork of a standby interpreter that imported torch once per rank "
       "(a restart skips the import; default on; --warm-start=false: start them cold)"},
      {"warm_import", "--warm-import,--warm_import", Kind::kValue,
       absl::StrCat("Modules a --warm-start standby imports, comma separated (default ", kDefaultWarmImport, ")")},
      {"start_method", "--start-method,--start_method", Kind::kValue,
       "spawn, fork or forkserver: accepted for torchrun compatibility; every worker is a fresh process (exec)"},
      {"logs_specs", "--logs-specs,--logs_specs", Kind::kValue, "Not supported (torchrun's plugin for log layouts)"},
      {"log_dir", "--log-dir,--log_dir", Kind::kValue,
       "Write <dir>/<run_id>/attempt_<k>/<local_rank>/{stdout,stderr}.log and error.json"},
      {"redirects", "-r,--redirects", Kind::kValue,
       "Streams to send to log files only: 0-3 or per local rank 0:1,1:2 (1 out, 2 err, 3 both)"},
      {"tee", "-t,--tee", Kind::kValue, "Streams to log files and the console: as --redirects"},
      {"local_ranks_filter", "--local-ranks-filter,--local_ranks_filter", Kind::kValue,
       "Local ranks shown on the console, e.g. 0,1 (files keep all)"},
      {"log_line_prefix_template", "--log-line-prefix-template,--log_line_prefix_template", Kind::kValue,
       absl::StrCat("Console prefix of the workers' lines: ${role_name}, ${rank}, ${local_rank}, ${hostname} (default ",
                    kSingleNodeLinePrefix, ", on several nodes ", kMultiNodeLinePrefix, ")")},
      {"duplicate_stdout_filters", "--duplicate-stdout-filters,--duplicate_stdout_filters", Kind::kValue,
       "Also copy the workers' stdout lines containing any of these comma-separated strings (,, for a comma) to "
       "attempt_<k>/filtered_stdout.log"},
      {"duplicate_stderr_filters", "--duplicate-stderr-filters,--duplicate_stderr_filters", Kind::kValue,
       "The same for stderr, to attempt_<k>/filtered_stderr.log"},
      {"numa_binding", "--numa-binding,--numa_binding", Kind::kValue,
       "Bind each worker to the CPUs (and memory) nearest its GPU: node, socket, exclusive or core-complex "
       "(without GPUs: the NUMA nodes divided among the workers)"},
      {"virtual_local_rank", "--virtual-local-rank,--virtual_local_rank", Kind::kFlag,
       "LOCAL_RANK=0 for every worker, each seeing only its own GPU(s) (implies --gpu-binding=isolate)"},
  };
}

// Addresses, stopping, hangs, GPUs, checks and credentials; then the YAML-only keys.
std::vector<OptionDef> NodeAndCredentialOptions() {
  return {
      {"master_addr", "--master-addr,--master_addr", Kind::kValue, "MASTER_ADDR (default 127.0.0.1 on a single node)"},
      {"master_port", "--master-port,--master_port", Kind::kValue,
       "MASTER_PORT (default: a free port, bound when this node joins and kept for every attempt)"},
      {"local_addr", "--local-addr,--local_addr", Kind::kValue, "This node's address as other nodes reach it"},
      {"config", "--config", Kind::kValue, "YAML file with any of these settings; flags override it"},
      {"stop_timeout", "--stop-timeout,--stop_timeout,--shutdown-timeout,--shutdown_timeout", Kind::kValue,
       absl::StrCat("Seconds from SIGTERM to SIGKILL when stopping workers (default ", SecondsOf(kDefaultStopTimeout),
                    ")")},
      {"signals_to_handle", "--signals-to-handle,--signals_to_handle", Kind::kValue,
       "Signals forwarded to the workers before they are stopped (default SIGTERM,SIGINT,SIGHUP,SIGQUIT; "
       "in a Slurm job step also SIGUSR1,SIGUSR2)"},
      {"restart_backoff", "--restart-backoff,--restart_backoff", Kind::kValue,
       "Seconds to wait before a restart (default 0)"},
      {"hang_timeout", "--hang-timeout,--hang_timeout", Kind::kValue,
       absl::StrCat("Seconds without a progress report after which a rank is hung: its stacks are captured and the "
                    "group restarts (default: the larger of ",
                    kHangTimeoutFactor, "x its median step time and ", SecondsOf(kHangTimeoutFloor), "; 0: off)")},
      {"gpus", "--gpus", Kind::kValue, "GPUs to use: indices or UUIDs, comma separated"},
      {"exclude_gpus", "--exclude-gpus,--exclude_gpus", Kind::kValue, "GPUs not to use"},
      {"gpu_binding", "--gpu-binding,--gpu_binding", Kind::kValue,
       "shared (every worker sees the pool; default) or isolate (each its own GPUs)"},
      {"cuda_alloc_conf", "--cuda-alloc-conf,--cuda_alloc_conf", Kind::kValue,
       "PYTORCH_CUDA_ALLOC_CONF for the workers unless already set"},
      {"threads_per_worker", "--threads-per-worker,--threads_per_worker", Kind::kValue,
       "OMP/MKL/OPENBLAS threads per worker (default: usable CPUs / local workers)"},
      {"dry_run", "--dry-run,--dry_run", Kind::kFlag, "Print each worker's argv and env; start nothing"},
      {"preflight", "--preflight", Kind::kFlag,
       "Run launch doctor's checks for this run first: print them, and start nothing when one fails (exit 2)"},
      {"rdzv_token_file", "--rdzv-token-file,--rdzv_token_file", Kind::kValue,
       "File whose first line is the job's rendezvous token (else LAUNCH_RDZV_TOKEN)"},
      {"tls_cert", "--tls-cert,--tls_cert", Kind::kValue,
       "PEM certificate: the coordinator's, or this agent's for mutual TLS"},
      {"tls_key", "--tls-key,--tls_key", Kind::kValue, "PEM private key of --tls-cert"},
      {"tls_ca", "--tls-ca,--tls_ca", Kind::kValue,
       "PEM CA: agents trust the coordinator signed by it; a hosting agent requires client certificates"},
      {"insecure", "--insecure", Kind::kFlag, "Let a coordinator reachable from other hosts run without token or TLS"},
      {"program", "", Kind::kYamlOnly, ""},
      {"args", "", Kind::kYamlOnly, ""},
      {"train_base_lr", "", Kind::kYamlOnly, ""},
      {"train_per_worker_batch", "", Kind::kYamlOnly, ""},
      {"train_global_batch", "", Kind::kYamlOnly, ""},
      {"train_base_batch", "", Kind::kYamlOnly, ""},
      {"train_grad_accum_steps", "", Kind::kYamlOnly, ""},
      {"train_lr_scaling", "", Kind::kYamlOnly, ""},
  };
}

const std::vector<OptionDef>& OptionTable() {
  static const auto* const kOptions = [] {
    auto* all = new std::vector<OptionDef>(WorkerAndRendezvousOptions());
    for (OptionDef& d : NodeAndCredentialOptions()) all->push_back(std::move(d));
    return all;
  }();
  return *kOptions;
}

using RawMap = std::map<std::string, RawValue>;

const OptionDef* FindOption(const std::string& key) {
  for (const auto& o : OptionTable())
    if (key == o.key) return &o;
  return nullptr;
}

absl::Status Bad(const RawValue& v, const std::string& expected) {
  return absl::InvalidArgumentError(absl::StrCat(v.origin, "=", v.value, ": expected ", expected));
}

// A dotted Python module name ("torch", "mypkg.models"), at most 200 characters.
bool IsPythonModuleName(absl::string_view m) {
  if (m.empty() || m.size() > 200) return false;
  for (absl::string_view part : absl::StrSplit(m, '.')) {
    if (part.empty() || absl::ascii_isdigit(part[0])) return false;
    for (char ch : part)
      if (!absl::ascii_isalnum(ch) && ch != '_') return false;
  }
  return true;
}

// ---- YAML ----

std::string YamlOrigin(const std::string& file, const YAML::Node& node, const std::string& key) {
  return absl::StrCat(file, ":", node.Mark().line + 1, ": ", key);
}

// A YAML on/off setting as "true" or "false": YAML's booleans, an empty value (on, as a bare
// flag), or an integer (0 off, else on, as PET_ variables read); anything else is an error.
absl::StatusOr<std::string> YamlOnOff(const YAML::Node& value, const std::string& origin) {
  const std::string expected = ": expected true or false (or yes/no, on/off, 1/0)";
  if (value.IsNull()) return std::string("true");
  if (!value.IsScalar()) return absl::InvalidArgumentError(absl::StrCat(origin, expected));
  const std::string text = absl::AsciiStrToLower(value.as<std::string>());
  if (text.empty() || text == "true" || text == "yes" || text == "on") return std::string("true");
  if (text == "false" || text == "no" || text == "off") return std::string("false");
  long long n;
  if (absl::SimpleAtoi(text, &n)) return std::string(n != 0 ? "true" : "false");
  return absl::InvalidArgumentError(absl::StrCat(origin, "=", value.as<std::string>().substr(0, 64), expected));
}

absl::Status FlattenYaml(const std::string& file, const YAML::Node& map, const std::string& prefix, RawMap* out) {
  for (auto it = map.begin(); it != map.end(); ++it) {
    std::string name = it->first.as<std::string>();
    std::string key = absl::StrReplaceAll(absl::StrCat(prefix, name), {{"-", "_"}});
    // A copy (a YAML::Node is a handle): `it->second` is a member of a temporary (AddressSanitizer
    // found the reference to it used after its scope).
    const YAML::Node value = it->second;
    const std::string origin = YamlOrigin(file, it->first, key);
    const OptionDef* def = FindOption(key);
    if (value.IsMap() && !def) {
      RETURN_IF_ERROR(FlattenYaml(file, value, key + "_", out));
      continue;
    }
    if (!def) {
      return absl::InvalidArgumentError(
          absl::StrCat(origin,
                       ": unknown key; expected a flag name (e.g. nproc_per_node, max_restarts, "
                       "rdzv: {endpoint}) or train.{base_lr, per_worker_batch, global_batch, base_batch, "
                       "grad_accum_steps, lr_scaling}"));
    }
    if (key == "config") return absl::InvalidArgumentError(absl::StrCat(origin, ": config files do not nest"));
    RawValue raw;
    raw.set = true;
    raw.origin = origin;
    if (def->kind == Kind::kFlag) {
      // As on the command line and in PET_ variables: on or off, and nothing else (`maybe`, `2`,
      // `[1]` were read as off, off and on).
      ASSIGN_OR_RETURN(raw.value, YamlOnOff(value, origin));
      (*out)[key] = std::move(raw);
      continue;
    }
    if (value.IsMap() && key != "rdzv_conf" && key != "redirects" && key != "tee") {
      return absl::InvalidArgumentError(absl::StrCat(origin, key == "args"
                                                                 ? ": expected a list of arguments, not a mapping"
                                                                 : ": expected a value, not a mapping"));
    }
    if (value.IsScalar()) {
      raw.value = value.as<std::string>();
      if (key == "args") raw.list = {raw.value};
    } else if (value.IsSequence()) {
      for (const auto& item : value) {
        if (!item.IsScalar()) {
          return absl::InvalidArgumentError(absl::StrCat(origin, ": expected a list of plain values"));
        }
        raw.list.push_back(item.as<std::string>());
      }
      raw.value = absl::StrJoin(raw.list, ",");
    } else if (value.IsMap()) {
      // rdzv_conf: {k: v} → "k=v,..."; redirects/tee: {0: 1} → "0:1,...".
      const char* sep = key == "rdzv_conf" ? "=" : ":";
      std::vector<std::string> items;
      for (auto kv = value.begin(); kv != value.end(); ++kv) {
        if (!kv->second.IsScalar()) {
          return absl::InvalidArgumentError(absl::StrCat(origin, ": expected plain values"));
        }
        items.push_back(absl::StrCat(kv->first.as<std::string>(), sep, kv->second.as<std::string>()));
      }
      raw.value = absl::StrJoin(items, ",");
    } else {
      raw.value = "";  // `key:` with no value
    }
    // A key given twice (also as rdzv: {endpoint} and rdzv_endpoint) would silently take one.
    if (auto seen = out->find(key); seen != out->end() && seen->second.set) {
      return absl::InvalidArgumentError(absl::StrCat(origin, ": duplicate key (first at ", seen->second.origin, ")"));
    }
    (*out)[key] = std::move(raw);
  }
  return absl::OkStatus();
}

absl::StatusOr<RawMap> LoadYaml(const std::string& file) {
  auto text = ReadRegularFile(file, kMaxConfigBytes, "a YAML file");
  if (!text.ok()) return absl::InvalidArgumentError(absl::StrCat("--config=", text.status().message()));
  YAML::Node root;
  try {
    // One document: a second one (after ---) would be ignored without a word.
    std::vector<YAML::Node> docs = YAML::LoadAll(*text);
    if (docs.size() > 1) {
      return absl::InvalidArgumentError(absl::StrCat(file, ":", docs[1].Mark().line + 1,
                                                     ": a second YAML document; expected one mapping of settings"));
    }
    if (!docs.empty()) root = docs[0];
  } catch (const YAML::ParserException& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(file, ":", e.mark.line + 1, ":", e.mark.column + 1, ": YAML syntax error: ", e.msg));
  }
  RawMap out;
  if (root.IsNull()) return out;
  if (!root.IsMap()) {
    return absl::InvalidArgumentError(absl::StrCat(file, ":1: expected a mapping of settings"));
  }
  try {
    RETURN_IF_ERROR(FlattenYaml(file, root, "", &out));
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(file, ":", e.mark.line + 1, ": ", e.msg));
  }
  return out;
}

// ---- typed values ----

absl::StatusOr<int> ParseInt(const RawValue& v, int min, const std::string& expected) {
  int out;
  if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(v.value), &out) || out < min) return Bad(v, expected);
  return out;
}

// Every duration in seconds goes through here: 0..kMaxSeconds, and at least kMinPositiveSeconds
// where it must be positive.
absl::StatusOr<double> ParseSeconds(const RawValue& v, const std::string& value, bool positive,
                                    const std::string& what = "") {
  double out;
  const std::string range = positive ? absl::StrCat(kMinPositiveSeconds, "..", kMaxSeconds)
                                     : absl::StrCat("0..", kMaxSeconds);
  if (!absl::SimpleAtod(absl::StripAsciiWhitespace(value), &out) || !std::isfinite(out) || out < 0 ||
      out > kMaxSeconds || (positive && out < kMinPositiveSeconds)) {
    return Bad(v, absl::StrCat("a number of seconds", what.empty() ? "" : " for " + what, " in ", range,
                               what.empty() ? "" : absl::StrCat(" (got '", value, "')")));
  }
  return out;
}
absl::StatusOr<double> ParseSeconds(const RawValue& v) { return ParseSeconds(v, v.value, false); }

// torchrun's comma-separated filter list: ",," is a literal comma; empty items are dropped.
absl::StatusOr<std::vector<std::string>> ParseFilterList(const RawValue& v) {
  constexpr size_t kMaxFilters = 64, kMaxFilterBytes = 1024;
  std::vector<std::string> out;
  std::string item;
  auto take = [&]() -> absl::Status {
    if (item.empty()) return absl::OkStatus();
    if (item.size() > kMaxFilterBytes) return Bad(v, absl::StrCat("filters of at most ", kMaxFilterBytes, " bytes"));
    if (out.size() == kMaxFilters) return Bad(v, absl::StrCat("at most ", kMaxFilters, " filters"));
    out.push_back(std::move(item));
    item.clear();
    return absl::OkStatus();
  };
  for (size_t i = 0; i < v.value.size(); ++i) {
    if (v.value[i] != ',') {
      item.push_back(v.value[i]);
    } else if (i + 1 < v.value.size() && v.value[i + 1] == ',') {
      item.push_back(',');
      ++i;
    } else {
      RETURN_IF_ERROR(take());
    }
  }
  RETURN_IF_ERROR(take());
  return out;
}

absl::Status ParseRdzvConf(const RawValue& v, LaunchConfig* c) {
  static const std::set<std::string> kKeys = {"join_timeout",      "last_call_timeout",
                                              "close_timeout",     "heartbeat_interval",
                                              "heartbeat_timeout", "is_host",
                                              "read_timeout",      "timeout"};
  for (const auto& item : SplitCommaList(v.value)) {
    auto eq = item.find('=');
    if (eq == std::string::npos || eq == 0) return Bad(v, "k=v pairs separated by commas");
    std::string key = item.substr(0, eq), value = item.substr(eq + 1);
    if (!kKeys.count(key)) {
      return Bad(v, absl::StrCat("keys among ", absl::StrJoin(kKeys, ", "), " ('", key, "' is unknown)"));
    }
    if (key == "is_host") {
      std::string b = absl::AsciiStrToLower(value);
      if (b == "1" || b == "true" || b == "yes") c->rdzv.is_host = true;
      else if (b == "0" || b == "false" || b == "no") c->rdzv.is_host = false;
      else return Bad(v, absl::StrCat("is_host=1 or is_host=0 (got '", value, "')"));
    } else {
      const bool positive = key == "join_timeout" || key == "timeout" || key == "heartbeat_interval" ||
                            key == "heartbeat_timeout";
      ASSIGN_OR_RETURN(double d, ParseSeconds(v, value, positive, key));
      if (key == "join_timeout" || key == "timeout") c->rdzv.join_timeout = d;
      else if (key == "last_call_timeout") c->rdzv.last_call_timeout = d;
      else if (key == "close_timeout") c->rdzv.close_timeout = d;
      else if (key == "heartbeat_interval") c->rdzv.heartbeat_interval = d;
      else if (key == "heartbeat_timeout") c->rdzv.heartbeat_timeout = d;
      // read_timeout: the c10d store's read timeout; there is no store here to apply it to.
    }
    c->rdzv_conf.emplace_back(key, value);
  }
  if (c->rdzv.heartbeat_interval >= c->rdzv.heartbeat_timeout) {
    return Bad(v, absl::StrCat("heartbeat_interval < heartbeat_timeout (got ", c->rdzv.heartbeat_interval, " and ",
                               c->rdzv.heartbeat_timeout, ")"));
  }
  return absl::OkStatus();
}

absl::Status ParseTrain(RawMap& raw, LaunchConfig* c) {
  bool any = false;
  for (const auto& [k, v] : raw) any |= (k.rfind("train_", 0) == 0 && v.set);
  if (!any) return absl::OkStatus();
  TrainScaling t;
  RawValue& lr = raw["train_base_lr"];
  if (!lr.set) {
    const auto& some = std::find_if(raw.begin(), raw.end(),
                                    [](const auto& kv) { return kv.first.rfind("train_", 0) == 0 && kv.second.set; });
    return absl::InvalidArgumentError(absl::StrCat(some->second.origin, ": the train section needs base_lr"));
  }
  if (!absl::SimpleAtod(lr.value, &t.base_lr) || !(t.base_lr > 0)) return Bad(lr, "a learning rate > 0");
  auto opt_int = [&](const char* key, std::optional<int>* out) -> absl::Status {
    RawValue& v = raw[key];
    if (!v.set) return absl::OkStatus();
    ASSIGN_OR_RETURN(int n, ParseInt(v, 1, "a positive integer"));
    *out = n;
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(opt_int("train_per_worker_batch", &t.per_worker_batch));
  RETURN_IF_ERROR(opt_int("train_global_batch", &t.global_batch));
  RETURN_IF_ERROR(opt_int("train_base_batch", &t.base_batch));
  std::optional<int> accum;
  RETURN_IF_ERROR(opt_int("train_grad_accum_steps", &accum));
  if (accum) t.grad_accum_steps = *accum;
  if (t.per_worker_batch && t.global_batch) {
    return absl::InvalidArgumentError(absl::StrCat(raw["train_global_batch"].origin,
                                                   ": give train.per_worker_batch or train.global_batch, not both"));
  }
  if (!t.per_worker_batch && !t.global_batch) {
    return absl::InvalidArgumentError(
        absl::StrCat(lr.origin, ": train.base_lr needs train.per_worker_batch or train.global_batch"));
  }
  RawValue& mode = raw["train_lr_scaling"];
  if (mode.set) {
    std::string m = absl::AsciiStrToLower(mode.value);
    if (m == "linear") t.mode = LrScaling::kLinear;
    else if (m == "sqrt") t.mode = LrScaling::kSqrt;
    else if (m == "none") t.mode = LrScaling::kNone;
    else return Bad(mode, "linear, sqrt or none");
  }
  c->train = t;
  return absl::OkStatus();
}

// Whether a setting was given (a flag, a PET_ variable, the config file or Slurm).
bool IsSet(RawMap& raw, const char* key) { return raw[key].set; }

// An on/off setting: on when given bare or as true, 1, yes or on.
bool IsOn(RawMap& raw, const char* key) {
  const RawValue& v = raw[key];
  if (!v.set) return false;
  std::string s = absl::AsciiStrToLower(v.value);
  return s.empty() || s == "true" || s == "1" || s == "yes" || s == "on";
}

// Validate's checks, one per concern, in the order Validate runs them: each reads its settings from
// `raw` and fills its part of `c`, and the first bad value it finds is the error.

// torchrun's default backend is static: several nodes with a master address and no endpoint (a
// non-elastic PyTorchJob, Trainer v2) mean static ranks, not a missing --rdzv-endpoint.
void DefaultToStaticBackend(RawMap& raw) {
  if (!raw["rdzv_backend"].set && raw["master_addr"].set && raw["nnodes"].set &&
      (!raw["rdzv_endpoint"].set || raw["rdzv_endpoint"].value.empty())) {
    const std::string n(absl::StripAsciiWhitespace(raw["nnodes"].value));
    if (n != "1" && n.find(':') == std::string::npos) {
      raw["rdzv_backend"] = RawValue{"static", {}, true, "torchrun's default (a master address, no endpoint)"};
    }
  }
}

// --nproc-per-node, --nnodes, --node-rank.
absl::Status ParseWorkersAndNodes(RawMap& raw, LaunchConfig& c) {
  if (IsSet(raw, "nproc_per_node")) {
    RawValue& v = raw["nproc_per_node"];
    std::string s = absl::AsciiStrToLower(v.value);
    if (s == "cpu") c.nproc_kind = LaunchConfig::Nproc::kCpu;
    else if (s == "gpu") c.nproc_kind = LaunchConfig::Nproc::kGpu;
    else if (s == "auto") c.nproc_kind = LaunchConfig::Nproc::kAuto;
    else {
      ASSIGN_OR_RETURN(c.nproc, ParseInt(v, 1, "a positive integer, cpu, gpu or auto"));
      if (c.nproc > kMaxWorkersPerNode) {
        return Bad(v, absl::StrCat("at most ", kMaxWorkersPerNode, " workers per node, cpu, gpu or auto"));
      }
    }
  }
  if (IsSet(raw, "nnodes")) {
    RawValue& v = raw["nnodes"];
    std::vector<std::string> parts = absl::StrSplit(v.value, ':');
    int lo, hi;
    if (parts.size() == 1 && absl::SimpleAtoi(parts[0], &lo) && lo >= 1) {
      c.min_nodes = c.max_nodes = lo;
    } else if (parts.size() == 2 && absl::SimpleAtoi(parts[0], &lo) && absl::SimpleAtoi(parts[1], &hi) && lo >= 1 &&
               hi >= lo) {
      c.min_nodes = lo;
      c.max_nodes = hi;
    } else {
      return Bad(v, "N or MIN:MAX with 1 <= MIN <= MAX");
    }
    if (c.max_nodes > kMaxNodes) return Bad(v, absl::StrCat("at most ", kMaxNodes, " nodes"));
  }
  if (IsSet(raw, "node_rank")) {
    ASSIGN_OR_RETURN(c.node_rank, ParseInt(raw["node_rank"], 0, "an integer >= 0"));
  }
  return absl::OkStatus();
}

// --rdzv-backend, --rdzv-endpoint, --rdzv-id, --rdzv-conf, --standalone.
absl::Status ParseRendezvous(RawMap& raw, LaunchConfig& c) {
  if (IsSet(raw, "rdzv_backend")) {
    c.rdzv_backend = raw["rdzv_backend"].value;
    if (c.rdzv_backend != "c10d" && c.rdzv_backend != "static") {
      return Bad(raw["rdzv_backend"], "c10d or static");
    }
  }
  if (IsSet(raw, "rdzv_endpoint") && !raw["rdzv_endpoint"].value.empty()) {
    RawValue& v = raw["rdzv_endpoint"];
    auto hp = ParseEndpoints(v.value, v.origin);  // several: replicated coordinators
    if (!hp.ok()) return hp.status();
    c.rdzv_endpoint = v.value;
  }
  if (IsSet(raw, "rdzv_id")) c.rdzv_id = raw["rdzv_id"].value;
  if (c.rdzv_id == "none") c.rdzv_id.clear();  // torchrun's default spelling
  if (c.rdzv_id.size() > kMaxRunIdLength) {
    return Bad(raw["rdzv_id"], absl::StrCat("at most ", kMaxRunIdLength, " characters (got ", c.rdzv_id.size(), ")"));
  }
  for (char ch : c.rdzv_id) {
    if (!(std::isalnum(static_cast<unsigned char>(ch)) || ch == '-' || ch == '_' || ch == '.')) {
      return Bad(raw["rdzv_id"], "letters, digits, '-', '_' or '.' (it names a log directory)");
    }
  }
  if (c.rdzv_id == "." || c.rdzv_id == "..") {
    return Bad(raw["rdzv_id"], "a name, not '.' or '..' (it names a log directory under --log-dir)");
  }
  if (IsSet(raw, "rdzv_conf")) RETURN_IF_ERROR(ParseRdzvConf(raw["rdzv_conf"], &c));
  c.standalone = IsOn(raw, "standalone");
  return absl::OkStatus();
}

// --max-restarts, and what watches the workers: --monitor-interval, --straggler-factor, --metrics-port.
absl::Status ParseRestartsAndMonitoring(RawMap& raw, LaunchConfig& c) {
  if (IsSet(raw, "max_restarts")) {
    ASSIGN_OR_RETURN(c.max_restarts, ParseInt(raw["max_restarts"], 0, "an integer >= 0"));
  }
  if (IsSet(raw, "monitor_interval")) {
    ASSIGN_OR_RETURN(c.monitor_interval, ParseSeconds(raw["monitor_interval"]));
  }
  if (IsSet(raw, "straggler_factor")) {
    const RawValue& v = raw["straggler_factor"];
    double f;
    if (!absl::SimpleAtod(absl::StripAsciiWhitespace(v.value), &f) || !std::isfinite(f) ||
        (f != 0 && (f < 1 || f > kMaxStragglerFactor))) {
      return Bad(v, absl::StrCat("0 (off) or a factor in 1..", kMaxStragglerFactor));
    }
    c.straggler_factor = f;
  }
  if (IsSet(raw, "metrics_port")) {
    ASSIGN_OR_RETURN(int port, ParseInt(raw["metrics_port"], 1, "a port in 1..65535"));
    if (port > 65535) return Bad(raw["metrics_port"], "a port in 1..65535");
    c.metrics_port = port;
  }
  return absl::OkStatus();
}

// --role, how the program runs (-m, --no-python, --no-flight-recorder), --warm-start, --warm-import.
absl::Status ParseRoleAndWarmStart(RawMap& raw, LaunchConfig& c) {
  if (IsSet(raw, "role")) {
    c.role = raw["role"].value;
    if (c.role.empty()) return Bad(raw["role"], "a non-empty role name");
  }
  c.module = IsOn(raw, "module");
  c.no_python = IsOn(raw, "no_python");
  c.no_flight_recorder = IsOn(raw, "no_flight_recorder");
  c.warm_start_given = raw["warm_start"].set;
  c.warm_start = !c.warm_start_given || IsOn(raw, "warm_start");  // on unless --warm-start=false
  if (IsSet(raw, "warm_import")) {
    c.warm_imports.clear();
    for (absl::string_view m : absl::StrSplit(raw["warm_import"].value, ',', absl::SkipWhitespace())) {
      m = absl::StripAsciiWhitespace(m);
      if (!IsPythonModuleName(m) || c.warm_imports.size() >= kMaxWarmImports) {
        return Bad(raw["warm_import"],
                   absl::StrCat("at most ", kMaxWarmImports, " Python module names (e.g. torch,numpy,mypkg.models)"));
      }
      c.warm_imports.emplace_back(m);
    }
    if (c.warm_imports.empty()) return Bad(raw["warm_import"], "one or more Python module names");
  }
  return absl::OkStatus();
}

// torchrun's flags that launch accepts without a use (--start-method) or refuses with a reason.
absl::Status CheckUnsupportedFlags(RawMap& raw, const LaunchConfig& c) {
  if (IsSet(raw, "start_method")) {
    const std::string m = raw["start_method"].value;
    if (m != "spawn" && m != "fork" && m != "forkserver") return Bad(raw["start_method"], "spawn, fork or forkserver");
  }
  if (IsSet(raw, "logs_specs")) {
    return absl::InvalidArgumentError(absl::StrCat(
        raw["logs_specs"].origin, "=", raw["logs_specs"].value,
        ": not supported (torchrun's Python plugin for log layouts); launch writes torchrun's default layout "
        "(--log-dir, --redirects, --tee)"));
  }
  if (IsOn(raw, "run_path")) {
    return absl::InvalidArgumentError(
        "--run-path is not supported: launch starts every worker as its own process; run the "
        "script by path or with -m MODULE");
  }
  if (c.module && c.no_python) {
    return absl::InvalidArgumentError("--module and --no-python cannot be used together");
  }
  return absl::OkStatus();
}

// --log-dir, --redirects, --tee, --local-ranks-filter, the line prefix and the duplicate filters.
absl::Status ParseLogs(RawMap& raw, LaunchConfig& c) {
  if (IsSet(raw, "log_dir")) c.log_dir = raw["log_dir"].value;
  if (IsSet(raw, "redirects")) {
    ASSIGN_OR_RETURN(c.redirects, ParseStdSpec(raw["redirects"].value, raw["redirects"].origin));
  }
  if (IsSet(raw, "tee")) {
    ASSIGN_OR_RETURN(c.tee, ParseStdSpec(raw["tee"].value, raw["tee"].origin));
  }
  if (IsSet(raw, "local_ranks_filter") && !raw["local_ranks_filter"].value.empty()) {
    std::set<int> ranks;
    for (const auto& r : SplitCommaList(raw["local_ranks_filter"].value)) {
      int n;
      if (!absl::SimpleAtoi(r, &n) || n < 0) return Bad(raw["local_ranks_filter"], "local ranks like 0,1,2");
      ranks.insert(n);
    }
    c.local_ranks_filter = ranks;
  }
  if (IsSet(raw, "log_line_prefix_template")) {
    const RawValue& v = raw["log_line_prefix_template"];
    auto checked = FormatLinePrefix(v.value, LinePrefixFields{});
    if (!checked.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(v.origin, "=", v.value.substr(0, 64), ": ", checked.status().message()));
    }
    c.log_line_prefix_template = v.value;
  }
  for (const char* key : {"duplicate_stdout_filters", "duplicate_stderr_filters"}) {
    if (!IsSet(raw, key)) continue;
    const RawValue& v = raw[key];
    ASSIGN_OR_RETURN(std::vector<std::string> filters, ParseFilterList(v));
    (std::string(key) == "duplicate_stdout_filters" ? c.duplicate_stdout_filters
                                                    : c.duplicate_stderr_filters) = std::move(filters);
  }
  return absl::OkStatus();
}

// --virtual-local-rank, --numa-binding.
absl::Status ParseVirtualRankAndNuma(RawMap& raw, LaunchConfig& c) {
  c.virtual_local_rank = IsOn(raw, "virtual_local_rank");
  if (IsSet(raw, "numa_binding")) {
    auto b = ParseNumaBinding(raw["numa_binding"].value);
    if (!b.ok()) return Bad(raw["numa_binding"], "node, socket, exclusive or core-complex");
    c.numa_binding = *b;
  }
  return absl::OkStatus();
}

// --master-addr, --master-port, --local-addr (checked with the other settings).
absl::Status ParseMasterAndLocalAddr(RawMap& raw, LaunchConfig& c) {
  if (IsSet(raw, "master_addr")) {
    RawValue& v = raw["master_addr"];
    auto hp = ParseHostPort(v.value, v.origin);
    if (!hp.ok() || hp->port) return Bad(v, "a host name or IP address");
    c.master_addr = hp->host;
  }
  if (IsSet(raw, "master_port")) {
    ASSIGN_OR_RETURN(c.master_port, ParseInt(raw["master_port"], 1, "a port 1-65535"));
  }
  if (c.master_port && *c.master_port > 65535) return Bad(raw["master_port"], "a port 1-65535");
  if (IsSet(raw, "local_addr")) c.local_addr = raw["local_addr"].value;
  return absl::OkStatus();
}

// How the workers are stopped and restarted: --stop-timeout, --signals-to-handle,
// --restart-backoff, --hang-timeout.
absl::Status ParseStopAndRestart(RawMap& raw, LaunchConfig& c) {
  if (IsSet(raw, "stop_timeout")) {
    ASSIGN_OR_RETURN(c.stop_timeout, ParseSeconds(raw["stop_timeout"]));
  }
  if (IsSet(raw, "signals_to_handle")) {
    auto sigs = ParseSignalList(raw["signals_to_handle"].value);
    if (!sigs.ok()) {
      const RawValue& v = raw["signals_to_handle"];
      return absl::InvalidArgumentError(absl::StrCat(v.origin, "=", v.value, ": ", sigs.status().message()));
    }
    c.signals_to_handle = *sigs;
  }
  if (IsSet(raw, "restart_backoff")) {
    ASSIGN_OR_RETURN(c.restart_backoff, ParseSeconds(raw["restart_backoff"]));
  }
  if (IsSet(raw, "hang_timeout")) {
    ASSIGN_OR_RETURN(double hang, ParseSeconds(raw["hang_timeout"]));
    c.hang_timeout = hang;
  }
  return absl::OkStatus();
}

// --gpus, --exclude-gpus, --gpu-binding, --cuda-alloc-conf, --threads-per-worker.
absl::Status ParseDevices(RawMap& raw, LaunchConfig& c) {
  if (IsSet(raw, "gpus")) c.gpus = SplitCommaList(raw["gpus"].value);
  if (IsSet(raw, "exclude_gpus")) c.exclude_gpus = SplitCommaList(raw["exclude_gpus"].value);
  if (IsSet(raw, "gpu_binding")) {
    RawValue& v = raw["gpu_binding"];
    if (v.value == "shared") c.gpu_binding = GpuBinding::kShared;
    else if (v.value == "isolate") c.gpu_binding = GpuBinding::kIsolate;
    else return Bad(v, "shared or isolate");
  }
  if (IsSet(raw, "cuda_alloc_conf")) c.cuda_alloc_conf = raw["cuda_alloc_conf"].value;
  if (IsSet(raw, "threads_per_worker")) {
    ASSIGN_OR_RETURN(int t,
                     ParseInt(raw["threads_per_worker"], 1, absl::StrCat("an integer in 1..", kMaxThreadsPerWorker)));
    if (t > kMaxThreadsPerWorker)
      return Bad(raw["threads_per_worker"], absl::StrCat("an integer in 1..", kMaxThreadsPerWorker));
    c.threads_per_worker = t;
  }
  return absl::OkStatus();
}

// --dry-run, --preflight, and the rendezvous's token and TLS files.
void ParseModeAndCredentials(RawMap& raw, LaunchConfig& c) {
  c.dry_run = IsOn(raw, "dry_run");
  c.preflight = IsOn(raw, "preflight");
  if (IsSet(raw, "rdzv_token_file")) c.rdzv_token_file = raw["rdzv_token_file"].value;
  if (IsSet(raw, "tls_cert")) c.tls_cert = raw["tls_cert"].value;
  if (IsSet(raw, "tls_key")) c.tls_key = raw["tls_key"].value;
  if (IsSet(raw, "tls_ca")) c.tls_ca = raw["tls_ca"].value;
  c.insecure = IsOn(raw, "insecure");
}

// What one setting cannot say alone: --local-addr's form, and settings that exclude each other.
absl::Status CheckCombinations(RawMap& raw, LaunchConfig& c) {
  if (IsSet(raw, "local_addr") && !c.local_addr.empty()) {
    auto hp = ParseHostPort(c.local_addr, raw["local_addr"].origin);
    if (!hp.ok() || hp->port) return Bad(raw["local_addr"], "a host name or IP address (no port)");
    c.local_addr = hp->host;
  }
  if (c.virtual_local_rank) {
    if (IsSet(raw, "gpu_binding") && c.gpu_binding == GpuBinding::kShared) {
      return Bad(raw["gpu_binding"],
                 "isolate (or no --gpu-binding) with --virtual-local-rank, whose workers each see "
                 "only their own GPU(s)");
    }
    c.gpu_binding = GpuBinding::kIsolate;
  }
  if (c.rdzv_backend == "static" && c.min_nodes != c.max_nodes) {
    return Bad(raw["nnodes"], "a fixed number of nodes with --rdzv-backend=static");
  }
  if (c.rdzv_backend == "static" && c.node_rank >= c.max_nodes) {
    return Bad(raw["node_rank"], absl::StrCat("a node rank below --nnodes=", c.max_nodes));
  }
  // Static ranks have no rendezvous to restart every node together: each node restarted alone,
  // against a store its old workers hosted, and the job hung in its next round.
  if (c.rdzv_backend == "static" && c.max_nodes > 1 && c.max_restarts > 0) {
    return Bad(raw["max_restarts"],
               absl::StrCat("0 with static ranks on ", c.max_nodes,
                            " nodes, which cannot restart together; for restarts use the c10d backend on every node "
                            "(--rdzv-backend=c10d --rdzv-endpoint=<node 0's address>:29400, --node-rank not needed)"));
  }
  if (c.standalone && c.max_nodes > 1) {
    return Bad(raw["nnodes"], "1 with --standalone (a single-node run)");
  }
  return absl::OkStatus();
}

// The program: the command line's, else the config file's.
absl::Status ParseProgram(RawMap& raw, std::vector<std::string> remaining, LaunchConfig& c) {
  if (!remaining.empty() && remaining[0] == "--") remaining.erase(remaining.begin());
  if (!remaining.empty()) {
    if (remaining[0].size() > 1 && remaining[0][0] == '-') {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag '", remaining[0], "' (see launch --help)"));
    }
    c.program = remaining[0];
    c.args.assign(remaining.begin() + 1, remaining.end());
  } else if (IsSet(raw, "program")) {
    c.program = raw["program"].value;
    c.args = raw["args"].list;
  }
  if (c.program.empty()) {
    return absl::InvalidArgumentError("no program given; usage: launch [flags] PROGRAM [ARGS...]");
  }
  return absl::OkStatus();
}

absl::StatusOr<LaunchConfig> Validate(RawMap& raw, std::vector<std::string> remaining) {
  LaunchConfig c;
  DefaultToStaticBackend(raw);
  RETURN_IF_ERROR(ParseWorkersAndNodes(raw, c));
  RETURN_IF_ERROR(ParseRendezvous(raw, c));
  RETURN_IF_ERROR(ParseRestartsAndMonitoring(raw, c));
  RETURN_IF_ERROR(ParseRoleAndWarmStart(raw, c));
  RETURN_IF_ERROR(CheckUnsupportedFlags(raw, c));
  RETURN_IF_ERROR(ParseLogs(raw, c));
  RETURN_IF_ERROR(ParseVirtualRankAndNuma(raw, c));
  RETURN_IF_ERROR(ParseMasterAndLocalAddr(raw, c));
  RETURN_IF_ERROR(ParseStopAndRestart(raw, c));
  RETURN_IF_ERROR(ParseDevices(raw, c));
  ParseModeAndCredentials(raw, c);
  RETURN_IF_ERROR(CheckCombinations(raw, c));
  RETURN_IF_ERROR(ParseTrain(raw, &c));
  RETURN_IF_ERROR(ParseProgram(raw, std::move(remaining), c));
  return c;
}

// The setting a flag word names exactly ("--nproc-per-node", "-r"; "=VALUE" ignored), or nullptr.
const OptionDef* FindOptionByName(const std::string& word) {
  const std::string name = word.substr(0, word.find('='));
  for (const auto& def : OptionTable()) {
    if (def.kind == Kind::kYamlOnly) continue;
    for (absl::string_view n : absl::StrSplit(def.names, ',', absl::SkipEmpty())) {
      if (n == name) return &def;
    }
  }
  return nullptr;
}

// Launch's own words (those before the program), as CLI11 should read them:
// - a flag shortened as argparse allows (`--nproc=2`, `--nn 2`): the start of one setting's names
//   only is that setting; the start of several is an error naming them;
// - `--log-line-prefix-template=`: an empty template (no prefix), as argparse reads it. CLI11
//   reads `--role= PROG` as `--role PROG`, so any other `--flag=` with nothing after is an error.
absl::StatusOr<std::vector<std::string>> NormalizeArgs(const std::vector<std::string>& argv) {
  struct Name {
    std::string name;
    const OptionDef* def;
  };
  // --help and --version are CLI11's and main's: shortened like the others.
  static const OptionDef kHelp{"help", "--help", Kind::kFlag, ""};
  static const OptionDef kVersion{"version", "--version", Kind::kFlag, ""};
  std::vector<Name> names = {{"--help", &kHelp}, {"--version", &kVersion}};
  for (const auto& def : OptionTable()) {
    if (def.kind == Kind::kYamlOnly) continue;
    for (absl::string_view n : absl::StrSplit(def.names, ',', absl::SkipEmpty())) {
      if (absl::StartsWith(n, "-")) names.push_back({std::string(n), &def});
    }
  }
  auto resolve = [&](const std::string& name) -> absl::StatusOr<const Name*> {
    for (const auto& n : names) {
      if (n.name == name) return &n;
    }
    if (name.size() <= 2) return nullptr;
    const Name* only = nullptr;
    std::vector<std::string> could;
    for (const auto& n : names) {
      if (!absl::StartsWith(n.name, "--") || !absl::StartsWith(n.name, name)) continue;
      if (only == nullptr) only = &n;
      if (n.def != only->def && std::find(could.begin(), could.end(), n.def->key) == could.end()) {
        if (could.empty()) could.push_back(only->def->key);
        could.push_back(n.def->key);
      }
    }
    if (!could.empty()) {
      std::vector<std::string> flags;
      for (const auto& key : could) flags.push_back(absl::StrCat("--", absl::StrReplaceAll(key, {{"_", "-"}})));
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": ambiguous; it could be ", absl::StrJoin(flags, ", "), " (see launch --help)"));
    }
    return only;
  };
  std::vector<std::string> out(argv.begin(), argv.begin() + std::min<size_t>(argv.size(), 1));
  size_t i = 1;
  for (; i < argv.size(); ++i) {
    const std::string& a = argv[i];
    if (a == "--" || a.empty() || a[0] != '-' || a == "-") break;                   // the program
    const size_t eq = absl::StartsWith(a, "--") ? a.find('=') : std::string::npos;  // -r3 is CLI11's
    ASSIGN_OR_RETURN(const Name* n, resolve(a.substr(0, eq)));
    if (n == nullptr) {  // CLI11 names it
      out.push_back(a);
      continue;
    }
    const OptionDef* def = n->def;
    if (eq == std::string::npos) {
      out.push_back(n->name);
      if (def->kind == Kind::kValue && i + 1 < argv.size()) out.push_back(argv[++i]);  // its value
      continue;
    }
    if (eq + 1 == a.size() && def->kind == Kind::kValue) {
      if (std::string_view(def->key) != "log_line_prefix_template") {
        return absl::InvalidArgumentError(absl::StrCat(a, ": expected a value after '='"));
      }
      out.push_back(n->name);
      out.push_back("");
      continue;
    }
    out.push_back(absl::StrCat(n->name, a.substr(eq)));
  }
  out.insert(out.end(), argv.begin() + std::min(i, argv.size()), argv.end());
  return out;
}

// torchrun's environment for its flags: PET_<KEY>, the key upper-cased (PET_NPROC_PER_NODE). A
// flag on the command line wins. For on/off flags (PET_STANDALONE) an empty value or a non-zero
// integer is on, 0 is off, anything else an error naming the variable.
absl::Status FillFromEnvironment(const std::map<std::string, std::string>& env,
                                 const std::map<std::string, CLI::Option*>& cli,
                                 const std::map<std::string, bool>& flags, RawMap* raw) {
  for (const auto& [key, opt] : cli) {
    RawValue& v = (*raw)[key];
    if (v.set) continue;
    const std::string name = absl::StrCat("PET_", absl::AsciiStrToUpper(key));
    auto it = env.find(name);
    if (it == env.end()) continue;
    v = RawValue{it->second, {}, true, name};
    if (!flags.count(key)) continue;
    int on = 1;
    if (!it->second.empty() && !absl::SimpleAtoi(it->second, &on)) {
      return Bad(v, "an empty value or an integer (0: off, else on), as torchrun reads it");
    }
    v.value = on ? "true" : "false";
  }
  return absl::OkStatus();
}

// A Slurm job step's topology (srun with one task per node) for what nothing else set: the node
// count, node rank, run id and, with more than one node, the endpoint (or, with the static
// backend, the master address); the step's GPUs as the workers per node. --standalone turns it off.
absl::Status FillFromSlurm(const std::map<std::string, std::string>& env, RawMap* raw,
                           std::optional<int>* cpus_on_node) {
  ASSIGN_OR_RETURN(std::optional<SlurmTopology> slurm, SlurmFromEnv(env));
  if (!slurm) return absl::OkStatus();
  RawMap& r = *raw;
  if (r["standalone"].set) {
    const std::string on = absl::AsciiStrToLower(absl::StripAsciiWhitespace(r["standalone"].value));
    if (on.empty() || on == "true" || on == "1" || on == "yes" || on == "on") return absl::OkStatus();
  }
  bool used = false;
  auto fill = [&](const char* key, const SlurmValue& v, bool counts = true) {
    if (r[key].set) return;
    r[key] = RawValue{v.value, {}, true, v.origin};
    used |= counts;
  };
  fill("nnodes", slurm->nnodes);
  fill("node_rank", slurm->node_rank, false);
  fill("rdzv_id", slurm->rdzv_id);
  // The node count as it will be validated: the endpoint only matters with more than one.
  const std::string nnodes(absl::StripAsciiWhitespace(r["nnodes"].value));
  const bool several = nnodes != "1" && nnodes != "1:1";
  if (several) {
    if (r["rdzv_backend"].set && r["rdzv_backend"].value == "static") {
      fill("master_addr", slurm->master_addr);
    } else {
      fill("rdzv_endpoint", slurm->rdzv_endpoint);
    }
  }
  if (slurm->nproc_per_node) fill("nproc_per_node", *slurm->nproc_per_node);
  // A step's tasks get SIGUSR1/SIGUSR2 from `sbatch --signal` before a time limit or preemption:
  // they reach the workers (to checkpoint) instead of ending launch.
  fill("signals_to_handle", {SignalListName(SlurmHandledSignals()), "default in a Slurm job step"}, false);
  *cpus_on_node = slurm->cpus_on_node;
  const long nodes = std::stol(slurm->nnodes.value);
  if (used && slurm->tasks > nodes) {
    return absl::InvalidArgumentError(
        absl::StrCat("srun started ", slurm->tasks, " tasks on ", nodes,
                     " node(s) (SLURM_STEP_NUM_TASKS=", slurm->tasks, ", ", slurm->nnodes.origin, "=", nodes,
                     "): launch is one agent per node and starts the workers itself; expected srun --ntasks-per-node=1 "
                     "and launch --nproc-per-node=N"));
  }
  return absl::OkStatus();
}

}  // namespace

bool AsksForVersion(const std::vector<std::string>& argv) {
  auto words = NormalizeArgs(argv);
  if (!words.ok()) return false;
  for (size_t i = 1; i < words->size(); ++i) {
    const std::string& a = (*words)[i];
    if (a == "--version") return true;
    if (a == "--" || a.empty() || a[0] != '-' || a == "-") return false;  // the program
    const OptionDef* def = FindOptionByName(a);
    if (def && def->kind == Kind::kValue && a.find('=') == std::string::npos) ++i;  // its value
  }
  return false;
}

absl::StatusOr<ParsedArgs> ParseLaunchArgs(const std::vector<std::string>& argv,
                                           const std::map<std::string, std::string>& env) {
  ASSIGN_OR_RETURN(const std::vector<std::string> words, NormalizeArgs(argv));
  CLI::App app{"launch: start and supervise distributed training workers (torchrun's flags)", "launch"};
  app.prefix_command(true);
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.footer(
      "Usage: launch [flags] PROGRAM [ARGS...]; \"${local_rank}\" in ARGS is replaced per worker.\n"
      "Also: launch coordinator (a standalone or replicated coordinator), launch status (a running job), "
      "launch doctor (is this machine ready); each with --help.");
  RawMap raw;
  std::map<std::string, bool> flags;
  std::map<std::string, CLI::Option*> cli;
  for (const auto& def : OptionTable()) {
    if (def.kind == Kind::kYamlOnly) continue;
    CLI::Option* opt = def.kind == Kind::kFlag ? app.add_flag(def.names, flags[def.key], def.help)
                                               : app.add_option(def.names, raw[def.key].value, def.help);
    cli[def.key] = opt;
  }
  std::vector<std::string> args(words.rbegin(), words.rend() - 1);  // CLI11 wants them reversed
  try {
    app.parse(args);
  } catch (const CLI::CallForHelp&) {
    std::cout << app.help();
    return ParsedArgs{true, {}};
  } catch (const CLI::ParseError& e) {
    std::string what = e.what();
    std::replace(what.begin(), what.end(), '\n', ' ');
    return absl::InvalidArgumentError(absl::StrCat(what, " (see launch --help)"));
  }

  // The command line first; then the config file fills what the flags left unset.
  for (const auto& [key, opt] : cli) {
    RawValue& v = raw[key];
    if (opt->count() == 0) continue;
    v.set = true;
    v.origin = opt->get_name();
    if (flags.count(key)) v.value = flags[key] ? "true" : "false";
  }
  // Then torchrun's PET_<FLAG> variables (what Kubeflow's operators set), for flags not given.
  RETURN_IF_ERROR(FillFromEnvironment(env, cli, flags, &raw));
  if (raw["config"].set) {
    std::string file = raw["config"].value;
    ASSIGN_OR_RETURN(RawMap from_file, LoadYaml(file));
    for (auto& [key, v] : from_file) {
      if (!raw[key].set) raw[key] = std::move(v);
    }
  }
  // A Slurm job step (srun) gives what the flags, variables and file did not.
  std::optional<int> slurm_cpus;
  RETURN_IF_ERROR(FillFromSlurm(env, &raw, &slurm_cpus));
  // torchrun's variables for its prefix template and its SIGTERM-to-SIGKILL grace, where nothing
  // else gives them.
  if (!raw["log_line_prefix_template"].set) {
    if (auto it = env.find("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"); it != env.end()) {
      raw["log_line_prefix_template"] = RawValue{it->second, {}, true, "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"};
    }
  }
  if (!raw["stop_timeout"].set) {
    if (auto it = env.find("TORCH_ELASTIC_SHUTDOWN_TIMEOUT"); it != env.end()) {
      raw["stop_timeout"] = RawValue{it->second, {}, true, "TORCH_ELASTIC_SHUTDOWN_TIMEOUT"};
    }
  }
  // An indexed Job's pod (Kubernetes JobSet, Trainer v2) knows its place only from this.
  if (!raw["node_rank"].set) {
    if (auto it = env.find("JOB_COMPLETION_INDEX"); it != env.end()) {
      raw["node_rank"] = RawValue{it->second, {}, true, "JOB_COMPLETION_INDEX"};
    }
  }
  ASSIGN_OR_RETURN(LaunchConfig config, Validate(raw, app.remaining()));
  if (raw["config"].set) config.config_file = raw["config"].value;
  for (const auto& [key, v] : raw) {
    if (v.set) config.origins[key] = v.origin;
  }
  config.slurm_cpus_on_node = slurm_cpus;
  return ParsedArgs{false, std::move(config)};
}

}  // namespace launch

namespace launch {

namespace {
// A subcommand's flags (argv[0] is "launch", argv[1] the subcommand): true when help was asked for
// and printed; a bad flag is one line that points at `NAME --help`.
absl::StatusOr<bool> ParseSubcommandArgs(CLI::App& app, const std::vector<std::string>& argv, const char* name) {
  std::vector<std::string> args(argv.rbegin(), argv.rend() - 2);
  try {
    app.parse(args);
  } catch (const CLI::CallForHelp&) {
    std::cout << app.help();
    return true;
  } catch (const CLI::ParseError& e) {
    std::string what = e.what();
    std::replace(what.begin(), what.end(), '\n', ' ');
    return absl::InvalidArgumentError(absl::StrCat(what, " (see ", name, " --help)"));
  }
  return false;
}
}  // namespace

absl::StatusOr<ParsedCoordinatorArgs> ParseCoordinatorArgs(const std::vector<std::string>& argv) {
  CLI::App app{"launch coordinator: a standalone rendezvous coordinator for any number of jobs", "launch coordinator"};
  ParsedCoordinatorArgs out;
  CoordinatorConfig& c = out.config;
  app.add_option("--listen", c.listen,
                 absl::StrCat("HOST:PORT to serve on (default ", c.listen, "; port 0 picks one)"));
  app.add_option("--rdzv-token-file,--rdzv_token_file", c.rdzv_token_file,
                 "File whose first line is the token every agent must present (else LAUNCH_RDZV_TOKEN)");
  app.add_option("--tls-cert,--tls_cert", c.tls_cert, "PEM certificate to serve TLS with");
  app.add_option("--tls-key,--tls_key", c.tls_key, "PEM private key of --tls-cert");
  app.add_option("--tls-ca,--tls_ca", c.tls_ca, "PEM CA: require agents' client certificates signed by it (mTLS)");
  app.add_flag("--insecure", c.insecure, "Serve a non-loopback address without token or TLS");
  app.add_option("--metrics-port,--metrics_port", c.metrics_port,
                 "Serve Prometheus metrics on this port of the --listen host (bearer token: the rendezvous token)")
      ->check(CLI::Range(1, 65535));
  app.add_option("--state", c.state,
                 "etcd://HOST:PORT[,HOST:PORT...][/PREFIX]: run as one of several replicas that keep their state in "
                 "etcd (etcds:// for TLS); one leads, the others stand by");
  app.add_option("--advertise", c.advertise,
                 "HOST:PORT agents reach this replica at (default: --listen's, with this host's name for a wildcard)");
  app.add_option("--etcd-cacert,--etcd_cacert", c.etcd_ca, "PEM CA of etcd's certificates (etcds://)");
  app.add_option("--etcd-cert,--etcd_cert", c.etcd_cert, "PEM client certificate for etcd");
  app.add_option("--etcd-key,--etcd_key", c.etcd_key, "PEM private key of --etcd-cert");
  app.add_option("--leader-lease,--leader_lease", c.leader_lease,
                 absl::StrCat("Seconds of the leader's etcd lease: a standby leads within this after the leader is "
                              "lost (default ",
                              c.leader_lease, ")"))
      ->check(CLI::Range(1, 60));
  ASSIGN_OR_RETURN(out.help, ParseSubcommandArgs(app, argv, "launch coordinator"));
  if (out.help) return out;
  auto hp = ParseHostPort(c.listen, "--listen");
  if (!hp.ok()) return hp.status();
  if (!hp->port) {
    return absl::InvalidArgumentError(absl::StrCat("--listen=", c.listen, ": expected HOST:PORT"));
  }
  if (!c.advertise.empty()) {
    auto ad = ParseHostPort(c.advertise, "--advertise");
    if (!ad.ok()) return ad.status();
    if (!ad->port || *ad->port == 0) {
      return absl::InvalidArgumentError(absl::StrCat("--advertise=", c.advertise, ": expected HOST:PORT"));
    }
  }
  if (c.state.empty() && (!c.advertise.empty() || !c.etcd_ca.empty() || !c.etcd_cert.empty() || !c.etcd_key.empty())) {
    return absl::InvalidArgumentError("--advertise and --etcd-* are for replicas: they need --state etcd://...");
  }
  return out;
}

absl::StatusOr<ParsedStatusArgs> ParseStatusArgs(const std::vector<std::string>& argv) {
  CLI::App app{"launch status: a running job as its coordinator sees it (nodes, ranks, steps, CPU, memory, GPUs)",
               "launch status"};
  ParsedStatusArgs out;
  StatusConfig& c = out.config;
  app.add_option("--rdzv-endpoint,--rdzv_endpoint", c.rdzv_endpoint, "The job's coordinator HOST[:PORT]")->required();
  app.add_option("--rdzv-id,--rdzv_id", c.rdzv_id, "The job's id")->required();
  app.add_flag("--watch", c.watch, "Refresh until the job ends (Ctrl-C to stop)");
  app.add_option("--interval", c.interval, absl::StrCat("Seconds between --watch screens (default ", c.interval, ")"))
      ->check(CLI::Range(0.1, 3600.0));
  app.add_flag("--json", c.json, "The coordinator's answer as JSON");
  app.add_option("--rdzv-token-file,--rdzv_token_file", c.rdzv_token_file,
                 "File whose first line is the job's rendezvous token (else LAUNCH_RDZV_TOKEN)");
  app.add_option("--tls-cert,--tls_cert", c.tls_cert, "PEM client certificate (mutual TLS)");
  app.add_option("--tls-key,--tls_key", c.tls_key, "PEM private key of --tls-cert");
  app.add_option("--tls-ca,--tls_ca", c.tls_ca, "PEM CA the coordinator's certificate is signed by");
  ASSIGN_OR_RETURN(out.help, ParseSubcommandArgs(app, argv, "launch status"));
  if (out.help) return out;
  if (!(c.interval >= 0.1 && c.interval <= 3600)) {  // CLI11's range lets nan through
    return absl::InvalidArgumentError(absl::StrCat("--interval=", c.interval, ": expected seconds in 0.1..3600"));
  }
  RETURN_IF_ERROR(ParseHostPort(c.rdzv_endpoint, "--rdzv-endpoint").status());
  if (c.rdzv_id.empty() || c.rdzv_id.size() > kMaxRunIdLength) {
    return absl::InvalidArgumentError(
        absl::StrCat("--rdzv-id=", c.rdzv_id, ": expected 1 to ", kMaxRunIdLength, " characters"));
  }
  return out;
}

absl::StatusOr<ParsedDoctorArgs> ParseDoctorArgs(const std::vector<std::string>& argv) {
  CLI::App app{
      "launch doctor: whether this machine is ready for a run (driver, CUDA, torch, GPUs, /dev/shm, "
      "CPUs, limits, directories, BLAS); exit 0 all ok, 1 a warning, 2 a failure",
      "launch doctor"};
  ParsedDoctorArgs out;
  DoctorConfig& c = out.config;
  int nproc = 0;
  auto* nproc_option = app.add_option("--nproc-per-node,--nproc_per_node", nproc,
                                      "Workers planned on this node (default: the GPUs in the pool, else 1)")
                           ->check(CLI::Range(1, kMaxWorkersPerNode));
  std::string exclude;
  app.add_option("--exclude-gpus,--exclude_gpus", exclude, "GPUs the run will not use (as launch takes them)");
  app.add_option("--log-dir,--log_dir", c.log_dir, "The run's --log-dir: its filesystem, space and permissions");
  app.add_option("--checkpoint-dir,--checkpoint_dir", c.checkpoint_dir, "Where the run writes checkpoints: likewise");
  app.add_flag("--json", c.json, "The checks as JSON");
  ASSIGN_OR_RETURN(out.help, ParseSubcommandArgs(app, argv, "launch doctor"));
  if (out.help) return out;
  if (nproc_option->count() > 0) c.nproc = nproc;
  c.exclude_gpus = SplitCommaList(exclude);
  for (const auto& [flag, dir] :
       {std::pair<const char*, const std::string*>{"--log-dir", &c.log_dir}, {"--checkpoint-dir", &c.checkpoint_dir}}) {
    if (dir->size() >= PATH_MAX) {
      return absl::InvalidArgumentError(absl::StrCat(flag, ": expected a path shorter than ", PATH_MAX, " bytes"));
    }
  }
  return out;
}

}  // namespace launch
