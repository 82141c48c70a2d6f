// Exact rate bounds of tree collectives on a GPU graph (DESIGN.md §1.3):
//   broadcast/reduce from root r: lambda = min over v != r of maxflow(r, v);
//   all-reduce (reduce + broadcast over the same trees, the two directions of each connection
//   overlapped): the graph strength sigma = min over partitions P of c(delta P) / (|P| - 1).
// Pure functions; every rate is in bytes/s.
#pragma once

#include <vector>

#include "topology/gpu_graph.h"

namespace tributary::topology {

// Optimal broadcast (equivalently reduce) rate from GPU `root` (index into graph.gpus):
// min over v != root of maxflow(root, v), bytes/s. 0 when some GPU is unreachable from the root
// or the graph has fewer than two GPUs.
double BroadcastBound(const GpuGraph& graph, int root);

struct RootedBound {
  int root = 0;     // index into graph.gpus; the lowest such index on ties
  double rate = 0;  // bytes/s
};
// The root with the highest BroadcastBound.
RootedBound BestBroadcastBound(const GpuGraph& graph);

// Capacity of each undirected connection for the all-reduce model: c{u,v} = min(total capacity
// u->v, total capacity v->u) (a tree edge carries broadcast one way and reduce the other way at
// the same rate). Symmetric n x n matrix, bytes/s, zero diagonal.
std::vector<std::vector<double>> UndirectedCapacities(const GpuGraph& graph);

struct StrengthResult {
  double rate = 0;  // sigma, bytes/s
  // A partition attaining sigma: part[v] = part id of GPU v (0..num_parts-1). With < 2 GPUs:
  // one part.
  std::vector<int> part;
  int num_parts = 1;
};
// Exact graph strength over UndirectedCapacities: sigma = min over partitions P of the GPUs into
// >= 2 parts of c(delta P) / (|P| - 1). 0 for a disconnected graph or fewer than two GPUs.
//
// Polynomial: Dinkelbach iteration on k, each step evaluating
//   h(k) = min_P c(delta P) - k (|P| - 1)
// as the Dilworth truncation of the intersecting-submodular f(S) = d(S)/2 - k, computed by the
// greedy algorithm with one s-t minimum cut per GPU (Cunningham 1985 / Barahona 1992). Each
// Dinkelbach step strictly lowers k to the ratio of an actual partition; a handful of steps
// suffice in practice (O(n) in the worst case), so the cost is O(n^2) max-flows on n + 1 nodes.
StrengthResult GraphStrength(const GpuGraph& graph);

// GraphStrength(graph).rate.
double AllReduceBound(const GpuGraph& graph);

// The subgraph induced by `gpus` (indices into graph.gpus, in the order given; GPU i of the
// result is graph.gpus[gpus[i]]).
GpuGraph InducedSubgraph(const GpuGraph& graph, const std::vector<int>& gpus);

// The graph with its NVLink arcs only.
GpuGraph NvLinkOnly(const GpuGraph& graph);

}  // namespace tributary::topology
