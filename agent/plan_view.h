// Reads a job plan from the controller as the data plane's JobView for one node.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "dataplane/collectives/algorithm_selector.h"
#include "dataplane/collectives/job_view.h"
#include "tributary/v1/controller.pb.h"

namespace tributary::agent {

// The view of `plan` from node `node_id`: its worker rank and server index (-1 when it has
// none). INVALID_ARGUMENT when the plan is unusable (no workers or servers, weights not
// summing to 2^32).
absl::StatusOr<dataplane::JobView> ToJobView(const tributary::v1::JobPlan& plan,
                                             const std::string& node_id);

// The one conversion of a plan's algorithm into the data plane's. INVALID_ARGUMENT for a value
// this agent does not know (a newer controller's).
absl::StatusOr<dataplane::Algorithm> ToAlgorithm(tributary::v1::Algorithm algorithm);

}  // namespace tributary::agent
