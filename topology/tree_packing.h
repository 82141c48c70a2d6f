// Spanning-tree packings for broadcast and all-reduce (Blink's TreeGen, DESIGN.md §1.3), their
// feasibility check, and the ring baseline. Pure functions; rates in bytes/s.
#pragma once

#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "topology/gpu_graph.h"

namespace tributary::topology {

// A spanning tree over all GPUs of the graph, carrying `weight` bytes/s.
struct Tree {
  int root = 0;       // index into GpuGraph::gpus
  double weight = 0;  // bytes/s
  // parent -> child, indices into GpuGraph::gpus; every non-root GPU is a child exactly once.
  std::vector<std::pair<int, int>> edges;
};

struct Packing {
  std::vector<Tree> trees;
  double rate = 0;  // bytes/s; the sum of the trees' weights
};

struct PackingOptions {
  // The reduced packing keeps at most this many trees ...
  int max_trees = 10;
  // ... and drops trees while its rate stays >= (1 - tolerance) x bound (never below
  // max_trees' best if that is already outside the tolerance).
  double tolerance = 0.05;
  // Column-generation limit (the weighted packing stops early, still feasible, if reached).
  int max_columns = 5000;
};

struct TreePlan {
  double bound = 0;  // lambda (broadcast) or sigma (all-reduce), bytes/s
  // Optimal fractional packing (exact column generation; rate == bound up to rounding unless
  // max_columns was reached).
  Packing weighted;
  // Few trees: for broadcast with integer capacities, the unit-weight arborescences of Edmonds'
  // theorem (<= lambda / unit trees, identical ones merged) when they fit in max_trees;
  // otherwise a subset of `weighted` with re-optimised weights (see PackingOptions).
  Packing reduced;
};

// Broadcast (and, with edges reversed, reduce) from GPU `root`. Trees are arborescences rooted
// at `root`; an arc u->v carries the weights of the trees with edge (u, v).
absl::StatusOr<TreePlan> PlanBroadcast(const GpuGraph& graph, int root,
                                       const PackingOptions& options = {});

// All-reduce as reduce (edges reversed) + broadcast (edges forward) over the same trees at the
// same time: an arc u->v carries the weights of the trees with edge (u, v) or (v, u). Each tree
// is rooted at a centre (least depth).
absl::StatusOr<TreePlan> PlanAllReduce(const GpuGraph& graph, const PackingOptions& options = {});

// OK when every tree spans all GPUs as an arborescence from its root, weights are >= 0, rate is
// their sum, and no arc is loaded beyond its capacity (both up to a relative 1e-9), with the
// load model of PlanBroadcast (allreduce = false) or PlanAllReduce (allreduce = true).
absl::Status CheckFeasible(const GpuGraph& graph, const Packing& packing, bool allreduce);

struct RingResult {
  bool exists = false;
  bool nvlink = false;     // the ring uses NVLink arcs only
  std::vector<int> order;  // GPU indices around the ring
  // Weakest connection of the ring, bytes/s per direction (min of the two directions).
  double bottleneck_bytes_per_s = 0;
  // Ring all-reduce algorithm bandwidth, one ring direction: b * n / (2 (n - 1)).
  double allreduce_rate = 0;
  // Two counter-rotating rings on the same cycle (both directions of each link, like the trees'
  // model): b * n / (n - 1).
  double bidirectional_allreduce_rate = 0;
};

// True when a Hamiltonian cycle over NVLink connections (both directions present) exists.
bool HasNvLinkRing(const GpuGraph& graph);

// The ring with the largest bottleneck over NVLink connections; when none exists, over all
// connections (PCIe fallback). exists = false when neither has a Hamiltonian cycle or the graph
// has more than 20 GPUs (subset DP). Cost O(2^n n^2) per distinct capacity value.
RingResult BestRing(const GpuGraph& graph);

}  // namespace tributary::topology
