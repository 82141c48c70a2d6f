#include "agent/plan_view.h"

#include "absl/strings/str_cat.h"
#include "dataplane/collectives/wire.h"
#include "dataplane/schedule/chunk_map.h"

namespace tributary::agent {

absl::StatusOr<dataplane::JobView> ToJobView(const tributary::v1::JobPlan& plan,
                                             const std::string& node_id) {
  dataplane::JobView v;
  v.job_id = plan.job_id();
  v.plan_version = plan.version();
  v.generation = plan.generation();
  for (const auto& w : plan.workers()) {
    if (w.node_id() == node_id) v.my_worker_rank = static_cast<int>(v.worker_addresses.size());
    v.worker_addresses.push_back(w.data_plane_address());
    v.worker_node_ids.push_back(w.node_id());
  }
  uint64_t total = 0;
  for (const auto& s : plan.servers()) {
    if (s.node_id() == node_id) v.my_server_index = static_cast<int>(v.server_addresses.size());
    v.server_addresses.push_back(s.data_plane_address());
    v.server_node_ids.push_back(s.node_id());
    v.server_weights.push_back(s.weight());
    total += s.weight();
  }
  if (v.worker_addresses.empty() || v.server_addresses.empty() ||
      total != dataplane::ChunkMap::kWeightTotal) {
    return absl::InvalidArgumentError(
        absl::StrCat("plan v", plan.version(), " of job ", plan.job_id(),
                     " is unusable: ", v.worker_addresses.size(), " workers, ",
                     v.server_addresses.size(), " servers, weights summing to ", total));
  }
  v.procs_per_node = std::max<uint32_t>(1, plan.procs_per_node());
  v.partition_bytes = plan.partition_bytes();
  // Push/pull tunes each tensor's partition from there (MIAD) unless the job fixed it.
  v.tune_partition = !plan.fixed_partition();
  v.credit_bytes = std::max(plan.credit_bytes(), plan.partition_bytes());
  v.op_timeout = std::chrono::milliseconds(plan.op_timeout_ms());
  v.secret = plan.job_secret();
  for (const auto& w : plan.workers()) {
    if (w.agent_instance() != 0)
      v.node_instances.push_back(dataplane::InstanceTag(w.agent_instance()));
  }
  for (const auto& s : plan.servers()) {
    if (s.agent_instance() != 0)
      v.node_instances.push_back(dataplane::InstanceTag(s.agent_instance()));
  }
  v.async_mode = plan.mode() == tributary::v1::JOB_MODE_ASYNC;
  v.staleness = plan.staleness();
  v.delta_scale = plan.delta_scale() != 0 ? plan.delta_scale() : 1.0;
  v.fusion_bytes = plan.fusion_bytes();
  v.fusion_cycle = std::chrono::microseconds(plan.fusion_cycle_us());
  v.selector_nic_bytes_per_s = plan.selector_nic_bytes_per_s();
  return v;
}

absl::StatusOr<dataplane::Algorithm> ToAlgorithm(tributary::v1::Algorithm algorithm) {
  switch (algorithm) {
    case tributary::v1::ALGORITHM_AUTO:
      return dataplane::Algorithm::kAuto;
    case tributary::v1::ALGORITHM_PUSH_PULL:
      return dataplane::Algorithm::kPushPull;
    case tributary::v1::ALGORITHM_RING:
      return dataplane::Algorithm::kRing;
    case tributary::v1::ALGORITHM_HALVING_DOUBLING:
      return dataplane::Algorithm::kHalvingDoubling;
    case tributary::v1::ALGORITHM_RECURSIVE_DOUBLING:
      return dataplane::Algorithm::kRecursiveDoubling;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("unknown algorithm ", static_cast<int>(algorithm)));
  }
}

}  // namespace tributary::agent
