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
  if (e.kind != dataplane::IntraNodeExecution::kTrees) {
    return absl::FailedPreconditionError(
        absl::StrCat("the plan's strategy (", plan.strategy(),
                     ") sums its GPU groups on the host, which the mirrors' path does already"));
  }
  if (static_cast<size_t>(plan.gpus_size()) != devices.size()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the plan names ", plan.gpus_size(), " GPUs for ", devices.size(), " local ranks"));
  }
  if (!factory) return absl::FailedPreconditionError("no GPUs to run on");
  std::unique_ptr<GpuAggregation> a(new GpuAggregation());
  ASSIGN_OR_RETURN(a->ops_, factory(devices));
  ASSIGN_OR_RETURN(a->trees_, dataplane::TreeAllReduce::Create(*a->ops_, a->host_reducer_,
                                                               std::move(e.trees), {}));
  a->description_ = e.description;
  return a;
}

std::vector<void*> GpuAggregation::DeviceBuffers(const std::vector<MirroredRegion>& regions) const {
  std::vector<void*> buffers;
  for (const MirroredRegion& r : regions) {
    buffers.push_back(static_cast<std::byte*>(r.mapping->mirror()->device_data()) + r.offset);
  }
  return buffers;
}

absl::Status GpuAggregation::Before(const std::vector<MirroredRegion>& regions,
                                    common::DataType dtype, uint64_t count,
                                    std::chrono::milliseconds timeout) {
  const size_t size = common::DataTypeSize(dtype);
  if (regions.size() != static_cast<size_t>(ops_->gpu_count())) {
    return absl::InternalError(
        absl::StrCat(regions.size(), " regions for ", ops_->gpu_count(), " GPUs"));
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
  // Each root's share of the sum lands in its mirror (pinned host memory the GPUs reach); the
  // same range of the other mirrors is zeroed, so that the data plane, which sums the mirrors,
  // counts the node's sum once. The GPU buffers stay as they were (a failure keeps the inputs).
  std::vector<void*> host_out;
  for (const MirroredRegion& r : regions)
    host_out.push_back(r.mapping->mirror()->host() + r.offset);
  RETURN_IF_ERROR(trees_->ReduceToRoots(dtype, DeviceBuffers(regions), count, host_out));
  for (const dataplane::TreeAllReduce::Share& share : trees_->Shares(count)) {
    for (size_t r = 0; r < regions.size(); ++r) {
      if (static_cast<int>(r) == share.root) continue;
      std::memset(static_cast<std::byte*>(host_out[r]) + share.first * size, 0, share.count * size);
    }
  }
  ++runs_;
  return absl::OkStatus();
}

absl::Status GpuAggregation::After(const std::vector<MirroredRegion>& regions,
                                   common::DataType dtype, uint64_t count,
                                   std::chrono::milliseconds timeout) {
  const size_t size = common::DataTypeSize(dtype);
  for (const dataplane::TreeAllReduce::Share& share : trees_->Shares(count)) {
    const MirroredRegion& root = regions[share.root];
    if (absl::Status s = root.mapping->mirror()->CopyOut(root.offset + share.first * size,
                                                         share.count * size, timeout);
        !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("copying the result back to ",
                                                 root.mapping->name(), ": ", s.message()));
    }
  }
  return trees_->BroadcastFromRoots(dtype, DeviceBuffers(regions), count);
}

absl::StatusOr<GpuAggregation*> GpuAggregationSlot::Get(const std::string& job_id) {
  std::lock_guard lock(mu_);
  if (!tried_) {
    tried_ = true;
    absl::StatusOr<std::unique_ptr<GpuAggregation>> made =
        GpuAggregation::Create(*plan_, devices_, factory_);
    if (made.ok()) {
      aggregation_ = std::move(*made);
      Log()->info("job {}: the node's GPU tensors are summed on the GPUs ({})", job_id,
                  aggregation_->description());
    } else {
      failed_ = made.status();
      Log()->info("job {}: GPU tensors go through host memory one by one: {}", job_id,
                  failed_.message());
    }
  }
  if (!aggregation_) return failed_;
  return aggregation_.get();
}

}  // namespace tributary::agent
