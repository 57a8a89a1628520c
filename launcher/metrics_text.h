// The coordinator's runs in Prometheus' text exposition format (version 0.0.4): each metric
// family once with its HELP and TYPE, names and units in Prometheus' conventions
// (launch_<what>_<unit>, counters end in _total), label values escaped. Pure.
#pragma once

#include <string>
#include <vector>

#include "launch.pb.h"

namespace launch {

// `replica`: the answering coordinator's place among replicated ones (nullptr: not replicated).
std::string PrometheusText(const std::vector<v1::StatusResponse>& runs, const v1::ReplicaStatus* replica = nullptr);

// A label value as the format writes it: backslash, double quote and newline escaped.
std::string EscapeLabelValue(const std::string& v);

}  // namespace launch
