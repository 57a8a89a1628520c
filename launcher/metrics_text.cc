#include "launcher/metrics_text.h"

#include <cmath>
#include <map>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace launch {

namespace {

using Labels = std::vector<std::pair<std::string, std::string>>;

// Families in the order they are first defined; samples under their family.
class Exposition {
 public:
  void Define(const std::string& name, const char* type, const char* help) {
    if (families_.count(name)) return;
    order_.push_back(name);
    families_[name] = absl::StrCat("# HELP ", name, " ", help, "\n# TYPE ", name, " ", type, "\n");
  }
  void Add(const std::string& name, const Labels& labels, double value) {
    std::string& out = families_[name];
    absl::StrAppend(&out, name);
    if (!labels.empty()) {
      std::vector<std::string> parts;
      for (const auto& [k, v] : labels) parts.push_back(absl::StrCat(k, "=\"", EscapeLabelValue(v), "\""));
      absl::StrAppend(&out, "{", absl::StrJoin(parts, ","), "}");
    }
    if (std::isnan(value)) {
      absl::StrAppend(&out, " NaN\n");
    } else if (std::floor(value) == value && std::fabs(value) < 1e15) {
      absl::StrAppend(&out, " ", static_cast<int64_t>(value), "\n");
    } else {
      absl::StrAppendFormat(&out, " %.9g\n", value);
    }
  }
  std::string Text() const {
    std::string out;
    for (const std::string& name : order_) absl::StrAppend(&out, families_.at(name));
    return out;
  }

 private:
  std::vector<std::string> order_;
  std::map<std::string, std::string> families_;
};

}  // namespace

std::string EscapeLabelValue(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\') out += "\\\\";
    else if (c == '"') out += "\\\"";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

std::string PrometheusText(const std::vector<v1::StatusResponse>& runs, const v1::ReplicaStatus* replica) {
  Exposition e;
  if (replica != nullptr) {
    e.Define("launch_coordinator_leader", "gauge", "1 while this coordinator replica leads, else 0.");
    e.Define("launch_coordinator_leader_since_seconds", "gauge",
             "When this replica began to lead, in seconds since the epoch (0: it does not lead).");
    e.Define("launch_coordinator_failovers_total", "counter",
             "Leaderships this replica has seen begin after the first one it saw.");
    e.Define("launch_etcd_endpoint_healthy", "gauge", "1 while the etcd endpoint answers with a leader, else 0.");
    const Labels me = {{"replica", replica->replica()}, {"leader", replica->leader()}};
    e.Add("launch_coordinator_leader", me, replica->leading() ? 1 : 0);
    e.Add("launch_coordinator_leader_since_seconds", me, replica->leader_since_unix());
    e.Add("launch_coordinator_failovers_total", me, static_cast<double>(replica->failovers()));
    for (const v1::EtcdEndpointHealth& h : replica->etcd())
      e.Add("launch_etcd_endpoint_healthy", {{"endpoint", h.endpoint()}}, h.healthy() ? 1 : 0);
  }
  e.Define("launch_run_info", "gauge", "A run this coordinator knows, with its state (always 1).");
  e.Define("launch_run_round", "gauge", "The run's current rendezvous round.");
  e.Define("launch_run_restarts_total", "counter", "Restarts of the run's worker groups so far.");
  e.Define("launch_run_max_restarts", "gauge", "The run's restart budget.");
  e.Define("launch_run_nodes", "gauge", "Nodes in the run's current round.");
  e.Define("launch_run_hung_ranks_total", "counter", "Ranks stopped by hang detection.");
  e.Define("launch_run_straggler_episodes_total", "counter", "Times a rank became a straggler.");
  e.Define("launch_node_heartbeat_age_seconds", "gauge", "Seconds since the node's agent was last heard from.");
  e.Define("launch_node_load1", "gauge", "The node's 1-minute load average.");
  e.Define("launch_node_memory_available_bytes", "gauge", "The node's available memory.");
  e.Define("launch_node_shm_used_bytes", "gauge", "Bytes used in the node's /dev/shm.");
  e.Define("launch_node_shm_size_bytes", "gauge", "The size of the node's /dev/shm.");
  e.Define("launch_rank_step", "gauge", "The last step the rank reported.");
  e.Define("launch_rank_steps_per_second", "gauge", "The rank's step rate (from its median step time).");
  e.Define("launch_rank_step_seconds", "gauge", "The rank's median step time over its last steps.");
  e.Define("launch_rank_own_work_seconds", "gauge",
           "The rank's median step time less its wait for the other ranks (what tells a straggler).");
  e.Define("launch_rank_seconds_since_step", "gauge", "Seconds since the rank's last progress report.");
  e.Define("launch_rank_straggler", "gauge", "1 while the rank is a straggler, else 0.");
  e.Define("launch_rank_cpu_usage_ratio", "gauge", "The rank's CPU use since the previous sample (1 = one core).");
  e.Define("launch_rank_resident_memory_bytes", "gauge", "The rank's resident memory.");
  e.Define("launch_rank_threads", "gauge", "The rank's threads.");
  e.Define("launch_gpu_utilization_ratio", "gauge", "Time a kernel ran on the GPU over NVML's last period.");
  e.Define("launch_gpu_memory_used_bytes", "gauge", "GPU memory in use.");
  e.Define("launch_gpu_memory_total_bytes", "gauge", "GPU memory in all.");
  e.Define("launch_gpu_temperature_celsius", "gauge", "GPU temperature.");
  e.Define("launch_gpu_power_watts", "gauge", "GPU power draw.");
  e.Define("launch_gpu_sm_clock_hertz", "gauge", "GPU SM clock.");
  e.Define("launch_gpu_ecc_uncorrected_errors", "gauge", "Uncorrected ECC errors since the driver loaded.");
  e.Define("launch_gpu_xid_errors", "gauge", "XID errors the GPU reported in the node's last sample.");

  for (const v1::StatusResponse& s : runs) {
    const Labels run = {{"run", s.run_id()}};
    e.Add("launch_run_info", {{"run", s.run_id()}, {"state", s.state()}}, 1);
    e.Add("launch_run_round", run, static_cast<double>(s.round()));
    e.Add("launch_run_restarts_total", run, s.restart_count());
    e.Add("launch_run_max_restarts", run, s.max_restarts());
    e.Add("launch_run_nodes", run, s.nodes_size());
    e.Add("launch_run_hung_ranks_total", run, s.hung_ranks());
    e.Add("launch_run_straggler_episodes_total", run, s.straggler_episodes());
    const std::set<int> straggling(s.straggling_ranks().begin(), s.straggling_ranks().end());
    for (const v1::NodeStatus& n : s.nodes()) {
      const std::string& host = n.node().hostname();
      const Labels node = {{"run", s.run_id()}, {"node", host}, {"group_rank", absl::StrCat(n.group_rank())}};
      e.Add("launch_node_heartbeat_age_seconds", node, n.seconds_since_heartbeat());
      if (!n.has_sample()) continue;
      const v1::SampleRequest& sample = n.sample();
      e.Add("launch_node_load1", node, sample.node().load1());
      e.Add("launch_node_memory_available_bytes", node, static_cast<double>(sample.node().memory_available_bytes()));
      e.Add("launch_node_shm_used_bytes", node, static_cast<double>(sample.node().shm_used_bytes()));
      e.Add("launch_node_shm_size_bytes", node, static_cast<double>(sample.node().shm_total_bytes()));
      for (const v1::RankSample& r : sample.ranks()) {
        const Labels rank = {{"run", s.run_id()}, {"rank", absl::StrCat(r.rank())}, {"node", host}};
        if (r.last_step() >= 0) e.Add("launch_rank_step", rank, static_cast<double>(r.last_step()));
        if (r.step_seconds() > 0) {
          e.Add("launch_rank_steps_per_second", rank, 1 / r.step_seconds());
          e.Add("launch_rank_step_seconds", rank, r.step_seconds());
          e.Add("launch_rank_own_work_seconds", rank, r.busy_seconds());
        }
        if (r.seconds_since_step() >= 0) e.Add("launch_rank_seconds_since_step", rank, r.seconds_since_step());
        e.Add("launch_rank_straggler", rank, straggling.count(r.rank()) ? 1 : 0);
        if (r.state() == "running") {
          e.Add("launch_rank_cpu_usage_ratio", rank, r.cpu_percent() / 100);
          e.Add("launch_rank_resident_memory_bytes", rank, static_cast<double>(r.rss_bytes()));
          e.Add("launch_rank_threads", rank, r.threads());
        }
      }
      for (const v1::GpuSample& g : sample.gpus()) {
        const Labels gpu = {{"run", s.run_id()}, {"node", host}, {"gpu", absl::StrCat(g.index())}, {"uuid", g.uuid()}};
        if (g.utilization_percent() >= 0) e.Add("launch_gpu_utilization_ratio", gpu, g.utilization_percent() / 100.0);
        if (g.memory_used_bytes() >= 0)
          e.Add("launch_gpu_memory_used_bytes", gpu, static_cast<double>(g.memory_used_bytes()));
        if (g.memory_total_bytes() >= 0)
          e.Add("launch_gpu_memory_total_bytes", gpu, static_cast<double>(g.memory_total_bytes()));
        if (g.temperature_c() >= 0) e.Add("launch_gpu_temperature_celsius", gpu, g.temperature_c());
        if (g.power_watts() >= 0) e.Add("launch_gpu_power_watts", gpu, g.power_watts());
        if (g.sm_clock_mhz() >= 0) e.Add("launch_gpu_sm_clock_hertz", gpu, g.sm_clock_mhz() * 1e6);
        if (g.ecc_uncorrected_errors() >= 0) {
          e.Add("launch_gpu_ecc_uncorrected_errors", gpu, static_cast<double>(g.ecc_uncorrected_errors()));
        }
        e.Add("launch_gpu_xid_errors", gpu, g.xids_size());
      }
    }
  }
  return e.Text();
}

}  // namespace launch
