// One node's intra-node plan: strategy, exact bounds, tree packings and the ring comparison for
// the GPUs a job holds. Pure: a topology in, a plan out.
#pragma once

#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "topology/bounds.h"
#include "topology/strategy.h"
#include "topology/topology_graph.h"
#include "topology/tree_packing.h"
#include "tributary/v1/topology.pb.h"

namespace tributary::topology {

// Everything computed for one node and GPU selection.
struct IntraNodeResult {
  IntraNodeStrategy strategy;
  GpuGraph graph;
  LinkMode mode = LinkMode::kAll;
  // Broadcast/reduce root (index into graph.gpus): the strategy's root when it has one, else
  // the root with the best bound.
  int root = 0;
  RootedBound best_root;
  double broadcast_bound = 0;
  double allreduce_bound = 0;
  // Absent with fewer than two GPUs.
  std::optional<absl::StatusOr<TreePlan>> broadcast;
  std::optional<absl::StatusOr<TreePlan>> allreduce;
  RingResult ring;
};

// `gpus`: device indices (empty = all). INVALID_ARGUMENT for unknown GPUs.
absl::StatusOr<IntraNodeResult> PlanIntraNode(const tributary::v1::Topology& topology,
                                              const std::vector<int>& gpus, LinkMode mode,
                                              const PackingOptions& options = {});

// The result as the plan message carried in job plans (reduced packings, device indices).
tributary::v1::IntraNodePlan ToProto(const IntraNodeResult& result);

}  // namespace tributary::topology
