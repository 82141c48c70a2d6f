#include "agent/gpu_aggregation.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "dataplane/intranode/intra_node_execution.h"

namespace tributary::agent {
namespace {

constexpr auto Log = common::ComponentLog<"agent">;

}  // namespace

absl::StatusOr<std::unique_ptr<GpuAggregation>> GpuAggregation::Create(
    const tributary::v1::IntraNodePlan& plan, const std::vector<int>& devices,
    const GpuOpsFactory& factory) {
  ASSIGN_OR_RETURN(dataplane::IntraNodeExecution e, dataplane::ExecutionFromPlan(plan));
  if (e.kind == dataplane::IntraNodeExecution::kNone) {
    return absl::FailedPreconditionError(
        absl::StrCat("the plan's strategy (", plan.strategy(), ") aggregates nothing on GPUs"));
  }
  if (static_cast<size_t>(plan.gpus_size()) != devices.size()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the plan names ", plan.gpus_size(), " GPUs for ", devices.size(), " local ranks"));
  }
  if (!factory) return absl::FailedPreconditionError("no GPUs to run on");
  std::unique_ptr<GpuAggregation> a(new GpuAggregation());
  // The parts: every GPU in one, over the plan's trees; or one per CPU-assisted group, a star
  // onto its leader (the host then sums the leaders' partials: the data plane's sum of the
  // mirrors).
  std::vector<std::pair<std::vector<int>, std::vector<dataplane::GpuTree>>> parts;
  if (e.kind == dataplane::IntraNodeExecution::kTrees) {
    std::vector<int> all(devices.size());
    for (size_t r = 0; r < all.size(); ++r) all[r] = static_cast<int>(r);
    parts.emplace_back(std::move(all), std::move(e.trees));
  } else {
    for (const std::vector<int>& group : e.groups) {
      dataplane::GpuTree star{std::vector<int>(group.size(), 0), 1};
      star.parent[0] = -1;
      parts.emplace_back(group, std::vector<dataplane::GpuTree>{star});
    }
  }
  for (auto& [ranks, trees] : parts) {
    Part part;
    part.ranks = ranks;
    std::vector<int> part_devices;
    for (int r : ranks) part_devices.push_back(devices[r]);
    ASSIGN_OR_RETURN(part.ops, factory(part_devices));
    ASSIGN_OR_RETURN(part.trees, dataplane::TreeAllReduce::Create(*part.ops, a->host_reducer_,
                                                                  std::move(trees), {}));
    a->parts_.push_back(std::move(part));
  }
  a->description_ = e.description;
  a->devices_ = devices.size();
  return a;
}

void GpuAggregation::PartMemory(const Part& part, const std::vector<MirroredRegion>& regions,
                                std::vector<void*>& buffers, std::vector<void*>& host) {
  for (int r : part.ranks) {
    MirroredMemory* mirror = regions[r].mapping->mirror();
    buffers.push_back(static_cast<std::byte*>(mirror->device_data()) + regions[r].offset);
    host.push_back(mirror->host() + regions[r].offset);
  }
}

absl::Status GpuAggregation::Before(const std::vector<MirroredRegion>& regions,
                                    common::DataType dtype, uint64_t count,
                                    std::chrono::milliseconds timeout) {
  const size_t size = common::DataTypeSize(dtype);
  if (regions.size() != devices_) {
    return absl::InternalError(
        absl::StrCat(regions.size(), " regions for ", devices_, " local ranks"));
  }
  for (const MirroredRegion& r : regions) {
    if (r.mapping->mirror()->device_data() == nullptr || r.bytes != count * size) {
      return absl::InternalError(
          absl::StrCat(r.mapping->name(), " is no GPU region of ", count, " elements"));
    }
    if (absl::Status s = r.mapping->mirror()->WaitReady(timeout); !s.ok()) {
      return absl::Status(s.code(),
                          absl::StrCat("waiting for ", r.mapping->name(), ": ", s.message()));
    }
  }
  // Each root's share of its part's sum lands in its mirror (pinned host memory the GPUs
  // reach); the same range of the part's other mirrors is zeroed, so that the data plane, which
  // sums the mirrors, counts each part's sum once. The GPU buffers stay as they were (a failure
  // keeps the inputs).
  for (const Part& part : parts_) {
    std::vector<void*> buffers, host_out;
    PartMemory(part, regions, buffers, host_out);
    RETURN_IF_ERROR(part.trees->ReduceToRoots(dtype, buffers, count, host_out));
    for (const dataplane::TreeAllReduce::Share& share : part.trees->Shares(count)) {
      for (size_t i = 0; i < part.ranks.size(); ++i) {
        if (static_cast<int>(i) == share.root) continue;
        std::memset(static_cast<std::byte*>(host_out[i]) + share.first * size, 0,
                    share.count * size);
      }
    }
  }
  return absl::OkStatus();
}

absl::Status GpuAggregation::After(const std::vector<MirroredRegion>& regions,
                                   common::DataType dtype, uint64_t count,
                                   std::chrono::milliseconds timeout) {
  const size_t size = common::DataTypeSize(dtype);
  for (const Part& part : parts_) {
    std::vector<void*> buffers, host;
    PartMemory(part, regions, buffers, host);
    for (const dataplane::TreeAllReduce::Share& share : part.trees->Shares(count)) {
      const MirroredRegion& root = regions[part.ranks[share.root]];
      if (absl::Status s = root.mapping->mirror()->CopyOut(root.offset + share.first * size,
                                                           share.count * size, timeout);
          !s.ok()) {
        return absl::Status(s.code(), absl::StrCat("copying the result back to ",
                                                   root.mapping->name(), ": ", s.message()));
      }
    }
    RETURN_IF_ERROR(part.trees->BroadcastFromRoots(dtype, buffers, count));
  }
  return absl::OkStatus();
}

absl::StatusOr<GpuAggregation*> GpuAggregationSlot::Get() {
  std::lock_guard lock(mu_);
  if (!tried_) {
    tried_ = true;
    absl::StatusOr<std::unique_ptr<GpuAggregation>> made =
        GpuAggregation::Create(*plan_, devices_, factory_);
    if (made.ok()) {
      aggregation_ = std::move(*made);
      Log()->info("job {}: the node's GPU tensors are summed on the GPUs ({})", job_id_,
                  aggregation_->description());
    } else {
      failed_ = made.status();
      Log()->info("job {}: GPU tensors go through host memory one by one: {}", job_id_,
                  failed_.message());
    }
  }
  if (!aggregation_) return failed_;
  return aggregation_.get();
}

}  // namespace tributary::agent
