// The node's sum of a job's GPU tensors formed on the GPUs, as the job's intra-node plan says
// (dataplane/intranode): only the plan's roots' shares cross to host memory and back.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "agent/mirror_stager.h"
#include "common/dtype.h"
#include "dataplane/intranode/gpu_ops.h"
#include "dataplane/intranode/tree_allreduce.h"
#include "dataplane/reduce/cpu/scalar_reducer.h"
#include "tributary/v1/topology.pb.h"

namespace tributary::agent {

// The executor's GPUs for the local ranks' devices (MakeDeviceGpuOps; tests: HostGpuOps).
using GpuOpsFactory = std::function<absl::StatusOr<std::unique_ptr<dataplane::GpuOps>>(
    const std::vector<int>& devices)>;

// Local rank r is the executor's GPU r -- the plan's GPU plan.gpus(r) (the job's r-th GPU on the
// node) -- on the device its buffer lives on. NVLink-rooted and packed-tree plans run as one
// TreeAllReduce over all ranks; a CPU-assisted plan (PCIe switches, host staging) as one star
// per group onto its leader, whose partial sums the host then adds (the data plane sums the
// mirrors). Not thread-safe: the agent's one staging thread (mirror_stager.h) runs it.
class GpuAggregation {
 public:
  // FAILED_PRECONDITION when the plan has nothing to run on GPUs ("direct", "cpu-only", one
  // GPU) or names another number of GPUs than there are local ranks; the errors of
  // ExecutionFromPlan (a malformed plan) and of `factory` (called once per part).
  static absl::StatusOr<std::unique_ptr<GpuAggregation>> Create(
      const tributary::v1::IntraNodePlan& plan, const std::vector<int>& devices,
      const GpuOpsFactory& factory);

  // Before the data plane starts the node's operation on the mirrors (`regions`, by local rank,
  // each `count` elements of `dtype` of a GPU buffer): waits for each process's ready mark, sums
  // on the GPUs to the roots (the trees' roots, or each group's leader), which copy their share
  // of the sum into their mirror, and zeroes that range of their part's other mirrors (the data
  // plane sums the mirrors: each part's sum counts once). The GPU buffers are not written: a
  // failed operation leaves the processes' inputs. INTERNAL when `regions` is not one GPU
  // region of `count` elements per local rank.
  absl::Status Before(const std::vector<MirroredRegion>& regions, common::DataType dtype,
                      uint64_t count, std::chrono::milliseconds timeout);
  // After it succeeded (every mirror holds the result): copies each root's share back to its GPU
  // buffer and broadcasts it down the trees (or from each leader to its group).
  absl::Status After(const std::vector<MirroredRegion>& regions, common::DataType dtype,
                     uint64_t count, std::chrono::milliseconds timeout);

  // "nvlink-rooted-outside-nic-switch: ring 0 3 2 1 cut at GPU 0" (ExecutionFromPlan's).
  const std::string& description() const { return description_; }

 private:
  struct Part {
    std::vector<int> ranks;  // The part's GPU i is local rank ranks[i].
    std::unique_ptr<dataplane::GpuOps> ops;
    std::unique_ptr<dataplane::TreeAllReduce> trees;
  };
  GpuAggregation() = default;
  // The part's GPU buffers (each rank's region in its GPU memory) and host mirrors, in the
  // part's order.
  static void PartMemory(const Part& part, const std::vector<MirroredRegion>& regions,
                         std::vector<void*>& buffers, std::vector<void*>& host);

  dataplane::ScalarReducer host_reducer_;  // Unused by the tree phases; the executor wants one.
  std::vector<Part> parts_;
  size_t devices_ = 0;  // Local ranks.
  std::string description_;
};

// One job's aggregation for one plan version and set of devices, made on first use (on the
// staging thread: making it calls CUDA) and kept for the job's later operations; a plan it
// cannot run is remembered (logged once) and the mirrors' path taken.
class GpuAggregationSlot {
 public:
  GpuAggregationSlot(std::string job_id, std::shared_ptr<const tributary::v1::IntraNodePlan> plan,
                     std::vector<int> devices, GpuOpsFactory factory)
      : job_id_(std::move(job_id)),
        plan_(std::move(plan)),
        devices_(std::move(devices)),
        factory_(std::move(factory)) {}
  const std::vector<int>& devices() const { return devices_; }
  // The aggregation, or why there is none.
  absl::StatusOr<GpuAggregation*> Get();

 private:
  const std::string job_id_;
  std::mutex mu_;
  std::shared_ptr<const tributary::v1::IntraNodePlan> plan_;
  std::vector<int> devices_;
  GpuOpsFactory factory_;
  bool tried_ = false;                           // Guarded by mu_.
  absl::Status failed_;                          // Guarded by mu_.
  std::unique_ptr<GpuAggregation> aggregation_;  // Guarded by mu_.
};

}  // namespace tributary::agent
