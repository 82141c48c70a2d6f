#include "tributary/v1/assigned_plan.h"

#include <zlib.h>

#include <string>
#include <string_view>
#include <unordered_map>

#include "absl/strings/str_cat.h"

namespace tributary::v1 {
namespace {

std::unordered_map<std::string_view, const WorkerNode*> WorkersById(const JobPlan& plan) {
  std::unordered_map<std::string_view, const WorkerNode*> workers;
  for (const WorkerNode& w : plan.workers()) workers.emplace(w.node_id(), &w);
  return workers;
}

}  // namespace

void PackAssignedPlan(JobPlan& plan) {
  const auto workers = WorkersById(plan);
  for (SummationServer& s : *plan.mutable_servers()) {
    s.clear_share();
    s.clear_nic_bytes_per_s();
    s.clear_sum_bytes_per_s();
    if (!s.is_worker()) continue;
    auto w = workers.find(s.node_id());
    if (w == workers.end() || w->second->data_plane_address() != s.data_plane_address() ||
        w->second->agent_instance() != s.agent_instance()) {
      continue;  // would not be rebuilt the same: kept
    }
    s.clear_data_plane_address();
    s.clear_agent_instance();
  }
  plan.clear_predicted_seconds_per_byte();
  plan.clear_ring_seconds_per_byte();
  plan.clear_model_bytes();
  plan.clear_predicted_seconds();
  plan.clear_ring_seconds();

  JobPlan kept;  // what stays outside the packed part
  kept.set_job_id(plan.job_id());
  kept.set_version(plan.version());
  kept.set_job_secret(plan.job_secret());
  kept.set_generation(plan.generation());
  kept.mutable_intra_node()->Swap(plan.mutable_intra_node());
  plan.clear_job_id();
  plan.clear_version();
  plan.clear_job_secret();
  plan.clear_generation();
  std::string raw;
  plan.SerializeToString(&raw);
  uLongf size = compressBound(raw.size());
  std::string packed(size, '\0');
  // Z_BEST_SPEED: about 5x smaller for a plan of a thousand workers, at a few ms.
  compress2(reinterpret_cast<Bytef*>(packed.data()), &size,
            reinterpret_cast<const Bytef*>(raw.data()), raw.size(), Z_BEST_SPEED);
  packed.resize(size);
  kept.set_packed(std::move(packed));
  kept.set_packed_size(raw.size());
  plan = std::move(kept);
}

absl::Status ExpandAssignedPlan(JobPlan& plan) {
  if (!plan.packed().empty() || plan.packed_size() != 0) {
    if (plan.packed_size() > kMaxPackedPlanBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("job '", plan.job_id(), "': the packed plan claims ", plan.packed_size(),
                       " bytes, more than the ", kMaxPackedPlanBytes, " allowed"));
    }
    std::string raw(plan.packed_size(), '\0');
    uLongf size = raw.size();
    const int z =
        uncompress(reinterpret_cast<Bytef*>(raw.data()), &size,
                   reinterpret_cast<const Bytef*>(plan.packed().data()), plan.packed().size());
    JobPlan fields;
    if (z != Z_OK || size != raw.size() || !fields.ParseFromString(raw)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "job '", plan.job_id(), "': the packed plan does not ",
          z != Z_OK || size != raw.size() ? "inflate to its size" : "parse as a JobPlan"));
    }
    plan.clear_packed();
    plan.clear_packed_size();
    plan.MergeFrom(fields);
  }
  const auto workers = WorkersById(plan);
  for (SummationServer& s : *plan.mutable_servers()) {
    s.set_share(static_cast<double>(s.weight()) / 4294967296.0);
    if (!s.is_worker() || !s.data_plane_address().empty()) continue;
    auto w = workers.find(s.node_id());
    if (w == workers.end()) continue;
    s.set_data_plane_address(w->second->data_plane_address());
    s.set_agent_instance(w->second->agent_instance());
  }
  return absl::OkStatus();
}

}  // namespace tributary::v1
