// The form in which a node's assignments (GetAssignments, WatchAssignments) carry a plan. Every
// node of a plan of n workers receives it, so its size times its node count is what a plan change
// costs the controller (controller/README.md, "Scale"). The controller packs each plan once;
// the agent expands every plan it receives.
//
// PackAssignedPlan leaves out what agents do not use or can rebuild:
//  * each summation server's share (rebuilt from its weight), nic_bytes_per_s and sum_bytes_per_s,
//    and the plan's predictions (predicted_*, ring_*, model_bytes): planner outputs, for GetJob;
//  * a server that is also a worker: its data_plane_address and agent_instance, which its worker
//    entry (same node_id) carries;
// then moves every field but job_id, version, job_secret, generation and intra_node (which a
// commit sets, or which differ per node) into `packed`: serialized and deflated (zlib).
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "tributary/v1/controller.pb.h"

namespace tributary::v1 {

// The most bytes a packed plan may expand to.
inline constexpr uint64_t kMaxPackedPlanBytes = uint64_t{256} << 20;

void PackAssignedPlan(JobPlan& plan);
// The plan as the controller planned it, but for the fields left out (share is weight / 2^32).
// A plan that was not packed is left as it is (but for share). INVALID_ARGUMENT naming the job
// for a packed part that does not inflate or parse (the plan is then unchanged).
absl::Status ExpandAssignedPlan(JobPlan& plan);

}  // namespace tributary::v1
