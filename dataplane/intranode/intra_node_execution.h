// From the topology planner's intra-node plan (tributary.v1.IntraNodePlan, as job plans carry
// it) to the executor that runs it and that executor's input.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "dataplane/intranode/tree_allreduce.h"
#include "tributary/v1/topology.pb.h"

namespace tributary::dataplane {

// Executor GPU i is the plan's GPU plan.gpus(i) (device indices map to positions).
struct IntraNodeExecution {
  enum Kind {
    kNone,         // "direct" or "cpu-only" (or one GPU): nothing to aggregate on GPUs
    kCpuAssisted,  // "cpu-assisted-per-switch", "host-staging": CpuAssistedAllReduce(groups)
    kTrees,        // "nvlink-rooted-outside-nic-switch", "packed-trees": TreeAllReduce(trees)
  };
  Kind kind = kNone;
  // kCpuAssisted: the plan's groups as positions, each led by its first GPU, except that the
  // group holding the plan's root GPU is led by it.
  std::vector<std::vector<int>> groups;
  // kTrees: nvlink-rooted -- the plan's ring cut at its root (RingRootedTree); packed-trees --
  // the plan's all-reduce trees, weighted by their rates.
  std::vector<GpuTree> trees;
  // "nvlink-rooted-outside-nic-switch: ring 0 3 2 1 5 6 7 4 cut at GPU 6", for logs.
  std::string description;
};

// INVALID_ARGUMENT naming what is wrong for a plan that cannot run: an unknown strategy, a
// repeated GPU, a group, ring, root or tree edge naming a GPU outside plan.gpus, groups that
// do not partition the GPUs, an nvlink-rooted plan without its ring (from a controller that
// predates the field: re-plan with a newer one), trees that do not span the GPUs, a tree
// weight that is not positive.
absl::StatusOr<IntraNodeExecution> ExecutionFromPlan(const tributary::v1::IntraNodePlan& plan);

}  // namespace tributary::dataplane
