// What the coordinator knows of a run's ranks from its nodes' monitor samples: each node's latest
// sample, straggler episodes and the events agents are told of. Pure: no I/O, time passed in.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "common/clock.h"
#include "launch.pb.h"

namespace launch {

// A sample's numbers and sizes bounded before it is kept (it comes from the wire).
absl::Status ValidateSample(const v1::SampleRequest& s);

class JobView {
 public:
  // A rank becomes a straggler when its own work per step (the median over its last steps of
  // the step time less the wait for the others) is at least `straggler_factor` times the median
  // of every rank's (the lower middle one of an even count; 0: never) and longer by
  // kMinGapSeconds (below that, timer noise decides) in kSlowSamples samples of its node in a
  // row; it stays one until its ratio is back under 1 + (factor - 1) / 2.
  explicit JobView(double straggler_factor) : factor_(straggler_factor) {}

  // Keeps the node's sample in place of its last one and looks for stragglers across the latest
  // samples of the newest round.
  void Update(const v1::SampleRequest& s, Clock::TimePoint now);
  // Events whose seq is larger than `seen`, oldest first.
  std::vector<v1::StragglerEvent> EventsAfter(uint64_t seen) const;
  // A rank stopped by hang detection, from a node's report (a repeated report counts once).
  void NoteHung(int64_t round, int rank) { hung_.insert({round, rank}); }
  // The samples of this round into `status`'s nodes (matched by node id), the straggler figures.
  void Fill(v1::StatusResponse* status, Clock::TimePoint now) const;

  double straggler_factor() const { return factor_; }

  // Steps a rank must have reported in the round before it is compared (its first steps warm up).
  static constexpr int64_t kMinSteps = 5;
  static constexpr double kMinGapSeconds = 0.001;
  static constexpr int kSlowSamples = 3;
  // Events kept for agents that have not seen them (older ones are dropped).
  static constexpr size_t kMaxEvents = 1024;

 private:
  struct Kept {
    v1::SampleRequest sample;
    Clock::TimePoint at;
  };
  // Compares the ranks of `fresh` (a node's new sample) with the job's median.
  void FindStragglers(const v1::SampleRequest& fresh);

  double factor_;
  int64_t round_ = 0;                  // the newest round a sample came from
  std::map<std::string, Kept> nodes_;  // node id -> latest sample
  std::set<int> straggling_;           // ranks in an episode now
  std::map<int, int> slow_samples_;    // rank -> its samples in a row over the factor
  int episodes_ = 0;
  std::set<std::pair<int64_t, int>> hung_;  // (round, rank)
  uint64_t next_seq_ = 1;
  std::deque<v1::StragglerEvent> events_;
};

}  // namespace launch
