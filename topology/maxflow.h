// Maximum flow (Dinic) on small capacitated digraphs: the workhorse of the intra-node bounds.
#pragma once

#include <vector>

#include "topology/gpu_graph.h"

namespace tributary::topology {

// A flow network with real capacities. Nodes are 0..num_nodes-1. Not thread-safe; cheap to
// copy, so callers copy a template network and run one flow per copy.
class FlowNetwork {
 public:
  explicit FlowNetwork(int num_nodes);

  int num_nodes() const { return static_cast<int>(head_.size()); }
  // Adds an arc u->v with capacity `capacity` (>= 0, any unit). Returns its arc index.
  int AddArc(int u, int v, double capacity);
  // Computes a maximum s-t flow from the current (residual) state and returns its value.
  // Calling it twice continues from the residual network (the second call returns 0).
  double MaxFlow(int s, int t);
  // After MaxFlow: true for nodes reachable from s in the residual network (a minimum cut's
  // source side).
  std::vector<bool> SourceSide(int s) const;
  // Flow currently on arc `arc` (index returned by AddArc).
  double Flow(int arc) const;

 private:
  struct Arc {
    int to;
    int next;
    double cap;  // residual capacity
  };
  bool Bfs(int s, int t);
  double Dfs(int u, int t, double pushed);

  std::vector<int> head_;
  std::vector<Arc> arcs_;
  std::vector<double> original_;  // capacity per forward arc (index / 2)
  std::vector<int> level_;
  std::vector<int> iter_;
};

// Maximum flow from GPU `s` to GPU `t` (indices into graph.gpus) over all arcs, bytes/s.
double MaxFlow(const GpuGraph& graph, int s, int t);

// A FlowNetwork with one node per GPU and one arc per GpuArc.
FlowNetwork BuildFlowNetwork(const GpuGraph& graph);

}  // namespace tributary::topology
